"""PagedAttention (Kwon et al., SOSP 2023), plain PyTorch: the executable spec.

K/V live in fixed-size blocks; a sequence's block table lists its blocks in order, so its
position p sits in block `block_table[p // block_size]` at offset `p % block_size`:

    block_table = [7, 2, 9]          block_size = 4
    positions   0..3 -> block 7,  4..7 -> block 2,  8..11 -> block 9
    slot(p)     = block_table[p // 4] * 4 + p % 4

Tokens of several sequences are packed flat (see engine/model/forward_context.py).
"""

from __future__ import annotations

import torch

from loraplex.kernels.reference.fused_ops import apply_rotary_pos_emb


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> None:
    """Write each token's K/V into its cache slot."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    block_size = key_cache.shape[1]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[keep].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[keep].to(value_cache.dtype)


def rotary_and_cache(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,  # [num_tokens, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = skip
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """RoPE on q and k, then k and v into the cache: returns the rotated q (attention reads the
    keys from the cache, so the rotated k is only written there)."""
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    reshape_and_cache(k_rot, v, key_cache, value_cache, slot_mapping)
    return q_rot


def paged_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables: torch.Tensor,  # [num_seqs, max_num_blocks] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32, context length including this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    scale: float,
    sliding_window: int | None = None,
    num_decode_seqs: int = 0,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of each sequence's query tokens over its cached K/V.

    `num_decode_seqs` (leading sequences of one query token) only lets the Triton path split
    a mixed step by kernel; the result is the same math either way."""
    num_seqs = seq_lens.shape[0]
    if query.shape[0] == num_seqs:  # one query token per sequence: decode, batched
        return _decode_attention(
            query, key_cache, value_cache, block_tables, seq_lens, scale, sliding_window
        )
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for seq, seq_len in enumerate(seq_lens.tolist()):
        q_start, q_end = starts[seq], starts[seq + 1]
        if q_end == q_start:
            continue
        k, v = _gather_kv(key_cache, value_cache, block_tables[seq : seq + 1], seq_len)
        q_pos = torch.arange(seq_len - (q_end - q_start), seq_len, device=query.device)
        out[q_start:q_end] = _attend(
            query[q_start:q_end][None],
            k,
            v,
            q_pos[None],
            torch.tensor([seq_len], device=query.device),
            scale,
            sliding_window,
        )[0]
    return out


def _decode_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    max_len = int(seq_lens.max())
    k, v = _gather_kv(key_cache, value_cache, block_tables, max_len)  # [S, L, Hkv, D]
    q_pos = (seq_lens.long() - 1)[:, None]  # [S, 1]
    return _attend(query[:, None], k, v, q_pos, seq_lens, scale, sliding_window)[:, 0]


def _gather_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_tables: torch.Tensor, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the first `length` positions of each row's blocks: [S, length, Hkv, D]."""
    block_size = key_cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = block_tables[:, :num_blocks].long()  # [S, num_blocks]
    shape = (blocks.shape[0], num_blocks * block_size, *key_cache.shape[2:])
    return (
        key_cache[blocks].reshape(shape)[:, :length],
        value_cache[blocks].reshape(shape)[:, :length],
    )


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_pos: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """q [S, Q, H, D] at positions q_pos [S, Q]; k, v [S, L, Hkv, D] -> [S, Q, H, D].

    Query heads are grouped onto their KV head by a reshape (no K/V copies per group).
    """
    num_seqs, num_q, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    # [S, Hkv, group * Q, D]: head h = kv_head * group + g, as in repeat_interleave.
    qg = q.float().reshape(num_seqs, num_q, num_kv_heads, group, head_dim)
    qg = qg.permute(0, 2, 3, 1, 4).reshape(num_seqs, num_kv_heads, group * num_q, head_dim)
    kt = k.float().permute(0, 2, 3, 1)  # [S, Hkv, D, L]
    scores = torch.matmul(qg, kt) * scale  # [S, Hkv, group * Q, L]
    k_pos = torch.arange(k.shape[1], device=q.device)[None, None, :]  # [1, 1, L]
    qp = q_pos[:, :, None]  # [S, Q, 1]
    allowed = (k_pos <= qp) & (k_pos < seq_lens.long()[:, None, None])
    if sliding_window is not None:
        allowed &= k_pos > qp - sliding_window
    allowed = allowed[:, None, None].expand(num_seqs, 1, group, num_q, k.shape[1])
    scores = scores.masked_fill(~allowed.reshape(num_seqs, 1, group * num_q, -1), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # Rows shorter than L read positions past their end: zero them (0 * garbage may be NaN).
    in_seq = torch.arange(k.shape[1], device=q.device)[None, :] < seq_lens.long()[:, None]
    v = v.float().masked_fill(~in_seq[:, :, None, None], 0.0)
    out = torch.matmul(probs, v.permute(0, 2, 1, 3))  # [S, Hkv, group * Q, D]
    out = out.reshape(num_seqs, num_kv_heads, group, num_q, head_dim).permute(0, 3, 1, 2, 4)
    return out.reshape(num_seqs, num_q, num_heads, head_dim).to(q.dtype)
