"""Tensor parallelism: sharding arithmetic, the process group, the workers (docs/tensor_parallel.md)."""

from loraplex.engine.distributed.sharding import (
    ShardSpec,
    TPLayout,
    create_tp_layout,
    take_shard,
    validate_tensor_parallel,
)
from loraplex.engine.distributed.tp_group import TensorParallel, TPGroup

__all__ = [
    "ShardSpec",
    "TPGroup",
    "TPLayout",
    "TensorParallel",
    "create_tp_layout",
    "take_shard",
    "validate_tensor_parallel",
]
