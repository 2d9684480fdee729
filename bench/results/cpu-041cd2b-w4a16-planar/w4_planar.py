"""W4A16 GEMM with a "planar" packing of the 4-bit weight, against the shipped K-loop kernel,
bf16 cuBLAS and the packed weight's read time (a Llama-3-8B layer's four projections, group 128).

The shipped layout packs K rows 8r..8r+7 into int r: the kernel must reshape
[BLOCK_K / 8, 8, BLOCK_N] nibbles into [BLOCK_K, BLOCK_N], a shuffle that stops Triton from
keeping the dequantized tile in the registers a tensor-core instruction reads. The planar layout
packs rows r, r + K/8, ..., r + 7K/8 into int r, so nibble j of a [BLOCK_P, BLOCK_N] tile is the
weight's rows j*K/8 + p (contiguous in K): eight dots of depth BLOCK_P per packed tile, each on an
elementwise function of the loaded tile, no reshape. TRANS computes out^T = W^T x^T so the
dequantized weight is the first operand (Hopper's wgmma reads A from registers) and few rows of
x are the narrow side of the instruction.

Every candidate is checked against the reference GEMM on the same (unpacked) weights.
Run from the repo root: python3 <this file> (a GPU), or with TRITON_INTERPRET=1 --cpu-check.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import sys
import time

sys.path.insert(0, "bench")
import torch
import triton
import triton.language as tl

from loraplex.engine.model.quant.int4_layout import pack_int4


def pack_planar(q: torch.Tensor) -> torch.Tensor:
    """q [K, N] uint8 in [0, 16) -> [K/8, N] int32, value j of int r = q[j * K/8 + r]."""
    k, n = q.shape
    planes = q.reshape(8, k // 8, n).to(torch.int32)  # [8, K/8, N]
    out = torch.zeros(k // 8, n, dtype=torch.int32, device=q.device)
    for j in range(8):
        out |= planes[j] << (4 * j)
    return out


@triton.jit(do_not_specialize=["M"])
def _planar_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    M,
    N,
    K8,
    p_per_split,
    stride_xm,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
    SPLIT_K: tl.constexpr,
    TRANS: tl.constexpr,
    DQ16: tl.constexpr = False,
):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k8 = K8  # K / 8, an argument so that Triton sees its divisibility
    p_begin = tl.program_id(2) * p_per_split
    p_end = tl.minimum(p_begin + p_per_split, k8)
    if TRANS:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p0 in range(p_begin, p_end, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        if TRANS:
            packed = tl.load(
                qw_ptr + offs_p[None, :].to(tl.int64) * N + offs_n[:, None],
                mask=mask_n[:, None],
                other=0,
            )  # [BLOCK_N, BLOCK_P]
        else:
            packed = tl.load(
                qw_ptr + offs_p[:, None].to(tl.int64) * N + offs_n[None, :],
                mask=mask_n[None, :],
                other=0,
            )  # [BLOCK_P, BLOCK_N]
        for j in tl.static_range(8):
            k_first = j * k8 + p0  # the tile's K rows lie in one group (GROUP_SIZE | K/8)
            if DQ16:
                # Marlin's bf16 trick, not the reference's rounding: nibbles j and j + 4 at once as
                # the low mantissa bits of two bf16 128 + q, then one bf16 FMA with the scale.
                half = (packed >> (4 * (j % 4))) & 0x000F000F | 0x43004300
                if j < 4:  # noqa: SIM108 - a constexpr branch of the Triton kernel
                    bits = (half & 0xFFFF).to(tl.uint16)
                else:
                    bits = (half >> 16).to(tl.uint16)
                v = bits.to(tl.bfloat16, bitcast=True)  # 128 + q
            group_row = (k_first // GROUP_SIZE) * N + offs_n
            scale = tl.load(s_ptr + group_row, mask=mask_n, other=0.0).to(tl.float32)
            if DQ16:
                z16 = tl.load(z_ptr + group_row, mask=mask_n, other=0).to(tl.float32)
                s16 = scale.to(tl.bfloat16)
                nzs = (-(z16 + 128.0) * s16.to(tl.float32)).to(tl.bfloat16)
            # 2^23 + zero, so the magic constant cancels in one subtraction (exact)
            zero = tl.load(z_ptr + group_row, mask=mask_n, other=0).to(tl.float32) + 8388608.0
            q = ((packed >> (4 * j)) & 0xF) | 0x4B000000
            q = q.to(tl.float32, bitcast=True)  # 2^23 + q
            offs_k = k_first + tl.arange(0, BLOCK_P)
            if TRANS:
                if DQ16:
                    w = tl.fma(v, s16[:, None], nzs[:, None])
                else:
                    w = ((q - zero[:, None]) * scale[:, None]).to(
                        x_ptr.dtype.element_ty
                    )  # [BN, BP]
                x = tl.trans(
                    tl.load(
                        x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
                        mask=mask_m[:, None],
                        other=0.0,
                    )  # [BM, BP]
                )  # [BP, BM]
                acc = tl.dot(w, x, acc, input_precision="tf32")
            else:
                w = ((q - zero[None, :]) * scale[None, :]).to(x_ptr.dtype.element_ty)  # [BP, BN]
                x = tl.load(
                    x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                    mask=mask_m[:, None],
                    other=0.0,
                )  # [BM, BP]
                acc = tl.dot(x, w, acc, input_precision="tf32")
    if TRANS:
        offs = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        mask = mask_m[None, :] & mask_n[:, None]
    else:
        offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(out_ptr + tl.program_id(2).to(tl.int64) * M * N + offs, acc, mask=mask)


def planar_gemm(x, qw, s, z, gs, bm, bn, bp, split, warps, stages, trans, partial, dq16=False):  # type: ignore[no-untyped-def]
    m, k = x.shape
    n = qw.shape[1]
    k8 = k // 8
    # the kernel reads one row of scales per run: every run of bp rows must lie in one group
    assert (k8 % gs == 0 and gs % bp == 0) or gs % k8 == 0, (k8, gs, bp)
    p_per_split = triton.cdiv(triton.cdiv(k8, split), bp) * bp
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    target = out if split == 1 else partial[: split * m * n]
    _planar_kernel[(triton.cdiv(n, bn), triton.cdiv(m, bm), split)](
        x,
        qw,
        s,
        z,
        target,
        m,
        n,
        k8,
        p_per_split,
        x.stride(0),
        GROUP_SIZE=gs,
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_P=bp,
        SPLIT_K=split,
        TRANS=trans,
        DQ16=dq16,
        num_warps=warps,
        num_stages=stages,
    )
    if split > 1:
        out.copy_(target.view(split, m, n).sum(0))
    return out


def make_layer(m: int, k: int, n: int, gs: int, device: str, dtype=torch.bfloat16):  # type: ignore[no-untyped-def]
    q = torch.randint(0, 16, (k, n), device=device, dtype=torch.uint8)
    s = (torch.rand(k // gs, n, device=device) * 0.01 + 0.001).half()
    z = torch.randint(0, 16, (k // gs, n), device=device, dtype=torch.uint8)
    x = torch.randn(m, k, device=device, dtype=dtype)
    shipped = pack_int4(q, 0)
    groups = torch.arange(k, device=device) // gs
    w = ((q.float() - z[groups].float()) * s[groups].float()).to(
        dtype
    )  # [K, N], the spec's formula
    ref = x.float() @ w.float()
    return x, shipped, pack_planar(q), s, z, w, ref


def close(y: torch.Tensor, ref: torch.Tensor) -> bool:
    # float32 sums in another order, rounded to bf16 once
    return bool(((y.float() - ref).abs() <= 1e-2 * ref.abs().max() + 1e-2 * ref.abs()).all())


def cpu_check() -> None:
    torch.manual_seed(0)
    for m, k, n, gs, trans, split in itertools.product(
        (3, 16), (256,), (64,), (32,), (False, True), (1, 2)
    ):
        x, _, planar, s, z, _, ref = make_layer(
            m, k, n, gs, "cpu", torch.float16
        )  # no bf16 dot in the interpreter
        partial = torch.empty(split * m * n, dtype=torch.float32)
        y = planar_gemm(x, planar, s, z, gs, 16, 32, 16, split, 4, 1, trans, partial)
        print(f"m={m} trans={trans} split={split}: {'ok' if close(y, ref) else 'WRONG'}")


def splits_for(tiles: int, k8: int, bp: int) -> list[int]:
    """Split-K counts that give 132-1,100 programs (the smallest two), else the largest that fits."""
    fits = [s for s in (1, 2, 4, 8, 16) if k8 // s >= bp and tiles * s <= 1100]
    good = [s for s in fits if tiles * s >= 132]
    return good[:2] if good else fits[-1:]


def sweep_configs(m: int) -> list[tuple]:
    """(trans, dq16, bm, bn, bp, warps, stages)"""
    if m <= 16:
        grid = itertools.product((True,), (False, True), (16,), (64, 128), (32, 64), (4,), (2, 3))
        return list(grid)
    grid = itertools.product((True,), (False, True), (64,), (64, 128), (16, 32, 64), (4,), (2, 3))
    wide = itertools.product((True,), (False, True), (64,), (256,), (16, 32), (8,), (2,))
    return [(False, False, 64, 128, 32, 4, 3), *grid, *wide]


def report(m, best, bf16, shipped, read_floor) -> None:  # type: ignore[no-untyped-def]
    """The best config per projection for each variant so far (also to best.txt: a run cut
    short by its time limit keeps what it measured)."""
    lines = []
    for trans, dq16 in sorted({(t, q) for _, t, q in best}):
        rows = {name: v for (name, t, q), v in best.items() if (t, q) == (trans, dq16)}
        total = sum(v[0] for v in rows.values())
        lines.append(
            f"M={m} trans={trans} dq16={dq16}: best planar {total:.1f} us/layer over {len(rows)}"
            f" projections (bf16 {sum(bf16.values()):.1f}, shipped {sum(shipped.values()):.1f},"
            f" read floor {read_floor:.1f})"
        )
        for name, (us, cfg, err) in rows.items():
            lines.append(
                f"  {name}: {us:.1f} us ({cfg}, max err/max {err:.1e}); bf16 {bf16[name]:.1f},"
                f" shipped {shipped[name]:.1f}"
            )
    text = "\n".join(lines)
    with open(os.path.join(os.environ.get("OUT", "."), f"best_m{m}.txt"), "w") as f:
        f.write(text + "\n")
    print(text, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-check", action="store_true")
    ap.add_argument("--rows", default="64,16")
    args = ap.parse_args()
    if args.cpu_check:
        cpu_check()
        return
    from kernel_timing import graph_us

    from loraplex.kernels.triton.w4a16 import launch_w4a16_gemm, w4a16_tiles

    torch.manual_seed(0)
    gs = 128
    shapes = {
        "qkv": (4096, 6144),
        "o": (4096, 4096),
        "gate_up": (4096, 28672),
        "down": (14336, 4096),
    }
    partial = torch.empty(16 * 64 * 28672, device="cuda", dtype=torch.float32)
    for m in map(int, args.rows.split(",")):
        layers = {name: make_layer(m, k, n, gs, "cuda") for name, (k, n) in shapes.items()}
        w16 = {name: d[5].t().contiguous() for name, d in layers.items()}  # [N, K] as nn.Linear
        bf16 = {
            name: graph_us(lambda d=d, w=w16[name]: torch.nn.functional.linear(d[0], w))
            for name, d in layers.items()
        }
        shipped = {}
        for name, d in layers.items():
            fn = functools.partial(
                launch_w4a16_gemm, d[0], d[1], d[3], d[4], None, gs, w4a16_tiles(m, d[1].shape[1])
            )
            assert close(fn(), d[6]), name
            shipped[name] = graph_us(fn)
        packed_bytes = sum(d[2].numel() * 4 for d in layers.values())
        buf = torch.empty(packed_bytes // 2, device="cuda", dtype=torch.bfloat16)
        buf2 = torch.empty_like(buf)
        read_floor = graph_us(functools.partial(buf2.copy_, buf)) / 2
        print(
            f"M={m}: bf16 cuBLAS {sum(bf16.values()):.1f} us/layer "
            + " ".join(f"{k}={v:.1f}" for k, v in bf16.items())
            + f"; shipped W4A16 {sum(shipped.values()):.1f} "
            + " ".join(f"{k}={v:.1f}" for k, v in shipped.items())
            + f"; packed {packed_bytes / 1e6:.1f} MB read floor ~{read_floor:.1f} us",
            flush=True,
        )
        best: dict[tuple[str, bool, bool], tuple[float, str, float]] = {}
        for trans, dq16, bm, bn, bp, warps, stages in sweep_configs(m):
            t0 = time.time()
            for name, d in layers.items():
                k, n = shapes[name]
                tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
                for split in splits_for(tiles, k // 8, bp):
                    cfg = f"bn={bn} bp={bp} w={warps} st={stages} split={split}"
                    fn = functools.partial(
                        planar_gemm, d[0], d[2], d[3], d[4], gs, bm, bn, bp, split, warps, stages,
                        trans, partial, dq16,
                    )  # fmt: skip
                    try:
                        y = fn()
                        us = graph_us(fn)
                    except Exception as e:  # noqa: BLE001 - out of resources etc.: skip the config
                        print(
                            f"  fail {name} trans={trans} dq16={dq16} {cfg}: {type(e).__name__} {str(e)[:60]}"
                        )
                        break
                    err = ((y.float() - d[6]).abs().max() / d[6].abs().max()).item()
                    if not dq16 and not close(y, d[6]):
                        print(f"  WRONG {name} trans={trans} {cfg} rel err {err:.2e}")
                        continue
                    key = (name, trans, dq16)
                    if key not in best or us < best[key][0]:
                        best[key] = (us, cfg, err)
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                report(m, best, bf16, shipped, read_floor)
            print(
                f"  swept trans={trans} dq16={dq16} bn={bn} bp={bp} w={warps} st={stages} ({time.time() - t0:.1f}s)",
                flush=True,
            )
        report(m, best, bf16, shipped, read_floor)


if __name__ == "__main__":
    main()
