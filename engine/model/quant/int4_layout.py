"""4-bit packing: the Hub's AWQ and GPTQ layouts, and the one layout the W4A16 GEMM reads.

Eight 4-bit values share an int32, value j in bits 4j..4j+3. The three layouts:

    GPTQ qweight [K/8, N]   packed along K (input), in order: int r of column n holds rows 8r..8r+7
    GPTQ qzeros  [G, N/8]   packed along N, in order; the "gptq" format stores zero - 1
    AWQ  qweight [K, N/8]   packed along N, interleaved: value j of int c holds column 8c + AWQ_ORDER[j]
    AWQ  qzeros  [G, N/8]   as AWQ qweight; zeros stored as they are
    scales       [G, N]     both (float16 as a rule)

Loraplex's layout (`kernels/reference/w4a16.py`): qweight as GPTQ's ([K/8, N], packed along K,
so a fused projection concatenates along N), zeros unpacked [G, N] uint8, scales [G, N], and
g_idx [K] int32 (group of each input row) only for GPTQ act-order checkpoints.
"""

from __future__ import annotations

import torch

PACK_FACTOR = 8  # 4-bit values per int32
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # value j of an int holds column AWQ_ORDER[j]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column c sits at value AWQ_REVERSE_ORDER[c]
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # [8]


def unpack_int4(packed: torch.Tensor, dim: int) -> torch.Tensor:
    """int32 packed along `dim` (values in order) -> uint8 values, `dim` 8 times longer."""
    assert packed.dtype == torch.int32 and dim in (0, 1) and packed.dim() == 2
    if dim == 0:
        return unpack_int4(packed.t(), 1).t().contiguous()
    values = (packed.unsqueeze(-1) >> _SHIFTS.to(packed.device)) & 0xF  # [R, C, 8]
    return values.reshape(packed.shape[0], -1).to(torch.uint8)


def pack_int4(values: torch.Tensor, dim: int) -> torch.Tensor:
    """uint8 / int values in [0, 16) -> int32 packed along `dim` (in order); inverse of unpack."""
    assert values.dim() == 2 and dim in (0, 1) and values.shape[dim] % PACK_FACTOR == 0
    if dim == 0:
        return pack_int4(values.t(), 1).t().contiguous()
    v = values.to(torch.int64).reshape(values.shape[0], -1, PACK_FACTOR)  # [R, C/8, 8]
    packed = (v << _SHIFTS.to(values.device, torch.int64)).sum(-1)  # [R, C/8] in [0, 2^32)
    return torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)


def unpack_awq(packed: torch.Tensor) -> torch.Tensor:
    """AWQ qweight / qzeros [R, N/8] int32 -> [R, N] uint8 in column order."""
    values = unpack_int4(packed, 1).reshape(packed.shape[0], -1, PACK_FACTOR)
    order = torch.tensor(AWQ_REVERSE_ORDER, device=packed.device)
    return values[:, :, order].reshape(packed.shape[0], -1)


def awq_to_loraplex(
    qweight: torch.Tensor, qzeros: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ qweight [K, N/8], qzeros [G, N/8] -> (qweight [K/8, N] int32, zeros [G, N] uint8)."""
    return pack_int4(unpack_awq(qweight), 0), unpack_awq(qzeros)


def gptq_zeros(qzeros: torch.Tensor, zero_offset: int) -> torch.Tensor:
    """GPTQ qzeros [G, N/8] -> zeros [G, N] uint8 (the "gptq" format's stored zero is z - 1)."""
    # As AutoGPTQ's and vLLM's kernels read it: stored + 1, not wrapped (a stored 15 is 16).
    return unpack_int4(qzeros, 1) + zero_offset
