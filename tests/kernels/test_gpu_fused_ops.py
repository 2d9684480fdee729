"""RMSNorm (+ residual add) and SiLU-and-mul on the GPU at Llama-3-8B shapes: Triton vs the
reference per dtype, at a decode batch and a prefill chunk (RoPE: test_gpu_attention.py, with
the KV-cache write it shares a kernel with)."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.kernels.reference import fused_ops as reference
from tests.kernels.fused_op_inputs import FUSED_OPS, fused_op_call, fused_op_inputs
from tests.kernels.llama3_shapes import GPU_DTYPES, ROUNDED, assert_close

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_tokens", [64, 4096])
@pytest.mark.parametrize("op", FUSED_OPS)
def test_fused_op_matches_reference_and_leaves_inputs(
    triton_kernels: ModuleType, op: str, num_tokens: int, dtype: torch.dtype
) -> None:
    inputs = fused_op_inputs(num_tokens, dtype, CUDA)
    before = {name: t.clone() for name, t in inputs.items()}
    actual = fused_op_call(triton_kernels, op, inputs)()
    expected = fused_op_call(reference, op, inputs)()
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.is_contiguous()
        assert_close(a, e, ROUNDED[dtype])
    for name, t in inputs.items():  # out of place
        assert torch.equal(t, before[name]), name


@pytest.mark.parametrize("hidden_size", [576, 960, 4096, 5120])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_rounds_as_pytorch_does_one_row_at_a_time(
    triton_kernels: ModuleType, hidden_size: int, residual: bool
) -> None:
    """The sum of squares in PyTorch's order for one row (HF's decode step): bit for bit with
    the reference run on each row alone, whatever the number of rows."""
    torch.manual_seed(0)
    num_tokens = 1024
    scale = torch.exp(torch.randn(num_tokens, 1, device=CUDA))
    x = (torch.randn(num_tokens, hidden_size, device=CUDA) * scale).to(torch.bfloat16)
    res = torch.randn_like(x)
    weight = (1 + 0.1 * torch.randn(hidden_size, device=CUDA)).to(torch.bfloat16)
    rows = [reference.rms_norm(r[None], weight, 1e-5) for r in (x + res if residual else x)]
    if residual:
        actual, _ = triton_kernels.fused_add_rms_norm(x, res, weight, 1e-5)
    else:
        actual = triton_kernels.rms_norm(x, weight, 1e-5)
    assert torch.equal(actual, torch.cat(rows))
    squares = (x + res if residual else x).float() ** 2
    sums = torch.cat([s[None].sum(-1) for s in squares])
    assert torch.equal(reference.row_sum_cuda_order(squares), sums)
