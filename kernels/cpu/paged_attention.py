"""PagedAttention on the CPU through PyTorch's fused attention (`scaled_dot_product_attention`,
FlashAttention-style tiling on the CPU): same signature and results as the reference
(`kernels/reference/paged_attention.py`, the spec), without the reference's materialised
[heads, queries, keys] score matrix, which makes a long prefill quadratic in memory traffic.

Prefill chunks and mixed batches go sequence by sequence: each sequence's K/V is gathered from
its blocks once per layer, and its queries (positions seq_len - num_q .. seq_len - 1) attend
causally:

    keys      0 .. seq_len - num_q - 1 | seq_len - num_q .. seq_len - 1
    query i   all visible              | visible up to its own position (causal)

A whole prompt (num_q == seq_len) is plain causal attention; a single query sees every key.
Decode-only batches keep the reference's batched path: one query per sequence is small.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from loraplex.kernels.reference.paged_attention import _gather_kv
from loraplex.kernels.reference.paged_attention import paged_attention as reference_attention


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    sliding_window: int | None = None,
    num_decode_seqs: int = 0,  # a hint for the Triton path's kernel choice; unused here
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's query tokens over its cached K/V."""
    num_seqs = seq_lens.shape[0]
    if query.shape[0] == num_seqs:  # one query token per sequence: decode, batched
        return reference_attention(
            query,
            key_cache,
            value_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            sliding_window,
        )
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for seq, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[seq], starts[seq + 1]
        if q_end == q_start:
            continue
        k, v = _gather_kv(key_cache, value_cache, block_tables[seq : seq + 1], seq_len)
        out[q_start:q_end] = _attend(query[q_start:q_end], k[0], v[0], scale, sliding_window)
    return out


def _attend(
    q: torch.Tensor,  # [Q, H, D], positions L - Q .. L - 1
    k: torch.Tensor,  # [L, Hkv, D]
    v: torch.Tensor,  # [L, Hkv, D]
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:  # [Q, H, D]
    num_q, num_keys = q.shape[0], k.shape[0]
    mask: torch.Tensor | None = None
    is_causal = False
    if num_q == num_keys and sliding_window is None:
        is_causal = True  # the whole prompt: the fused kernel skips the masked half
    elif num_q > 1 or sliding_window is not None:
        mask = _mask(num_q, num_keys, sliding_window, q.device)
    # [1, heads, tokens, D] views (the fused CPU kernels want 4-D), float32 like the reference
    # so that both give the same results.
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1)[None],
        k.float().transpose(0, 1)[None],
        v.float().transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=True,  # query heads grouped onto their KV head, no K/V copies
    )
    return out[0].transpose(0, 1).to(q.dtype)


@functools.lru_cache(maxsize=8)  # every layer of a step asks for the same few masks
def _mask(
    num_q: int, num_keys: int, sliding_window: int | None, device: torch.device
) -> torch.Tensor:
    """[Q, L] additive mask: query i, at position L - Q + i, sees keys up to its position (and
    within the window); 0 where visible, -inf elsewhere. Read only."""
    q_pos = torch.arange(num_keys - num_q, num_keys, device=device)[:, None]
    k_pos = torch.arange(num_keys, device=device)[None, :]
    visible = k_pos <= q_pos
    if sliding_window is not None:
        visible &= k_pos > q_pos - sliding_window
    return torch.zeros(visible.shape, device=device).masked_fill_(~visible, float("-inf"))
