"""Disk -> staged CPU pages time of one never-seen adapter (issue 11's cold-load cost).

Builds a Llama-3-8B-shaped adapter (rank 16, all 7 projections, bf16: 84 MB) and times
`AdapterLoader.load` with a content hash given, as the platform loads it (the file, in the
model's dtype, read straight into its pages: engine/lora/staged_read.py): the median of
`--repeats` loads; beside it the buffered load (into a read buffer, then staged from it), and
the median of each of its stages on its own (read, header + tensor index, NaN/Inf check,
stage). Pages of 32768 elements (Llama-3-8B's KV block: 2 * 16 * 8 * 128),
staged into the CPU cache's pages (HostPagePool, pinned on CUDA hosts). The file stays in the
page cache: this is the CPU's part of a load. Beside it, in the same run: the CPU time of the
kernels' layout made on the host (`pack_adapter`: B transposed there, as loads did before),
and on CUDA the device part of an upload (copy + `transpose_staged_b`, synchronized).

    python bench/adapter_load_time.py [--repeats 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from workload import LORA_MODULES, SHAPES, write_random_adapter

from loraplex.engine.lora import adapter as adapter_module
from loraplex.engine.lora.adapter import LoRAAdapter
from loraplex.engine.lora.adapter_config import parse_adapter_config
from loraplex.engine.lora.adapter_loader import AdapterLoader, CpuAdapter
from loraplex.engine.lora.host_pages import HostPagePool
from loraplex.engine.lora.page_layout import (
    AdapterPageLayout,
    max_adapter_pages,
    pack_adapter,
    plan_layout,
    stage_adapter,
    transpose_staged_b,
)
from loraplex.engine.lora.safetensors_header import data_section_start, parse_safetensors_header
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.request import LoRARequest

PAGE_SIZE = 2 * 16 * 8 * 128
RANK = 16
MAX_LORA_RANK = 64


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def stage_into_pool(
    pool: HostPagePool, adapter: LoRAAdapter, layout: AdapterPageLayout, layers: int, dtype
) -> None:
    run = pool.allocate(layout.num_pages)
    assert run is not None
    stage_adapter(adapter, layout, layers, PAGE_SIZE, dtype, out=pool.view(run))
    pool.free(run)


def upload_ms(staged: torch.Tensor, layout: AdapterPageLayout, repeats: int) -> float:
    """Host -> device copy of staged pages and the device transpose of each B, synchronized."""

    def upload() -> None:
        # a run of the host pool is page-major in memory: it travels as it lies
        on_device = staged.transpose(0, 1).to("cuda", non_blocking=True).transpose(0, 1)
        transpose_staged_b(on_device, layout)
        torch.cuda.synchronize()

    upload()
    return median_ms(upload, repeats)


def stage_ms(
    path: Path, arch: ModelArchConfig, pool: HostPagePool, repeats: int
) -> dict[str, float]:
    """Each stage of a load, timed alone on the same inputs the load gives it."""
    config_bytes, data = adapter_module._read_files(path)
    config = parse_adapter_config(config_bytes, MAX_LORA_RANK)
    file_bytes = data.numpy().data
    tensors = parse_safetensors_header(file_bytes)
    index = adapter_module._index_tensors(tensors, config, arch)
    start = data_section_start(file_bytes)
    views = adapter_module._tensor_views(data, start, tensors)
    adapter = adapter_module.load_lora_adapter(path, arch, MAX_LORA_RANK, "0" * 64)
    shapes = adapter_module.lora_module_shapes(arch)
    layout = plan_layout(RANK, adapter.target_modules, shapes, PAGE_SIZE)
    layers, dtype = arch.num_hidden_layers, torch.bfloat16
    return {
        "read": median_ms(lambda: adapter_module._read_files(path), repeats),
        "header_and_index": median_ms(
            lambda: adapter_module._index_tensors(
                parse_safetensors_header(file_bytes), config, arch
            ),
            repeats,
        ),
        "finite_check": median_ms(
            lambda: adapter_module._check_finite(data, start, tensors, views, index), repeats
        ),
        "stage": median_ms(lambda: stage_into_pool(pool, adapter, layout, layers, dtype), repeats),
        "pack_with_host_transpose": median_ms(
            lambda: pack_adapter(adapter, layout, layers, PAGE_SIZE, dtype), repeats
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    arch = ModelArchConfig.from_dict(SHAPES["llama3-8b"])
    path = write_random_adapter(
        Path(tempfile.mkdtemp()) / "adapter", SHAPES["llama3-8b"], RANK, 0, modules=LORA_MODULES
    )
    pin = torch.cuda.is_available()
    shapes = adapter_module.lora_module_shapes(arch)
    max_pages = max_adapter_pages(MAX_LORA_RANK, shapes, PAGE_SIZE)
    pool = HostPagePool(max_pages, arch.num_hidden_layers, PAGE_SIZE, torch.bfloat16, pin)
    loader = AdapterLoader(arch, MAX_LORA_RANK, PAGE_SIZE, torch.bfloat16, host_pages=pool)
    request = LoRARequest("bench", 1, str(path), content_hash="0" * 64)

    def load(read: Callable[[LoRARequest], CpuAdapter]) -> None:
        run = read(request).host_run
        assert run is not None, "staged into the CPU cache's pages"
        pool.free(run)

    load(loader.load)  # warm-up: imports, allocator
    load(loader._load_and_stage)
    result = {
        "adapter_mb": round(sum(f.stat().st_size for f in path.iterdir()) / 1e6, 1),
        "pinned": pin,
        "load_ms": median_ms(lambda: load(loader.load), args.repeats),
        "buffered_load_ms": median_ms(lambda: load(loader._load_and_stage), args.repeats),
        **{f"{k}_ms": v for k, v in stage_ms(path, arch, pool, args.repeats).items()},
    }
    if pin:
        staged = loader.load(request)
        result["device_upload_ms"] = upload_ms(staged.packed, staged.layout, args.repeats)
    loader.shutdown()
    if args.json:
        print(
            json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()})
        )
        return
    print(f"{result['adapter_mb']} MB adapter, pinned={pin}, medians of {args.repeats}:")
    for key, value in result.items():
        if key.endswith("_ms"):
            print(f"  {key[:-3]:<17} {value:7.1f} ms")


if __name__ == "__main__":
    main()
