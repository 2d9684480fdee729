"""Random W4A16 GEMM inputs in Loraplex's 4-bit layout (see kernels/reference/w4a16.py)."""

from __future__ import annotations

import torch

from loraplex.engine.model.quant.int4_layout import pack_int4


def w4a16_inputs(
    m: int,
    k: int,
    n: int,
    group_size: int,
    act_order: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """-> x [M, K], qweight [K/8, N], scales [G, N] fp16, zeros [G, N] uint8, g_idx [K] | None."""
    num_groups = k // group_size
    q = torch.randint(0, 16, (k, n), dtype=torch.uint8)
    qweight = pack_int4(q, 0)
    scales = (torch.rand(num_groups, n) * 0.02 + 0.001).half()
    zeros = torch.randint(0, 16, (num_groups, n), dtype=torch.uint8)
    g_idx = None
    if act_order:
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[torch.randperm(k)] = (torch.arange(k) // group_size).to(torch.int32)
        g_idx = g_idx.to(device)
    x = torch.randn(m, k).to(dtype)
    return x.to(device), qweight.to(device), scales.to(device), zeros.to(device), g_idx
