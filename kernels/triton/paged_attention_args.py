"""Argument checks of the paged-attention launchers (prefill/mixed and split-KV decode)."""

from __future__ import annotations

import torch

from loraplex.kernels.launch_checks import (
    check,
    check_contiguous_last_dim,
    check_one_device,
)


def check_paged_attention_args(
    op: str,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    sliding_window: int | None,
) -> None:
    """Raise ValueError (naming `op`) unless the arguments are what the kernels read."""
    check(op, query.dim() == 3 and key_cache.dim() == 4, "query must be 3-D and key_cache 4-D")
    check(op, key_cache.shape == value_cache.shape, "key_cache and value_cache shapes differ")
    _, num_heads, head_dim = query.shape
    _, _, num_kv_heads, cache_head_dim = key_cache.shape
    check(
        op, cache_head_dim == head_dim, "cache head_dim %s != query's %s", cache_head_dim, head_dim
    )
    check(op, num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads")
    check(
        op, query.dtype in (torch.float16, torch.bfloat16, torch.float32), "dtype %s", query.dtype
    )
    check(op, query.dtype == key_cache.dtype == value_cache.dtype, "query and caches dtypes differ")
    check(op, block_tables.dim() == 2, "block_tables must be [num_seqs, max_num_blocks]")
    num_seqs = block_tables.shape[0]
    check(op, seq_lens.shape == (num_seqs,), "seq_lens must be [num_seqs]")
    check(op, query_start_loc.shape == (num_seqs + 1,), "query_start_loc must be [num_seqs + 1]")
    for name, t in (
        ("block_tables", block_tables),
        ("seq_lens", seq_lens),
        ("query_start_loc", query_start_loc),
    ):
        check(op, t.dtype == torch.int32, "%s must be int32", name)
    check(op, block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    check(
        op,
        seq_lens.is_contiguous() and query_start_loc.is_contiguous(),
        "seq_lens and query_start_loc must be contiguous",
    )
    check_contiguous_last_dim(op, query=query, key_cache=key_cache, value_cache=value_cache)
    check(op, sliding_window is None or sliding_window > 0, "sliding_window must be > 0 or None")
    check_one_device(op, query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)


def check_out(op: str, query: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`out` checked to take the launch's output ([num_tokens, num_heads, head_dim], query's
    dtype and device, contiguous last dim), or a new tensor like query if None."""
    if out is None:
        return torch.empty_like(query)
    check(
        op, out.shape == query.shape, "out must be %s, got %s", tuple(query.shape), tuple(out.shape)
    )
    check(op, out.dtype == query.dtype and out.device == query.device, "out must match query")
    check_contiguous_last_dim(op, out=out)
    return out
