"""The planar W4A16 K loop with TMA loads (tensor descriptors), with and without Triton's
automatic warp specialization, beside the patched engine's kernel, at 64 rows (Llama-3-8B
projections, AWQ group 128). On Hopper, Triton 3.9 warp-specializes this loop only when every
load in it is a TMA load ("unsupported load type for producer commit" otherwise).

SCALES_3D reads the eight runs' scales (and zeros) of a step in one TMA load each, viewing
[G, N] as [8 planes, groups per plane, N], instead of one small load per run: 2 loads a step
instead of 16 (K/8 must be a multiple of the group size, the group size of BLOCK_P).

Run on the GPU with the patched wheel installed: python3 w4_tma_ws.py [rows]
On the CPU: TRITON_INTERPRET=1 python3 w4_tma_ws.py --cpu-check (float16, small shapes)
"""

from __future__ import annotations

import functools
import itertools
import sys

sys.path.insert(0, "bench")
sys.path.insert(0, "bench/results/cpu-041cd2b-w4a16-planar")
import torch
import triton
import triton.language as tl
from kernel_timing import graph_us
from w4_planar import LLAMA3_8B_SHAPES, close, make_layer

from loraplex.kernels.triton.w4a16 import launch_w4a16_gemm, w4a16_tiles


@triton.jit
def _columns8(t):  # type: ignore[no-untyped-def]
    """[R, 8] -> the 8 columns, each [R] (three halvings of the last dimension)."""
    t = tl.reshape(t, (t.shape[0], 2, 2, 2))  # column j = 4a + 2b + c at [:, a, b, c]
    c0, c1 = tl.split(t)  # [R, 2(a), 2(b)]
    c0b0, c0b1 = tl.split(c0)  # [R, 2(a)]
    c1b0, c1b1 = tl.split(c1)
    j0, j4 = tl.split(c0b0)
    j1, j5 = tl.split(c1b0)
    j2, j6 = tl.split(c0b1)
    j3, j7 = tl.split(c1b1)
    return j0, j1, j2, j3, j4, j5, j6, j7


