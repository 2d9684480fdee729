"""The Triton W4A16 GEMM and dequantization against their reference (on CPU under
TRITON_INTERPRET=1, tiny shapes): group sizes, act-order, dtypes, ragged M / N, split-K, the
dequantize-then-matmul path for many rows, and launch checks. bf16 runs on CUDA only: Triton's CPU interpreter has no bfloat16 tl.dot."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from loraplex.kernels import reference
from tests.kernels.interpreter_dtypes import BF16
from tests.kernels.w4a16_inputs import w4a16_inputs

TOLERANCES = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
TILES = (16, 16, 32, 4)  # small tiles keep the interpreter quick (block m, n, k, warps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16], ids=str)
@pytest.mark.parametrize(
    ("m", "k", "n", "group_size", "act_order"),
    [
        (3, 64, 32, 32, False),
        (17, 128, 40, 64, False),
        (5, 128, 24, 128, False),
        (9, 96, 16, 32, True),
        (1, 128, 48, 64, True),
        (4, 64, 24, 16, False),  # groups smaller than the K tile
    ],
)
@pytest.mark.parametrize("split_k", [1, 3], ids=["split1", "split3"])
def test_triton_w4a16_matches_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    dtype: torch.dtype,
    m: int,
    k: int,
    n: int,
    group_size: int,
    act_order: bool,
    split_k: int,
) -> None:
    from loraplex.kernels.triton.w4a16 import W4A16Tiles, launch_w4a16_gemm

    x, qweight, scales, zeros, g_idx = w4a16_inputs(m, k, n, group_size, act_order, dtype, device)
    expected = reference.w4a16_gemm(x, qweight, scales, zeros, g_idx, group_size)
    tiles = W4A16Tiles(*TILES, split_k=split_k)
    got = launch_w4a16_gemm(x, qweight, scales, zeros, g_idx, group_size, tiles)
    assert got.dtype == dtype and got.shape == (m, n)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, BF16], ids=str)
@pytest.mark.parametrize(
    ("k", "n", "group_size", "act_order"), [(128, 40, 32, False), (64, 24, 16, True)]
)
def test_triton_w4a16_dequantize_equals_reference(
    triton_kernels: ModuleType,
    device: torch.device,
    dtype: torch.dtype,
    k: int,
    n: int,
    group_size: int,
    act_order: bool,
) -> None:
    _, qweight, scales, zeros, g_idx = w4a16_inputs(1, k, n, group_size, act_order, dtype, device)
    expected = reference.w4a16_dequantize(qweight, scales, zeros, g_idx, group_size, dtype)
    got = triton_kernels.w4a16_dequantize(qweight, scales, zeros, g_idx, group_size, dtype)
    assert torch.equal(got, expected)  # the same float32 formula, rounded once


def test_triton_w4a16_many_rows_dequantize_then_matmul(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    from loraplex.kernels.triton.w4a16 import DEQUANT_MIN_M

    x, qweight, scales, zeros, g_idx = w4a16_inputs(
        DEQUANT_MIN_M + 3, 64, 24, 16, True, torch.float32, device
    )
    got = triton_kernels.w4a16_gemm(x, qweight, scales, zeros, g_idx, 16)
    expected = reference.w4a16_gemm(x, qweight, scales, zeros, g_idx, 16)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="group_size"):
        triton_kernels.w4a16_gemm(x, qweight, scales, zeros, None, 32)


def test_triton_w4a16_default_tiles_and_strided_x(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    x, qweight, scales, zeros, _ = w4a16_inputs(4, 64, 16, 32, False, torch.float32, device)
    wide = torch.randn(4, 80, device=device)
    wide[:, 8:72] = x
    got = triton_kernels.w4a16_gemm(wide[:, 8:72], qweight, scales, zeros, None, 32)
    expected = reference.w4a16_gemm(x, qweight, scales, zeros, None, 32)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_split_k_follows_the_weight_width_from_17_rows() -> None:
    """Decode-sized launches split K to fill the GPU: at 64 rows a wide weight (gate_up) has
    enough output tiles for split 3, a narrow one keeps the table's 8; up to 16 rows always 8."""
    from loraplex.kernels.triton.w4a16 import w4a16_tiles

    assert [w4a16_tiles(64, n).split_k for n in (4096, 6144, 28672)] == [8, 8, 3]
    assert [w4a16_tiles(m, 28672).split_k for m in (1, 16)] == [8, 8]
    assert w4a16_tiles(64, 28672)._replace(split_k=8) == w4a16_tiles(64, 4096)
    assert w4a16_tiles(64, 0).split_k == 8  # an empty weight: no tiles to divide by


def test_triton_w4a16_empty_shapes(triton_kernels: ModuleType, device: torch.device) -> None:
    for m, n in ((0, 32), (20, 0)):  # no rows; no output columns (at a row count that splits K)
        x = torch.randn(m, 64, device=device)
        qweight = torch.zeros(8, n, dtype=torch.int32, device=device)
        scales = torch.ones(2, n, dtype=torch.float16, device=device)
        zeros = torch.zeros(2, n, dtype=torch.uint8, device=device)
        assert triton_kernels.w4a16_gemm(x, qweight, scales, zeros, None, 32).shape == (m, n)


def test_reference_dequantizes_by_the_documented_formula() -> None:
    x, qweight, scales, zeros, g_idx = w4a16_inputs(2, 32, 8, 16, True, torch.float32, "cpu")
    w = reference.dequantize_w4(qweight, scales, zeros, g_idx, 16)
    shifts = (torch.arange(32) % 8) * 4
    q = (qweight[torch.arange(32) // 8] >> shifts[:, None]) & 0xF
    g = g_idx.long()
    assert torch.equal(w, (q.float() - zeros[g].float()) * scales[g].float())


def test_triton_w4a16_rejects_bad_arguments(
    triton_kernels: ModuleType, device: torch.device
) -> None:
    x, qweight, scales, zeros, _ = w4a16_inputs(2, 64, 16, 32, False, torch.float32, device)
    gemm = triton_kernels.w4a16_gemm
    with pytest.raises(ValueError, match="qweight"):
        gemm(x, qweight[:4], scales, zeros, None, 32)
    with pytest.raises(ValueError, match="group_size"):
        gemm(x, qweight, scales, zeros, None, 16)
    with pytest.raises(ValueError, match="zeros"):
        gemm(x, qweight, scales, zeros.int(), None, 32)
    with pytest.raises(ValueError, match="g_idx"):
        gemm(x, qweight, scales, zeros, torch.zeros(64, dtype=torch.int64, device=device), 32)
    from loraplex.kernels.triton.w4a16 import W4A16Tiles, launch_w4a16_gemm

    with pytest.raises(ValueError, match="split_k"):
        launch_w4a16_gemm(x, qweight, scales, zeros, None, 32, W4A16Tiles(*TILES, split_k=0))
