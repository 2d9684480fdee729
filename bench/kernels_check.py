"""GPU check of the Triton kernels: correctness vs the reference, CUDA-graph replay, timings.

Run on a CUDA machine from the repo root, after `pip install -e . --no-deps` (the package is
`loraplex.kernels`, so the repo root on sys.path is not enough):

    python bench/kernels_check.py

1. Correctness in bf16 on Llama-3-8B shapes (hidden 4096, 32 query heads, 8 kv heads, head_dim
   128, block_size 16): paged attention (mixed prefill chunks + decode, decode only, sliding
   window), reshape_and_cache, and the fused (multi-slice, split-K) lora_shrink / lora_expand
   for each slice group of a layer (qkv, o, gate_up, down) over 8 adapters of rank 8/16/64
   (one empty slot, one at half rank, one without its second slice) at T in {1, 32, 256, 2048},
   and the one-launch lora_shrink_expand at the decode sizes; Triton vs reference, max abs
   error and PASS/FAIL.
2. CUDA graphs: a captured launch replayed with a different batch mapping / ranks / sequence
   lengths (same shapes) must still match the reference (the grids depend on shapes only); the
   captured shrink memset must zero its buffer again. lora_shrink_expand (whose expand programs
   wait on its shrink programs' signals) is replayed 200 times, every result checked.
3. Timings (triton.testing.do_bench, L2 flushed before each run): paged attention decode (batch
   32/64, context 640) and prefill (4 x 512). Then LoRA at decode as the engine runs it: a
   32-layer Llama-3-8B LoRASlots (8 adapters x rank 16 on every module; max_lora_rank 16, as in
   bench/offline_throughput.py, and 64, the engine's default) driven through LoRABatch, each
   launch plan / grid / tile variant (`variants()`) checked against the reference on layer 0,
   then timed as CUDA graphs of all 32 layers: 'lora' = the LoRA launches alone, 'step' = (base
   GEMMs + LoRA) - (base GEMMs), both per layer, at T = 32/64 (decode: every variant) and
   256/2048 (prefill sizes, where the plans coincide: legacy vs current launches). The
   overlapped-shrink variants call begin / GEMM / finish as MergedLinear would (the last one
   passing the residual stream as o_proj's and down_proj's `delta_into`, as the model does).
   Then, unless `--no-sweep`, candidate decode tiles for the shrink, the expand and the fused
   kernel (lora graphs, T = 64). Each table ends with the best variant or tiles. With
   `--prefill-sweep`, prefill-row candidates for the shrink and the expand, each kernel alone at
   T = 4096 (offline_throughput.py's prefill step), summed over a layer's 4 slice groups.

Prints everything to stdout; writes a JSON summary to $OUT/kernels.json when OUT is set. Exits 1
if any check fails (a variant that fails its check is reported and not timed). Budget: well
under the 180 s that bench/h200_run.sh gives the step (most of it Triton compiles).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from loraplex.engine.lora.lora_batch import LoRABatch, LoRAKernelPlan
from loraplex.engine.lora.lora_slots import SLICE_GROUPS, LoRASlots
from loraplex.kernels import reference
from loraplex.kernels.lora_mapping import build_lora_mapping
from loraplex.kernels.reference import lora as reference_lora

# Llama-3-8B
NUM_LAYERS = 32
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


def report(
    section: str,
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    quiet: bool = False,
    atol: float = ATOL,
) -> bool:
    """Record (and print, unless quiet and passing) a Triton-vs-reference comparison."""
    err = (actual.float() - expected.float()).abs()
    max_err = float(err.nan_to_num(float("inf")).max()) if err.numel() else 0.0
    ok = bool(torch.allclose(actual.float(), expected.float(), atol=atol, rtol=RTOL))
    if not (ok and quiet):
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
                if num_tokens <= 64:  # decode: the one-launch shrink + expand
                    y_fused = y0.clone()
                    lora_out = torch.zeros_like(shrunk["ref"])
                    counters = torch.zeros_like(ranks)
                    fused_args = (*args, y_fused, 128, sizes, lora_out, counters)
                    fused().lora_shrink_expand(x, lora_a, lora_b, *fused_args)
                    ok &= report("correctness", f"lora_shrink_expand {label}", y_fused, y_ref)
    return ok


def fused() -> Any:
    return importlib.import_module("loraplex.kernels.triton.lora_shrink_expand")


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

    ok &= check_fused_replays(x, lora_a, lora_b, ids, loc, ranks, scalings, sizes)

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


def check_fused_replays(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    ids: torch.Tensor,
    loc: torch.Tensor,
    ranks: torch.Tensor,
    scalings: torch.Tensor,
    sizes: tuple[int, ...],
) -> bool:
    """lora_shrink_expand in a graph (with the zeroing of its buffers), replayed with a new
    mapping, then 200 times more: a missed signal or a stale read shows as a wrong replay."""
    num_tokens, rank = x.shape[0], lora_a.shape[2]
    lora_out = torch.zeros(len(sizes), num_tokens, rank, device=DEVICE)
    counters = torch.zeros_like(ranks)
    y0 = torch.randn(num_tokens, sum(sizes), device=DEVICE, dtype=DTYPE)
    y = y0.clone()

    def step() -> None:
        y.copy_(y0)
        lora_out.zero_()
        counters.zero_()
        fused().lora_shrink_expand(
            x, lora_a, lora_b, ids, loc, ranks, scalings, y, 0, sizes, lora_out, counters
        )

    graph, _ = capture(step)
    ids.copy_(ids.flip(0))  # same segments, other tokens
    ranks[1, 3] = 8
    graph.replay()
    expected = y0.clone()
    expected_out = torch.zeros_like(lora_out)
    reference_lora.lora_shrink(x, lora_a, ids, loc, ranks, expected_out)
    reference_lora.lora_expand(expected_out, lora_b, ids, loc, ranks, scalings, expected, 0, sizes)
    ok = report("cuda_graphs", "lora_shrink_expand qkv, new mapping and ranks", y, expected)
    worst = expected.clone()  # per element, the replayed value farthest from the expected one
    for _ in range(200):
        graph.replay()
        farther = (y.float() - expected.float()).abs() > (worst.float() - expected.float()).abs()
        worst = torch.where(farther, y, worst)
    ok &= report("cuda_graphs", "lora_shrink_expand qkv, 200 replays (worst)", worst, expected)
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


def graph_us(fn: Callable[[], Any]) -> float:
    graph, _ = capture(fn)
    return bench_ms(graph.replay) * 1e3


# --- 3b. LoRA at decode: launch plans, grids and tiles on a 32-layer model ---------------------

ADAPTER_RANK = 16
DECODE_TOKENS = (32, 64)
PREFILL_TOKENS = (256, 2048)  # plans differ only at decode: legacy vs current launches only
PREFILL_VARIANTS = ("legacy: memset/launch, slot grid", "step workspace")
STORAGE_RANKS = (16, 64)  # max_lora_rank: offline_throughput.py's, the engine's default


@dataclass(frozen=True)
class Llama3Arch:
    """engine/lora/adapter.py's ArchLike for Llama-3-8B."""

    model_type: str = "llama"
    hidden_size: int = HIDDEN
    intermediate_size: int = INTERMEDIATE
    num_hidden_layers: int = NUM_LAYERS
    num_attention_heads: int = NUM_HEADS
    num_key_value_heads: int = NUM_KV_HEADS
    head_dim: int = HEAD_DIM


