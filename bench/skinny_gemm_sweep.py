"""Skinny bf16 GEMMs y = x @ w.T (decode-step linear layers): a Triton kernel against cuBLAS.

At the Llama-3-8B projection shapes (qkv, o, gate_up, down, lm_head) and a few token counts
M = 1..64, where the cost is reading the weight [N, K] once, it times cuBLAS
(`torch.nn.functional.linear`) and a sweep of a Triton kernel's candidates: tiles (BLOCK_M,
BLOCK_N, BLOCK_K), warps, pipeline stages, swap-AB (the weight tile as the dot's left operand, so
that BLOCK_N is the MMA's M dimension) and split-K, whose fp32 partials are summed either by a
small reduce kernel (deterministic, [SPLIT_K, M, N] partials) or by atomic adds into a zeroed fp32
buffer, then a cast.

    python3 bench/skinny_gemm_sweep.py [--ms 1,16,32,64] [--shapes qkv,o] [--full]
                                       [--json out.json] [--jobs 12]
    TRITON_INTERPRET=1 python3 bench/skinny_gemm_sweep.py --smoke   # CPU, correctness only

1. Ceiling: the copy bandwidth (a 2 GiB device-to-device copy, bytes read + written per second).
2. Per (shape, M): every candidate is first checked against an fp32 reference on the same inputs
   (failures are counted and skipped, so are configs that do not compile or fit in shared
   memory), then timed as a CUDA graph (the engine replays decode steps as graphs) of the whole
   call, zeroing and reduce kernel included. The time reported ("us") is per call of a graph
   that calls it back to back on 2..8 copies of the weight, >= 256 MB together (5x the 50 MB
   L2), so that each call reads its weight from HBM, as in a decode step: median of trials of
   back-to-back replays, CUDA events. "flushed" is one replay after do_bench's L2 flush (median
   of its runs): pessimistic, since the flush leaves L2 full of dirty lines that the timed call
   writes back, and the graph launch latency is counted. cuBLAS is timed both ways too. A short
   sweep picks the three fastest, timed again for longer (with the atomic twin of the best
   split-K candidate); the best of those is reported.
3. Per M: the four decoder projections summed, times 32 layers (one decode step's linear layers
   at batch M), cuBLAS against the best Triton candidate per shape.

Default grid: BLOCK_M the one tile covering M (16/16/32/64), BLOCK_N 32/64/128, BLOCK_K 128/256,
4/8 warps, 3/4 stages, swap-AB for BLOCK_N >= 64, SPLIT_K 1/2/4/8 (partials) where
K / SPLIT_K >= BLOCK_K and the CTAs stay within 4 per SM: about 2,000 timed candidates, 224
kernels. --full adds every smaller BLOCK_M, BLOCK_N 256, BLOCK_K 64, 5 stages, SPLIT_K 16 and the
atomic reduce (about 16,600 candidates: give it a few shapes or M at a time).
Compiles run first, in --jobs processes (into triton's disk cache). Self-contained: it imports
nothing from loraplex. The exit status is 1 when any candidate gave a wrong result.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if "--smoke" in sys.argv:  # before triton is imported: the interpreter runs kernels on the CPU
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.testing import do_bench  # noqa: E402

DTYPE = torch.bfloat16
LAYERS = 32
# Llama-3-8B (name, N, K): w is [N, K] (nn.Linear), x is [M, K].
SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}
DECODER_SHAPES = ("qkv", "o", "gate_up", "down")
ROW_COUNTS = (1, 16, 32, 64)
SMOKE_SHAPES = {"tiny": (96, 320), "tiny_even": (64, 256)}  # N % 64 != 0, K % 128 != 0
SMOKE_ROW_COUNTS = (1, 16, 20)
OUT_DIRECT, OUT_PARTIALS, OUT_ATOMIC = 0, 1, 2
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
ROTATE_BYTES = 256 * 2**20  # weight copies the timed graph cycles through: 5x the 50 MB L2
SWEEP_TRIALS, SWEEP_TRIAL_MS = 3, 1.0
FINAL_TRIALS, FINAL_TRIAL_MS, FINAL_REP_MS = 9, 5.0, 50
SMEM_BYTES = 232448  # H100/H200: 227 KiB of shared memory per block


@triton.jit(do_not_specialize=["M"])
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    stride_ys,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    EVEN_K: tl.constexpr,
    OUT_MODE: tl.constexpr,
    DOT_IN_FP32: tl.constexpr = False,
):
    """y[M, N] = x[M, K] @ w[N, K].T over one K range per program_id(1) (SPLIT_K of them).

    OUT_MODE 0: store y (its dtype); 1: store fp32 partials at y + pid_k * stride_ys; 2: atomic
    add into fp32 y. M-tiles of one N-tile are adjacent program ids (they read the same weight).
    DOT_IN_FP32 (--smoke only): tiles to fp32 before tl.dot, which the interpreter gets wrong on
    bf16 (triton 3.5).
    """
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    split_k = tl.num_programs(1)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    pid_n = pid // num_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rn = offs_n % N  # rows of w past N wrap to valid rows (their outputs are masked at the store)
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), split_k) * BLOCK_K
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    m_mask = offs_m[:, None] < M
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_lo + offs_k)[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + (k_lo + offs_k)[None, :]
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=m_mask, other=0.0)
            wt = tl.load(w_ptrs)
        else:
            k_mask = (k + offs_k)[None, :] < k_hi
            xt = tl.load(x_ptrs, mask=m_mask & k_mask, other=0.0)
            wt = tl.load(w_ptrs, mask=k_mask, other=0.0)
        if DOT_IN_FP32:
            xt = xt.to(tl.float32)
            wt = wt.to(tl.float32)
        # acc [BLOCK_N, BLOCK_M] with SWAP_AB, else [BLOCK_M, BLOCK_N]
        acc = tl.dot(wt, tl.trans(xt), acc) if SWAP_AB else tl.dot(xt, tl.trans(wt), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if SWAP_AB:
        y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
        y_mask = (offs_m[None, :] < M) & (offs_n[:, None] < N)
    else:
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        y_mask = m_mask & (offs_n[None, :] < N)
    if OUT_MODE == 2:
        tl.atomic_add(y_ptrs, acc, mask=y_mask, sem="relaxed")
    elif OUT_MODE == 1:
        tl.store(y_ptrs + pid_k * stride_ys, acc, mask=y_mask)
    else:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)


@triton.jit
def _splitk_reduce_kernel(p_ptr, y_ptr, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """y[i] = sum over s of p[s * numel + i], cast to y's dtype (SPLIT_K = 1: a cast)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(p_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024


