"""Reading an adapter file straight into its staged pages: the same pages as staging it from a
buffer, every other element zero, and the buffered load kept for what the direct read cannot do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora import adapter_loader
from loraplex.engine.lora.adapter import (
    load_lora_adapter,
    lora_module_shapes,
    read_adapter_header,
)
from loraplex.engine.lora.adapter_loader import AdapterLoader
from loraplex.engine.lora.host_pages import HostPagePool
from loraplex.engine.lora.page_layout import page_chunks, plan_layout, stage_adapter
from loraplex.engine.lora.staged_read import read_staged
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.request import LoRARequest
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.lora_adapters import write_peft_adapter

MODULES = ["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"]
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("base") / "base", "llama")


def request(path: Path, content_hash: str | None = "ab" * 32) -> LoRARequest:
    return LoRARequest(path.name, 1, str(path), content_hash=content_hash)


def expected_staged(path: Path, arch: ModelArchConfig, page_size: int, dtype: torch.dtype):
    adapter = load_lora_adapter(path, arch, 16)
    layout = plan_layout(adapter.rank, adapter.target_modules, lora_module_shapes(arch), page_size)
    return stage_adapter(adapter, layout, arch.num_hidden_layers, page_size, dtype)


def nan_pages(arch: ModelArchConfig, page_size: int, dtype: torch.dtype) -> HostPagePool:
    pool = HostPagePool(400, arch.num_hidden_layers, page_size, dtype, pin=False)
    pool.slab.fill_(float("nan"))  # whatever the slab held before
    assert pool.allocate(3) is not None  # the adapter's run does not start at page 0
    return pool


def test_page_chunks_cover_a_matrix_in_order() -> None:
    assert page_chunks(rows=5, row_len=32, page_size=96) == [(0, 96), (1, 64)]  # 3 + 2 rows
    assert page_chunks(rows=2, row_len=200, page_size=96) == [
        (0, 96), (1, 96), (2, 8), (3, 96), (4, 96), (5, 8),
    ]  # fmt: skip
    assert page_chunks(rows=1, row_len=50, page_size=96) == [(0, 50)]


# Tiny llama: hidden 64, intermediate 128. 64: rows of 128 split over pages; 96: part-filled
# pages; 200: several rows to a page.
@pytest.mark.parametrize("page_size", [64, 96, 200])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_file_in_the_model_dtype_is_read_into_the_pages_staging_would_write(
    base: Path, tmp_path: Path, page_size: int, dtype: torch.dtype, monkeypatch
) -> None:
    arch = ModelArchConfig.from_model_dir(base)
    path = write_peft_adapter(base, tmp_path / "a", 6, MODULES, seed=1)
    if dtype != torch.float32:
        tensors = load_file(path / WEIGHTS)
        save_file({k: v.to(dtype) for k, v in tensors.items()}, path / WEIGHTS)
    expected = expected_staged(path, arch, page_size, dtype)
    pool = nan_pages(arch, page_size, dtype)
    loader = AdapterLoader(arch, 16, page_size, dtype, host_pages=pool)

    def no_buffered_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("the buffered load ran")

    monkeypatch.setattr(adapter_loader, "load_lora_adapter", no_buffered_load)
    cpu = loader.load(request(path))
    assert cpu.host_run is not None and cpu.content_hash == "ab" * 32
    assert torch.equal(cpu.packed, expected)
    loader.shutdown()


def test_a_file_in_another_dtype_is_converted_from_a_buffer(base: Path, tmp_path: Path) -> None:
    arch = ModelArchConfig.from_model_dir(base)
    path = write_peft_adapter(base, tmp_path / "a", 4, MODULES, seed=2)  # float32
    pool = nan_pages(arch, 96, torch.bfloat16)
    loader = AdapterLoader(arch, 16, 96, torch.bfloat16, host_pages=pool)
    for content_hash in ("cd" * 32, None):  # no hash: the buffered load computes it
        cpu = loader.load(request(path, content_hash))
        assert torch.equal(cpu.packed, expected_staged(path, arch, 96, torch.bfloat16))
    loader.shutdown()


def test_a_nan_in_a_file_read_into_pages_is_named_and_its_run_given_back(
    base: Path, tmp_path: Path
) -> None:
    arch = ModelArchConfig.from_model_dir(base)
    path = write_peft_adapter(base, tmp_path / "a", 4, MODULES, seed=3)
    tensors = load_file(path / WEIGHTS)
    name = next(k for k in tensors if "layers.1.mlp.up_proj.lora_B" in k)
    tensors[name][2, 1] = float("nan")
    save_file(tensors, path / WEIGHTS)
    pool = nan_pages(arch, 96, torch.float32)
    free_before = pool.num_free_pages
    loader = AdapterLoader(arch, 16, 96, torch.float32, host_pages=pool)
    with pytest.raises(InvalidAdapterError, match="lora_B for layer 1 up_proj contains NaN"):
        loader.load(request(path))
    assert pool.num_free_pages == free_before
    pool.check_integrity()
    loader.shutdown()


def test_a_file_changed_after_its_header_was_read_is_refused(base: Path, tmp_path: Path) -> None:
    arch = ModelArchConfig.from_model_dir(base)
    path = write_peft_adapter(base, tmp_path / "a", 4, MODULES, seed=4)
    header = read_adapter_header(path, arch, 16)
    layout = plan_layout(4, header.config.target_modules, lora_module_shapes(arch), 96)
    pages = torch.empty(layout.num_pages, arch.num_hidden_layers, 96)
    read_staged(header, layout, pages)  # unchanged: reads
    stat = os.stat(path / WEIGHTS)
    os.utime(path / WEIGHTS, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    with pytest.raises(InvalidAdapterError, match="changed while it was being loaded"):
        read_staged(header, layout, pages)
