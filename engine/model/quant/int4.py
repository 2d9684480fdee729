"""4-bit W4A16 linear layers from AWQ and GPTQ checkpoints (`kernels.w4a16_gemm`: Triton on
CUDA, the reference on CPU).

Each checkpoint slice (q_proj, k_proj, ...) is converted into Loraplex's layout
(`int4_layout.py`) and written into its columns of the fused layer, so fused QKV / gate-up
stay one GEMM:

    qweight [K/8, N]   columns [start, start + size) <- the slice's qweight, repacked along K
    zeros   [G, N]     the same columns <- the slice's qzeros, unpacked
    scales  [G, N]     the same columns <- the slice's scales

GPTQ act-order (desc_act) checkpoints store g_idx [K] per projection. Projections fused into
one layer read the same input, so GPTQ orders their rows alike; the loader checks that they
agree (one g_idx per layer) and drops a g_idx that is the plain k // group_size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loraplex.engine.errors import QuantizationError
from loraplex.engine.model.quant.int4_layout import (
    PACK_FACTOR,
    gptq_zeros,
    pack_int4,
    unpack_awq,
)
from loraplex.engine.model.quant.linear_method import (
    DUMMY_STD,
    LinearMethod,
    Loader,
    QuantizedInput,
    WeightTarget,
    register,
)
from loraplex.engine.model.quant.quant_config import Int4Config
from loraplex.kernels import w4a16_gemm

if TYPE_CHECKING:
    from loraplex.engine.model.linear import MergedLinear

SCALES_DTYPE = torch.float16  # as AWQ and GPTQ checkpoints store them
_SCALE_DTYPES = ("F16", "BF16", "F32")
_ZERO_POINT = 8  # dummy weights: symmetric around the middle of [0, 16)


class Int4LinearMethod(LinearMethod):
    def __init__(self, quant: Int4Config) -> None:
        self.quant = quant
        self.g_idx: torch.Tensor | None = None
        self._g_idx_slices: dict[str, torch.Tensor] = {}

    def create_weights(self, layer: MergedLinear, dtype: torch.dtype, device: torch.device) -> None:
        k, n = layer.input_size, layer.output_size
        num_groups = self.quant.groups(k)  # raises unless the group size divides K
        self.group_size = self.quant.group_size_for(k)
        if self.quant.method == "awq":
            odd = [s for s in layer.slice_sizes if s % PACK_FACTOR]
            if odd:
                raise QuantizationError(f"AWQ packs 8 output columns per int32; sizes {odd}")
        self.qweight = register(layer, "qweight", (k // PACK_FACTOR, n), torch.int32, device)
        self.scales = register(layer, "scales", (num_groups, n), SCALES_DTYPE, device)
        self.zeros = register(layer, "zeros", (num_groups, n), torch.uint8, device)

    def checkpoint_targets(self, layer: MergedLinear, prefix: str) -> dict[str, WeightTarget]:
        k, num_groups = layer.input_size, self.scales.shape[0]
        targets = {}
        for name in layer.slice_names:
            start, size = layer.slice_range(name)
            cols = slice(start, start + size)
            base = f"{prefix}.{name}"
            targets[f"{base}.scales"] = WeightTarget(
                ((num_groups, size),), self.scales[:, cols].copy_, _SCALE_DTYPES
            )
            zeros_shape = ((num_groups, size // PACK_FACTOR),)
            if self.quant.method == "awq":
                targets[f"{base}.qweight"] = WeightTarget(
                    ((k, size // PACK_FACTOR),), self._awq_qweight_into(cols), ("I32",)
                )
                targets[f"{base}.qzeros"] = WeightTarget(
                    zeros_shape, self._awq_zeros_into(cols), ("I32",)
                )
                continue
            targets[f"{base}.qweight"] = WeightTarget(
                ((k // PACK_FACTOR, size),), self.qweight[:, cols].copy_, ("I32",)
            )
            targets[f"{base}.qzeros"] = WeightTarget(
                zeros_shape, self._gptq_zeros_into(cols), ("I32",)
            )
            targets[f"{base}.g_idx"] = WeightTarget(
                ((k,),), self._g_idx_into(name), ("I32", "I64"), optional=not self.quant.desc_act
            )
            if not layer.has_bias:  # AutoGPTQ saves an all-zero bias for every layer
                targets[f"{base}.bias"] = WeightTarget(
                    ((size,),), _zero_bias_check(base), optional=True
                )
        return targets

    def _awq_qweight_into(self, cols: slice) -> Loader:
        return lambda packed: self.qweight[:, cols].copy_(pack_int4(unpack_awq(packed), 0))

    def _awq_zeros_into(self, cols: slice) -> Loader:
        return lambda packed: self.zeros[:, cols].copy_(unpack_awq(packed))

    def _gptq_zeros_into(self, cols: slice) -> Loader:
        offset = self.quant.zero_offset
        return lambda packed: self.zeros[:, cols].copy_(gptq_zeros(packed, offset))

    def _g_idx_into(self, name: str) -> Loader:
        def load(g_idx: torch.Tensor) -> None:
            self._g_idx_slices[name] = g_idx.to(torch.int32)

        return load

    def finish_loading(self, layer: MergedLinear) -> None:
        """One g_idx per layer (all slices alike), or none when it is the trivial one."""
        slices = {n: self._g_idx_slices[n] for n in layer.slice_names if n in self._g_idx_slices}
        self._g_idx_slices = {}
        if not slices:
            return
        if len(slices) != len(layer.slice_names):
            missing = [n for n in layer.slice_names if n not in slices]
            raise QuantizationError(f"g_idx is missing for {missing} but present beside them")
        first_name, g_idx = next(iter(slices.items()))  # in the layer's slice order
        for name, other in slices.items():
            if not torch.equal(other, g_idx):
                raise QuantizationError(
                    f"{layer.slice_names}: g_idx of {name} differs from {first_name}'s; fused "
                    "projections need one act-order"
                )
        k, num_groups = layer.input_size, self.scales.shape[0]
        if int(g_idx.min()) < 0 or int(g_idx.max()) >= num_groups:
            raise QuantizationError(f"{first_name}: g_idx out of range [0, {num_groups})")
        if torch.equal(g_idx.long(), torch.arange(k) // self.group_size):
            return  # not act-order: the kernel computes k // group_size
        self.g_idx = g_idx.to(self.qweight.device)
        layer.register_buffer("g_idx", self.g_idx)

    @torch.no_grad()
    def fill_dummy(self, generator: torch.Generator) -> None:
        # Values uniform in [0, 16) around zero point 8: (q - 8) has std ~4.6.
        info = torch.iinfo(torch.int32)
        self.qweight.random_(info.min, info.max, generator=generator)
        self.zeros.fill_(_ZERO_POINT)
        self.scales.fill_(DUMMY_STD / 4.6)

    def apply(self, x: torch.Tensor, quantized: QuantizedInput | None = None) -> torch.Tensor:
        return w4a16_gemm(x, self.qweight, self.scales, self.zeros, self.g_idx, self.group_size)


def _zero_bias_check(name: str) -> Loader:
    def load(bias: torch.Tensor) -> None:
        if torch.count_nonzero(bias):
            raise QuantizationError(f"{name}.bias is non-zero but the model has no bias there")

    return load
