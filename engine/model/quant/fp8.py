"""FP8 W8A8 linear layers: float8_e4m3fn weights with one float32 scale per output channel,
activations quantized per token at every call (dynamic), the GEMM through
`kernels.fp8_scaled_mm` (`torch._scaled_mm` on CUDA, the float32 reference on CPU).

Weights come from (see quant_config.py):
- a 16/32-bit checkpoint, quantized at load row by row: scale[n] = r * max_k |W[n, k]| / 448
  with the clip ratio r of least rounding error (`quantize_fp8_per_channel`);
- vLLM's "fp8" layout: `weight` float8_e4m3fn [N, K] and `weight_scale` per tensor ([] or [1]),
  optional `input_scale`;
- compressed-tensors' float-quantized layout: `weight` and `weight_scale` per tensor ([1]) or
  per channel ([N, 1]), optional `input_scale`.
Per-tensor scales become per-row scales (each slice of a fused projection keeps its own), so
every layout runs the same GEMM. Static `input_scale`s are read and not used: activations are
always scaled per token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from loraplex.engine.errors import QuantizationError
from loraplex.engine.model.quant.linear_method import (
    DUMMY_STD,
    LinearMethod,
    Loader,
    QuantizedInput,
    WeightTarget,
    register,
)
from loraplex.engine.model.quant.quant_config import Fp8Config
from loraplex.kernels import fp8_scaled_mm, quantize_fp8_per_token
from loraplex.kernels.reference.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE

if TYPE_CHECKING:
    from loraplex.engine.model.linear import MergedLinear

FP8_MIN_CAPABILITY = (8, 9)  # Ada / Hopper: FP8 tensor cores
_FLOAT_DTYPES = ("F32", "F16", "BF16")


def check_fp8_supported(device: torch.device) -> None:
    """Raise QuantizationError on a CUDA GPU without FP8 tensor cores."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        raise QuantizationError(
            f"quantization='fp8' needs a GPU of compute capability >= 8.9 (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} is {capability[0]}.{capability[1]}"
        )


# Online weight scales: per output row, the clip ratio whose scale ratio * max|w| / 448 leaves
# the least sum |w - dequantized|^2.4 (GPTQ's `find_params` grid, llm-compressor's "mse"
# observer). Clipping a row's few largest weights buys finer steps for all the others: on the
# demo model FP8's perplexity over bf16 went from +3.4-4.0% to +0.7-2.2% (bench/results).
CLIP_RATIOS = tuple(1.0 - i / 100 for i in range(20))  # 1.00, 0.99, ..., 0.81
CLIP_ERROR_NORM = 2.4


def quantize_fp8_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (w_fp8 [N, K] float8_e4m3fn, scale [N] float32), one scale per row, its clip
    ratio searched over CLIP_RATIOS (the first of equal errors: the least clipping)."""
    w = w.float()
    amax = w.abs().amax(dim=1)  # [N]
    scales = torch.stack([(amax * r / FP8_MAX).clamp(min=MIN_SCALE) for r in CLIP_RATIOS])
    errors = torch.stack([_rounding_error(w, scale) for scale in scales])  # [R, N]
    # argmin takes the first of equal minima: the least clipping.
    scale = scales.gather(0, errors.argmin(dim=0, keepdim=True))[0]  # [N]
    return _to_fp8(w, scale), scale


def _to_fp8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w [N, K] float32 / scale [N] -> float8_e4m3fn, saturated at +-448."""
    return (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _rounding_error(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Per row, sum |w - dequantized|^CLIP_ERROR_NORM with this scale -> [N]."""
    back = _to_fp8(w, scale).float() * scale[:, None]
    return (back - w).abs().pow(CLIP_ERROR_NORM).sum(dim=1)


def _ignore(_: torch.Tensor) -> None:
    """Static activation scales: activations are scaled per token instead."""


class Fp8LinearMethod(LinearMethod):
    takes_fp8_input = True

    def __init__(self, quant: Fp8Config) -> None:
        self.quant = quant

    def create_weights(self, layer: MergedLinear, dtype: torch.dtype, device: torch.device) -> None:
        check_fp8_supported(device)
        n, k = layer.output_size, layer.input_size
        self.out_dtype = dtype
        self.weight = register(layer, "weight", (n, k), FP8_DTYPE, device)  # [N, K]
        self.weight_scale = register(layer, "weight_scale", (n,), torch.float32, device)  # [N]

    def checkpoint_targets(self, layer: MergedLinear, prefix: str) -> dict[str, WeightTarget]:
        targets = {}
        for name in layer.slice_names:
            start, size = layer.slice_range(name)
            rows = slice(start, start + size)
            base = f"{prefix}.{name}"
            weight_shapes = ((size, layer.input_size),)
            if self.quant.checkpoint_format == "online":
                load = self._quantize_into(rows)
                targets[f"{base}.weight"] = WeightTarget(weight_shapes, load, _FLOAT_DTYPES)
                continue
            targets[f"{base}.weight"] = WeightTarget(
                weight_shapes, self.weight[rows].copy_, ("F8_E4M3",)
            )
            per_channel = ((size,), (size, 1)) if self.quant.weight_scale_per_channel else ()
            targets[f"{base}.weight_scale"] = WeightTarget(
                ((), (1,), *per_channel), self._scale_into(rows), _FLOAT_DTYPES
            )
            targets[f"{base}.input_scale"] = WeightTarget(
                ((), (1,)), _ignore, _FLOAT_DTYPES, optional=True
            )
        return targets

    def _quantize_into(self, rows: slice) -> Loader:
        def load(w: torch.Tensor) -> None:
            w_fp8, scale = quantize_fp8_per_channel(w.to(self.weight.device))
            self.weight[rows].copy_(w_fp8)
            self.weight_scale[rows].copy_(scale)

        return load

    def _scale_into(self, rows: slice) -> Loader:
        def load(scale: torch.Tensor) -> None:
            # One per tensor broadcasts over the slice's rows; one per channel fills them.
            self.weight_scale[rows].copy_(scale.float().reshape(-1))

        return load

    @torch.no_grad()
    def fill_dummy(self, generator: torch.Generator) -> None:
        w = torch.empty(self.weight.shape, device=self.weight.device)
        w_fp8, scale = quantize_fp8_per_channel(w.normal_(0.0, DUMMY_STD, generator=generator))
        self.weight.copy_(w_fp8)
        self.weight_scale.copy_(scale)

    def apply(self, x: torch.Tensor, quantized: QuantizedInput | None = None) -> torch.Tensor:
        if quantized is None:
            quantized = QuantizedInput(*quantize_fp8_per_token(x))  # [T, K] fp8, [T, 1] float32
        return self.apply_quantized(quantized)

    def apply_quantized(self, quantized: QuantizedInput) -> torch.Tensor:
        """x as FP8 per token -> y [T, output_size] in the model's dtype, no bias."""
        return fp8_scaled_mm(
            quantized.values, quantized.scale, self.weight, self.weight_scale, self.out_dtype
        )
