"""GPU check of the Triton kernels: correctness vs the reference, CUDA-graph replay, timings.

Run on a CUDA machine from the repo root, after `pip install -e . --no-deps` (the package is
`loraplex.kernels`, so the repo root on sys.path is not enough):

    python bench/kernels_check.py

1. Correctness in bf16 on Llama-3-8B shapes (hidden 4096, 32 query heads, 8 kv heads, head_dim
   128, block_size 16): paged attention (mixed prefill chunks + decode, decode only, sliding
   window), reshape_and_cache, and the fused (multi-slice, split-K) lora_shrink / lora_expand
   for each slice group of a layer (qkv, o, gate_up, down) over 8 adapters of rank 8/16/64
   (one empty slot, one at half rank, one without its second slice) at T in {1, 32, 256, 2048};
   Triton vs reference, max abs error and PASS/FAIL.
2. CUDA graphs: a captured launch replayed with a different batch mapping / ranks / sequence
   lengths (same shapes) must still match the reference (the grids depend on shapes only); the
   captured shrink memset must zero its buffer again.
3. Timings (triton.testing.do_bench): paged attention decode (batch 32/64, context 640) and
   prefill (4 x 512); the 4 fused shrinks + 4 fused expands of one layer (8 adapters, rank 16)
   at T = 32/64/256, eager and replayed as a CUDA graph, beside the base GEMMs of that layer,
   and their ratio; then 3 candidate decode tile rows each for the shrink and the expand
   (graph-replayed, T = 32/64), to pick `SHRINK_TILES` / `EXPAND_TILES`' decode rows.

Prints everything to stdout; writes a JSON summary to $OUT/kernels.json when OUT is set. Exits 1
if any check fails. Takes well under 2 minutes on an H100/H200.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
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
# LoRA slice groups of one layer, as engine/lora/lora_slots.py stacks them (one fused shrink +
# one fused expand each): name -> (in_dim, out_dim of each slice)
LORA_GROUPS = {
    "qkv": (HIDDEN, (NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM)),
    "o": (NUM_HEADS * HEAD_DIM, (HIDDEN,)),
    "gate_up": (HIDDEN, (INTERMEDIATE, INTERMEDIATE)),
    "down": (INTERMEDIATE, (HIDDEN,)),
}
FUSED = {name: (in_dim, sum(sizes)) for name, (in_dim, sizes) in LORA_GROUPS.items()}
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


def lora_group(
    rank: int, in_dim: int, slice_sizes: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lora_a [MAX_LORAS, S, rank, in_dim], lora_b [MAX_LORAS, sum(sizes), rank] (outputs O(1))
    and ranks [S, MAX_LORAS]: full rank, except slot 3 empty, slot 6 at half rank, and slot 2
    without its second slice (k_proj / up_proj), as an adapter targeting fewer modules."""
    num_slices = len(slice_sizes)
    lora_a = torch.randn(MAX_LORAS, num_slices, rank, in_dim, device=DEVICE) / in_dim**0.5
    lora_b = torch.randn(MAX_LORAS, sum(slice_sizes), rank, device=DEVICE) / rank**0.5
    ranks = torch.full((num_slices, MAX_LORAS), rank, dtype=torch.int32)
    ranks[:, 3] = 0
    ranks[:, 6] = max(rank // 2, 1)
    if num_slices > 1:
        ranks[1, 2] = 0
    return lora_a.to(DTYPE), lora_b.to(DTYPE), ranks.to(DEVICE)


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
    print("LoRA fused shrink/expand per slice group (bf16, 8 adapters, split-K fp32 shrink)")
    ok = True
    scalings = torch.rand(MAX_LORAS, device=DEVICE) + 0.5
    for rank in (8, 16, 64):
        for group, (in_dim, sizes) in LORA_GROUPS.items():
            lora_a, lora_b, ranks = lora_group(rank, in_dim, sizes)
            for num_tokens in (1, 32, 256, 2048):
                ids, loc = lora_mapping(num_tokens, with_plain=num_tokens > 1)
                x = torch.randn(num_tokens, in_dim, device=DEVICE, dtype=DTYPE)
                shrunk = {}
                for impl_name, impl in (("ref", reference_lora), ("triton", tk)):
                    shrunk[impl_name] = torch.full(
                        (len(sizes), num_tokens, rank), 7.0, device=DEVICE
                    )
                    impl.lora_shrink(x, lora_a, ids, loc, ranks, shrunk[impl_name])
                label = f"rank {rank:>2} T {num_tokens:>4} {group}"
                ok &= report("correctness", f"lora_shrink {label}", shrunk["triton"], shrunk["ref"])
                y0 = torch.randn(num_tokens, sum(sizes) + 256, device=DEVICE, dtype=DTYPE)
                y_ref, y_tri = y0.clone(), y0.clone()
                args = (ids, loc, ranks, scalings)
                reference_lora.lora_expand(shrunk["ref"], lora_b, *args, y_ref, 128, sizes)
                tk.lora_expand(shrunk["ref"], lora_b, *args, y_tri, 128, sizes)
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
    in_dim, sizes = LORA_GROUPS["qkv"]
    lora_a, lora_b, ranks = lora_group(rank, in_dim, sizes)
    scalings = torch.ones(MAX_LORAS, device=DEVICE)
    x = torch.randn(num_tokens, in_dim, device=DEVICE, dtype=DTYPE)
    ids, loc = lora_mapping(num_tokens, with_plain=True)
    shrunk = torch.zeros(len(sizes), num_tokens, rank, device=DEVICE)
    y = torch.zeros(num_tokens, sum(sizes), device=DEVICE, dtype=DTYPE)

    def lora_step() -> None:
        tk.lora_shrink(x, lora_a, ids, loc, ranks, shrunk)
        tk.lora_expand(shrunk, lora_b, ids, loc, ranks, scalings, y, 0, sizes)

    graph, _ = capture(lora_step)
    new_ids, new_loc = build_lora_mapping(
        torch.arange(num_tokens, device=DEVICE) % 3 - 1,
        MAX_LORAS,  # slots -1, 0, 1 only
    )
    ids.copy_(new_ids)
    loc.copy_(new_loc)
    ranks[0, 1] = 4
    ranks[2, 0] = 0
    shrunk.fill_(7.0)  # the captured memset must zero it again
    y.zero_()
    graph.replay()
    expected_shrunk = torch.zeros_like(shrunk)
    reference_lora.lora_shrink(x, lora_a, ids, loc, ranks, expected_shrunk)
    ok &= report(
        "cuda_graphs", "lora fused qkv shrink, new mapping and ranks", shrunk, expected_shrunk
    )
    expected_y = torch.zeros_like(y)
    expand_args = (ids, loc, ranks, scalings, expected_y, 0, sizes)
    reference_lora.lora_expand(expected_shrunk, lora_b, *expand_args)
    ok &= report(
        "cuda_graphs", "lora fused qkv shrink+expand, new mapping and ranks", y, expected_y
    )

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
    """Closures running one layer's fused LoRA shrinks, expands, both, and the base GEMMs."""
    weights = {}
    for name, (in_dim, sizes) in LORA_GROUPS.items():
        lora_a, lora_b, _ = lora_group(rank, in_dim, sizes)
        ranks = torch.full((len(sizes), MAX_LORAS), rank, dtype=torch.int32, device=DEVICE)
        weights[name] = (lora_a, lora_b, ranks)
    base = {n: torch.randn(o, i, device=DEVICE, dtype=DTYPE) for n, (i, o) in FUSED.items()}
    scalings = torch.ones(MAX_LORAS, device=DEVICE)
    slots = torch.arange(num_tokens, device=DEVICE) % MAX_LORAS  # every adapter busy
    ids, loc = build_lora_mapping(slots, MAX_LORAS)
    inputs = {
        n: torch.randn(num_tokens, i, device=DEVICE, dtype=DTYPE) for n, (i, _) in FUSED.items()
    }
    outputs = {
        n: torch.zeros(num_tokens, o, device=DEVICE, dtype=DTYPE) for n, (_, o) in FUSED.items()
    }
    shrunk = {
        n: torch.zeros(len(sizes), num_tokens, rank, device=DEVICE)
        for n, (_, sizes) in LORA_GROUPS.items()
    }

    def shrink() -> None:
        for name, (lora_a, _, ranks) in weights.items():
            tk.lora_shrink(inputs[name], lora_a, ids, loc, ranks, shrunk[name])

    def expand() -> None:
        for name, (_, lora_b, ranks) in weights.items():
            sizes = LORA_GROUPS[name][1]
            tk.lora_expand(shrunk[name], lora_b, ids, loc, ranks, scalings, outputs[name], 0, sizes)

    def lora() -> None:
        shrink()
        expand()

    def base_gemms() -> None:
        for name, w in base.items():
            torch.matmul(inputs[name], w.T, out=outputs[name])

    return {"shrink": shrink, "expand": expand, "lora": lora, "base": base_gemms}


def graph_us(fn: Callable[[], Any]) -> float:
    graph, _ = capture(fn)
    return bench_ms(graph.replay) * 1e3


@contextlib.contextmanager
def decode_tiles(shrink: Any = None, expand: Any = None) -> Iterator[None]:
    """Swap the decode row (<= 64 tokens) of the launchers' tile tables while inside."""
    shrink_mod: Any = importlib.import_module("loraplex.kernels.triton.lora_shrink")
    expand_mod: Any = importlib.import_module("loraplex.kernels.triton.lora_expand")
    saved = shrink_mod.SHRINK_TILES, expand_mod.EXPAND_TILES
    if shrink is not None:
        shrink_mod.SHRINK_TILES = ((saved[0][0][0], shrink), *saved[0][1:])
    if expand is not None:
        expand_mod.EXPAND_TILES = ((saved[1][0][0], expand), *saved[1][1:])
    try:
        yield
    finally:
        shrink_mod.SHRINK_TILES, expand_mod.EXPAND_TILES = saved


def time_lora_layer(tk: Any) -> None:
    print("LoRA (4 slice groups: 1 fused shrink + 1 fused expand each) vs base GEMMs, one")
    print(
        "  Llama-3-8B layer, 8 adapters x rank 16, bf16; 'graph' = the 8 LoRA launches (and the 4"
    )
    print("  shrink memsets) replayed as one CUDA graph; base graph = the 4 GEMMs as a graph")
    for num_tokens in (32, 64, 256):
        fns = lora_layer_fns(tk, num_tokens, rank=16)
        us = {name: bench_ms(fn) * 1e3 for name, fn in fns.items()}
        for name in ("shrink", "expand", "lora", "base"):
            us[f"{name}_cuda_graph"] = graph_us(fns[name])
        ratio, ratio_graph = us["lora"] / us["base"], us["lora_cuda_graph"] / us["base"]
        print(
            f"  T {num_tokens:>3}: lora {us['lora']:6.1f} us (shrink {us['shrink']:5.1f},"
            f" expand {us['expand']:5.1f})  graph {us['lora_cuda_graph']:5.1f} us"
            f" (shrink {us['shrink_cuda_graph']:5.1f}, expand {us['expand_cuda_graph']:5.1f})"
        )
        print(
            f"         base {us['base']:6.1f} us (graph {us['base_cuda_graph']:6.1f})"
            f"  lora/base {ratio:4.2f}  graph lora/base {ratio_graph:4.2f}"
            f"  (vs base graph {us['lora_cuda_graph'] / us['base_cuda_graph']:4.2f})"
        )
        results["timings"][f"lora_layer_T{num_tokens}"] = {
            **{f"{name}_us": value for name, value in us.items()},
            "ratio": ratio,
            "ratio_cuda_graph": ratio_graph,
        }


def sweep_decode_tiles(tk: Any) -> None:
    """Graph-replayed time of one layer's 4 fused shrinks (4 expands) per candidate tile row."""
    from loraplex.kernels.triton.lora_expand import ExpandTiles
    from loraplex.kernels.triton.lora_shrink import ShrinkTiles

    shrink_candidates = (
        ShrinkTiles(block_m=16, block_k=128, k_chunk=512, num_warps=4, num_stages=2),
        ShrinkTiles(block_m=16, block_k=64, k_chunk=256, num_warps=2, num_stages=2),
        ShrinkTiles(block_m=16, block_k=128, k_chunk=1024, num_warps=4, num_stages=3),
    )
    expand_candidates = (
        ExpandTiles(block_m=16, block_n=128, num_warps=4, num_stages=2),
        ExpandTiles(block_m=16, block_n=128, num_warps=2, num_stages=2),
        ExpandTiles(block_m=16, block_n=256, num_warps=4, num_stages=2),
    )
    print("decode tile candidates: graph-replayed us for one layer's 4 fused launches (rank 16)")
    sweep: dict[str, float] = {}
    for num_tokens in (32, 64):
        fns = lora_layer_fns(tk, num_tokens, rank=16)
        best: dict[str, Any] = {}
        for op, candidates in (("shrink", shrink_candidates), ("expand", expand_candidates)):
            timed = []
            for tiles in candidates:
                with decode_tiles(**{op: tiles}):
                    us = graph_us(fns[op])
                print(f"  T {num_tokens:>2} {op:<6} {us:6.1f} us  {tiles}")
                sweep[f"T{num_tokens} {op} {tiles}"] = us
                timed.append((us, tiles))
            best[op] = min(timed, key=lambda pair: pair[0])[1]
        with decode_tiles(**best):
            us = graph_us(fns["lora"])
        base_us = graph_us(fns["base"])
        print(
            f"  T {num_tokens:>2} best shrink + best expand: lora graph {us:6.1f} us,"
            f" base graph {base_us:6.1f} us, ratio {us / base_us:4.2f}"
        )
        sweep[f"T{num_tokens} best lora"] = us
    results["timings"]["decode_tile_sweep_us"] = sweep


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
    sweep_decode_tiles(tk)
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
