"""GPU check of the Triton kernels: correctness vs the reference, CUDA-graph replay, timings.

Run on a CUDA machine from the repo root, after `pip install -e . --no-deps` (the package is
`loraplex.kernels`, so the repo root on sys.path is not enough):

    python bench/kernels_check.py

1. Correctness in bf16 on Llama-3-8B shapes (hidden 4096, 32 query heads, 8 kv heads, head_dim
   128, block_size 16): paged attention (mixed prefill chunks + decode, decode only, sliding
   window), reshape_and_cache, and lora_shrink / lora_expand over 8 adapters of rank 8/16/64 at
   T in {1, 32, 256, 2048}; Triton vs reference, max abs error and PASS/FAIL.
2. CUDA graphs: a captured launch replayed with a different batch mapping / different sequence
   lengths (same shapes) must still match the reference (the grids depend on shapes only).
3. Timings (triton.testing.do_bench): paged attention decode (batch 32/64, context 640) and
   prefill (4 x 512); shrink + expand for the 7 LoRA projections of one layer (8 adapters, rank
   16) at T = 32/64/256 beside the base GEMMs of that layer, and their ratio.

Prints everything to stdout; writes a JSON summary to $OUT/kernels.json when OUT is set. Exits 1
if any check fails. Takes well under 2 minutes on an H100/H200.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from loraplex.kernels import reference
from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference_lora

# Llama-3-8B
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
BLOCK_SIZE = 16
# name -> (in_dim, out_dim, fused output it lands in, offset in that output)
PROJECTIONS = {
    "q_proj": (HIDDEN, NUM_HEADS * HEAD_DIM, "qkv", 0),
    "k_proj": (HIDDEN, NUM_KV_HEADS * HEAD_DIM, "qkv", NUM_HEADS * HEAD_DIM),
    "v_proj": (HIDDEN, NUM_KV_HEADS * HEAD_DIM, "qkv", (NUM_HEADS + NUM_KV_HEADS) * HEAD_DIM),
    "o_proj": (NUM_HEADS * HEAD_DIM, HIDDEN, "o", 0),
    "gate_proj": (HIDDEN, INTERMEDIATE, "gate_up", 0),
    "up_proj": (HIDDEN, INTERMEDIATE, "gate_up", INTERMEDIATE),
    "down_proj": (INTERMEDIATE, HIDDEN, "down", 0),
}
FUSED = {  # base GEMMs of one layer: name -> (in_dim, out_dim)
    "qkv": (HIDDEN, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM),
    "o": (NUM_HEADS * HEAD_DIM, HIDDEN),
    "gate_up": (HIDDEN, 2 * INTERMEDIATE),
    "down": (INTERMEDIATE, HIDDEN),
}
MAX_LORAS = 8
DTYPE = torch.bfloat16
ATOL = 2e-2  # bf16 outputs of O(1)
RTOL = 2e-2
DEVICE = torch.device("cuda")

results: dict[str, Any] = {"correctness": [], "cuda_graphs": [], "timings": {}}


def report(section: str, name: str, actual: torch.Tensor, expected: torch.Tensor) -> bool:
    err = (actual.float() - expected.float()).abs()
    max_err = float(err.nan_to_num(float("inf")).max()) if err.numel() else 0.0
    ok = bool(torch.allclose(actual.float(), expected.float(), atol=ATOL, rtol=RTOL))
    print(f"  {'PASS' if ok else 'FAIL'}  {name:<58} max abs err {max_err:.3e}")
    results[section].append({"name": name, "max_abs_err": max_err, "pass": ok})
    return ok


# --- inputs -----------------------------------------------------------------------------------


def paged_inputs(
    seq_lens: list[int], q_lens: list[int], spare_blocks: int = 8
) -> tuple[torch.Tensor, ...]:
    """query, caches, block_tables (shuffled block ids), seq_lens, query_start_loc."""
    blocks_per_seq = [-(-n // BLOCK_SIZE) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    perm = torch.randperm(num_blocks, device=DEVICE).to(torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(blocks_per_seq), dtype=torch.int32)
    used = 0
    for seq, n in enumerate(blocks_per_seq):
        block_tables[seq, :n] = perm[used : used + n].cpu()
        used += n
    shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    key_cache = torch.randn(shape, device=DEVICE, dtype=DTYPE)
    value_cache = torch.randn(shape, device=DEVICE, dtype=DTYPE)
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    query = torch.randn(int(query_start_loc[-1]), NUM_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return (
        query,
        key_cache,
        value_cache,
        block_tables.to(DEVICE),
        seq_lens_t,
        query_start_loc.to(DEVICE),
    )


def lora_weights(rank: int, in_dim: int, out_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lora_a [MAX_LORAS, rank, in_dim], lora_b [MAX_LORAS, out_dim, rank]; outputs O(1)."""
    lora_a = torch.randn(MAX_LORAS, rank, in_dim, device=DEVICE) / in_dim**0.5
    lora_b = torch.randn(MAX_LORAS, out_dim, rank, device=DEVICE) / rank**0.5
    return lora_a.to(DTYPE), lora_b.to(DTYPE)


