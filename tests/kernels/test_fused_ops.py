"""Fused decoder ops (RMSNorm + residual, RoPE, SiLU-and-mul): Triton vs reference, and the
model run through the Triton path against the reference path."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from loraplex.engine.model import load_model
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext
from loraplex.kernels.reference import fused_ops as reference
from tests.checkpoints import CheckpointFactory

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Reductions and exp differ in the last bits between Triton and PyTorch: about one ulp.
TOLERANCES = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}
# The interpreter truncates fp32 -> bf16 casts (GPUs round to nearest even, as PyTorch does),
# so on CPU each bf16 rounding point may be one more ulp off.
INTERPRETED_BF16_TOLERANCE = 3e-2


def has_exact_casts(dtype: torch.dtype, device: torch.device) -> bool:
    return dtype != torch.bfloat16 or device.type == "cuda"


@pytest.fixture
def fused(triton_kernels: ModuleType) -> SimpleNamespace:
    """The Triton fused-op modules (the `triton_kernels` fixture checks Triton can run)."""
    # By module path: the package re-exports functions of the same names as these modules.
    names = ("rms_norm", "rotary_and_cache", "silu_and_mul")
    return SimpleNamespace(
        **{n: importlib.import_module(f"loraplex.kernels.triton.{n}") for n in names}
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    exact = has_exact_casts(expected.dtype, expected.device)
    tol = TOLERANCES[expected.dtype] if exact else INTERPRETED_BF16_TOLERANCE
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


def strided_rows(
    num_tokens: int, width: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """[num_tokens, width] with a row stride > width (a slice of a fused projection output)."""
    return torch.randn(num_tokens, width + 8, device=device).to(dtype)[:, 3 : 3 + width]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden_size", [64, 96, 5])
@pytest.mark.parametrize("strided", [False, True])
def test_triton_rms_norm_matches_reference(
    fused: SimpleNamespace,
    device: torch.device,
    dtype: torch.dtype,
    hidden_size: int,
    strided: bool,
) -> None:
    num_tokens, eps = 7, 1e-5
    if strided:
        x = strided_rows(num_tokens, hidden_size, device, dtype)
    else:
        x = (3 * torch.randn(num_tokens, hidden_size, device=device)).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden_size, device=device)).to(dtype)
    out = fused.rms_norm.rms_norm(x, weight, eps)
    assert out.is_contiguous()
    assert_close(out, reference.rms_norm(x, weight, eps))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden_size", [64, 96])
def test_triton_fused_add_rms_norm_matches_reference(
    fused: SimpleNamespace, device: torch.device, dtype: torch.dtype, hidden_size: int
) -> None:
    num_tokens, eps = 9, 1e-6
    x = strided_rows(num_tokens, hidden_size, device, dtype)
    residual = (4 * torch.randn(num_tokens, hidden_size, device=device)).to(dtype)
    x_before, residual_before = x.clone(), residual.clone()
    weight = torch.randn(hidden_size, device=device).to(dtype)
    out, new_residual = fused.rms_norm.fused_add_rms_norm(x, residual, weight, eps)
    expected_out, expected_residual = reference.fused_add_rms_norm(x, residual, weight, eps)
    # The sum is rounded once to the dtype on both paths: exactly equal.
    if has_exact_casts(dtype, device):
        assert torch.equal(new_residual, expected_residual)
    assert_close(new_residual, expected_residual)
    assert_close(out, expected_out)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)  # out of place


@pytest.mark.parametrize("hidden_size", [5, 96, 200, 576])
@pytest.mark.parametrize("residual", [False, True])
def test_triton_rms_norm_sums_squares_in_pytorchs_row_order(
    fused: SimpleNamespace, device: torch.device, hidden_size: int, residual: bool
) -> None:
    """float32 bit for bit with the reference math whose mean is `row_sum_cuda_order` times
    float32(1 / hidden_size): the order the kernel claims (bench/row_sum_order.py checks the
    claim against PyTorch on a GPU)."""
    x = torch.randn(9, hidden_size, device=device) * torch.exp(torch.randn(9, 1, device=device))
    res = torch.randn_like(x)
    weight = 1 + 0.1 * torch.randn(hidden_size, device=device)
    if residual:
        out, _ = fused.rms_norm.fused_add_rms_norm(x, res, weight, 1e-5)
        x = x + res
    else:
        out = fused.rms_norm.rms_norm(x, weight, 1e-5)
    mean = reference.row_sum_cuda_order(x * x) * reference.inverse_float32(hidden_size)
    assert torch.equal(out, weight * (x * torch.rsqrt(mean[:, None] + 1e-5)))


def test_triton_rms_norm_rejects_mismatched_weight(
    fused: SimpleNamespace, device: torch.device
) -> None:
    x = torch.randn(3, 16, device=device)
    with pytest.raises(ValueError, match="dtype"):
        fused.rms_norm.rms_norm(x, torch.ones(16, device=device, dtype=torch.float16), 1e-5)
    with pytest.raises(ValueError, match="weight"):
        fused.rms_norm.rms_norm(x, torch.ones(8, device=device), 1e-5)


def test_reference_rotary_rotates_each_half_pair(device: torch.device) -> None:
    # The spec itself: with cos = 0, sin = 1 everywhere, rotate_half maps [a | b] to [-b | a].
    q = torch.arange(8.0, device=device).view(1, 1, 8)
    ones, zeros = torch.ones(1, 8, device=device), torch.zeros(1, 8, device=device)
    q_rot, k_rot = reference.apply_rotary_pos_emb(q, q, zeros, ones)
    expected = torch.tensor([[[-4.0, -5, -6, -7, 0, 1, 2, 3]]], device=device)
    assert torch.equal(q_rot, expected) and torch.equal(k_rot, expected)
    assert torch.equal(reference.apply_rotary_pos_emb(q, q, ones, zeros)[0], q)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("intermediate", [64, 1500])  # 1500: two column blocks, the last masked
def test_triton_silu_and_mul_matches_reference(
    fused: SimpleNamespace, device: torch.device, dtype: torch.dtype, intermediate: int
) -> None:
    x = strided_rows(5, 2 * intermediate, device, dtype)
    out = fused.silu_and_mul.silu_and_mul(x)
    assert out.shape == (5, intermediate)
    assert_close(out, reference.silu_and_mul(x))


def test_triton_fused_ops_accept_zero_tokens(fused: SimpleNamespace, device: torch.device) -> None:
    x, weight = torch.empty(0, 32, device=device), torch.ones(32, device=device)
    assert fused.rms_norm.rms_norm(x, weight, 1e-5).shape == (0, 32)
    out, residual = fused.rms_norm.fused_add_rms_norm(x, x, weight, 1e-5)
    assert out.shape == residual.shape == (0, 32)
    assert fused.silu_and_mul.silu_and_mul(x).shape == (0, 16)


def run_model(path: Path, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One step of two sequences (a 6-token prefill and a 5-token prefill) -> hidden [11, H]."""
    model, cfg = load_model(path, dtype=dtype, device=device)
    block_size, num_blocks = 4, 6
    shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
    kv_caches = [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(cfg.num_hidden_layers)
    ]
    tables = [[0, 1], [2, 3]]
    lens = [6, 5]
    slots = [
        tables[s][p // block_size] * block_size + p % block_size
        for s, n in enumerate(lens)
        for p in range(n)
    ]
    attn = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, 6, 11], dtype=torch.int32, device=device),
        max_query_len=6,
        max_seq_len=6,
    )
    g = torch.Generator().manual_seed(7)
    input_ids = torch.randint(3, cfg.vocab_size, (11,), generator=g).to(device)
    positions = torch.tensor([*range(6), *range(5)], device=device)
    with torch.inference_mode():
        return model(input_ids, positions, ForwardContext(attn, kv_caches, None))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_model_through_triton_fused_ops_matches_reference_path(
    fused: SimpleNamespace,
    device: torch.device,
    checkpoint_factory: CheckpointFactory,
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
) -> None:
    # Exercises the model's use of the ops: residual plumbing, strided q/k views, yarn scaling.
    path = checkpoint_factory(
        "qwen2",
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 4,
        },
    )
    expected = run_model(path, dtype, device)  # CPU: the reference path
    # Swap in the Triton fused ops only (attention stays on the reference: the interpreter
    # has no bf16 dot); the model modules hold their own references to the dispatched ops.
    from loraplex.engine.model import attention, layers

    monkeypatch.setattr(layers, "rms_norm", fused.rms_norm.rms_norm)
    monkeypatch.setattr(layers, "fused_add_rms_norm", fused.rms_norm.fused_add_rms_norm)
    monkeypatch.setattr(layers, "silu_and_mul", fused.silu_and_mul.silu_and_mul)
    monkeypatch.setattr(attention, "rotary_and_cache", fused.rotary_and_cache.rotary_and_cache)
    actual = run_model(path, dtype, device)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)