def create_lora_slots(max_lora_rank: int) -> LoRASlots:
    """Every slot holds a rank-16 adapter on all 7 modules of all 32 layers. Random weights are
    written straight into the stacked storage (LoRASlots.load would copy 8 x 32 x 7 CPU pairs)."""
    slots = LoRASlots(Llama3Arch(), MAX_LORAS, max_lora_rank, DTYPE, DEVICE)
    for group in slots.groups.values():
        in_dim = group.lora_a.shape[-1]
        group.lora_a[:, :, :, :ADAPTER_RANK].normal_(0.0, in_dim**-0.5)
        group.lora_b[..., :ADAPTER_RANK].normal_(0.0, ADAPTER_RANK**-0.5)
        group.ranks.fill_(ADAPTER_RANK)
    slots.scalings.fill_(1.0)
    for module in slots.host_ranks:
        slots.host_ranks[module] = [ADAPTER_RANK] * MAX_LORAS
    return slots


class DecodeStep:
    """The 4 adaptable projections of every layer of a decode step of `num_tokens` tokens (round
    robin over the 8 adapters), run as MergedLinear runs them: base GEMM, then LoRABatch.apply;
    or begin, GEMM, finish when the plan overlaps the shrink with the GEMM."""

    def __init__(self, slots: LoRASlots, num_tokens: int, base: list[dict[Any, torch.Tensor]]):
        self.slots = slots
        self.base = base  # per layer: fused projection weight [out, in] per slice group
        token_slots = torch.arange(num_tokens, device=DEVICE) % MAX_LORAS
        self.ids, self.loc = build_lora_mapping(token_slots, MAX_LORAS)
        self.x, self.y = {}, {}
        # The residual stream that o_proj's and down_proj's outputs are added to next.
        self.residual = torch.zeros(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE)
        for names, group in slots.groups.items():
            in_dim = group.lora_a.shape[-1]
            self.x[names] = torch.randn(num_tokens, in_dim, device=DEVICE, dtype=DTYPE)
            self.y[names] = torch.zeros(
                num_tokens, sum(group.slice_sizes), device=DEVICE, dtype=DTYPE
            )

    def run(
        self,
        plan: LoRAKernelPlan | None,
        with_base: bool,
        num_layers: int | None = None,
        into_residual: bool = False,
    ) -> None:
        """One step's projections; `into_residual`: o_proj's and down_proj's deltas go into the
        residual stream (`begin(..., delta_into=residual)`), as MergedLinear passes them."""
        batch = None
        if plan is not None:
            modules = set(self.slots.module_shapes)
            batch = LoRABatch(self.slots, self.ids, self.loc, modules, plan)
        for layer in range(num_layers or NUM_LAYERS):
            for names, group in self.slots.groups.items():
                x, y, sizes = self.x[names], self.y[names], group.slice_sizes
                if batch is not None and batch.plan.overlap_shrink:
                    residual = self.residual if into_residual and len(names) == 1 else None
                    shrunk = batch.begin(layer, names, sizes, x, delta_into=residual)
                    if with_base:
                        torch.matmul(x, self.base[layer][names].T, out=y)
                    batch.finish(shrunk, y)
                    continue
                if with_base:
                    torch.matmul(x, self.base[layer][names].T, out=y)
                if batch is not None:
                    batch.apply(layer, names, sizes, x, y)

    def check(self, plan: LoRAKernelPlan, label: str, into_residual: bool = False) -> bool:
        """Layer 0's deltas, from y = 0 (and residual = 0), against the reference kernels. With
        `into_residual` the residual must hold o's plus down's deltas, and their y stay 0."""
        ok = True
        self.residual.zero_()
        for y in self.y.values():
            y.zero_()
        self.run(plan, with_base=False, num_layers=1, into_residual=into_residual)
        residual_expected = torch.zeros_like(self.residual, dtype=torch.float32)
        for names, group in self.slots.groups.items():
            lora_out = torch.zeros(
                len(names), self.ids.shape[0], self.slots.max_lora_rank, device=DEVICE
            )
            mapping = (self.ids, self.loc, group.ranks)
            reference_lora.lora_shrink(self.x[names], group.lora_a[0], *mapping, lora_out)
            # float32: o's and down's deltas sum in the residual, and a bf16 expected value
            # would add a rounding of its own to the comparison.
            expected = torch.zeros_like(self.y[names], dtype=torch.float32)
            args = (self.slots.scalings, expected, 0, group.slice_sizes)
            reference_lora.lora_expand(lora_out, group.lora_b[0], *mapping, *args)
            if into_residual and len(names) == 1:
                residual_expected += expected
                expected = torch.zeros_like(expected)
            name = f"{label} {'_'.join(names)}"
            ok &= report("correctness", name, self.y[names], expected, quiet=True)
        if into_residual:
            # The sum went through a bf16 intermediate (o's delta alone, up to ~8 here, where a
            # bf16 step is 1/32): allow two such steps, even where the sum itself is small.
            name = f"{label} o+down into the residual"
            ok &= report(
                "correctness", name, self.residual, residual_expected, quiet=True, atol=1 / 16
            )
        return ok