def lora_mapping(num_tokens: int, with_plain: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens spread over MAX_LORAS adapters, unevenly; every 7th without adapter if asked."""
    slots = torch.randint(0, MAX_LORAS, (num_tokens,))
    slots[slots == 5] = 1  # slot 5 gets no tokens, slot 1 twice as many
    if with_plain:
        slots[::7] = -1
    return build_lora_mapping(slots.to(DEVICE), MAX_LORAS)


# --- 1. correctness -----------------------------------------------------------------------------


def check_paged_attention(tk: Any) -> bool:
    print("paged attention (bf16, 32 q heads / 8 kv heads, head_dim 128, block 16)")
    ok = True
    scale = HEAD_DIM**-0.5
    cases = {
        "mixed: 2 prefill chunks + 1 prompt + 13 decodes": (
            [700, 1000, 333] + [640 + 7 * i for i in range(13)],
            [200, 512, 333] + [1] * 13,
            None,
        ),
        "decode: 64 seqs, ctx 640": ([640] * 64, [1] * 64, None),
        "mixed, sliding window 256": ([700, 1000, 90, 640], [200, 512, 90, 1], 256),
    }
    for name, (seq_lens, q_lens, window) in cases.items():
        args = paged_inputs(seq_lens, q_lens)
        expected = reference.paged_attention(*args, scale, window)
        actual = tk.paged_attention(*args, scale, window)
        ok &= report("correctness", f"paged_attention {name}", actual, expected)

    num_tokens = 300
    qkv = torch.randn(
        num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE
    )
    key, value = qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS], qkv[:, NUM_HEADS + NUM_KV_HEADS :]
    caches = [torch.randn(64, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)]
    caches.append(caches[0].clone())
    slot_mapping = torch.randperm(64 * BLOCK_SIZE, device=DEVICE)[:num_tokens]
    slot_mapping[::9] = -1
    expected_k, expected_v = (c.clone() for c in caches)
    reference.reshape_and_cache(key, value, expected_k, expected_v, slot_mapping)
    tk.reshape_and_cache(key, value, caches[0], caches[1], slot_mapping)
    ok &= report("correctness", "reshape_and_cache (strided k/v, -1 slots)", caches[0], expected_k)
    ok &= report("correctness", "reshape_and_cache value_cache", caches[1], expected_v)
    return ok


def check_lora(tk: Any) -> bool:
    print("LoRA shrink/expand (bf16, 8 adapters, fp32 shrink output)")
    ok = True
    for rank in (8, 16, 64):
        weights = {
            name: lora_weights(rank, *PROJECTIONS[name][:2]) for name in ("q_proj", "down_proj")
        }
        ranks = torch.full((MAX_LORAS,), rank, dtype=torch.int32, device=DEVICE)
        ranks[3] = 0  # one empty slot
        ranks[6] = max(rank // 2, 1)  # one smaller adapter in a padded slot
        scalings = torch.rand(MAX_LORAS, device=DEVICE) + 0.5
        for num_tokens in (1, 32, 256, 2048):
            ids, loc = lora_mapping(num_tokens, with_plain=num_tokens > 1)
            for name, (lora_a, lora_b) in weights.items():
                in_dim, out_dim = PROJECTIONS[name][:2]
                x = torch.randn(num_tokens, in_dim, device=DEVICE, dtype=DTYPE)
                shrunk = {}
                for impl_name, impl in (("ref", reference_lora), ("triton", tk)):
                    shrunk[impl_name] = torch.zeros(num_tokens, rank, device=DEVICE)
                    impl.lora_shrink(x, lora_a, ids, loc, ranks, shrunk[impl_name])
                label = f"rank {rank:>2} T {num_tokens:>4} {name}"
                ok &= report("correctness", f"lora_shrink {label}", shrunk["triton"], shrunk["ref"])
                y0 = torch.randn(num_tokens, out_dim + 256, device=DEVICE, dtype=DTYPE)
                y_ref, y_tri = y0.clone(), y0.clone()
                args = (ids, loc, ranks, scalings)
                reference_lora.lora_expand(shrunk["ref"], lora_b, *args, y_ref, 128)
                tk.lora_expand(shrunk["ref"], lora_b, *args, y_tri, 128)
                ok &= report("correctness", f"lora_expand {label} (y_offset 128)", y_tri, y_ref)
    return ok


# --- 2. CUDA graphs -----------------------------------------------------------------------------


def capture(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def check_cuda_graphs(tk: Any) -> bool:
    print("CUDA graph capture + replay with new batch data (same shapes)")
    ok = True
    num_tokens, rank = 64, 16
    lora_a, lora_b = lora_weights(rank, HIDDEN, HIDDEN)
    ranks = torch.full((MAX_LORAS,), rank, dtype=torch.int32, device=DEVICE)
    scalings = torch.ones(MAX_LORAS, device=DEVICE)
    x = torch.randn(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE)
    ids, loc = lora_mapping(num_tokens, with_plain=True)
    shrunk = torch.zeros(num_tokens, rank, device=DEVICE)
    y = torch.zeros(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE)

    def lora_step() -> None:
        tk.lora_shrink(x, lora_a, ids, loc, ranks, shrunk)
        tk.lora_expand(shrunk, lora_b, ids, loc, ranks, scalings, y, 0)

    graph, _ = capture(lora_step)
    new_ids, new_loc = build_lora_mapping(
        torch.arange(num_tokens, device=DEVICE) % 3 - 1,
        MAX_LORAS,  # slots -1, 0, 1 only
    )
    ids.copy_(new_ids)
    loc.copy_(new_loc)
    ranks[1] = 4
    shrunk.zero_()
    y.zero_()
    graph.replay()
    expected_shrunk = torch.zeros_like(shrunk)
    reference_lora.lora_shrink(x, lora_a, ids, loc, ranks, expected_shrunk)
    expected_y = torch.zeros_like(y)
    reference_lora.lora_expand(expected_shrunk, lora_b, ids, loc, ranks, scalings, expected_y, 0)
    ok &= report("cuda_graphs", "lora shrink+expand, new mapping and ranks", y, expected_y)

    seq_lens = [640 + 3 * i for i in range(32)]
    args = paged_inputs([n + 200 for n in seq_lens], [1] * 32)  # blocks for longer sequences
    scale = HEAD_DIM**-0.5
    args[4].copy_(torch.tensor(seq_lens, dtype=torch.int32))
    graph, out = capture(lambda: tk.paged_attention(*args, scale))
    args[4].add_(150)  # every sequence grew; same shapes
    graph.replay()
    expected = reference.paged_attention(*args, scale)
    ok &= report("cuda_graphs", "paged_attention decode, new seq_lens", out, expected)
    return ok


# --- 3. timings ---------------------------------------------------------------------------------


def bench_ms(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=50))


def time_paged_attention(tk: Any) -> None:
    print("paged attention timings (bf16)")
    scale = HEAD_DIM**-0.5
    kv_bytes_per_token = 2 * NUM_KV_HEADS * HEAD_DIM * 2
    for batch in (32, 64):
        args = paged_inputs([640] * batch, [1] * batch)
        ms = bench_ms(functools.partial(tk.paged_attention, *args, scale))
        gbps = batch * 640 * kv_bytes_per_token / ms / 1e6
        print(f"  decode batch {batch:>2} ctx 640: {ms * 1e3:8.1f} us  ({gbps:6.0f} GB/s of KV)")
        results["timings"][f"paged_attention_decode_b{batch}_ctx640_us"] = ms * 1e3
    args = paged_inputs([512] * 4, [512] * 4)
    ms = bench_ms(functools.partial(tk.paged_attention, *args, scale))
    flops = 4 * 4 * 512 * 512 * NUM_HEADS * HEAD_DIM / 2  # QK^T and PV, causal half
    print(f"  prefill 4 x 512:          {ms * 1e3:8.1f} us  ({flops / ms / 1e9:6.1f} TFLOP/s)")
    results["timings"]["paged_attention_prefill_4x512_us"] = ms * 1e3


def lora_layer_fns(tk: Any, num_tokens: int, rank: int) -> dict[str, Callable[[], None]]:
    """Closures running one layer's LoRA shrinks, expands, both, and the base GEMMs."""
    weights = {name: lora_weights(rank, *spec[:2]) for name, spec in PROJECTIONS.items()}
    base = {n: torch.randn(o, i, device=DEVICE, dtype=DTYPE) for n, (i, o) in FUSED.items()}
    ranks = torch.full((MAX_LORAS,), rank, dtype=torch.int32, device=DEVICE)
    scalings = torch.ones(MAX_LORAS, device=DEVICE)
    slots = torch.arange(num_tokens, device=DEVICE) % MAX_LORAS  # every adapter busy
    ids, loc = build_lora_mapping(slots, MAX_LORAS)
    inputs = {
        n: torch.randn(num_tokens, i, device=DEVICE, dtype=DTYPE) for n, (i, _) in FUSED.items()
    }
    outputs = {
        n: torch.zeros(num_tokens, o, device=DEVICE, dtype=DTYPE) for n, (_, o) in FUSED.items()
    }
    shrunk = torch.zeros(len(PROJECTIONS), num_tokens, rank, device=DEVICE)

    def shrink() -> None:
        for i, (name, (_, _, fused, _)) in enumerate(PROJECTIONS.items()):
            tk.lora_shrink(inputs[fused], weights[name][0], ids, loc, ranks, shrunk[i])

    def expand() -> None:
        for i, (name, (_, _, fused, offset)) in enumerate(PROJECTIONS.items()):
            lora_b = weights[name][1]
            tk.lora_expand(shrunk[i], lora_b, ids, loc, ranks, scalings, outputs[fused], offset)

    def lora() -> None:
        shrink()
        expand()

    def base_gemms() -> None:
        for name, w in base.items():
            torch.matmul(inputs[name], w.T, out=outputs[name])

    return {"shrink": shrink, "expand": expand, "lora": lora, "base": base_gemms}


def time_lora_layer(tk: Any) -> None:
    print("LoRA (7 projections: shrink + expand each) vs base GEMMs, one Llama-3-8B layer")
    print("  8 adapters x rank 16, bf16; 'graph' = the 14 LoRA launches replayed as one CUDA graph")
    for num_tokens in (32, 64, 256):
        fns = lora_layer_fns(tk, num_tokens, rank=16)
        us = {name: bench_ms(fn) * 1e3 for name, fn in fns.items()}
        graph, _ = capture(fns["lora"])
        us["lora_cuda_graph"] = bench_ms(graph.replay) * 1e3
        ratio, ratio_graph = us["lora"] / us["base"], us["lora_cuda_graph"] / us["base"]
        print(
            f"  T {num_tokens:>3}: lora {us['lora']:6.1f} us (shrink {us['shrink']:5.1f},"
            f" expand {us['expand']:5.1f}, graph {us['lora_cuda_graph']:5.1f})"
            f"  base {us['base']:6.1f} us  lora/base {ratio:4.2f} (graph {ratio_graph:4.2f})"
        )
        results["timings"][f"lora_layer_T{num_tokens}"] = {
            **{f"{name}_us": value for name, value in us.items()},
            "ratio": ratio,
            "ratio_cuda_graph": ratio_graph,
        }


def main() -> int:
    if not torch.cuda.is_available():
        print("kernels_check needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    from loraplex.kernels import triton as tk

    torch.manual_seed(0)
    started = time.perf_counter()
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    results["env"] = env
    ok = check_paged_attention(tk)
    ok &= check_lora(tk)
    ok &= check_cuda_graphs(tk)
    time_paged_attention(tk)
    time_lora_layer(tk)
    results["all_pass"] = ok
    results["wall_s"] = time.perf_counter() - started
    print(f"{'ALL PASS' if ok else 'SOME CHECKS FAILED'} in {results['wall_s']:.1f} s")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "kernels.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
