"""RMSNorm, alone or fused with the residual add before it, in Triton (one pass per row).

Method: RMSNorm (Zhang & Sennrich, 2019, "Root Mean Square Layer Normalization") with vLLM's
`fused_add_rms_norm` fusion: a decoder layer's `hidden + sublayer_out` and the next norm read
and write each row once instead of the ~8 elementwise/reduction kernels of the HF-style math.

One program per row holds the whole row in registers (hidden sizes up to 16K): it loads x (and
the residual), forms the sum, reduces mean(x^2) in float32 and writes out. The rounding points
are the reference's (kernels/reference/fused_ops.py): the residual sum is rounded to the dtype
before it is normalized, the normalized row is rounded to the dtype before the weight multiply.
Out of place: the inputs are not modified.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loraplex.kernels.triton.launch_checks import check, check_contiguous_last_dim, check_one_device

OP = "rms_norm"

MAX_HIDDEN_SIZE = 16384  # one row per program must fit in registers


def _num_warps(block: int) -> int:
    if block <= 1024:
        return 4
    if block <= 4096:
        return 8
    return 16


@triton.jit
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    stride_x,
    stride_residual,
    stride_out,
    stride_new_residual,
    eps,
    HIDDEN_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN_SIZE
    dtype = out_ptr.dtype.element_ty

    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + offs, mask=mask, other=0.0)
        summed = (x + residual.to(tl.float32)).to(dtype)
        tl.store(new_residual_ptr + row * stride_new_residual + offs, summed, mask=mask)
        x = summed.to(tl.float32)

    variance = tl.sum(x * x, axis=0) / HIDDEN_SIZE
    normed = (x * tl.rsqrt(variance + eps)).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, (weight * normed).to(dtype), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    check(OP, x.dim() == 2, f"x must be [num_tokens, hidden_size], got {tuple(x.shape)}")
    num_tokens, hidden_size = x.shape
    check(OP, weight.shape == (hidden_size,), "weight must be [hidden_size]")
    check(OP, hidden_size <= MAX_HIDDEN_SIZE, f"hidden_size {hidden_size} > {MAX_HIDDEN_SIZE}")
    check(OP, weight.dtype == x.dtype, "x and weight must share one dtype")
    check(OP, x.stride(-1) == 1 and weight.is_contiguous(), "x needs a contiguous last dim")
    if residual is not None:
        check(
            OP,
            residual.shape == x.shape and residual.dtype == x.dtype,
            "residual must match x's shape and dtype",
        )
        check_contiguous_last_dim(OP, residual=residual)
    check_one_device(OP, *(t for t in (x, weight, residual) if t is not None))

    out = torch.empty((num_tokens, hidden_size), dtype=x.dtype, device=x.device)
    new_residual = None if residual is None else torch.empty_like(out)
    if num_tokens == 0:
        return out, new_residual
    block = triton.next_power_of_2(hidden_size)
    # Without a residual the residual pointers are never read: pass x / out as placeholders.
    res_in = x if residual is None else residual
    res_out = out if new_residual is None else new_residual
    _rms_norm_kernel[(num_tokens,)](
        x,
        res_in,
        weight,
        out,
        res_out,
        x.stride(0),
        res_in.stride(0),
        out.stride(0),
        res_out.stride(0),
        eps,
        HIDDEN_SIZE=hidden_size,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        num_warps=_num_warps(block),
    )
    return out, new_residual


def rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> torch.Tensor:
    """weight * normalize(x) -> [num_tokens, hidden_size] in x's dtype (a new tensor)."""
    out, _ = _launch(x, None, weight, eps)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,  # [num_tokens, hidden_size]
    residual: torch.Tensor,  # [num_tokens, hidden_size]
    weight: torch.Tensor,  # [hidden_size]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass; new tensors, inputs untouched."""
    out, new_residual = _launch(x, residual, weight, eps)
    assert new_residual is not None
    return out, new_residual
