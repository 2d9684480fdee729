"""How often each Triton kernel rounds differently from the PyTorch math HF transformers runs
(issue 12's numerics bar: the engine's greedy tokens against HF's, one prompt at a time).

    python bench/kernel_rounding.py [--json FILE]
    TRITON_INTERPRET=1 python bench/kernel_rounding.py --device cpu    (a smoke test only)

For the demo model's shapes (SmolLM2-135M: hidden 576, intermediate 1,536, 9 query heads and 3
KV heads of 64) in bf16, on the same random inputs: the share of output elements whose bits
differ between the Triton kernel and HF's math, and the largest difference in units of the last
place at the output's RMS (ulp). RMSNorm, RoPE and SiLU-and-mul are compared with the references in
kernels/reference (HF's math, rounding point for rounding point); paged attention with
`F.scaled_dot_product_attention` as HF's sdpa attention calls it (prefill: causal over the
prompt, with the table's tiles and then with KV tiles of 32 to 128; decode: one query over the
whole context), how far each side is from the float32 result, and the same at the Llama-3-8B
head shape (32 query and 8 KV heads of 128). Last, the linear layers' cuBLAS GEMMs as the engine
shapes them (fused projections, many rows a step) against HF's shapes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from loraplex.kernels import reference
from loraplex.kernels import triton as triton_kernels
from loraplex.kernels.triton.paged_attention import AttentionTiles, launch_paged_attention

HIDDEN, INTERMEDIATE, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64
VOCAB_SIZE = 49152
DEMO_HEADS = (NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
LLAMA3_8B_HEADS = (32, 8, 128)
BLOCK_SIZE = 16
PREFILL_TILE_NS = (32, 64, 128)
DTYPE = torch.bfloat16


def differ(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, float]:
    """Share of elements whose bits differ, and the largest difference in ulps at the output's
    RMS (an element-wise ulp means nothing at outputs near zero)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    a, e = actual.float(), expected.float()
    ulp = torch.finfo(actual.dtype).eps * e.pow(2).mean().sqrt()
    return {
        "differ": round(float((actual != expected).float().mean()), 5),
        "max_ulps": round(float((a - e).abs().max() / ulp), 2),
    }


