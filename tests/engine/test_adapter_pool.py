"""AdapterPool: adapters in the KV cache's blocks, with exact block ids and eviction order."""

from __future__ import annotations

import pytest
import torch

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.lora.adapter_loader import CpuAdapter
from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.page_layout import SLICES, pack_adapter, plan_layout, stage_adapter
from loraplex.engine.request import Request, SamplingParams
from tests.engine.lora_units import ARCH, SHAPES, make_adapter

PAGE_SIZE = 96


def cpu_adapter(rank: int, modules: tuple[str, ...], seed: int) -> CpuAdapter:
    adapter = make_adapter(rank, modules, seed)
    layout = plan_layout(rank, modules, SHAPES, PAGE_SIZE)
    packed = stage_adapter(adapter, layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32)
    return CpuAdapter(adapter.content_hash, layout, packed, adapter.scaling, 0.0)


def make_pool(num_blocks: int = 12, max_resident: int = 3) -> tuple[AdapterPool, KVCacheManager]:
    kv = KVCacheManager(num_blocks, block_size=4)
    pages = torch.zeros(ARCH.num_hidden_layers, num_blocks, PAGE_SIZE)
    pool = AdapterPool(kv, pages, max_resident=max_resident, max_pages=16)
    kv.reclaim = pool.reclaim
    return pool, kv


# q_proj + v_proj at rank 4 take 7 pages; v_proj alone at rank 2: 2 pages.
QV4 = (4, ("q_proj", "v_proj"))
V2 = (2, ("v_proj",))


def test_upload_writes_pages_and_tables() -> None:
    pool, kv = make_pool()
    cpu = cpu_adapter(*QV4, seed=0)
    assert cpu.layout.num_pages == 7
    assert pool.upload(cpu, keep=())
    assert kv.adapter_blocks["hash-0"] and kv.num_free_blocks == 5
    block_ids = [b.block_id for b in kv.adapter_blocks["hash-0"]]
    assert block_ids == list(range(7))
    rid = pool.resident_id("hash-0")
    assert rid == 0 and pool.is_ready("hash-0")  # CPU: copied synchronously
    assert pool.page_table[rid, :7].tolist() == block_ids
    q, v = SLICES.index("q_proj"), SLICES.index("v_proj")
    assert pool.ranks[:, rid].tolist() == [4 if i in (q, v) else 0 for i in range(len(SLICES))]
    assert pool.first_a[v, rid] == cpu.layout.first_a[v]
    assert pool.first_b[q, rid] == cpu.layout.first_b[q]
    assert float(pool.scalings[rid]) == cpu.scaling
    # The upload transposed each B on the device; the CPU cache's staged copy is unchanged.
    adapter = make_adapter(*QV4, seed=0)
    expected = pack_adapter(adapter, cpu.layout, ARCH.num_hidden_layers, PAGE_SIZE, torch.float32)
    assert torch.equal(pool.pages[:, block_ids], expected)
    assert torch.equal(cpu.packed, cpu_adapter(*QV4, seed=0).packed)
    pool.check_integrity()
    kv.check_integrity()


def test_idle_adapters_are_evicted_lru_first_and_pinned_ones_never() -> None:
    pool, kv = make_pool(num_blocks=12, max_resident=3)
    a, b, c = (cpu_adapter(*V2, seed=s) for s in range(3))
    for cpu in (a, b, c):
        assert pool.upload(cpu, keep=())
    assert kv.num_free_blocks == 6 and [pool.resident_id(h) for h in pool.resident_hashes()] == [
        0, 1, 2,
    ]  # fmt: skip
    pool.touch("hash-0")  # now b is the least recently used
    pool.pin("hash-1")
    d = cpu_adapter(*V2, seed=3)
    assert pool.upload(d, keep=())  # no resident id left: the LRU idle adapter (c) goes
    assert "hash-2" not in pool and pool.resident_id("hash-3") == 2
    big = cpu_adapter(*QV4, seed=4)  # 7 pages, 6 free: one idle adapter must go
    assert not pool.upload(big, keep=("hash-0", "hash-3"))  # b is pinned, a and d kept
    assert pool.resident_hashes() == ["hash-1", "hash-0", "hash-3"]
    pool.unpin("hash-1")
    assert pool.upload(big, keep=("hash-3",))  # b, now idle and least recent, is enough
    assert pool.resident_hashes() == ["hash-0", "hash-3", "hash-4"]
    assert pool.num_evictions == 2
    pool.check_integrity()
    kv.check_integrity()


def test_requests_reclaim_idle_adapters_blocks() -> None:
    pool, kv = make_pool(num_blocks=12)
    assert pool.upload(cpu_adapter(*QV4, seed=0), keep=())
    assert pool.upload(cpu_adapter(*V2, seed=1), keep=())
    pool.pin("hash-1")
    assert kv.num_free_blocks == 3
    request = Request("r", list(range(20)), SamplingParams())  # 5 blocks of 4 tokens
    assert kv.allocate_slots(request, 20)  # the idle adapter's 7 blocks were reclaimed
    assert "hash-0" not in pool and "hash-1" in pool
    assert not kv.allocate_slots(Request("s", list(range(40)), SamplingParams()), 40)
    assert "hash-1" in pool  # pinned: never reclaimed
    pool.check_integrity()
    kv.check_integrity()


def test_an_upload_that_cannot_fit_changes_nothing() -> None:
    pool, kv = make_pool(num_blocks=8)
    assert pool.upload(cpu_adapter(*V2, seed=0), keep=())
    assert not pool.upload(cpu_adapter(*QV4, seed=1), keep=(), reserve_blocks=2)
    assert pool.resident_hashes() == ["hash-0"] and kv.num_free_blocks == 6
    with pytest.raises(AssertionError):
        pool.pin("hash-9")  # not resident
    pool.check_integrity()


@pytest.mark.parametrize("max_resident", [3, 5, 8])
def test_every_slice_range_of_the_tables_starts_16_byte_aligned(max_resident: int) -> None:
    """A launch reads the tables from its projection's first slice on (a range that depends on
    the step's adapters' modules); Triton compiles a variant per pointer alignment."""
    pool, _ = make_pool(max_resident=max_resident)
    for start in range(len(SLICES)):
        rows = pool.slice_rows(slice(start, len(SLICES)))
        assert [t.data_ptr() % 16 for t in (rows.first_a, rows.first_b, rows.ranks)] == [0] * 3
        assert rows.first_a.shape == (len(SLICES) - start, max_resident)