@triton.jit
def _tma_kernel(  # type: ignore[no-untyped-def]
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, partial_ptr, M, N, K8, p_per_split, stride_xm,
    GROUP_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr, WS: tl.constexpr, STAGES: tl.constexpr, SCALES_3D: tl.constexpr,
):  # fmt: skip
    n0 = tl.program_id(0) * BLOCK_N
    m0 = tl.program_id(1) * BLOCK_M
    p_begin = tl.program_id(2) * p_per_split
    p_end = tl.minimum(p_begin + p_per_split, K8)
    num_groups = K8 * 8 // GROUP_SIZE
    desc_q = tl.make_tensor_descriptor(qweight_ptr, [K8, N], [N, 1], [BLOCK_P, BLOCK_N])
    desc_x = tl.make_tensor_descriptor(x_ptr, [M, K8 * 8], [stride_xm, 1], [BLOCK_M, BLOCK_P])
    if SCALES_3D:  # groups of whole runs within a plane: [8 planes, groups per plane, N]
        gpp = K8 // GROUP_SIZE
        desc_s = tl.make_tensor_descriptor(
            scales_ptr, [8, gpp, N], [gpp * N, N, 1], [8, 1, BLOCK_N]
        )
        desc_z = tl.make_tensor_descriptor(zeros_ptr, [8, gpp, N], [gpp * N, N, 1], [8, 1, BLOCK_N])
    else:
        desc_s = tl.make_tensor_descriptor(scales_ptr, [num_groups, N], [N, 1], [1, BLOCK_N])
        desc_z = tl.make_tensor_descriptor(zeros_ptr, [num_groups, N], [N, 1], [1, BLOCK_N])
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # out^T
    for p0 in tl.range(p_begin, p_end, BLOCK_P, num_stages=STAGES, warp_specialize=WS):
        packed = tl.trans(desc_q.load([p0, n0]))  # [BLOCK_N, BLOCK_P]
        if SCALES_3D:  # one load each for the 8 runs: the rows of their groups
            scales8 = _columns8(
                tl.trans(tl.reshape(desc_s.load([0, p0 // GROUP_SIZE, n0]), (8, BLOCK_N)))
            )
            zeros8 = _columns8(
                tl.trans(tl.reshape(desc_z.load([0, p0 // GROUP_SIZE, n0]), (8, BLOCK_N)))
            )
        for j in tl.static_range(8):
            if SCALES_3D:
                scale = tl.reshape(scales8[j], (BLOCK_N, 1)).to(tl.float32)
                zero = tl.reshape(zeros8[j], (BLOCK_N, 1)).to(tl.float32)
            else:
                g = (j * K8 + p0) // GROUP_SIZE
                scale = tl.reshape(desc_s.load([g, n0]), (BLOCK_N, 1)).to(tl.float32)
                zero = tl.reshape(desc_z.load([g, n0]), (BLOCK_N, 1)).to(tl.float32)
            q = (((packed >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)
            w = ((q - (zero + 8388608.0)) * scale).to(x_ptr.dtype.element_ty)
            x = desc_x.load([m0, j * K8 + p0])  # [BLOCK_M, BLOCK_P]
            acc = tl.dot(w, tl.trans(x), acc)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs = (tl.program_id(2) * M + offs_m[None, :]).to(tl.int64) * N + offs_n[:, None]
    tl.store(partial_ptr + offs, acc, mask=(offs_n[:, None] < N) & (offs_m[None, :] < M))


def tma_gemm(x, qw, s, z, gs, bn, bp, split, ws, stages, warps, partial, s3d=False):  # type: ignore[no-untyped-def]
    m, k = x.shape
    n = qw.shape[1]
    k8 = k // 8
    assert k8 % gs == 0 and gs % bp == 0, "runs of bp rows in one group, whole groups per plane"
    p_per_split = triton.cdiv(triton.cdiv(k8, split), bp) * bp
    target = partial[: split * m * n]
    grid = (triton.cdiv(n, bn), triton.cdiv(m, 64 if m > 16 else 16), split)
    _tma_kernel[grid](
        x, qw, s, z, target, m, n, k8, p_per_split, x.stride(0), GROUP_SIZE=gs,
        BLOCK_M=64 if m > 16 else 16, BLOCK_N=bn, BLOCK_P=bp, WS=ws, STAGES=stages, SCALES_3D=s3d,
        num_warps=warps,
    )  # fmt: skip
    return target.view(split, m, n).sum(0).to(x.dtype)


def cpu_check() -> None:
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8))
    torch.manual_seed(0)
    cases = ((3, 1, False, False), (16, 2, False, False), (3, 2, True, False), (3, 1, False, True))
    for m, split, ws, s3d in (*cases, (16, 2, True, True)):
        x, _, planar, s, z, _, ref = make_layer(m, 512, 64, 16, "cpu", torch.float16)
        partial = torch.empty(split * m * 64, dtype=torch.float32)
        y = tma_gemm(x, planar, s, z, 16, 64, 16, split, ws, 2, 4, partial, s3d)
        print(f"m={m} split={split} ws={ws} s3d={s3d}: {'ok' if close(y, ref) else 'WRONG'}")


def main() -> None:
    if sys.argv[1:] == ["--cpu-check"]:
        cpu_check()
        return
    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )
    m = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    gs = 128
    shapes = LLAMA3_8B_SHAPES
    partial = torch.empty(16 * 64 * 28672, device="cuda", dtype=torch.float32)
    torch.manual_seed(0)
    totals: dict[str, float] = {}
    for name, (k, n) in shapes.items():
        x, _, planar, s, z, w, ref = make_layer(m, k, n, gs, "cuda")
        bf16 = graph_us(functools.partial(torch.matmul, x, w))
        engine = functools.partial(launch_w4a16_gemm, x, planar, s, z, None, gs, w4a16_tiles(m, n))
        assert close(engine(), ref), name
        row = {"bf16": bf16, "engine": graph_us(engine)}
        for ws, s3d in itertools.product((True, False), (True, False)):  # the likeliest first
            for bn, bp, stages, warps, split in (
                (64, 32, 2, 4, 4),
                (64, 32, 3, 4, 4),
                (128, 32, 2, 4, 4),
                (64, 64, 2, 4, 2),
                (64, 32, 2, 4, 2),
                (64, 32, 2, 4, 8),
            ):
                key = f"tma ws={ws} s3d={s3d} bn={bn} bp={bp} st={stages} split={split}"
                fn = functools.partial(
                    tma_gemm, x, planar, s, z, gs, bn, bp, split, ws, stages, warps, partial, s3d
                )
                try:
                    ok = close(fn(), ref)
                    us = graph_us(fn)
                except Exception as e:  # noqa: BLE001 - a config Triton cannot build: report, go on
                    print(f"  {name} {key}: {type(e).__name__} {str(e)[:80]}", flush=True)
                    continue
                row[key] = us if ok else float("nan")
        for key, us in row.items():
            totals[key] = totals.get(key, 0.0) + us
        print(name, " ".join(f"{k}={v:.1f}" for k, v in row.items()), flush=True)
    print(f"M={m} us/layer, one config for all four projections (nan: a wrong result)")
    for key, us in sorted(totals.items(), key=lambda kv: kv[1]):
        print(f"  {us:8.1f}  {key}")


if __name__ == "__main__":
    main()