@dataclass(frozen=True)
class Cand:
    """One Triton candidate. reduce: "none" (split_k 1), "partials" or "atomic"."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    reduce: str = "none"
    swap_ab: bool = False
    num_warps: int = 4
    num_stages: int = 3

    @property
    def out_mode(self) -> int:
        return {"none": OUT_DIRECT, "partials": OUT_PARTIALS, "atomic": OUT_ATOMIC}[self.reduce]

    def compile_key(self) -> tuple[int, int, int, bool, int, int, int]:
        """What a compile depends on (split_k is the grid's second axis, not a constexpr)."""
        return (
            self.block_m,
            self.block_n,
            self.block_k,
            self.swap_ab,
            self.out_mode,
            self.num_warps,
            self.num_stages,
        )

    def label(self) -> str:
        split = f" s{self.split_k} {self.reduce}" if self.split_k > 1 else ""
        swap = " swap" if self.swap_ab else ""
        return (
            f"bm{self.block_m} bn{self.block_n} bk{self.block_k}{split}{swap} "
            f"w{self.num_warps} st{self.num_stages}"
        )


class TritonGemm:
    """y = x @ w.T with one candidate, buffers allocated once, so that a call can be captured."""

    def __init__(self, cand: Cand, x: torch.Tensor, w: torch.Tensor) -> None:
        assert x.is_contiguous() and w.is_contiguous() and x.shape[1] == w.shape[1]
        self.cand, self.x, self.w = cand, x, w
        self.m, self.k = x.shape
        self.n = w.shape[0]
        self.y = torch.empty(self.m, self.n, dtype=x.dtype, device=x.device)
        c = cand
        if c.reduce == "partials":
            self.buf = torch.empty(c.split_k, self.m, self.n, dtype=torch.float32, device=x.device)
        elif c.reduce == "atomic":
            self.buf = torch.empty(self.m, self.n, dtype=torch.float32, device=x.device)
        else:
            self.buf = self.y
        tiles = triton.cdiv(self.m, c.block_m) * triton.cdiv(self.n, c.block_n)
        self.grid = (tiles, c.split_k)
        self.reduce_grid = (triton.cdiv(self.m * self.n, REDUCE_BLOCK),)

    def poison(self) -> None:
        """NaN in every output buffer, so that an element nobody writes fails the check."""
        self.y.fill_(math.nan)
        self.buf.fill_(math.nan)

    def __call__(self) -> torch.Tensor:
        c = self.cand
        if c.reduce == "atomic":
            self.buf.zero_()
        _skinny_gemm_kernel[self.grid](
            self.x,
            self.w,
            self.buf,
            self.m,
            self.n,
            self.k,
            self.x.stride(0),
            self.w.stride(0),
            self.n,
            self.m * self.n if c.reduce == "partials" else 0,
            BLOCK_M=c.block_m,
            BLOCK_N=c.block_n,
            BLOCK_K=c.block_k,
            SWAP_AB=c.swap_ab,
            EVEN_K=self.k % c.block_k == 0,
            OUT_MODE=c.out_mode,
            DOT_IN_FP32=INTERPRET,
            num_warps=c.num_warps,
            num_stages=c.num_stages,
        )
        if c.reduce != "none":
            _splitk_reduce_kernel[self.reduce_grid](
                self.buf,
                self.y,
                self.m * self.n,
                SPLIT_K=c.split_k if c.reduce == "partials" else 1,
                BLOCK=REDUCE_BLOCK,
                num_warps=4,
            )
        return self.y


def block_m_for(m: int) -> int:
    """The one M-tile that covers M rows (tl.dot needs at least 16), at most 64."""
    return min(64, max(16, triton.next_power_of_2(m)))


def candidates(m: int, n: int, k: int, full: bool, sms: int) -> list[Cand]:
    """The sweep for one (M, N, K): split-K only where the N x M tiles fill few waves."""
    bm_max = block_m_for(m)
    block_ms = [b for b in (16, 32, 64) if b <= bm_max] if full else [bm_max]
    block_ns = (32, 64, 128, 256) if full else (32, 64, 128)
    block_ks = (64, 128, 256) if full else (128, 256)
    warps = (4, 8)
    stages = (3, 4, 5) if full else (3, 4)
    splits = (1, 2, 4, 8, 16) if full else (1, 2, 4, 8)
    reduces = ("partials", "atomic") if full else ("partials",)
    max_ctas = 4 * sms
    out = []
    for bm, bn, bk, swap, nw, ns in itertools.product(
        block_ms, block_ns, block_ks, (False, True), warps, stages
    ):
        if swap and bn < 64 and not full:  # swap-AB is for wgmma's 64-row minimum
            continue
        if (bm + bn) * bk * DTYPE.itemsize * (ns - 1) > SMEM_BYTES:
            continue  # cannot fit; near the limit the compile decides
        tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
        for s in splits:
            if s == 1:
                out.append(Cand(bm, bn, bk, 1, "none", swap, nw, ns))
                continue
            if k // s < bk or tiles * s > max_ctas:
                continue
            out.extend(Cand(bm, bn, bk, s, r, swap, nw, ns) for r in reduces)
    return out


def _compile_one(key: tuple[int, int, int, bool, int, int, int]) -> str | None:
    """Compile one candidate's kernel into triton's cache (in a worker process); the error, if
    it fails. The arguments' specialization (16-divisible ints, aligned pointers) matches the
    real shapes'."""
    bm, bn, bk, swap, out_mode, nw, ns = key
    t = torch.empty(64, dtype=DTYPE, device="cuda")
    y = torch.empty(64, dtype=DTYPE if out_mode == OUT_DIRECT else torch.float32, device="cuda")
    try:
        _skinny_gemm_kernel.warmup(
            t,
            t,
            y,
            64,
            4096,
            4096,
            4096,
            4096,
            4096,
            64 * 4096 if out_mode == OUT_PARTIALS else 0,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            SWAP_AB=swap,
            EVEN_K=True,
            OUT_MODE=out_mode,
            num_warps=nw,
            num_stages=ns,
            grid=(1,),
        )
    except Exception as e:  # any compile failure only skips the candidate
        return f"{type(e).__name__}: {e}"[:200]
    return None


def precompile(cands: Iterable[Cand], jobs: int) -> float:
    """Compile every distinct kernel in parallel processes; seconds spent."""
    started = time.perf_counter()
    keys = sorted({c.compile_key() for c in cands})
    if jobs > 1 and keys:
        ctx = torch.multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(keys)), mp_context=ctx) as pool:
            errors = [e for e in pool.map(_compile_one, keys) if e]
        print(
            f"precompiled {len(keys)} kernels in {jobs} processes "
            f"({len(errors)} failed) in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
    return time.perf_counter() - started


_capture_stream: torch.cuda.Stream | None = None


def capture(fns: Sequence[Callable[[], Any]]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of the calls, each run once first (compiles, warm-up). By hand, not with
    torch.cuda.graph, whose gc.collect() per capture would dominate a sweep."""
    global _capture_stream
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    if _capture_stream is None:
        _capture_stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    _capture_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_capture_stream):
        graph.capture_begin()
        try:
            for fn in fns:
                fn()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(_capture_stream)
    torch.cuda.synchronize()
    return graph


def rotating_us(fns: Sequence[Callable[[], Any]], trials: int, trial_ms: float) -> float:
    """Microseconds per call of a graph of the calls back to back, each on its own copy of the
    weight (together >= ROTATE_BYTES, so no weight is still in L2 when its call comes): median
    over `trials` of back-to-back replays for about trial_ms each, timed by CUDA events. Like a
    decode step: what L2 holds is other weights' clean lines, and x, which stays there."""
    graph = capture(fns)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    replays = max(2, round(trial_ms / start.elapsed_time(end)))
    per_call = []
    for _ in range(trials):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) * 1e3 / (replays * len(fns)))
    del graph
    return statistics.median(per_call)


