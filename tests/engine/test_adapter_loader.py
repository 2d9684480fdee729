"""AdapterLoader: each load packs its own adapter's weights, though a thread reuses one read
buffer for every file it reads and packs into the CPU cache's pages; a load split into pieces
on threads gives what one pass gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora import adapter as adapter_module
from loraplex.engine.lora.adapter import load_lora_adapter, lora_module_shapes
from loraplex.engine.lora.adapter_loader import AdapterLoader
from loraplex.engine.lora.host_pages import HostPagePool
from loraplex.engine.lora.page_layout import pack_adapter, plan_layout
from loraplex.engine.lora.task_map import serial_map
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
        expected = pack_adapter(adapter, layout, arch.num_hidden_layers, PAGE_SIZE, torch.float32)
        assert torch.equal(cpu.packed, expected) and cpu.host_run is not None
    loader.shutdown()


def test_pieces_read_and_packed_on_threads_equal_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pieces far smaller than the file, not multiples of any row: many pieces per pass.
    monkeypatch.setattr(adapter_module, "READ_CHUNK_BYTES", 1000)
    base = write_random_checkpoint(tmp_path / "base", "llama")
    arch = ModelArchConfig.from_model_dir(base)
    path = write_peft_adapter(base, tmp_path / "a", 4, ["q_proj", "v_proj", "down_proj"], seed=3)
    loader = AdapterLoader(arch, 16, PAGE_SIZE, torch.float32)
    cpu = loader.load(LoRARequest("a", 1, str(path), content_hash="0" * 64))
    adapter = load_lora_adapter(path, arch, 16, task_map=serial_map)
    layout = plan_layout(adapter.rank, adapter.target_modules, lora_module_shapes(arch), PAGE_SIZE)
    expected = pack_adapter(adapter, layout, arch.num_hidden_layers, PAGE_SIZE, torch.float32)
    assert torch.equal(cpu.packed, expected)

    # A NaN in the middle of the file, read by one of the pieces, is found.
    weights = load_file(str(path / "adapter_model.safetensors"))
    name = sorted(weights)[len(weights) // 2]
    weights[name].view(-1)[weights[name].numel() // 2] = float("nan")
    save_file(weights, str(path / "adapter_model.safetensors"))
    with pytest.raises(InvalidAdapterError, match="NaN or Inf"):
        loader.load(LoRARequest("a", 2, str(path), content_hash="1" * 64))
    loader.shutdown()