def fused_ops(num_tokens: int, device: torch.device) -> dict[str, dict[str, float]]:
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(DTYPE)

    x, residual = randn(num_tokens, HIDDEN), randn(num_tokens, HIDDEN, scale=4.0)
    weight = randn(HIDDEN, scale=0.5)
    q, k = randn(num_tokens, NUM_HEADS, HEAD_DIM), randn(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    angles = torch.arange(num_tokens, device=device)[:, None] * torch.logspace(
        0, -4, HEAD_DIM // 2, device=device
    )
    cos = torch.cat([angles.cos()] * 2, dim=-1).to(DTYPE)
    sin = torch.cat([angles.sin()] * 2, dim=-1).to(DTYPE)
    gate_up = randn(num_tokens, 2 * INTERMEDIATE, scale=2.0)

    def rope(m: Any) -> tuple[torch.Tensor, ...]:
        """The rotated q, and the rotated k as written into a cache of one token per block."""
        caches = [torch.zeros(num_tokens, 1, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device=device)]
        caches.append(caches[0].clone())
        slots = torch.arange(num_tokens, device=device)
        q_rot = m.rotary_and_cache(q, k, k, cos, sin, *caches, slots)
        return q_rot, caches[0][:, 0]

    cases: dict[str, Callable[[Any], tuple[torch.Tensor, ...]]] = {
        "rms_norm": lambda m: (m.rms_norm(x, weight, 1e-5),),
        "fused_add_rms_norm": lambda m: m.fused_add_rms_norm(x, residual, weight, 1e-5),
        "rotary_and_cache": rope,
        "silu_and_mul": lambda m: (m.silu_and_mul(gate_up),),
    }
    out = {}
    for name, call in cases.items():
        got, want = call(triton_kernels), call(reference)
        parts = [differ(a, e) for a, e in zip(got, want, strict=True)]
        out[name] = max(parts, key=lambda p: p["differ"])  # normed or residual, q or k
    return out


def attention(
    seq_len: int, num_seqs: int, device: torch.device, heads: tuple[int, int, int] = DEMO_HEADS
) -> dict[str, dict[str, float]]:
    """Prefill (every position of each sequence) and decode (its last position) against sdpa,
    for heads = (query heads, kv heads, head dim)."""
    num_heads, num_kv_heads, head_dim = heads
    label = "" if heads == DEMO_HEADS else f" [head dim {head_dim}]"
    g = torch.Generator(device=device).manual_seed(1)
    blocks_per_seq = -(-seq_len // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq
    k = torch.randn(num_seqs, seq_len, num_kv_heads, head_dim, generator=g, device=device)
    v = torch.randn(num_seqs, seq_len, num_kv_heads, head_dim, generator=g, device=device)
    q = torch.randn(num_seqs, seq_len, num_heads, head_dim, generator=g, device=device)
    k, v, q = k.to(DTYPE), v.to(DTYPE), q.to(DTYPE)
    key_cache = torch.zeros(
        num_blocks, BLOCK_SIZE, num_kv_heads, head_dim, dtype=DTYPE, device=device
    )
    value_cache = torch.zeros_like(key_cache)
    block_tables = torch.arange(num_blocks, dtype=torch.int32, device=device).view(num_seqs, -1)
    positions = torch.arange(seq_len, device=device)
    slots = block_tables.long()[:, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    reference.reshape_and_cache(
        k.flatten(0, 1), v.flatten(0, 1), key_cache, value_cache, slots.flatten()
    )
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    group = num_heads // num_kv_heads

    def sdpa(query: torch.Tensor, causal: bool, dtype: torch.dtype = DTYPE) -> torch.Tensor:
        # HF's sdpa_attention_forward: repeat_kv, then [S, heads, len, head_dim] in
        keys = k.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
        values = v.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            query.to(dtype).transpose(1, 2), keys, values, is_causal=causal, scale=scale
        )
        return out.transpose(1, 2).to(DTYPE)  # [S, len, heads, head_dim]

    starts = torch.arange(num_seqs + 1, dtype=torch.int32, device=device) * seq_len
    prefill = triton_kernels.paged_attention(
        q.flatten(0, 1), key_cache, value_cache, block_tables, seq_lens, starts, scale
    )
    last = q[:, -1:]
    decode = triton_kernels.paged_attention(
        last.flatten(0, 1), key_cache, value_cache, block_tables, seq_lens,
        torch.arange(num_seqs + 1, dtype=torch.int32, device=device), scale,
    )  # fmt: skip
    hf_prefill, hf_decode = sdpa(q, True).flatten(0, 1), sdpa(last, False).flatten(0, 1)
    # float32 math rounded once: how far each side's rounding is from the exact result
    exact_prefill = sdpa(q, True, torch.float32).flatten(0, 1)
    exact_decode = sdpa(last, False, torch.float32).flatten(0, 1)
    out = {
        f"prefill attention ({seq_len} tokens)": differ(prefill, hf_prefill),
        f"decode attention (context {seq_len})": differ(decode, hf_decode),
        f"  prefill ({seq_len}) vs float32: Triton": differ(prefill, exact_prefill),
        f"  prefill ({seq_len}) vs float32: HF": differ(hf_prefill, exact_prefill),
        f"  decode ({seq_len}) vs float32: Triton": differ(decode, exact_decode),
        f"  decode ({seq_len}) vs float32: HF": differ(hf_decode, exact_decode),
    }
    for tile_n in PREFILL_TILE_NS:  # the KV tile decides where P is rounded before rescaling
        tiles = AttentionTiles(block_m=128, tile_n=tile_n, num_warps=8, num_stages=2)
        tiled = launch_paged_attention(
            q.flatten(0, 1), key_cache, value_cache, block_tables, seq_lens, starts, scale,
            None, tiles,
        )  # fmt: skip
        out[f"  prefill, {seq_len} tokens, KV tiles of {tile_n}"] = differ(tiled, hf_prefill)
    return {name + label: result for name, result in out.items()}


def linear_layers(device: torch.device) -> dict[str, dict[str, float]]:
    """cuBLAS, not Triton: the engine's fused projections (one GEMM for q, k and v, one for gate
    and up) against HF's separate GEMMs of the same weights, and the LM head's rows of a 64-row
    step against one row at a time (HF's decode), at the token counts of the demo agreement. A
    GEMM of another shape may take another kernel, and so another order of its float32 sums."""
    g = torch.Generator(device=device).manual_seed(2)

    def randn(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(DTYPE)

    kv_size = NUM_KV_HEADS * HEAD_DIM
    fused = {
        "qkv_proj": [randn(n, HIDDEN, scale=HIDDEN**-0.5) for n in (HIDDEN, kv_size, kv_size)],
        "gate_up_proj": [randn(INTERMEDIATE, HIDDEN, scale=HIDDEN**-0.5) for _ in range(2)],
    }
    lm_head = randn(VOCAB_SIZE, HIDDEN, scale=HIDDEN**-0.5)
    out = {}
    for num_tokens in (1, 8, 32, 64):
        x = randn(num_tokens, HIDDEN, scale=1.0)
        for name, weights in fused.items():
            together = F.linear(x, torch.cat(weights))
            separate = torch.cat([F.linear(x, w) for w in weights], dim=1)
            out[f"{name}: fused vs separate, {num_tokens} tokens"] = differ(together, separate)
    step = randn(64, HIDDEN, scale=1.0)
    one_at_a_time = torch.cat([F.linear(row[None], lm_head) for row in step])
    out["lm_head: 64 rows vs one row at a time"] = differ(F.linear(step, lm_head), one_at_a_time)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)  # cpu: a smoke test only, under TRITON_INTERPRET=1
    # The demo agreement's prompts are 4-32 tokens and its contexts at most 96.
    results = {
        **fused_ops(256, device),
        **{k: v for n in (512, 96, 64, 32) for k, v in attention(n, 8, device).items()},
        **{k: v for n in (512, 96) for k, v in attention(n, 8, device, LLAMA3_8B_HEADS).items()},
        **linear_layers(device),
    }
    for name, r in results.items():
        print(f"{name:56s} {r['differ']:8.2%} of elements differ, at most {r['max_ulps']} ulps")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                    **results,
                }
            )
        )


if __name__ == "__main__":
    main()
