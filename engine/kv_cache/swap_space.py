"""CPU swap space: where a preempted request's KV blocks wait (preemption_mode="swap").

Pure bookkeeping, like the GPU side: it hands out CPU block ids and records which request
holds which; the model runner copies the data when told to by the scheduler output.
"""

from __future__ import annotations

from loraplex.engine.kv_cache.block_pool import BlockPool, KVCacheBlock


class SwapSpace:
    def __init__(self, num_cpu_blocks: int) -> None:
        self.num_cpu_blocks = num_cpu_blocks
        self.pool = BlockPool(num_cpu_blocks) if num_cpu_blocks > 0 else None
        self.req_to_cpu_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    def can_hold(self, num_blocks: int) -> bool:
        return self.pool is not None and self.pool.num_free_blocks >= num_blocks

    def store(self, request_id: str, num_blocks: int) -> list[int]:
        """Take CPU blocks for a request being swapped out; returns their ids."""
        assert self.pool is not None and request_id not in self.req_to_cpu_blocks
        blocks = self.pool.get_new_blocks(num_blocks)
        self.req_to_cpu_blocks[request_id] = blocks
        self.num_swapped_out_blocks += num_blocks
        return [block.block_id for block in blocks]

    def held(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_cpu_blocks.get(request_id, [])]

    def release(self, request_id: str, swapped_in: bool = False) -> None:
        """Give a request's CPU blocks back (after swap-in, or when it is aborted)."""
        blocks = self.req_to_cpu_blocks.pop(request_id, [])
        if blocks:
            assert self.pool is not None
            self.pool.free_blocks(blocks)
            if swapped_in:
                self.num_swapped_in_blocks += len(blocks)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks if self.pool is not None else 0

    def check_integrity(self) -> None:
        if self.pool is None:
            return
        self.pool.check_integrity()
        held = sum(len(blocks) for blocks in self.req_to_cpu_blocks.values())
        assert held == self.num_cpu_blocks - self.pool.num_free_blocks
