"""BlockPool: the KV cache's physical blocks as pure-Python bookkeeping.

Every block is in exactly one of three states:

    in use      ref_cnt > 0                 held by one or more requests (shared prefix: > 1)
    cached      ref_cnt == 0, hash set      in the free queue, still findable by its hash
    free        ref_cnt == 0, no hash       in the free queue

The free queue is ordered for eviction: allocation pops from the front. Blocks freed by a
request are appended tail-first, so a request's last blocks (least likely to be shared) are
evicted before its first ones. A cached block that gets a prefix hit leaves the queue.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    # Hash of the full block's tokens chained with its prefix; None while not full / not cached.
    block_hash: bytes | None = None


class BlockPool:
    """Block ids, ref counts, the free queue (LRU) and the prefix-hash map."""

    def __init__(self, num_blocks: int, enable_caching: bool = False) -> None:
        assert num_blocks > 0
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self._free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks
        )
        self._cached: dict[bytes, KVCacheBlock] = {}
        self.num_evictions = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free or evictable cached)."""
        return len(self._free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` blocks from the front of the free queue (evicting cached ones)."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot get {num_blocks} blocks, only {self.num_free_blocks} free")
        new_blocks = []
        for _ in range(num_blocks):
            _, block = self._free_queue.popitem(last=False)
            self._maybe_evict(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
            new_blocks.append(block)
        return new_blocks

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on blocks already holding data (prefix-cache hit, fork)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free_queue[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block, in eviction order (first = evicted first)."""
        for block in blocks:
            assert block.ref_cnt > 0, f"double free of block {block.block_id}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if not self.enable_caching:
                    block.block_hash = None
                self._free_queue[block.block_id] = block

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Register a full block under its chained hash (first writer wins)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return  # an identical block is cached already; this one stays private
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their data, only lose findability)."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()

    def _maybe_evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self._cached.get(block.block_hash) is block:
            del self._cached[block.block_hash]
            self.num_evictions += 1
        block.block_hash = None

    def check_integrity(self) -> None:
        """Assert the state invariants above; tests call it after every engine step."""
        free_ids = set(self._free_queue)
        assert len(free_ids) == len(self._free_queue)
        for block in self.blocks:
            assert block.ref_cnt >= 0, f"block {block.block_id} ref_cnt {block.ref_cnt}"
            assert (block.ref_cnt == 0) == (block.block_id in free_ids), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, in free queue "
                f"{block.block_id in free_ids}"
            )
        for block_hash, block in self._cached.items():
            assert block.block_hash == block_hash
