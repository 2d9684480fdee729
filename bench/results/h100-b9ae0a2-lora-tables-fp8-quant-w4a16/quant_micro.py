"""Per-token FP8 quantization of a [T, 14336] bf16 activation (the down projection's input):
the shipped kernel (one program per row) against an elementwise 2-D kernel that is given each
row's max |x|, as the activation kernel could supply it by an atomic max. Outputs are checked
bit for bit against the shipped kernel's. Run from the repo root on a GPU."""

import functools
import sys

sys.path.insert(0, "bench")
import torch
import triton
import triton.language as tl
from kernel_timing import graph_us

from loraplex.kernels.reference.fp8 import FP8_DTYPE, FP8_MAX, INV_FP8_MAX, MIN_SCALE
from loraplex.kernels.triton.fp8_quant import quantize_fp8_per_token


@triton.jit
def _elem(
    x_ptr,
    amax_ptr,
    out_ptr,
    scale_ptr,
    K,
    BLOCK: tl.constexpr,
    FP8_MAX: tl.constexpr,
    INV_FP8_MAX: tl.constexpr,
    MIN_SCALE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < K
    scale = tl.maximum(tl.load(amax_ptr + row) * INV_FP8_MAX, MIN_SCALE)
    x = tl.load(x_ptr + row * K + col, mask=mask, other=0.0).to(tl.float32)
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -FP8_MAX), FP8_MAX)
    tl.store(out_ptr + row * K + col, q.to(out_ptr.dtype.element_ty), mask=mask)
    if tl.program_id(1) == 0:
        tl.store(scale_ptr + row, scale)


def elem(x, amax, out, scale, block, warps):
    T, K = x.shape
    _elem[(T, triton.cdiv(K, block))](
        x,
        amax,
        out,
        scale,
        K,
        BLOCK=block,
        FP8_MAX=FP8_MAX,
        INV_FP8_MAX=INV_FP8_MAX,
        MIN_SCALE=MIN_SCALE,
        num_warps=warps,
    )


K = 14336
for T in (64, 256, 512, 1024, 2048, 4096):
    x = torch.randn(T, K, device="cuda", dtype=torch.bfloat16)
    ref_q, ref_s = quantize_fp8_per_token(x)
    amax = x.float().abs().amax(1).contiguous()
    out = torch.empty(T, K, device="cuda", dtype=FP8_DTYPE)
    scale = torch.empty(T, 1, device="cuda")
    row_us = graph_us(functools.partial(quantize_fp8_per_token, x))
    y = torch.empty(T, K, device="cuda", dtype=torch.bfloat16)
    copy_us = graph_us(functools.partial(y.copy_, x))  # 4 bytes/elem
    line = f"T {T:5d}: row kernel {row_us:7.1f} us  copy(4B) {copy_us:7.1f} (3B floor ~{copy_us * 0.75:6.1f})"
    for block, warps in ((1024, 4), (2048, 4), (2048, 8), (4096, 8)):
        elem(x, amax, out, scale, block, warps)
        assert torch.equal(out.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(
            scale, ref_s
        )
        us = graph_us(functools.partial(elem, x, amax, out, scale, block, warps))
        line += f"  elem{block}/{warps} {us:6.1f}"
    print(line, flush=True)