@dataclass(frozen=True)
class Variant:
    """A launch plan plus the kernel knobs it runs with (None: the module's default)."""

    name: str
    plan: LoRAKernelPlan
    compact_grid: bool = True
    shrink: Any = None  # ShrinkTiles for the decode row
    expand: Any = None  # ExpandTiles for the decode row
    fused: Any = None  # FusedTiles
    into_residual: bool = False  # o/down deltas into the residual stream (MergedLinear's way)


def shrink_module() -> Any:
    return importlib.import_module("loraplex.kernels.triton.lora_shrink")


def expand_module() -> Any:
    return importlib.import_module("loraplex.kernels.triton.lora_expand")


@contextlib.contextmanager
def using(variant: Variant) -> Iterator[None]:
    """Set the kernels' module-level knobs to the variant's while inside."""
    sm, em, fm = shrink_module(), expand_module(), fused()
    saved = sm.COMPACT_GRID, sm.SHRINK_TILES, em.EXPAND_TILES, fm.FUSED_TILES
    sm.COMPACT_GRID = variant.compact_grid
    if variant.shrink is not None:
        sm.SHRINK_TILES = ((saved[1][0][0], variant.shrink), *saved[1][1:])
    if variant.expand is not None:
        em.EXPAND_TILES = ((saved[2][0][0], variant.expand), *saved[2][1:])
    if variant.fused is not None:
        fm.FUSED_TILES = variant.fused
    try:
        yield
    finally:
        sm.COMPACT_GRID, sm.SHRINK_TILES, em.EXPAND_TILES, fm.FUSED_TILES = saved


