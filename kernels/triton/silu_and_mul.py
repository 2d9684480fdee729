"""SiLU-and-mul (the SwiGLU activation) on a fused [gate | up] projection, in Triton.

Method: SwiGLU (Shazeer, 2020, "GLU Variants Improve Transformer"), fused as vLLM's
`silu_and_mul`: out = silu(gate) * up reads the [T, 2I] gate_up output once and writes [T, I],
instead of a chunk, a silu kernel and a mul kernel with a [T, I] intermediate in between.
silu is computed in float32 and rounded to the dtype before the multiply, as the reference's
separate F.silu rounds.

Grid: (num_tokens, cdiv(intermediate, BLOCK)); each program does BLOCK columns of one row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.launch_checks import check
from loraplex.kernels.triton.grid_math import cdiv

OP = "silu_and_mul"

BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def silu_mul(gate, up, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """silu(gate) * up from float32 rows, rounded to `dtype` where the reference rounds."""
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    return (act * up).to(dtype)


@triton.jit
def _silu_and_mul_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    out_ptr,
    stride_x,
    stride_out,
    INTERMEDIATE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTERMEDIATE
    dtype = out_ptr.dtype.element_ty
    row = x_ptr + token * stride_x
    gate = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + INTERMEDIATE + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_out + offs, silu_mul(gate, up, dtype), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:  # x [num_tokens, 2 * intermediate_size]
    """silu(x[:, :I]) * x[:, I:] -> [num_tokens, I] in x's dtype (a new tensor)."""
    check(OP, x.dim() == 2, "x must be [num_tokens, 2 * intermediate], got %s", tuple(x.shape))
    num_tokens, width = x.shape
    check(OP, width % 2 == 0, "last dim must be even, got %s", width)
    check(OP, x.stride(-1) == 1, "x needs a contiguous last dim")
    intermediate = width // 2
    out = torch.empty((num_tokens, intermediate), dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    grid = (num_tokens, cdiv(intermediate, BLOCK))
    _silu_and_mul_kernel[grid](
        x,
        out,
        x.stride(0),
        out.stride(0),
        INTERMEDIATE=intermediate,
        BLOCK=BLOCK,
        num_warps=NUM_WARPS,
    )
    return out
