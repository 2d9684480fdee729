"""FP8 W8A8: the per-token activation quantization and the scaled GEMM's reference (the CPU
path), and, on a GPU with FP8, `torch._scaled_mm` against it."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.engine.model.quant import QuantizationError
from loraplex.engine.model.quant.fp8 import check_fp8_supported, quantize_fp8_per_channel
from loraplex.kernels import reference
from loraplex.kernels.reference.fp8 import FP8_MAX, INV_FP8_MAX


def test_per_token_quantization_scales_each_row_to_the_fp8_range() -> None:
    x = torch.randn(5, 64) * torch.tensor([0.01, 1.0, 30.0, 1e3, 0.0])[:, None]
    x_fp8, scale = reference.quantize_fp8_per_token(x)
    assert x_fp8.dtype == torch.float8_e4m3fn and scale.shape == (5, 1)
    assert torch.equal(scale[:4, 0], x[:4].abs().amax(1) * INV_FP8_MAX)
    assert x_fp8[:4].float().abs().amax(1).eq(FP8_MAX).all()  # each row's max hits 448
    assert x_fp8[4].float().eq(0).all()  # an all-zero row stays zero
    # e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4 per element.
    back = x_fp8.float() * scale
    assert ((back - x).abs() <= x.abs() / 16 + scale * 2**-9).all()


def test_weight_scales_are_searched_for_the_least_rounding_error() -> None:
    """Each row's scale is the clip ratio (1.00 .. 0.81 of max |w| / 448) of least error: never
    worse than the plain max scale, and better over the whole weight."""
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    w[5] = 0.0  # an all-zero row keeps the minimum scale and zeros
    w_fp8, scale = quantize_fp8_per_channel(w)
    assert w_fp8.dtype == torch.float8_e4m3fn and scale.shape == (64,)
    amax = w.abs().amax(1)
    ratios = scale / (amax / FP8_MAX)
    assert ((ratios[amax > 0] > 0.805) & (ratios[amax > 0] <= 1.0)).all()
    assert w_fp8[5].float().eq(0).all()

    def error(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (q.float() * s[:, None] - w).abs().pow(2.4).sum(1)

    plain_scale = (amax / FP8_MAX).clamp(min=1e-30)
    plain = (w / plain_scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    assert (error(w_fp8, scale) <= error(plain, plain_scale)).all()
    assert error(w_fp8, scale).sum() < error(plain, plain_scale).sum()


def test_scaled_mm_reference_is_the_dequantized_product() -> None:
    x, w = torch.randn(7, 32, dtype=torch.bfloat16), torch.randn(24, 32)
    x_fp8, x_scale = reference.quantize_fp8_per_token(x)
    w_fp8, w_scale = quantize_fp8_per_channel(w)
    y = reference.fp8_scaled_mm(x_fp8, x_scale, w_fp8, w_scale, torch.bfloat16)
    expected = (x_fp8.float() * x_scale) @ (w_fp8.float() * w_scale[:, None]).t()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, expected.bfloat16())
    # Close to the unquantized product: FP8 W8A8 is a few percent off.
    rel = (y.float() - x.float() @ w.t()).norm() / (x.float() @ w.t()).norm()
    assert rel < 0.08


def test_fp8_support_check_passes_on_cpu() -> None:
    check_fp8_supported(torch.device("cpu"))


def test_fp8_on_a_gpu_without_fp8_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(QuantizationError, match=r"compute capability >= 8.9.*A100 is 8.0"):
        check_fp8_supported(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8_supported(torch.device("cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 37, 512])
def test_scaled_mm_on_cuda_matches_the_reference(m: int) -> None:
    device = torch.device("cuda")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores")
    from loraplex.kernels.cuda import fp8_scaled_mm

    x = torch.randn(m, 4096, device=device, dtype=torch.bfloat16)
    w = torch.randn(1024, 4096, device=device) * 0.02
    x_fp8, x_scale = reference.quantize_fp8_per_token(x)
    w_fp8, w_scale = quantize_fp8_per_channel(w)
    got = fp8_scaled_mm(x_fp8, x_scale, w_fp8, w_scale, torch.bfloat16)
    expected = reference.fp8_scaled_mm(x_fp8, x_scale, w_fp8, w_scale, torch.bfloat16)
    # Same products, summed in another order and rounded once to bf16.
    torch.testing.assert_close(got, expected, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("k", [16, 100, 4096, 14336])
def test_triton_per_token_quantization_equals_the_reference(dtype: torch.dtype, k: int) -> None:
    from loraplex.kernels import triton as triton_kernels

    x = torch.randn(37, k, device="cuda") * torch.logspace(-3, 3, 37, device="cuda")[:, None]
    x[5] = 0.0  # an all-zero row keeps the minimum scale and zeros
    x = x.to(dtype)
    x_fp8, scale = triton_kernels.quantize_fp8_per_token(x)
    want_fp8, want_scale = reference.quantize_fp8_per_token(x)
    assert x_fp8.dtype == torch.float8_e4m3fn and scale.shape == (37, 1)
    assert torch.equal(scale, want_scale)
    assert torch.equal(x_fp8.view(torch.uint8), want_fp8.view(torch.uint8))
    strided = torch.randn(8, 2 * k, device="cuda", dtype=dtype)[:, :k]  # rows k apart, not dense
    got, _ = triton_kernels.quantize_fp8_per_token(strided)
    assert torch.equal(
        got.view(torch.uint8), reference.quantize_fp8_per_token(strided)[0].view(torch.uint8)
    )


def test_silu_and_mul_quant_fp8_reference_is_the_two_ops() -> None:
    x = torch.randn(5, 2 * 48)
    out, out_fp8, scale = reference.silu_and_mul_quant_fp8(x)
    assert torch.equal(out, reference.silu_and_mul(x))
    want_fp8, want_scale = reference.quantize_fp8_per_token(out)
    assert torch.equal(scale, want_scale)
    assert torch.equal(out_fp8.view(torch.uint8), want_fp8.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("intermediate", [16, 100, 14336])
def test_triton_silu_and_mul_quant_fp8_equals_the_two_kernels(
    dtype: torch.dtype, intermediate: int, device: torch.device, triton_kernels: ModuleType
) -> None:
    """Bit for bit what SiLU-and-mul then per-token quantization give as two launches (on CPU
    under the interpreter, at the small sizes)."""
    if device.type == "cpu" and intermediate > 1024:
        pytest.skip("interpreter: small sizes only")
    x = torch.randn(37, 2 * intermediate, device=device)
    x = (x * torch.logspace(-2, 2, 37, device=device)[:, None]).to(dtype)
    x[5] = 0.0  # an all-zero row keeps the minimum scale and zeros
    out, out_fp8, scale = triton_kernels.silu_and_mul_quant_fp8(x)
    want_out = triton_kernels.silu_and_mul(x)
    want_fp8, want_scale = triton_kernels.quantize_fp8_per_token(want_out)
    assert torch.equal(out, want_out)
    assert torch.equal(scale, want_scale)
    assert torch.equal(out_fp8.view(torch.uint8), want_fp8.view(torch.uint8))


def test_rms_norm_quant_fp8_references_are_the_two_ops() -> None:
    x, residual, weight = torch.randn(5, 48), torch.randn(5, 48), torch.rand(48) + 0.5
    out, out_fp8, scale = reference.rms_norm_quant_fp8(x, weight, 1e-6)
    assert torch.equal(out, reference.rms_norm(x, weight, 1e-6))
    want_fp8, want_scale = reference.quantize_fp8_per_token(out)
    assert torch.equal(scale, want_scale)
    assert torch.equal(out_fp8.view(torch.uint8), want_fp8.view(torch.uint8))
    out, new_residual, out_fp8, scale = reference.fused_add_rms_norm_quant_fp8(
        x, residual, weight, 1e-6
    )
    want_out, want_residual = reference.fused_add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(out, want_out) and torch.equal(new_residual, want_residual)
    want_fp8, want_scale = reference.quantize_fp8_per_token(want_out)
    assert torch.equal(scale, want_scale)
    assert torch.equal(out_fp8.view(torch.uint8), want_fp8.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("hidden", [96, 576, 4096])
@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_rms_norm_quant_fp8_equals_the_two_kernels(
    dtype: torch.dtype,
    hidden: int,
    with_residual: bool,
    device: torch.device,
    triton_kernels: ModuleType,
) -> None:
    """Bit for bit what the norm, then per-token quantization give as two launches (on CPU
    under the interpreter, at the small sizes)."""
    if device.type == "cpu" and hidden > 1024:
        pytest.skip("interpreter: small sizes only")
    x = torch.randn(37, hidden, device=device)
    x = (x * torch.logspace(-2, 2, 37, device=device)[:, None]).to(dtype)
    x[5] = 0.0  # an all-zero row (without a residual) keeps the minimum scale and zeros
    residual = torch.randn(37, hidden, device=device).to(dtype)
    weight = (torch.rand(hidden, device=device) + 0.5).to(dtype)
    if with_residual:
        out, new_res, out_fp8, scale = triton_kernels.fused_add_rms_norm_quant_fp8(
            x, residual, weight, 1e-5
        )
        want_out, want_res = triton_kernels.fused_add_rms_norm(x, residual, weight, 1e-5)
        assert torch.equal(new_res, want_res)
    else:
        out, out_fp8, scale = triton_kernels.rms_norm_quant_fp8(x, weight, 1e-5)
        want_out = triton_kernels.rms_norm(x, weight, 1e-5)
    want_fp8, want_scale = triton_kernels.quantize_fp8_per_token(want_out)
    assert torch.equal(out, want_out)
    assert torch.equal(scale, want_scale)
    assert torch.equal(out_fp8.view(torch.uint8), want_fp8.view(torch.uint8))


def test_fused_fp8_ops_without_the_unquantized_output_write_the_same_fp8(
    device: torch.device, triton_kernels: ModuleType
) -> None:
    """`keep_unquantized=False` (a step without adapters): the same FP8 values and scales, and
    no unquantized output, from the references and the kernels."""
    x = (torch.randn(9, 96, device=device) * 3).to(torch.bfloat16)
    residual = torch.randn(9, 96, device=device).to(torch.bfloat16)
    weight = (torch.rand(96, device=device) + 0.5).to(torch.bfloat16)
    for ops in (reference, triton_kernels):
        full = ops.silu_and_mul_quant_fp8(x)
        out, out_fp8, scale = ops.silu_and_mul_quant_fp8(x, keep_unquantized=False)
        assert out is None and torch.equal(scale, full[2])
        assert torch.equal(out_fp8.view(torch.uint8), full[1].view(torch.uint8))
        full = ops.rms_norm_quant_fp8(x, weight, 1e-5)
        out, out_fp8, scale = ops.rms_norm_quant_fp8(x, weight, 1e-5, keep_unquantized=False)
        assert out is None and torch.equal(scale, full[2])
        assert torch.equal(out_fp8.view(torch.uint8), full[1].view(torch.uint8))
        full4 = ops.fused_add_rms_norm_quant_fp8(x, residual, weight, 1e-5)
        out, new_residual, out_fp8, scale = ops.fused_add_rms_norm_quant_fp8(
            x, residual, weight, 1e-5, keep_unquantized=False
        )
        assert out is None and torch.equal(new_residual, full4[1])
        assert torch.equal(scale, full4[3])
        assert torch.equal(out_fp8.view(torch.uint8), full4[2].view(torch.uint8))