def flushed_us(fn: Callable[[], Any], rep_ms: int) -> float:
    """Median microseconds of one replay of a CUDA graph of fn over do_bench's runs, each after
    do_bench's L2 flush (zeroing 256 MB: the L2 is then full of dirty lines, which the timed
    call writes back, and the graph launch's latency is in the time too: a pessimistic bound)."""
    graph = capture([fn])
    ms = do_bench(graph.replay, warmup=2, rep=rep_ms, return_mode="median")
    del graph
    return float(ms) * 1e3


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 output of an fp32-accumulated product: 2% of the output's RMS, and 2% relative."""
    scale = float(ref.pow(2).mean().sqrt())
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * scale)


def copy_tbps() -> float:
    src = torch.empty(2**30, dtype=torch.int16, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    us = float(do_bench(lambda: dst.copy_(src), warmup=5, rep=100, return_mode="median")) * 1e3
    return 2 * src.numel() * src.element_size() / us / 1e6


def run_case(
    name: str, n: int, k: int, m: int, weights: list[torch.Tensor], full: bool, sms: int
) -> dict[str, Any]:
    """One (shape, M). weights: copies of one weight, together >= ROTATE_BYTES."""
    w = weights[0]
    x = torch.randn(m, k, dtype=DTYPE, device="cuda")
    ref = x.float() @ w.float().T
    weight_bytes = n * k * DTYPE.itemsize
    cublas_out = F.linear(x, w)
    check(cublas_out, ref)
    cublas_err = float((cublas_out.float() - ref).abs().max())
    cublas_calls = [functools.partial(F.linear, x, wi) for wi in weights]
    cublas_us = rotating_us(cublas_calls, FINAL_TRIALS, FINAL_TRIAL_MS)
    cublas_flushed = flushed_us(cublas_calls[0], FINAL_REP_MS)
    failed, skipped, bad_compiles = [], 0, set()
    timed: list[tuple[float, Cand]] = []
    for cand in candidates(m, n, k, full, sms):
        if cand.compile_key() in bad_compiles:
            skipped += 1
            continue
        try:
            gemms = [TritonGemm(cand, x, wi) for wi in weights]
            gemms[0].poison()
            out = gemms[0]()
            torch.cuda.synchronize()
        except Exception:  # compile errors, out of shared memory / registers
            bad_compiles.add(cand.compile_key())
            skipped += 1
            continue
        try:
            check(out, ref)
        except AssertionError as e:
            failed.append({"config": cand.label(), "error": str(e).splitlines()[0:3]})
            continue
        timed.append((rotating_us(gemms, SWEEP_TRIALS, SWEEP_TRIAL_MS), cand))
        del gemms
    timed.sort(key=lambda t: t[0])
    finalists = [c for _, c in timed[:3]]
    split = next((c for _, c in timed if c.reduce == "partials"), None)
    if split is not None:
        finalists.append(replace(split, reduce="atomic"))
    final: list[tuple[float, float, Cand]] = []
    for cand in dict.fromkeys(finalists):
        gemms = [TritonGemm(cand, x, wi) for wi in weights]
        try:
            gemms[0].poison()
            check(gemms[0](), ref)
        except Exception:  # the atomic twin may fail to compile
            continue
        us = rotating_us(gemms, FINAL_TRIALS, FINAL_TRIAL_MS)
        final.append((us, flushed_us(gemms[0], FINAL_REP_MS), cand))
    row: dict[str, Any] = {
        "shape": name,
        "n": n,
        "k": k,
        "m": m,
        "weight_copies": len(weights),
        "cublas_us": cublas_us,
        "cublas_tbps": weight_bytes / cublas_us / 1e6,
        "cublas_flushed_us": cublas_flushed,
        "cublas_max_abs_err": cublas_err,
        "ok": len(timed),
        "failed": len(failed),
        "skipped": skipped,
        "failures": failed[:5],
        "sweep": [{"config": asdict(c), "us": us} for us, c in timed],
        "final": [{"config": asdict(c), "us": us, "flushed_us": f} for us, f, c in final],
    }
    line = (
        f"{name:8s} M={m:<3d}: cuBLAS {cublas_us:6.1f} us {row['cublas_tbps']:.2f} TB/s"
        f" (flushed {cublas_flushed:5.1f})"
    )
    if final:
        best_us, best_flushed, best = min(final, key=lambda t: t[0])
        row.update(
            best_us=best_us,
            best_tbps=weight_bytes / best_us / 1e6,
            best_flushed_us=best_flushed,
            best_config=asdict(best),
            best_label=best.label(),
            cublas_over_best=cublas_us / best_us,
        )
        line += (
            f" | Triton {best_us:6.1f} us {row['best_tbps']:.2f} TB/s (flushed {best_flushed:5.1f})"
            f" {best.label():40s} | cuBLAS/Triton {row['cublas_over_best']:.2f}x"
        )
    else:
        line += " | no Triton candidate passed"
    print(line + f" | {len(timed)} ok, {len(failed)} failed, {skipped} skipped", flush=True)
    return row


def summarize(rows: list[dict[str, Any]], ms: list[int]) -> list[dict[str, Any]]:
    out = []
    for m in ms:
        by_shape = {r["shape"]: r for r in rows if r["m"] == m}
        if not all(s in by_shape and "best_us" in by_shape[s] for s in DECODER_SHAPES):
            continue
        cublas = sum(by_shape[s]["cublas_us"] for s in DECODER_SHAPES) * LAYERS / 1e3
        best = sum(by_shape[s]["best_us"] for s in DECODER_SHAPES) * LAYERS / 1e3
        either = (
            sum(min(by_shape[s]["cublas_us"], by_shape[s]["best_us"]) for s in DECODER_SHAPES)
            * LAYERS
            / 1e3
        )
        cublas_f = sum(by_shape[s]["cublas_flushed_us"] for s in DECODER_SHAPES) * LAYERS / 1e3
        best_f = sum(by_shape[s]["best_flushed_us"] for s in DECODER_SHAPES) * LAYERS / 1e3
        print(
            f"== M={m}: qkv+o+gate_up+down x {LAYERS} layers: cuBLAS {cublas:.3f} ms, "
            f"Triton best per shape {best:.3f} ms (cuBLAS/Triton {cublas / best:.2f}x), "
            f"faster of the two per shape {either:.3f} ms (flushed: cuBLAS {cublas_f:.3f} ms, "
            f"Triton {best_f:.3f} ms)"
        )
        out.append(
            {
                "m": m,
                "cublas_ms": cublas,
                "triton_ms": best,
                "either_ms": either,
                "cublas_flushed_ms": cublas_f,
                "triton_flushed_ms": best_f,
            }
        )
    return out


def smoke() -> int:
    """Correctness of a few candidates on the CPU under the Triton interpreter."""
    if not INTERPRET:
        print("--smoke needs TRITON_INTERPRET=1 before triton is imported", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    ok = failed = 0
    for name, (n, k) in SMOKE_SHAPES.items():
        w = torch.randn(n, k, dtype=DTYPE) * 0.02
        for m in SMOKE_ROW_COUNTS:
            x = torch.randn(m, k, dtype=DTYPE)
            ref = x.float() @ w.float().T
            bm = block_m_for(m)
            cands = [
                Cand(bm, 64, 64),
                Cand(bm, 32, 128, 2, "partials", swap_ab=True),
                Cand(bm, 64, 64, 3, "atomic"),
            ]
            for cand in cands:
                gemm = TritonGemm(cand, x, w)
                gemm.poison()
                try:
                    check(gemm(), ref)
                    ok += 1
                except AssertionError as e:
                    failed += 1
                    print(f"FAIL {name} M={m} {cand.label()}: {str(e).splitlines()[:3]}")
    print(f"smoke: {ok} ok, {failed} failed")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ms", default=",".join(map(str, ROW_COUNTS)), help="token counts M")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {','.join(SHAPES)}")
    ap.add_argument("--full", action="store_true", help="the larger candidate grid")
    ap.add_argument("--json", type=Path, help="write every timing here")
    ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1), help="compilers")
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, correctness only")
    args = ap.parse_args()
    if args.smoke:
        return smoke()
    if not torch.cuda.is_available():
        print("skinny_gemm_sweep needs a CUDA GPU (or --smoke)", file=sys.stderr)
        return 2
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [s.strip() for s in args.shapes.split(",")]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    torch.manual_seed(0)
    started = time.perf_counter()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    env = {
        "gpu": torch.cuda.get_device_name(),
        "sms": sms,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "grid": "full" if args.full else "default",
    }
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    copy = copy_tbps()
    torch.cuda.empty_cache()  # the copy's 4 GiB
    print(f"copy bandwidth {copy:.2f} TB/s (2 GiB device-to-device, read + write)", flush=True)
    all_cands = [c for s in shapes for m in ms for c in candidates(m, *SHAPES[s], args.full, sms)]
    print(f"{len(all_cands)} candidates over {len(shapes)} shapes x {len(ms)} M", flush=True)
    compile_s = precompile(all_cands, args.jobs)
    rows = []
    for name in shapes:
        n, k = SHAPES[name]
        w = torch.randn(n, k, dtype=DTYPE, device="cuda").mul_(0.02)
        copies = max(2, math.ceil(ROTATE_BYTES / w.nbytes))
        weights = [w] + [w.clone() for _ in range(copies - 1)]
        for m in ms:
            rows.append(run_case(name, n, k, m, weights, args.full, sms))
        del w, weights
        torch.cuda.empty_cache()
    failed = sum(r["failed"] for r in rows)
    skipped = sum(r["skipped"] for r in rows)
    print(f"correctness: {failed} candidate runs failed, {skipped} skipped (compile/resources)")
    summary = summarize(rows, ms)
    wall_s = time.perf_counter() - started
    print(f"done in {wall_s:.1f} s (compiles {compile_s:.1f} s)")
    if args.json:
        results = {
            "env": env,
            "copy_tbps": copy,
            "cases": rows,
            "summary": summary,
            "failed": failed,
            "skipped": skipped,
            "compile_s": compile_s,
            "wall_s": wall_s,
        }
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
