"""AdapterLoader: each load packs its own adapter's weights, though a thread reuses one read
buffer for every file it reads and packs into the CPU cache's pages."""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.engine.lora.adapter import load_lora_adapter, lora_module_shapes
from loraplex.engine.lora.adapter_loader import AdapterLoader
from loraplex.engine.lora.host_pages import HostPagePool
from loraplex.engine.lora.page_layout import plan_layout, stage_adapter
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.request import LoRARequest
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.lora_adapters import write_peft_adapter

PAGE_SIZE = 64


def test_loads_in_one_thread_each_pack_their_own_weights(tmp_path: Path) -> None:
    base = write_random_checkpoint(tmp_path / "base", "llama")
    arch = ModelArchConfig.from_model_dir(base)
    small = write_peft_adapter(base, tmp_path / "small", 2, ["q_proj"], seed=1)
    large = write_peft_adapter(base, tmp_path / "large", 8, ["q_proj", "down_proj"], seed=2)
    pages = HostPagePool(256, arch.num_hidden_layers, PAGE_SIZE, torch.float32, pin=False)
    loader = AdapterLoader(arch, 16, PAGE_SIZE, torch.float32, host_pages=pages)
    loaded = [
        loader.load(LoRARequest(path.name, 1 + i, str(path), content_hash=f"{i:064x}"))
        for i, path in enumerate([large, small, large, small])  # the buffer: grown, then reused
    ]
    for cpu, path in zip(loaded, [large, small, large, small], strict=True):
        adapter = load_lora_adapter(path, arch, 16)  # read into memory of its own
        layout = plan_layout(
            adapter.rank, adapter.target_modules, lora_module_shapes(arch), PAGE_SIZE
        )
        expected = stage_adapter(adapter, layout, arch.num_hidden_layers, PAGE_SIZE, torch.float32)
        assert torch.equal(cpu.packed, expected) and cpu.host_run is not None
    loader.shutdown()