def variants() -> list[Variant]:
    sm, em = shrink_module(), expand_module()
    # The launch structure before the step workspace and segment tiles: a memset per shrink,
    # a (token tile x slot) grid, rank tiles as wide as max_lora_rank.
    legacy_shrink = dataclasses.replace(sm.SHRINK_TILES[0][1], max_block_n=64)
    legacy_expand = dataclasses.replace(em.EXPAND_TILES[0][1], max_block_k=64)
    # Each plan names overlap_shrink: it defaults to on (the engine's plan).
    workspace = LoRAKernelPlan(step_workspace=True, overlap_shrink=False)
    per_launch = LoRAKernelPlan(step_workspace=False, overlap_shrink=False)
    return [
        Variant(
            "legacy: memset/launch, slot grid",
            per_launch,
            compact_grid=False,
            shrink=legacy_shrink,
            expand=legacy_expand,
        ),
        Variant("memset/launch", per_launch),
        Variant("step workspace, slot grid", workspace, compact_grid=False),
        Variant("step workspace", workspace),
        Variant(
            "step workspace + fused",
            LoRAKernelPlan(step_workspace=True, fused_max_tokens=64, overlap_shrink=False),
        ),
        Variant(
            "step workspace + overlapped shrink",
            LoRAKernelPlan(step_workspace=True, overlap_shrink=True),
        ),
        Variant(
            "... + o/down deltas into the residual",
            LoRAKernelPlan(step_workspace=True, overlap_shrink=True),
            into_residual=True,
        ),
    ]


