"""Kernel timings on a CUDA GPU at Llama-3-8B shapes in bf16: what an engine step spends in each.

Correctness is tested in tests/ (`pytest -m gpu`); this script only sanity-checks the LoRA step
it times against the reference first. Run from the repo root with `loraplex` installed:

    python3 bench/kernels_bench.py [--many | --many-only]

1. Paged attention: decode (batch 32 and 64, context 640; GB/s of KV read) and prefill (4 x 512).
2. Fused decoder ops, Triton vs the reference: eager, and per call in a CUDA graph of 20 calls,
   at T = 64 (decode) and 4096 (a prefill chunk); the decode-step total over 32 layers.
3. LoRA as the engine runs it: 8 adapters x rank 16 on all 7 modules of 32 layers, resident in
   an AdapterPool (bench/lora_step.py: pages of the KV cache's block size), driven through
   LoRABatch (begin, base GEMM, finish; o_proj's and down_proj's deltas into the residual
   stream) as CUDA graphs of all 32 layers, with a shrink output (max_lora_rank) 16 and 64 wide.
   Per layer: 'lora' = the LoRA launches alone, 'step' = (base GEMMs + LoRA) - base GEMMs.
4. `--many`: LoRA on q/k/v/o at ranks 8/16/32/64 in turn (max_lora_rank 64) with 8 to 128
   distinct adapters in one step (one adapter per token at most), as in bench/many_adapters.py's
   workload: ms per step of 32 layers and the adapters' weight bytes per second read.
Candidate tiles for the LoRA kernels: bench/lora_step_tiles.py (a step of 8 adapters) and
bench/lora_many_tiles.py (many adapters), each timed from CUDA graphs.

Prints a table per part; writes $OUT/kernels.json when OUT is set. Exits 1 if the sanity check
fails.
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
import triton
from kernel_timing import bench_us, graph_us
from lora_step import (
    LLAMA3_8B,
    NUM_LAYERS,
    AdapterMix,
    LoRAStep,
    create_adapter_pool,
    create_base_weights,
)

from loraplex.engine.lora.adapter_pool import AdapterPool
from loraplex.engine.lora.lora_batch import LoRAWorkspace
from loraplex.engine.model.hf_config import RopeConfig
from loraplex.engine.model.rotary import RotaryEmbedding
from loraplex.kernels import reference
from loraplex.kernels import triton as triton_kernels

DTYPE = torch.bfloat16
DEVICE = torch.device("cuda")
HIDDEN, INTERMEDIATE = LLAMA3_8B.hidden_size, LLAMA3_8B.intermediate_size
NUM_HEADS, NUM_KV_HEADS = LLAMA3_8B.num_attention_heads, LLAMA3_8B.num_key_value_heads
HEAD_DIM, BLOCK_SIZE = LLAMA3_8B.head_dim, 16
LORA_TOKENS = (32, 64, 256, 2048)
# max_lora_rank, the shrink output's width: offline_throughput.py's, the engine's default.
MAX_LORA_RANKS = (16, 64)
GRAPH_REPEATS = 20
# References that cannot be captured in a CUDA graph: reshape_and_cache (inside
# rotary_and_cache's reference) drops the -1 slots by boolean indexing, which syncs. They are
# timed eagerly only, and the reference's decode-step total takes their eager time.
EAGER_ONLY_REFERENCES = frozenset({"rotary_and_cache"})


def paged_inputs(seq_lens: list[int], q_lens: list[int]) -> tuple[torch.Tensor, ...]:
    """query, key/value caches, block tables (shuffled block ids), seq_lens, query_start_loc."""
    blocks = [-(-n // BLOCK_SIZE) for n in seq_lens]
    perm = torch.randperm(sum(blocks), device=DEVICE).to(torch.int32)
    block_tables = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32, device=DEVICE)
    for seq, start in enumerate([sum(blocks[:i]) for i in range(len(blocks))]):
        block_tables[seq, : blocks[seq]] = perm[start : start + blocks[seq]]
    shape = (sum(blocks), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    caches = [torch.randn(shape, device=DEVICE, dtype=DTYPE) for _ in range(2)]
    query_start_loc = torch.zeros(len(q_lens) + 1, dtype=torch.int32, device=DEVICE)
    query_start_loc[1:] = torch.cumsum(torch.tensor(q_lens, device=DEVICE), 0)
    num_tokens = sum(q_lens)
    query = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    return query, *caches, block_tables, seq_lens_t, query_start_loc


def time_paged_attention(tk: Any) -> dict[str, float]:
    print("paged attention (bf16, 32 q heads / 8 kv heads, head_dim 128, block 16)")
    scale = HEAD_DIM**-0.5
    out = {}
    kv_bytes_per_token = 2 * NUM_KV_HEADS * HEAD_DIM * DTYPE.itemsize
    for batch in (32, 64):
        args = paged_inputs([640] * batch, [1] * batch)
        us = bench_us(functools.partial(tk.paged_attention, *args, scale))
        gbps = batch * 640 * kv_bytes_per_token / us / 1e3
        print(f"  decode batch {batch:>2} ctx 640: {us:8.1f} us  ({gbps:6.0f} GB/s of KV)")
        out[f"decode_b{batch}_ctx640_us"] = us
    args = paged_inputs([512] * 4, [512] * 4)
    us = bench_us(functools.partial(tk.paged_attention, *args, scale))
    flops = 4 * 4 * 512 * 512 * NUM_HEADS * HEAD_DIM / 2  # QK^T and PV, causal half
    print(f"  prefill 4 x 512:          {us:8.1f} us  ({flops / us / 1e6:6.1f} TFLOP/s)")
    out["prefill_4x512_us"] = us
    return out


def fused_op_calls(impl: Any, num_tokens: int) -> dict[str, Callable[[], Any]]:
    """op name -> a closure running it through `impl` on the tensors the model hands it."""
    qkv = torch.randn(num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=DEVICE)
    qkv = qkv.to(DTYPE)
    q, k, v = qkv.split([NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS], dim=1)
    slots = torch.randperm(num_tokens + 64, device=DEVICE)[:num_tokens]
    key_cache = torch.zeros(num_tokens + 64, 1, NUM_KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    value_cache = torch.zeros_like(key_cache)
    rope = RopeConfig(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        original_max_position_embeddings=8192,
    )
    positions = torch.randint(0, 8192, (num_tokens,), device=DEVICE)
    cos, sin = RotaryEmbedding(rope, HEAD_DIM, DEVICE)(positions, DTYPE)
    x = torch.randn(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE)
    residual = torch.randn(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE)
    weight = torch.ones(HIDDEN, device=DEVICE, dtype=DTYPE)
    gate_up = torch.randn(num_tokens, 2 * INTERMEDIATE, device=DEVICE, dtype=DTYPE)
    return {
        "rms_norm": lambda: impl.rms_norm(x, weight, 1e-5),
        "fused_add_rms_norm": lambda: impl.fused_add_rms_norm(x, residual, weight, 1e-5),
        "rotary_and_cache": lambda: impl.rotary_and_cache(
            q, k, v, cos, sin, key_cache, value_cache, slots
        ),
        "silu_and_mul": lambda: impl.silu_and_mul(gate_up),
    }


def time_fused_ops(tk: Any) -> dict[str, Any]:
    print(f"fused ops, us per call: eager | in a CUDA graph ({GRAPH_REPEATS} calls captured)")
    rows = []
    for num_tokens in (64, 4096):
        fused, unfused = fused_op_calls(tk, num_tokens), fused_op_calls(reference, num_tokens)
        for name in fused:
            row = {"op": name, "num_tokens": num_tokens}
            for impl, calls in (("triton", fused), ("reference", unfused)):
                row[f"{impl}_us"] = eager_us = bench_us(calls[name])
                capturable = impl == "triton" or name not in EAGER_ONLY_REFERENCES
                graph = graph_us(calls[name], GRAPH_REPEATS) / GRAPH_REPEATS if capturable else None
                row[f"{impl}_graph_us"] = graph
                row[f"{impl}_step_us"] = eager_us if graph is None else graph
            rows.append(row)
            ref_graph = row["reference_graph_us"]
            print(
                f"  {name:<22} T={num_tokens:<5} triton {row['triton_us']:7.1f} ref "
                f"{row['reference_us']:7.1f} | graph triton {row['triton_graph_us']:7.1f} ref "
                + (f"{ref_graph:7.1f}" if ref_graph is not None else "    n/a (not capturable)")
            )
    per_layer = {"fused_add_rms_norm": 2, "rotary_and_cache": 1, "silu_and_mul": 1}
    decode = [r for r in rows if r["num_tokens"] == 64 and r["op"] in per_layer]
    step_ms = {
        impl: NUM_LAYERS * sum(per_layer[r["op"]] * r[f"{impl}_step_us"] for r in decode) / 1e3
        for impl in ("triton", "reference")
    }
    print(
        f"  decode step (T=64, {NUM_LAYERS} layers, graph): norms + rotary and KV write + silu "
        f"{step_ms['reference']:.2f} ms reference (its rotary and KV write eager) -> "
        f"{step_ms['triton']:.2f} ms Triton"
    )
    return {"rows": rows, "decode_step_ms": step_ms}


def time_lora(pool: AdapterPool) -> dict[str, Any]:
    print(
        f"LoRA per layer: {NUM_LAYERS} layers x 4 projections, 8 adapters x rank 16 in pages, "
        "bf16, CUDA graphs of all layers; 'lora' = LoRA alone, 'step' = (GEMMs + LoRA) - GEMMs, "
        "in us"
    )
    print(f"  {'max_lora_rank':>13} {'T':>5} {'GEMMs':>8} {'lora':>8} {'step':>8}")
    table = {}
    weights = create_base_weights(DTYPE, DEVICE)
    for max_rank in MAX_LORA_RANKS:
        workspace = LoRAWorkspace(NUM_LAYERS, max_rank, DEVICE)
        for num_tokens in LORA_TOKENS:
            step = LoRAStep(pool, workspace, num_tokens, weights)
            if max_rank == MAX_LORA_RANKS[0] and num_tokens == 64 and not step.sanity_check():
                print("  FAIL  the LoRA step differs from the reference: not timing it")
                raise SystemExit(1)
            gemms = graph_us(functools.partial(step.run, lora=False, gemms=True)) / NUM_LAYERS
            lora = graph_us(functools.partial(step.run, lora=True, gemms=False)) / NUM_LAYERS
            both = graph_us(functools.partial(step.run, lora=True, gemms=True)) / NUM_LAYERS
            cell = {"base_gemms_us": gemms, "lora_us": lora, "step_us": both - gemms}
            table[f"max_lora_rank {max_rank} T {num_tokens}"] = cell
            print(
                f"  {max_rank:>13} {num_tokens:>5} {gemms:8.1f} {lora:8.1f} {cell['step_us']:8.1f}"
            )
    return table


MANY_RANKS = (8, 16, 32, 64)
MANY_COUNTS = (8, 32, 128)
MANY_TOKENS = (64, 256)
QKVO = ("q_proj", "k_proj", "v_proj", "o_proj")


def time_lora_many() -> dict[str, Any]:
    print(
        f"LoRA with many adapters: q/k/v/o, ranks {MANY_RANKS} in turn, max_lora_rank 64, "
        f"{NUM_LAYERS} layers, CUDA graphs; ms per step, weight GB/s = the active adapters' "
        "bytes / 'lora'"
    )
    print(f"  {'adapters':>8} {'T':>5} {'GEMMs':>8} {'lora':>8} {'step':>8} {'GB/s':>8}")
    largest = AdapterMix(max(MANY_COUNTS), MANY_RANKS, QKVO)
    pool = create_adapter_pool(DTYPE, DEVICE, largest)
    weights = create_base_weights(DTYPE, DEVICE)
    workspace = LoRAWorkspace(NUM_LAYERS, max(MANY_RANKS), DEVICE)
    table = {}
    for count in MANY_COUNTS:
        for num_tokens in MANY_TOKENS:
            mix = AdapterMix(min(count, num_tokens), MANY_RANKS, QKVO)
            step = LoRAStep(pool, workspace, num_tokens, weights, mix)
            if not step.sanity_check():
                print(f"  FAIL  {count} adapters, T {num_tokens}: differs from the reference")
                raise SystemExit(1)
            gemms = graph_us(functools.partial(step.run, lora=False, gemms=True)) / 1e3
            lora = graph_us(functools.partial(step.run, lora=True, gemms=False)) / 1e3
            both = graph_us(functools.partial(step.run, lora=True, gemms=True)) / 1e3
            gb_s = mix.weight_bytes(DTYPE) / lora / 1e6
            cell = {"base_gemms_ms": gemms, "lora_ms": lora, "step_ms": both - gemms,
                    "weight_gb_per_s": gb_s}  # fmt: skip
            table[f"adapters {mix.num_adapters} T {num_tokens}"] = cell
            print(
                f"  {mix.num_adapters:>8} {num_tokens:>5} {gemms:8.2f} {lora:8.2f} "
                f"{cell['step_ms']:8.2f} {gb_s:8.0f}"
            )
    return table


def main() -> int:
    if not torch.cuda.is_available():
        print("kernels_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    started = time.perf_counter()
    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    results: dict[str, Any] = {"env": env}
    if "--many-only" not in sys.argv:
        results["paged_attention"] = time_paged_attention(triton_kernels)
        results["fused_ops"] = time_fused_ops(triton_kernels)
        pool = create_adapter_pool(DTYPE, DEVICE)
        results["lora_us_per_layer"] = time_lora(pool)
    if "--many" in sys.argv or "--many-only" in sys.argv:
        results["lora_many_ms_per_step"] = time_lora_many()
    results["wall_s"] = time.perf_counter() - started
    print(f"done in {results['wall_s']:.1f} s")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "kernels.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
