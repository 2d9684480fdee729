"""Reference W4A16 GEMM: 4-bit weights (AWQ / GPTQ, asymmetric, grouped) times 16/32-bit
activations. The executable spec of `kernels/triton/w4a16.py`.

Weight layout (Loraplex's; `engine/model/quant/int4_layout.py` converts the Hub's into it):

    qweight [K/8, N] int32   value j (bits 4j..4j+3) of qweight[r, n] is q[8r + j, n], in [0, 16)
    scales  [G, N]           float16 (as checkpoints store them)
    zeros   [G, N] uint8     the zero point of each group and column
    g_idx   [K] int32        group of each input row (GPTQ act-order), or None: row k -> k // group_size

    W[k, n] = (q[k, n] - zeros[g(k), n]) * scales[g(k), n]   computed in float32, then rounded to
    x's dtype once; y = x @ W.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)


def dequantize_w4(
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    g_idx: torch.Tensor | None,  # [K] int32
    group_size: int,
) -> torch.Tensor:
    """-> W [K, N] float32."""
    packed_rows, n = qweight.shape
    q = (qweight.unsqueeze(1) >> _SHIFTS.to(qweight.device)[None, :, None]) & 0xF  # [K/8, 8, N]
    q = q.reshape(packed_rows * 8, n)  # [K, N]
    rows = torch.arange(q.shape[0], device=qweight.device)
    groups = rows // group_size if g_idx is None else g_idx.long()  # [K]
    return (q.float() - zeros[groups].float()) * scales[groups].float()


def w4a16_dequantize(
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    g_idx: torch.Tensor | None,  # [K] int32
    group_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """-> W [K, N] in `dtype`: formed in float32, rounded once (the GEMM's W)."""
    return dequantize_w4(qweight, scales, zeros, g_idx, group_size).to(dtype)


def w4a16_gemm(
    x: torch.Tensor,  # [M, K]
    qweight: torch.Tensor,  # [K/8, N] int32
    scales: torch.Tensor,  # [G, N]
    zeros: torch.Tensor,  # [G, N] uint8
    g_idx: torch.Tensor | None,  # [K] int32
    group_size: int,
) -> torch.Tensor:
    """y = x @ dequantize(W) -> [M, N] in x's dtype (a new tensor)."""
    w = w4a16_dequantize(qweight, scales, zeros, g_idx, group_size, x.dtype)
    # As nn.Linear multiplies: weight [N, K] contiguous (HF's layout, same sums).
    return F.linear(x, w.t().contiguous())
