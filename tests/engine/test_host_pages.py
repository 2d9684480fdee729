"""HostPagePool: the CPU cache's pages (runs, first fit, coalescing, frees after an upload), and
adapters packed into them as the loader packs them and uploaded from there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loraplex.engine import LoRARequest, SamplingParams
from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.host_pages import HostPagePool, HostRun
from loraplex.engine.lora.page_layout import pack_adapter, plan_layout, stage_adapter
from loraplex.platform.demo.tiny_checkpoint import write_random_checkpoint
from tests.engine.engine_driver import make_llm, run_to_completion
from tests.engine.lora_adapters import write_peft_adapter
from tests.engine.lora_units import ARCH, SHAPES, make_adapter
from tests.engine.test_adapter_pool import make_pool

PAGE_SIZE = 96


class UploadEvent:
    """Stands in for the torch.cuda.Event of an upload still queued on the copy stream (the
    pool only asks it `query()`); CPU tests have no CUDA stream to queue one on."""

    def __init__(self) -> None:
        self.done = False

    def query(self) -> bool:
        return self.done


def make_host_pages(num_pages: int = 10) -> HostPagePool:
    return HostPagePool(num_pages, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32, pin=False)


def test_runs_are_first_fit_and_freed_runs_coalesce() -> None:
    pages = make_host_pages(10)
    a, b, c = pages.allocate(3), pages.allocate(4), pages.allocate(3)
    assert (a, b, c) == (HostRun(0, 3), HostRun(3, 4), HostRun(7, 3))
    assert pages.allocate(1) is None and pages.num_free_pages == 0
    pages.free(a)
    pages.free(c)
    assert pages.allocate(4) is None, "3 + 3 free pages, not contiguous"
    assert pages.allocate(2) == HostRun(0, 2)  # the first hole that fits
    pages.free(b)  # merges with page 2 on its left and 7..9 on its right
    assert pages.allocate(8) == HostRun(2, 8)
    pages.check_integrity()


def test_a_run_read_by_an_upload_in_flight_is_free_only_once_it_completes() -> None:
    pages = make_host_pages(4)
    run = pages.allocate(4)
    assert run is not None
    upload = UploadEvent()
    pages.free(run, after=upload)
    assert pages.num_free_pages == 0 and pages.allocate(1) is None
    pages.check_integrity()
    upload.done = True
    assert pages.allocate(4) == HostRun(0, 4)
    pages.check_integrity()


def test_freeing_a_run_twice_is_caught() -> None:
    pages = make_host_pages(4)
    run = pages.allocate(2)
    assert run is not None
    pages.free(run)
    with pytest.raises(AssertionError):
        pages.free(run)


def test_an_adapter_packed_into_a_run_uploads_the_same_pages() -> None:
    """A run is page-major in the slab; its view stages and uploads like a buffer of its own."""
    adapter = make_adapter(4, ("q_proj", "v_proj", "down_proj"), seed=2)
    layout = plan_layout(4, adapter.target_modules, SHAPES, PAGE_SIZE)
    own = stage_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32)
    kernel_pages = pack_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32)
    pages = make_host_pages(layout.num_pages + 3)
    pages.slab.fill_(float("nan"))  # whatever the slab held before
    assert pages.allocate(3) is not None  # the adapter's run does not start at page 0
    run = pages.allocate(layout.num_pages)
    assert run is not None
    view = pages.view(run)
    packed = stage_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32, view)
    assert packed.data_ptr() == view.data_ptr() and torch.equal(packed, own)
    pool, kv = make_pool(num_blocks=12)
    pool.upload(CpuAdapter(adapter.content_hash, layout, packed, adapter.scaling, 0.0), keep=())
    block_ids = [b.block_id for b in kv.adapter_blocks[adapter.content_hash]]
    assert torch.equal(pool.pages[:, block_ids], kernel_pages)
    assert torch.equal(packed, own)  # the upload transposed a copy: the run is still staged
    pool.check_integrity()


@pytest.mark.parametrize("cpu_lora_cache_gb", [1.0, 0.0])  # 0: every adapter packed apart
def test_the_cpu_cache_holds_its_adapters_in_runs_and_gives_them_back(
    tmp_path: Path, cpu_lora_cache_gb: float
) -> None:
    base = write_random_checkpoint(tmp_path / "base", "llama")
    paths = [
        write_peft_adapter(base, tmp_path / f"a{i}", rank, ["q_proj", "v_proj"], seed=i)
        for i, rank in enumerate([2, 4, 8, 4])
    ]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    outputs = []
    for cache_gb in (cpu_lora_cache_gb, 1.0):
        engine = make_llm(base, max_cpu_loras=2, cpu_lora_cache_gb=cache_gb).engine
        manager = engine.lora_manager
        assert manager is not None
        for i, path in enumerate(paths * 2):
            lora = LoRARequest(f"a{i % 4}", 1 + i % 4, str(path), content_hash=f"{i % 4:064x}")
            engine.add_request(f"r{i}", [5, 6, 7, i], params, lora_request=lora)
        outs = run_to_completion(engine)
        outputs.append({rid: out.outputs[0].token_ids for rid, out in outs.items()})
        cached = list(manager._cpu.values())
        assert len(cached) <= 2
        runs = [cpu.host_run for cpu in cached]
        if cache_gb:
            assert all(runs), "every cached adapter lies in the CPU cache's pages"
        held = sum(run.num_pages for run in runs if run is not None)
        assert manager.host_pages.num_free_pages == manager.host_pages.num_pages - held
        manager.check_integrity()
    assert outputs[0] == outputs[1]


@pytest.mark.gpu
def test_on_cuda_the_slab_is_pinned_and_an_upload_from_a_run_is_exact() -> None:
    adapter = make_adapter(8, ("q_proj", "k_proj", "gate_proj"), seed=4)
    layout = plan_layout(8, adapter.target_modules, SHAPES, PAGE_SIZE)
    num_pages = layout.num_pages + 2
    pages = HostPagePool(num_pages, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32, pin=True)
    assert pages.slab.is_pinned()
    run = pages.allocate(layout.num_pages)
    assert run is not None
    packed = stage_adapter(
        adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32, pages.view(run)
    )
    kernel_pages = pack_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32)
    kv_pages = torch.full((ARCH.num_hidden_layers, 40, PAGE_SIZE), float("nan"), device="cuda")
    kv = KVCacheManager(40, block_size=4)
    pool = AdapterPool(kv, kv_pages, max_resident=3, max_pages=layout.num_pages)
    cpu = CpuAdapter(adapter.content_hash, layout, packed, adapter.scaling, 0.0, (), run)
    pool.upload(cpu, keep=())
    pages.free(run, after=pool.upload_event(adapter.content_hash))
    torch.cuda.synchronize()
    assert pool.is_ready(adapter.content_hash)
    block_ids = [b.block_id for b in kv.adapter_blocks[adapter.content_hash]]
    assert torch.equal(kv_pages[:, block_ids].cpu(), kernel_pages)
    assert pages.num_free_pages == num_pages
    pages.check_integrity()
