"""KVCacheManager: which blocks each request holds, and prefix-cache lookups.

Pure Python: it hands out block ids; the model runner owns the tensors they index. Blocks also
hold the weights of adapters resident on the GPU (engine/lora/page_layout.py): one pool for
both, as in S-LoRA. When requests are short of blocks, adapters nobody is running give theirs
back first (`reclaim`), before anyone is preempted.
"""

from __future__ import annotations

from collections.abc import Callable

from loraplex.engine.kv_cache.block_hash import hash_block_extra, hash_request_blocks
from loraplex.engine.kv_cache.block_pool import BlockPool, KVCacheBlock
from loraplex.engine.kv_cache.swap_space import SwapSpace
from loraplex.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = False,
        num_cpu_blocks: int = 0,
    ) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.swap_space = SwapSpace(num_cpu_blocks)
        self.enable_caching = enable_caching
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._req_to_hashes: dict[str, list[bytes]] = {}
        # Copy-on-write copies (src block, dst block) for the runner, collected per step.
        self.pending_copies: list[tuple[int, int]] = []
        # Prefix-cache statistics, in tokens.
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0
        # Blocks holding the weights of adapters resident on the GPU, by adapter key.
        self.adapter_blocks: dict[str, list[KVCacheBlock]] = {}
        # Asked for `n` blocks when requests are short: frees idle adapters' blocks (LoRA).
        self.reclaim: Callable[[int], None] | None = None

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.usage

    def has_free_blocks(self, num_blocks: int) -> bool:
        """True if `num_blocks` can be handed out, after reclaiming idle adapters' blocks."""
        free = self.block_pool.num_free_blocks
        if num_blocks > free and self.reclaim is not None:
            self.reclaim(num_blocks - free)
        return num_blocks <= self.block_pool.num_free_blocks

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, [])]

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of a new request: (blocks, number of tokens they hold).

        At least one token is always left to compute, so the step produces logits; hits are
        whole blocks, so new tokens never land in a shared block.
        """
        if not self.enable_caching or request.request_id in self.req_to_blocks:
            return [], 0
        hashes = self._block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (once, however often admission was retried)."""
        self.num_prefix_queried_tokens += num_tokens
        self.num_prefix_hit_tokens += num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        computed_blocks: list[KVCacheBlock] | None = None,
    ) -> bool:
        """Make room for `num_new_tokens` more tokens after the computed ones.

        `computed_blocks` (prefix-cache hits, first allocation only) are taken by reference.
        Returns False, changing nothing but idle adapters' residency (reclaimed first), when
        the pool is short of blocks.
        """
        computed_blocks = computed_blocks or []
        held = self.req_to_blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed_blocks) * self.block_size
        num_needed = cdiv(num_computed + num_new_tokens, self.block_size)
        num_to_allocate = num_needed - len(held) - len(computed_blocks)
        # Held blocks this step writes into that others share must be copied first.
        first_written = num_computed // self.block_size
        shared = [i for i in range(first_written, len(held)) if held[i].ref_cnt > 1]
        num_evictable_hits = sum(1 for block in computed_blocks if block.ref_cnt == 0)
        if not self.has_free_blocks(num_to_allocate + len(shared) + num_evictable_hits):
            return False
        self.block_pool.touch(computed_blocks)
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        for i in shared:
            self._copy_on_write(blocks, i)
        blocks.extend(computed_blocks)
        if num_to_allocate > 0:
            blocks.extend(self.block_pool.get_new_blocks(num_to_allocate))
        self._cache_full_blocks(request, num_computed + num_new_tokens)
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Let `child` (same prompt) share the parent's prompt blocks (n > 1 sampling).

        The child recomputes only the last prompt token (for its own logits); the block that
        token lands in is shared, so writing it copies it first (copy on write).
        """
        assert child.request_id not in self.req_to_blocks
        assert parent.num_computed_tokens >= parent.num_prompt_tokens
        num_shared_tokens = child.num_prompt_tokens - 1
        parent_blocks = self.req_to_blocks[parent.request_id]
        shared = parent_blocks[: cdiv(num_shared_tokens, self.block_size)]
        self.block_pool.touch(shared)
        self.req_to_blocks[child.request_id] = list(shared)
        child.num_computed_tokens = num_shared_tokens

    def _copy_on_write(self, blocks: list[KVCacheBlock], index: int) -> None:
        old = blocks[index]
        [new] = self.block_pool.get_new_blocks(1)
        self.pending_copies.append((old.block_id, new.block_id))
        self.block_pool.free_blocks([old])
        blocks[index] = new

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, request: Request) -> None:
        """Return all of a request's blocks (tail first, so its prefix stays cached longest)."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._req_to_hashes.pop(request.request_id, None)
        self.block_pool.free_blocks(list(reversed(blocks)))
        self.swap_space.release(request.request_id)

    def swap_out(self, request: Request) -> list[tuple[int, int]] | None:
        """Move a request's blocks to CPU swap space: (gpu, cpu) pairs to copy, or None
        (changing nothing) when the swap space is short. Its GPU blocks are freed."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        if not self.swap_space.can_hold(len(blocks)):
            return None
        cpu_ids = self.swap_space.store(request.request_id, len(blocks))
        mapping = [(block.block_id, cpu_id) for block, cpu_id in zip(blocks, cpu_ids, strict=True)]
        del self.req_to_blocks[request.request_id]
        self.block_pool.free_blocks(list(reversed(blocks)))
        return mapping

    def swap_in(self, request: Request) -> list[tuple[int, int]] | None:
        """Bring a swapped request back: (cpu, gpu) pairs to copy, or None when GPU blocks
        are short. Room for its next tokens is allocated separately (allocate_slots)."""
        cpu_ids = self.swap_space.held(request.request_id)
        if not self.has_free_blocks(len(cpu_ids)):
            return None
        blocks = self.block_pool.get_new_blocks(len(cpu_ids))
        self.req_to_blocks[request.request_id] = blocks
        self.swap_space.release(request.request_id, swapped_in=True)
        return [(cpu_id, block.block_id) for cpu_id, block in zip(cpu_ids, blocks, strict=True)]

    def allocate_adapter_blocks(self, key: str, num_blocks: int) -> list[int] | None:
        """Blocks for an adapter's pages, or None (changing nothing) when the pool is short.
        Never reclaims: the caller decides which adapters to evict."""
        assert key not in self.adapter_blocks, f"adapter {key[:12]} already holds blocks"
        if num_blocks > self.block_pool.num_free_blocks:
            return None
        blocks = self.block_pool.get_new_blocks(num_blocks)
        self.adapter_blocks[key] = blocks
        return [block.block_id for block in blocks]

    def free_adapter_blocks(self, key: str) -> None:
        self.block_pool.free_blocks(self.adapter_blocks.pop(key))

    def _block_hashes(self, request: Request) -> list[bytes]:
        known = self._req_to_hashes.get(request.request_id)
        extra = hash_block_extra(
            request.lora_request.content_hash if request.lora_request else None,
            request.cache_salt,
        )
        hashes = hash_request_blocks(request.all_token_ids, self.block_size, extra, known)
        self._req_to_hashes[request.request_id] = hashes
        return hashes

    def _cache_full_blocks(self, request: Request, num_tokens: int) -> None:
        # Blocks become findable once full of known tokens; their K/V is written in this step,
        # before any later request in the same step reads it (layer by layer).
        if not self.enable_caching:
            return
        hashes = self._block_hashes(request)
        blocks = self.req_to_blocks[request.request_id]
        for block, block_hash in zip(blocks[: num_tokens // self.block_size], hashes, strict=False):
            self.block_pool.cache_block(block, block_hash)

    def reset_prefix_cache(self) -> None:
        self.block_pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Ref counts equal the number of requests holding each block; the pool is consistent."""
        self.block_pool.check_integrity()
        self.swap_space.check_integrity()
        holders: dict[int, int] = {}
        for blocks in [*self.req_to_blocks.values(), *self.adapter_blocks.values()]:
            ids = [block.block_id for block in blocks]
            assert len(ids) == len(set(ids)), f"a request or adapter holds a block twice: {ids}"
            for block_id in ids:
                holders[block_id] = holders.get(block_id, 0) + 1
        for block in self.block_pool.blocks:
            assert block.ref_cnt == holders.get(block.block_id, 0), (
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, "
                f"held by {holders.get(block.block_id, 0)} requests"
            )
