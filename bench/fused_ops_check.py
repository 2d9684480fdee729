"""GPU check of the fused decoder ops: correctness vs the reference, CUDA graphs, timings.

Run on a CUDA machine with `loraplex` importable (bench/h200_run.sh sets PYTHONPATH):

    python3 bench/fused_ops_check.py

Llama-3-8B shapes in bf16 (hidden 4096, intermediate 14336, 32 query / 8 kv heads, head_dim
128, llama3 RoPE), at T = 64 (a decode batch) and T = 4096 (a prefill chunk):

1. Correctness: Triton rms_norm, fused_add_rms_norm, apply_rotary_pos_emb, silu_and_mul vs the
   plain-PyTorch reference (the unfused ops the model ran before); max abs error, PASS/FAIL,
   and whether the outputs are bit-identical (the kernels keep the reference's rounding points).
2. CUDA graphs: each Triton op captured once, replayed on new input data, vs the reference.
3. Timings (triton.testing.do_bench), Triton vs reference: eager (one launch per call, as in
   prefill) and in a CUDA graph (20 calls captured back to back, per-call time; what a decode
   step replays), plus the per-decode-step total over 32 layers (2 fused_add_rms_norm, 1 rotary,
   1 silu_and_mul per layer).

Prints everything; writes $OUT/fused_ops.json when OUT is set. Exits 1 if any check fails.
Takes well under a minute on an H100/H200.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from loraplex.engine.model.hf_config import RopeConfig
from loraplex.engine.model.rotary import RotaryEmbedding
from loraplex.kernels.reference import fused_ops as reference

# Llama-3-8B
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
NUM_LAYERS = 32
EPS = 1e-5
ROPE = RopeConfig(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
TOKEN_COUNTS = (64, 4096)
DTYPE = torch.bfloat16
ATOL = 2e-2  # bf16 outputs of O(1)
RTOL = 2e-2
GRAPH_REPEATS = 20
DEVICE = torch.device("cuda")

results: dict[str, Any] = {
    "correctness": [],
    "cuda_graphs": [],
    "timings": [],
    "decode_step_estimate": {},
}


def report(section: str, name: str, actual: torch.Tensor, expected: torch.Tensor) -> bool:
    err = (actual.float() - expected.float()).abs()
    max_err = float(err.nan_to_num(float("inf")).max()) if err.numel() else 0.0
    ok = actual.shape == expected.shape and bool(
        torch.allclose(actual.float(), expected.float(), atol=ATOL, rtol=RTOL)
    )
    exact = bool(torch.equal(actual, expected))
    print(
        f"  {'PASS' if ok else 'FAIL'}  {name:<52} max abs err {max_err:.3e}"
        f"{'  (bit-identical)' if exact else ''}"
    )
    results[section].append(
        {"name": name, "max_abs_err": max_err, "pass": ok, "bit_identical": exact}
    )
    return ok


# --- inputs -------------------------------------------------------------------------------------


def make_inputs(num_tokens: int) -> dict[str, torch.Tensor]:
    """The tensors each op sees in the model; q/k are strided views of a fused qkv output."""
    qkv = torch.randn(
        num_tokens, NUM_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=DEVICE, dtype=DTYPE
    )
    positions = torch.randint(0, 8192, (num_tokens,), device=DEVICE)
    cos, sin = RotaryEmbedding(ROPE, HEAD_DIM, DEVICE)(positions, DTYPE)
    return {
        "x": torch.randn(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE),
        "residual": 4 * torch.randn(num_tokens, HIDDEN, device=DEVICE, dtype=DTYPE),
        "weight": (1 + 0.1 * torch.randn(HIDDEN, device=DEVICE)).to(DTYPE),
        "q": qkv[:, :NUM_HEADS],
        "k": qkv[:, NUM_HEADS : NUM_HEADS + NUM_KV_HEADS],
        "cos": cos,
        "sin": sin,
        "gate_up": torch.randn(num_tokens, 2 * INTERMEDIATE, device=DEVICE, dtype=DTYPE),
    }


def op_calls(impl: Any, t: dict[str, torch.Tensor]) -> dict[str, Callable[[], Any]]:
    """op name -> a closure running it through `impl` (the Triton modules or the reference)."""
    return {
        "rms_norm": lambda: impl.rms_norm(t["x"], t["weight"], EPS),
        "fused_add_rms_norm": lambda: impl.fused_add_rms_norm(
            t["x"], t["residual"], t["weight"], EPS
        ),
        "apply_rotary_pos_emb": lambda: impl.apply_rotary_pos_emb(
            t["q"], t["k"], t["cos"], t["sin"]
        ),
        "silu_and_mul": lambda: impl.silu_and_mul(t["gate_up"]),
    }


def as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


# --- 1. correctness, 2. CUDA graphs -------------------------------------------------------------


def check_correctness(triton_ops: Any) -> bool:
    print("correctness vs reference (bf16, Llama-3-8B shapes)")
    ok = True
    for num_tokens in TOKEN_COUNTS:
        t = make_inputs(num_tokens)
        before = {name: v.clone() for name, v in t.items()}
        expected = op_calls(reference, t)
        for name, call in op_calls(triton_ops, t).items():
            for i, (a, e) in enumerate(
                zip(as_tuple(call()), as_tuple(expected[name]()), strict=True)
            ):
                ok &= report("correctness", f"{name} T={num_tokens} output {i}", a, e)
        unchanged = all(torch.equal(t[n], before[n]) for n in t)
        print(
            f"  {'PASS' if unchanged else 'FAIL'}  inputs unchanged (out of place) T={num_tokens}"
        )
        results["correctness"].append(
            {"name": f"inputs unchanged T={num_tokens}", "pass": unchanged}
        )
        ok &= unchanged
    return ok


def capture(fn: Callable[[], Any], repeats: int = 1) -> tuple[torch.cuda.CUDAGraph, Any]:
    out = fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            out = fn()
    return graph, out


def check_cuda_graphs(triton_ops: Any) -> bool:
    print("CUDA graph capture + replay on new input data (same shapes)")
    ok = True
    t = make_inputs(64)
    for name, call in op_calls(triton_ops, t).items():
        graph, out = capture(call)
        fresh = make_inputs(64)
        for key in t:
            t[key].copy_(fresh[key])
        graph.replay()
        expected = op_calls(reference, t)[name]()
        for i, (a, e) in enumerate(zip(as_tuple(out), as_tuple(expected), strict=True)):
            ok &= report("cuda_graphs", f"{name} T=64 output {i}", a, e)
    return ok


# --- 3. timings ---------------------------------------------------------------------------------


def bench_us(fn: Callable[[], Any]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=40)) * 1e3


def graph_us(fn: Callable[[], Any]) -> float:
    graph, _ = capture(fn, GRAPH_REPEATS)
    return bench_us(graph.replay) / GRAPH_REPEATS


def time_ops(triton_ops: Any) -> None:
    print(
        "timings, us per call: eager (do_bench) | in a CUDA graph (per call of "
        f"{GRAPH_REPEATS} captured)"
    )
    for num_tokens in TOKEN_COUNTS:
        t = make_inputs(num_tokens)
        fused, unfused = op_calls(triton_ops, t), op_calls(reference, t)
        for name in fused:
            row = {
                "op": name,
                "num_tokens": num_tokens,
                "triton_us": bench_us(fused[name]),
                "reference_us": bench_us(unfused[name]),
                "triton_graph_us": graph_us(fused[name]),
                "reference_graph_us": graph_us(unfused[name]),
            }
            row["speedup"] = row["reference_us"] / row["triton_us"]
            row["graph_speedup"] = row["reference_graph_us"] / row["triton_graph_us"]
            results["timings"].append(row)
            print(
                f"  {name:<22} T={num_tokens:<5} triton {row['triton_us']:7.1f} "
                f"ref {row['reference_us']:7.1f} ({row['speedup']:4.1f}x) | graph triton "
                f"{row['triton_graph_us']:7.1f} ref {row['reference_graph_us']:7.1f} "
                f"({row['graph_speedup']:4.1f}x)"
            )
    per_layer = {"fused_add_rms_norm": 2, "apply_rotary_pos_emb": 1, "silu_and_mul": 1}
    decode = [r for r in results["timings"] if r["num_tokens"] == 64 and r["op"] in per_layer]
    est = {
        f"{impl}_ms": NUM_LAYERS
        * sum(per_layer[r["op"]] * r[f"{impl}_graph_us"] for r in decode)
        / 1e3
        for impl in ("triton", "reference")
    }
    results["decode_step_estimate"] = {"num_tokens": 64, "num_layers": NUM_LAYERS, **est}
    print(
        f"  decode step (T=64, {NUM_LAYERS} layers, graph): norms+adds+rotary+silu "
        f"{est['reference_ms']:.2f} ms reference -> {est['triton_ms']:.2f} ms fused"
    )


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA device")
        return 1
    from loraplex.kernels.triton.rms_norm import fused_add_rms_norm, rms_norm
    from loraplex.kernels.triton.rotary import apply_rotary_pos_emb
    from loraplex.kernels.triton.silu_and_mul import silu_and_mul

    triton_ops = SimpleNamespace(
        rms_norm=rms_norm,
        fused_add_rms_norm=fused_add_rms_norm,
        apply_rotary_pos_emb=apply_rotary_pos_emb,
        silu_and_mul=silu_and_mul,
    )
    torch.manual_seed(0)
    start = time.perf_counter()
    results["device"] = torch.cuda.get_device_name()
    ok = check_correctness(triton_ops)
    ok &= check_cuda_graphs(triton_ops)
    time_ops(triton_ops)
    results["pass"] = bool(ok)
    results["seconds"] = time.perf_counter() - start
    print(f"{'ALL PASS' if ok else 'SOME CHECKS FAILED'} in {results['seconds']:.1f} s")
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "fused_ops.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
