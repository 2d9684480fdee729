"""Paged-attention inputs: shuffled block tables over a cache that is NaN wherever no sequence
owns it (unowned blocks, slots past each sequence's length), so a kernel that reads outside a
sequence's blocks or past its length poisons its output."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PagedBatch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor
    block_tables: torch.Tensor  # [num_seqs, max_num_blocks] int32
    seq_lens: torch.Tensor  # [num_seqs] int32
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32

    @property
    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
        )


def make_paged_batch(
    seq_lens: list[int],
    q_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> PagedBatch:
    """Shuffled (non-contiguous) block ids; unused blocks and slots past seq_len are NaN."""
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # 3 blocks nobody owns
    max_num_blocks = max(blocks_per_seq) + 1  # a spare column pointing at an unowned block
    perm = torch.randperm(num_blocks)
    nan = float("nan")
    block_tables = torch.full((len(seq_lens), max_num_blocks), int(perm[-1]), dtype=torch.int32)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = torch.full(cache_shape, nan, device=device)  # built in float32 on the device
    value_cache = key_cache.clone()
    used = 0
    for seq, (seq_len, n) in enumerate(zip(seq_lens, blocks_per_seq, strict=True)):
        block_tables[seq, :n] = perm[used : used + n].to(torch.int32)
        ids = perm[used : used + n].to(device)
        used += n
        shape = (seq_len, num_kv_heads, head_dim)
        flat_k = key_cache[ids].reshape(-1, num_kv_heads, head_dim)
        flat_v = value_cache[ids].reshape(-1, num_kv_heads, head_dim)
        flat_k[:seq_len] = torch.randn(shape, device=device)
        flat_v[:seq_len] = torch.randn(shape, device=device)
        key_cache[ids] = flat_k.view(n, block_size, num_kv_heads, head_dim)
        value_cache[ids] = flat_v.view(n, block_size, num_kv_heads, head_dim)
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    query = torch.randn(int(query_start_loc[-1]), num_heads, head_dim, device=device)
    return PagedBatch(
        query=query.to(dtype),
        key_cache=key_cache.to(dtype),
        value_cache=value_cache.to(dtype),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=query_start_loc.to(device),
    )
