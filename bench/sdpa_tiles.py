"""Which backend `F.scaled_dot_product_attention` (HF transformers' attention) runs on this GPU,
and at which KV tile the engine's decode kernel rounds as it does.

    python bench/sdpa_tiles.py [--contexts 96,200,512] [--decode-only]
    TRITON_INTERPRET=1 python bench/sdpa_tiles.py --device cpu --contexts 40    (a smoke test)

For random bf16 inputs of one sequence, at the demo model's heads (9 query / 3 KV of 64) and the
Llama-3-8B shape's (32 / 8 of 128): the share of output elements where SDPA's default differs
from each backend forced in turn (0 names the default), and, for one query (decode), where the
decode kernel with one split and KV tiles of 64, 128 and 256 differs from SDPA. P is rounded to
bf16 once per KV tile against the running max, so the tile whose boundaries are SDPA's matches
it bit for bit (bench/results/h200-44a5363-sdpa-rounding).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from kernel_rounding import differ
from torch.nn.attention import SDPBackend, sdpa_kernel

from loraplex.kernels.triton.paged_decode_attention import (
    DecodeAttentionTiles,
    launch_paged_decode_attention,
)

HEADS = ((9, 3, 64), (32, 8, 128))  # (query heads, kv heads, head dim)
BACKENDS = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
DECODE_TILES = (64, 128, 256)
BLOCK_SIZE = 16


def share_differ(a: torch.Tensor, b: torch.Tensor) -> float:
    return differ(a, b)["differ"]


def backends(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> str:
    """Each backend against the default: 'NAME:share' (n/a where it cannot run these inputs)."""
    default = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    cells = []
    for backend in BACKENDS:
        try:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            cells.append(f"{backend.name}:{share_differ(out, default):.3f}")
        except RuntimeError:
            cells.append(f"{backend.name}:n/a")
    return " ".join(cells)


def decode_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_kv_heads: int) -> str:
    """The decode kernel (one split) at each KV tile against SDPA on the same GQA inputs.
    q [1, heads, 1, dim]; k, v [1, kv_heads, ctx, dim]."""
    _, num_heads, _, head_dim = q.shape
    ctx = k.shape[2]
    group = num_heads // num_kv_heads
    expected = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    )[0, :, 0]  # [heads, dim]
    num_blocks = -(-ctx // BLOCK_SIZE)
    key_cache = torch.zeros(
        num_blocks * BLOCK_SIZE, num_kv_heads, head_dim, dtype=q.dtype, device=q.device
    )
    value_cache = torch.zeros_like(key_cache)
    key_cache[:ctx], value_cache[:ctx] = k[0].transpose(0, 1), v[0].transpose(0, 1)
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    args = (
        q[0, :, 0][None],  # [1, heads, dim]
        key_cache.view(shape),
        value_cache.view(shape),
        torch.arange(num_blocks, dtype=torch.int32, device=q.device)[None],
        torch.tensor([ctx], dtype=torch.int32, device=q.device),
        torch.tensor([0, 1], dtype=torch.int32, device=q.device),
        head_dim**-0.5,
        None,
    )
    cells = []
    for tile_n in DECODE_TILES:
        tiles = DecodeAttentionTiles(tile_n, 1, 1, num_warps=4, num_stages=2)
        out = launch_paged_decode_attention(*args, tiles)[0]
        cells.append(f"tile {tile_n}: {share_differ(out, expected):.3f}")
    return " | ".join(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="96,200,512")
    ap.add_argument("--decode-only", action="store_true", help="one query only, no prefill")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1")
    args = ap.parse_args()
    torch.manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=args.device, dtype=torch.bfloat16)

    for num_heads, num_kv_heads, head_dim in HEADS:
        for ctx in (int(c) for c in args.contexts.split(",")):
            for q_len in (1,) if args.decode_only else (1, ctx):
                q = randn(1, num_heads, q_len, head_dim)
                k, v = randn(1, num_kv_heads, ctx, head_dim), randn(1, num_kv_heads, ctx, head_dim)
                group = num_heads // num_kv_heads
                k_all, v_all = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
                line = f"head dim {head_dim} keys {ctx} queries {q_len}: default vs "
                line += backends(q, k_all, v_all, causal=q_len > 1)
                if q_len == 1:
                    line += " | " + decode_tiles(q, k, v, num_kv_heads)
                print(line, flush=True)


if __name__ == "__main__":
    main()
