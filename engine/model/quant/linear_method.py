"""How a `MergedLinear` holds and multiplies its weight: dense, FP8 or 4-bit (vLLM's
`LinearMethodBase` pattern). One method object per layer: it creates the layer's weight
parameters (registered on the layer, so `qkv_proj.weight`, `qkv_proj.qweight`, ... are the
layer's own), says which checkpoint tensors fill them (`WeightTarget`), finishes them after
loading, and computes y = x @ W.T without the bias (the layer adds it, then the LoRA deltas).
Parameters are filled in place, never replaced: the method keeps references to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from loraplex.engine.distributed.sharding import ShardSpec

if TYPE_CHECKING:  # the layer imports this module; the method only reads the layer's sizes
    from loraplex.engine.model.linear import MergedLinear

DUMMY_STD = 0.02  # load_format="dummy": weights ~ N(0, DUMMY_STD), as dummy_weights.py
Loader = Callable[[torch.Tensor], object]


@dataclass(frozen=True)
class WeightTarget:
    """What one checkpoint tensor may look like and where it goes.

    `shapes`: the accepted shapes; `dtypes`: the accepted safetensors dtypes ("F16", "I32",
    "F8_E4M3", ...; None: any, converted on copy); `optional`: may be absent.
    """

    shapes: tuple[tuple[int, ...], ...]
    load: Loader
    dtypes: tuple[str, ...] | None = None
    optional: bool = False
    # Tensor parallelism: only this range of the checkpoint tensor is read and loaded.
    shard: ShardSpec | None = None

    @classmethod
    def of_tensor(cls, target: torch.Tensor) -> WeightTarget:
        """A tensor (or a view of one) filled by copying, dtype converted."""
        return cls(shapes=(tuple(target.shape),), load=target.copy_)

    @classmethod
    def of_shard(cls, target: torch.Tensor, shard: ShardSpec) -> WeightTarget:
        """`target` (a rank's share, maybe zero-padded past the shard) filled from `shard` of
        a checkpoint tensor of the full shape."""
        shape = list(target.shape)
        shape[shard.dim] = shard.full
        dest = target.narrow(shard.dim, 0, shard.size)
        return cls(shapes=(tuple(shape),), load=dest.copy_, shard=shard)


def register(
    layer: nn.Module, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> nn.Parameter:
    """A new uninitialized frozen parameter `name` of `layer`."""
    param = nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)
    layer.register_parameter(name, param)
    return param


class QuantizedInput(NamedTuple):
    """A layer's input already quantized to FP8 per token by the op before it."""

    values: torch.Tensor  # [T, input_size] float8_e4m3fn
    scale: torch.Tensor  # [T, 1] float32


class LinearMethod:
    """Dense weights: `weight` [output_size, input_size] in the model's dtype."""

    # Whether `apply` uses a QuantizedInput (FP8 W8A8): the op before may then produce one.
    takes_fp8_input = False

    def create_weights(self, layer: MergedLinear, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = register(
            layer, "weight", (layer.output_size, layer.input_size), dtype, device
        )

    def checkpoint_targets(self, layer: MergedLinear, prefix: str) -> dict[str, WeightTarget]:
        """Checkpoint name -> target, for the layer's slices under `prefix` (e.g.
        "model.layers.0.self_attn"); the bias is the layer's own."""
        targets = {}
        for i, name in enumerate(layer.slice_names):
            start, size = layer.slice_range(name)
            view = self.weight[start : start + size]
            targets[f"{prefix}.{name}.weight"] = (
                WeightTarget.of_tensor(view)
                if layer.shards is None
                else WeightTarget.of_shard(view, layer.shards[i])
            )
        return targets

    def finish_loading(self, layer: MergedLinear) -> None:
        """Called once every tensor of the checkpoint is loaded."""

    @torch.no_grad()
    def fill_dummy(self, generator: torch.Generator) -> None:
        self.weight.normal_(0.0, DUMMY_STD, generator=generator)

    def apply(self, x: torch.Tensor, quantized: QuantizedInput | None = None) -> torch.Tensor:
        """x [T, input_size] -> [T, output_size], no bias. `quantized`: x as FP8, for the
        methods that take it (ignored by the others)."""
        return F.linear(x, self.weight)
