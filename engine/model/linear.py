"""A projection whose output is several logical Hugging Face projections stacked row-wise.

`qkv_proj` holds q_proj, k_proj and v_proj; `gate_up_proj` holds gate_proj and up_proj. One
GEMM serves them all; the LoRA applier gets the slice names and sizes to add each adapter's
per-projection delta into the right columns of the output.

    weight rows:  [ q_proj (q_size) | k_proj (kv_size) | v_proj (kv_size) ]
    y columns:    [ q               | k                | v                ]

How the weight is held and multiplied (dense, FP8, 4-bit) is the layer's `LinearMethod`
(`quant/`); the bias and the LoRA deltas are the same for all of them: adapters run on the
layer's unquantized input activations.

Under tensor parallelism (docs/tensor_parallel.md) a layer holds one rank's share: `shards`
says which part of each slice's checkpoint tensor that is (rows: column-parallel; columns:
row-parallel), and a row-parallel layer (`reduce`) sums its partial outputs over the ranks
before adding its bias, once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.engine.distributed.sharding import ShardSpec
from loraplex.engine.distributed.tp_group import TPGroup
from loraplex.engine.model.forward_context import ForwardContext
from loraplex.engine.model.quant.fp8 import Fp8LinearMethod
from loraplex.engine.model.quant.linear_method import LinearMethod, QuantizedInput
from loraplex.engine.model.quant.method_factory import create_linear_method
from loraplex.engine.model.quant.quant_config import QuantConfig


class MergedLinear(nn.Module):
    """y = x @ W.T (+ b), then the step's LoRA deltas, if any, added in place."""

    weight: torch.Tensor  # dense and FP8: [output_size, input_size] (4-bit: see quant/int4.py)

    def __init__(
        self,
        layer_idx: int,
        input_size: int,
        slice_names: tuple[str, ...],
        slice_sizes: tuple[int, ...],
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
        quant: QuantConfig | None = None,
        shards: tuple[ShardSpec, ...] | None = None,
        reduce: TPGroup | None = None,
    ) -> None:
        """`shards`: per slice, the checkpoint range this rank holds (None: all of it);
        `reduce`: row-parallel, the group its partial outputs are summed over."""
        super().__init__()
        assert len(slice_names) == len(slice_sizes) > 0
        assert shards is None or len(shards) == len(slice_names)
        assert quant is None or shards is None, "quantized layers are not sharded"
        self.layer_idx = layer_idx
        self.input_size = input_size
        self.slice_names = slice_names
        self.slice_sizes = slice_sizes
        self.output_size = sum(slice_sizes)
        self.shards = shards
        self.reduce = reduce
        self.method = create_linear_method(quant)
        self.method.create_weights(self, dtype, device)
        self.bias: nn.Parameter | None = None
        if bias:
            self.bias = nn.Parameter(
                torch.empty(self.output_size, dtype=dtype, device=device), requires_grad=False
            )

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    def slice_range(self, name: str) -> tuple[int, int]:
        """(first row, number of rows) of the named projection in the fused weight."""
        start = 0
        for slice_name, size in zip(self.slice_names, self.slice_sizes, strict=True):
            if slice_name == name:
                return start, size
            start += size
        raise KeyError(f"{name!r} is not a slice of {self.slice_names}")

    @property
    def takes_fp8_input(self) -> bool:
        """Whether a QuantizedInput of x (FP8 per token) saves this layer quantizing x itself."""
        return self.method.takes_fp8_input

    def forward(
        self,
        x: torch.Tensor | None,
        ctx: ForwardContext,
        residual: torch.Tensor | None = None,
        quantized: QuantizedInput | None = None,
    ) -> torch.Tensor:
        """x [T, input_size] -> [T, output_size]

        x may be None when `quantized` holds it and the step has no adapters (ctx.lora is None):
        an FP8 layer's GEMM reads only the FP8 copy, so the op before need not write x.

        `residual` [T, output_size]: the residual stream that the caller adds y to next (o_proj,
        down_proj). The LoRA deltas then go into it (in place) rather than into y: the sum is the
        same, and the whole LoRA, not only its shrink, may run beside the GEMM.
        """
        if ctx.lora is None:
            return self._linear(x, quantized)
        assert x is not None, "the LoRA shrink reads x"
        # The shrink only reads x, so it may run beside the base GEMM (on a side stream).
        shrunk = ctx.lora.begin(
            self.layer_idx, self.slice_names, self.slice_sizes, x, delta_into=residual
        )
        y = self._linear(x, quantized)
        ctx.lora.finish(shrunk, y)
        return y

    def forward_unexpanded(
        self, x: torch.Tensor | None, ctx: ForwardContext, quantized: QuantizedInput | None = None
    ) -> tuple[torch.Tensor, Any]:
        """(y = x @ W.T (+ b) without the LoRA deltas, the step's shrink of x over every slice,
        an opaque handle, or None): for a consumer that adds the deltas itself (`LoRABatch.silu_and_mul`)."""
        if ctx.lora is None:
            return self._linear(x, quantized), None
        assert x is not None, "the LoRA shrink reads x"
        shrunk = ctx.lora.begin(
            self.layer_idx, self.slice_names, self.slice_sizes, x, all_slices=True
        )
        return self._linear(x, quantized), shrunk

    def _linear(
        self, x: torch.Tensor | None, quantized: QuantizedInput | None = None
    ) -> torch.Tensor:
        if x is None:  # FP8 input alone (see forward)
            assert quantized is not None and isinstance(self.method, Fp8LinearMethod)
            y = self.method.apply_quantized(quantized)
        elif self.reduce is not None:  # row-parallel: partial sums, then the bias once
            y = self.reduce.all_reduce(self.method.apply(x, quantized))
        elif type(self.method) is LinearMethod:  # dense: one fused GEMM + bias
            return F.linear(x, self.weight, self.bias)
        else:
            y = self.method.apply(x, quantized)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (
            f"layer={self.layer_idx}, in={self.input_size}, "
            f"slices={dict(zip(self.slice_names, self.slice_sizes, strict=True))}, "
            f"bias={self.bias is not None}, method={type(self.method).__name__}"
        )
