from __future__ import annotations

from loraplex.engine.kv_cache import KVCacheManager
from loraplex.engine.request import LoRARequest, Request, SamplingParams


def make_request(request_id: str, num_tokens: int, **kwargs) -> Request:
    return Request(request_id, list(range(100, 100 + num_tokens)), SamplingParams(), **kwargs)


def test_allocate_slots_grows_block_by_block():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    r = make_request("a", 6)
    assert kv.allocate_slots(r, 6)
    assert kv.get_block_ids("a") == [0, 1]
    r.num_computed_tokens = 6
    assert kv.allocate_slots(r, 1)  # position 6 still fits block 1
    assert kv.get_block_ids("a") == [0, 1]
    r.num_computed_tokens = 8
    assert kv.allocate_slots(r, 1)
    assert kv.get_block_ids("a") == [0, 1, 2]
    kv.check_integrity()


def test_allocation_failure_changes_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a, b = make_request("a", 8), make_request("b", 8)
    assert kv.allocate_slots(a, 8)
    assert not kv.allocate_slots(b, 8)
    assert kv.get_block_ids("b") == [] and kv.num_free_blocks == 1
    kv.check_integrity()


def test_free_returns_blocks_tail_first():
    kv = KVCacheManager(num_blocks=4, block_size=2)
    a = make_request("a", 6)
    assert kv.allocate_slots(a, 6)
    kv.free(a)
    assert kv.num_free_blocks == 4
    b = make_request("b", 8)
    assert kv.allocate_slots(b, 8)
    assert kv.get_block_ids("b") == [3, 2, 1, 0]
    kv.check_integrity()


def test_prefix_cache_hits_whole_blocks_and_keeps_one_token_to_compute():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_caching=True)
    a = make_request("a", 8)
    assert kv.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    b = make_request("b", 8)  # same 8 tokens: only the first block may be reused
    blocks, num_cached = kv.get_computed_blocks(b)
    assert [x.block_id for x in blocks] == [0] and num_cached == 4
    assert kv.allocate_slots(b, 4, blocks)
    assert kv.get_block_ids("b") == [0, 2]
    assert kv.block_pool.blocks[0].ref_cnt == 2
    kv.check_integrity()
    kv.free(a)
    kv.free(b)
    kv.check_integrity()
    assert kv.num_free_blocks == 10


def test_prefix_cache_is_keyed_by_adapter_and_salt():
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_caching=True)
    a = make_request("a", 9, cache_salt="tenant-1")
    assert kv.allocate_slots(a, 9)
    other_salt = make_request("b", 9, cache_salt="tenant-2")
    assert kv.get_computed_blocks(other_salt) == ([], 0)
    lora = LoRARequest("x", 1, "/nowhere", content_hash="abc")
    other_adapter = make_request("c", 9, cache_salt="tenant-1", lora_request=lora)
    assert kv.get_computed_blocks(other_adapter) == ([], 0)
    same = make_request("d", 9, cache_salt="tenant-1")
    blocks, num_cached = kv.get_computed_blocks(same)
    assert num_cached == 8 and [x.block_id for x in blocks] == [0, 1]