def tile_candidates() -> dict[str, list[Variant]]:
    """Decode-row candidates per kernel, each on the plan that uses that kernel."""
    sm, em, fm = shrink_module(), expand_module(), fused()
    workspace = LoRAKernelPlan(step_workspace=True)
    fused_plan = LoRAKernelPlan(step_workspace=True, fused_max_tokens=64)
    shrinks = [
        sm.ShrinkTiles(16, block_k=128, k_chunk=512, max_block_n=16, num_warps=4, num_stages=2),
        sm.ShrinkTiles(16, block_k=64, k_chunk=256, max_block_n=16, num_warps=4, num_stages=2),
        sm.ShrinkTiles(16, block_k=128, k_chunk=256, max_block_n=16, num_warps=4, num_stages=2),
        sm.ShrinkTiles(16, block_k=128, k_chunk=1024, max_block_n=16, num_warps=4, num_stages=3),
        sm.ShrinkTiles(16, block_k=64, k_chunk=128, max_block_n=16, num_warps=2, num_stages=2),
    ]
    expands = [
        em.ExpandTiles(16, block_n=128, max_block_k=16, num_warps=4, num_stages=2),
        em.ExpandTiles(16, block_n=64, max_block_k=16, num_warps=2, num_stages=2),
        em.ExpandTiles(16, block_n=256, max_block_k=16, num_warps=4, num_stages=2),
        em.ExpandTiles(16, block_n=256, max_block_k=16, num_warps=8, num_stages=2),
        em.ExpandTiles(16, block_n=512, max_block_k=16, num_warps=8, num_stages=2),
    ]
    fuseds = [
        fm.FusedTiles(
            16, block_k=128, k_chunk=512, block_n=128, max_block_r=16, num_warps=4, num_stages=2
        ),
        fm.FusedTiles(
            16, block_k=64, k_chunk=256, block_n=128, max_block_r=16, num_warps=4, num_stages=2
        ),
        fm.FusedTiles(
            16, block_k=128, k_chunk=256, block_n=128, max_block_r=16, num_warps=4, num_stages=2
        ),
        fm.FusedTiles(
            16, block_k=128, k_chunk=1024, block_n=128, max_block_r=16, num_warps=4, num_stages=3
        ),
        fm.FusedTiles(
            16, block_k=128, k_chunk=512, block_n=256, max_block_r=16, num_warps=8, num_stages=2
        ),
    ]
    return {
        "shrink": [Variant("shrink", workspace, shrink=t) for t in shrinks],
        "expand": [Variant("expand", workspace, expand=t) for t in expands],
        "fused": [Variant("fused", fused_plan, fused=t) for t in fuseds],
    }


def time_variant(
    step: DecodeStep, variant: Variant, base_us: float | None, label: str
) -> dict[str, float] | None:
    """Check, then time the variant: lora us/layer (and step us/layer with the base GEMMs)."""
    try:
        with using(variant):
            into = variant.into_residual
            if not step.check(variant.plan, label, into_residual=into):
                return None
            lora_only = functools.partial(step.run, variant.plan, False, into_residual=into)
            out = {"lora_us": graph_us(lora_only) / NUM_LAYERS}
            if base_us is not None:
                total = graph_us(
                    functools.partial(step.run, variant.plan, True, into_residual=into)
                )
                out["step_us"] = (total - base_us) / NUM_LAYERS
            return out
    except Exception:  # a variant that cannot compile or run is reported, the rest still run
        print(f"  FAIL  {label}: raised\n" + traceback.format_exc(limit=3))
        results["correctness"].append({"name": label, "pass": False})
        return None


def time_lora_decode() -> bool:
    print(
        f"LoRA per layer: Llama-3-8B, {NUM_LAYERS} layers x 4 projections, {MAX_LORAS} adapters x"
        f" rank {ADAPTER_RANK}, bf16, CUDA graphs of all {NUM_LAYERS} layers; per layer:\n"
        "  'lora' = the LoRA launches alone, 'step' = (base GEMMs + LoRA) - base GEMMs"
    )
    ok = True
    shapes = dict(zip(SLICE_GROUPS, FUSED.values(), strict=True))  # same order: qkv o gu down
    base = [
        {
            n: torch.empty(o, i, device=DEVICE, dtype=DTYPE).normal_(0.0, i**-0.5)
            for n, (i, o) in shapes.items()
        }
        for _ in range(NUM_LAYERS)
    ]
    table: dict[str, Any] = {}
    for max_rank in STORAGE_RANKS:
        slots = create_lora_slots(max_rank)
        for num_tokens in (*DECODE_TOKENS, *PREFILL_TOKENS):
            step = DecodeStep(slots, num_tokens, base)
            base_us = graph_us(functools.partial(step.run, None, True))
            key = f"max_lora_rank {max_rank} T {num_tokens}"
            table[key] = {"base_gemms_us_per_layer": base_us / NUM_LAYERS}
            for variant in variants():
                if num_tokens in PREFILL_TOKENS and variant.name not in PREFILL_VARIANTS:
                    continue
                label = f"{variant.name} [{key}]"
                timed = time_variant(step, variant, base_us, label)
                ok &= timed is not None
                table[key][variant.name] = timed
    for sizes in (DECODE_TOKENS, PREFILL_TOKENS):
        print_table({k: c for k, c in table.items() if int(k.split()[-1]) in sizes})
    for key, cell in table.items():
        timed = {n: t for n, t in cell.items() if isinstance(t, dict)}
        if timed and int(key.split()[-1]) in DECODE_TOKENS:
            best = min(timed, key=lambda n: timed[n]["step_us"])
            print(
                f"  best at {key}: {best} ({timed[best]['step_us']:.1f} us/layer of the step,"
                f" target <= 30 at T 64)"
            )
    results["timings"]["lora_decode_us_per_layer"] = table
    if "--no-sweep" not in sys.argv:
        ok &= sweep_decode_tiles(base)
    if "--prefill-sweep" in sys.argv:
        ok &= sweep_prefill_tiles()
    return ok


