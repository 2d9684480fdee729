from __future__ import annotations

import pytest

from loraplex.engine.kv_cache.block_pool import BlockPool


def ids(blocks):
    return [b.block_id for b in blocks]


def test_allocation_takes_free_queue_front_in_order():
    pool = BlockPool(6)
    assert ids(pool.get_new_blocks(2)) == [0, 1]
    assert ids(pool.get_new_blocks(3)) == [2, 3, 4]
    assert pool.num_free_blocks == 1
    pool.check_integrity()


def test_free_appends_to_queue_tail_in_given_order():
    pool = BlockPool(4)
    a = pool.get_new_blocks(3)  # 0, 1, 2; 3 stays free
    pool.free_blocks(list(reversed(a)))  # tail first: 2, 1, 0
    assert ids(pool.get_new_blocks(4)) == [3, 2, 1, 0]
    pool.check_integrity()


def test_ref_counts_and_shared_blocks():
    pool = BlockPool(3)
    [b] = pool.get_new_blocks(1)
    pool.touch([b])
    assert b.ref_cnt == 2
    pool.free_blocks([b])
    assert b.ref_cnt == 1 and pool.num_free_blocks == 2
    pool.free_blocks([b])
    assert b.ref_cnt == 0 and pool.num_free_blocks == 3
    pool.check_integrity()
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks([b])


def test_over_allocation_raises_and_changes_nothing():
    pool = BlockPool(2)
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    assert pool.num_free_blocks == 2


def test_cached_block_is_found_until_evicted_lru_first():
    pool = BlockPool(3, enable_caching=True)
    a, b = pool.get_new_blocks(2)
    pool.cache_block(a, b"h-a")
    pool.cache_block(b, b"h-b")
    pool.free_blocks([b, a])  # b evicted first
    assert pool.get_cached_block(b"h-a") is a
    # Free queue is now [2, b(1), a(0)]: taking two evicts b, keeps a.
    assert ids(pool.get_new_blocks(2)) == [2, 1]
    assert pool.get_cached_block(b"h-b") is None
    assert pool.get_cached_block(b"h-a") is a
    assert pool.num_evictions == 1
    pool.touch([a])  # a prefix hit takes the block out of the free queue
    assert a.ref_cnt == 1 and pool.num_free_blocks == 0
    pool.check_integrity()


def test_without_caching_hashes_are_ignored():
    pool = BlockPool(2)
    [a] = pool.get_new_blocks(1)
    pool.cache_block(a, b"h")
    assert pool.get_cached_block(b"h") is None