PREFILL_SWEEP_TOKENS = 4096  # offline_throughput.py's max_num_batched_tokens


def prefill_candidates() -> tuple[list[Any], list[Any]]:
    """Prefill-row (last row) candidates: the current tiles first."""
    sm, em = shrink_module(), expand_module()
    shrinks = [
        sm.SHRINK_TILES[-1][1],
        sm.ShrinkTiles(64, block_k=128, k_chunk=1024, max_block_n=64, num_warps=4, num_stages=3),
        sm.ShrinkTiles(128, block_k=64, k_chunk=1024, max_block_n=64, num_warps=4, num_stages=3),
        sm.ShrinkTiles(128, block_k=64, k_chunk=2048, max_block_n=64, num_warps=8, num_stages=3),
        sm.ShrinkTiles(64, block_k=64, k_chunk=2048, max_block_n=64, num_warps=4, num_stages=4),
    ]
    expands = [
        em.EXPAND_TILES[-1][1],
        em.ExpandTiles(64, block_n=256, max_block_k=64, num_warps=4, num_stages=2),
        em.ExpandTiles(128, block_n=128, max_block_k=64, num_warps=4, num_stages=2),
        em.ExpandTiles(128, block_n=128, max_block_k=64, num_warps=8, num_stages=2),
        em.ExpandTiles(64, block_n=128, max_block_k=64, num_warps=8, num_stages=3),
    ]
    return shrinks, expands


@contextlib.contextmanager
def prefill_row(module: Any, table_name: str, tiles: Any) -> Iterator[None]:
    """The kernel module's last (prefill) tile row set to `tiles` while inside."""
    saved = getattr(module, table_name)
    setattr(module, table_name, (*saved[:-1], (saved[-1][0], tiles)))
    try:
        yield
    finally:
        setattr(module, table_name, saved)


def sweep_prefill_tiles() -> bool:
    """Each kernel alone at a prefill step (T 4096, 8 adapters x rank 16 in runs of 512 tokens,
    max_lora_rank 16), per slice group, for each prefill-row candidate; checked, then timed."""
    from loraplex.kernels import triton as tk

    print(
        f"prefill tile candidates: us per layer (sum of the 4 groups), T {PREFILL_SWEEP_TOKENS},"
        " the base GEMMs for scale"
    )
    num_tokens = PREFILL_SWEEP_TOKENS
    slots = create_lora_slots(16)
    token_slots = (torch.arange(num_tokens, device=DEVICE) // 512) % MAX_LORAS
    ids, loc = build_lora_mapping(token_slots, MAX_LORAS)
    # Per kernel, per slice group: (name, launch, its output, the reference's output).
    launches: dict[str, list[tuple[str, Callable[[], Any], torch.Tensor, torch.Tensor]]] = {
        "shrink": [],
        "expand": [],
    }
    base_ms = 0.0
    for names, group in slots.groups.items():
        in_dim, out_dim = group.lora_a.shape[-1], sum(group.slice_sizes)
        x = torch.randn(num_tokens, in_dim, device=DEVICE, dtype=DTYPE)
        w = torch.empty(out_dim, in_dim, device=DEVICE, dtype=DTYPE).normal_(0.0, in_dim**-0.5)
        base_ms += bench_ms(functools.partial(torch.matmul, x, w.T))
        mapping = (ids, loc, group.ranks)
        lora_out = torch.zeros(len(names), num_tokens, 16, device=DEVICE)
        expected_out = torch.zeros_like(lora_out)
        reference_lora.lora_shrink(x, group.lora_a[0], *mapping, expected_out)
        y = torch.zeros(num_tokens, out_dim, device=DEVICE, dtype=DTYPE)
        expected_y = torch.zeros_like(y)
        expand_args = (slots.scalings, expected_y, 0, group.slice_sizes)
        reference_lora.lora_expand(expected_out, group.lora_b[0], *mapping, *expand_args)
        shrink = functools.partial(tk.lora_shrink, x, group.lora_a[0], *mapping, lora_out)
        expand = functools.partial(
            tk.lora_expand,
            expected_out,
            group.lora_b[0],
            *mapping,
            slots.scalings,
            y,
            0,
            group.slice_sizes,
        )
        launches["shrink"].append(("_".join(names), shrink, lora_out, expected_out))
        launches["expand"].append(("_".join(names), expand, y, expected_y))
    print(f"  base GEMMs {base_ms * 1e3:8.1f} us per layer")
    ok = True
    shrinks, expands = prefill_candidates()
    sweep: dict[str, float] = {"base_gemms_us_per_layer": base_ms * 1e3}
    kinds = (
        ("shrink", shrink_module(), "SHRINK_TILES", shrinks),
        ("expand", expand_module(), "EXPAND_TILES", expands),
    )
    for kind, module, table_name, candidates in kinds:
        for tiles in candidates:
            try:
                with prefill_row(module, table_name, tiles):
                    total_ms = 0.0
                    for name, launch, out, expected in launches[kind]:
                        out.zero_()  # the expand adds into y
                        launch()
                        label = f"prefill {kind} {name} {tiles}"
                        ok &= report("correctness", label, out, expected, quiet=True)
                        total_ms += bench_ms(launch)
                print(f"  {kind:<6} {total_ms * 1e3:8.1f} us  {tiles}")
                sweep[f"{kind} {tiles}"] = total_ms * 1e3
            except Exception:
                print(f"  FAIL  prefill {kind} {tiles}: raised\n" + traceback.format_exc(limit=3))
                ok = False
    results["timings"]["prefill_tile_sweep_us_per_layer"] = sweep
    return ok


def print_table(table: dict[str, Any]) -> None:
    """One row per variant, a (lora, step) pair of columns per (max_lora_rank, T)."""
    print(f"  {'us per layer':<38}" + "".join(f"{k:>26}" for k in table))
    print(f"  {'':<38}" + "".join(f"{'lora':>13}{'step':>13}" for _ in table))
    for variant in variants():
        cells = [cell.get(variant.name, "absent") for cell in table.values()]
        if all(c == "absent" for c in cells):
            continue
        row = ""
        for c in cells:
            if c == "absent":
                row += f"{'-':>26}"
            elif c is None:
                row += f"{'FAILED':>26}"
            else:
                row += f"{c['lora_us']:>13.1f}{c['step_us']:>13.1f}"
        print(f"  {variant.name:<38}{row}")
    bases = "".join(f"{c['base_gemms_us_per_layer']:>26.1f}" for c in table.values())
    print(f"  {'(base GEMMs alone)':<38}{bases}")


def sweep_decode_tiles(base: list[dict[Any, torch.Tensor]]) -> bool:
    """Decode-row candidates (lora graphs, T 64, max_lora_rank 16 and 64)."""
    print("decode tile candidates: 'lora' us per layer (T 64, 32-layer graphs)")
    ok = True
    sweep: dict[str, Any] = {}
    for max_rank in STORAGE_RANKS:
        slots = create_lora_slots(max_rank)
        step = DecodeStep(slots, 64, base)
        for kernel, candidates in tile_candidates().items():
            timed = []
            for variant in candidates:
                tiles = variant.shrink or variant.expand or variant.fused
                label = f"{kernel} max_lora_rank {max_rank} {tiles}"
                result = time_variant(step, variant, None, label)
                ok &= result is not None
                if result is not None:
                    print(
                        f"  max_lora_rank {max_rank:>2} {kernel:<6} {result['lora_us']:6.1f} us  {tiles}"
                    )
                    sweep[label] = result["lora_us"]
                    timed.append((result["lora_us"], tiles))
            if timed:
                us, tiles = min(timed, key=lambda pair: pair[0])
                print(f"  best {kernel} at max_lora_rank {max_rank}: {us:.1f} us  {tiles}")
    results["timings"]["decode_tile_sweep_us_per_layer"] = sweep
    return ok


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
    ok &= time_lora_decode()
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
