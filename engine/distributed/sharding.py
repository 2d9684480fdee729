"""Megatron-style sharding arithmetic: which part of each checkpoint tensor a rank holds.

    column-parallel (qkv_proj, gate_up_proj): rank r holds rows r*n/N .. (r+1)*n/N of each
        slice (its heads / its intermediate columns); no collective.
    row-parallel (o_proj, down_proj): rank r holds the matching input columns; the partial
        outputs are summed by one all-reduce.
    vocab-parallel (embed_tokens, lm_head): rank r holds vocab rows [r*V', (r+1)*V'), V' =
        ceil(V / N), the last shard zero-padded; embeddings are summed by one all-reduce, the
        LM head's logits gathered (and the padding cut) for sampling.

GQA with fewer KV heads than ranks: every rank holds one KV head, replicated on N / num_kv
ranks; rank r's query heads are exactly those that attend to KV head r // (N / num_kv).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from loraplex.engine.errors import ConfigError

if TYPE_CHECKING:  # the model's layers import this module; only its sizes are read here
    from loraplex.engine.model.hf_config import ModelArchConfig


@dataclass(frozen=True)
class ShardSpec:
    """Rows (`dim` 0) or columns (`dim` 1) [start, start + size) of a checkpoint tensor whose
    length along `dim` is `full`."""

    dim: int
    start: int
    size: int
    full: int


@dataclass(frozen=True)
class TPLayout:
    """One rank's share of the model: local head counts and sizes, and where they start."""

    rank: int
    world_size: int
    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    intermediate_size: int
    head_dim: int
    q_shard: ShardSpec  # rows of q_proj
    kv_shard: ShardSpec  # rows of k_proj and of v_proj
    intermediate_shard: ShardSpec  # rows of gate_proj / up_proj, columns of down_proj
    vocab_shard: ShardSpec  # rows of embed_tokens / lm_head (size: the real rows, <= padded)
    vocab_padded: int  # rows every rank allocates (the shard plus zero padding)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def validate_tensor_parallel(arch: ModelArchConfig, world_size: int) -> None:
    """ConfigError unless the model divides evenly into `world_size` ranks."""
    if world_size == 1:
        return
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    problems = []
    if heads % world_size:
        problems.append(f"num_attention_heads ({heads})")
    if kv_heads % world_size and world_size % kv_heads:
        problems.append(f"num_key_value_heads ({kv_heads}; or be a divisor of it)")
    if arch.intermediate_size % world_size:
        problems.append(f"intermediate_size ({arch.intermediate_size})")
    if problems:
        raise ConfigError(f"tensor_parallel_size={world_size} must divide " + ", ".join(problems))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def create_tp_layout(arch: ModelArchConfig, rank: int, world_size: int) -> TPLayout:
    validate_tensor_parallel(arch, world_size)
    assert 0 <= rank < world_size
    head_dim = arch.head_dim
    num_heads = arch.num_attention_heads // world_size
    kv_heads = arch.num_key_value_heads
    if kv_heads >= world_size:
        num_kv_heads, kv_start = kv_heads // world_size, rank * (kv_heads // world_size)
    else:  # replicated: world_size / kv_heads ranks share each KV head
        num_kv_heads, kv_start = 1, rank // (world_size // kv_heads)
    inter = arch.intermediate_size // world_size
    vocab, padded = arch.vocab_size, cdiv(arch.vocab_size, world_size)
    vocab_start = min(rank * padded, vocab)
    return TPLayout(
        rank=rank,
        world_size=world_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=inter,
        head_dim=head_dim,
        q_shard=ShardSpec(0, rank * num_heads * head_dim, num_heads * head_dim, arch.q_size),
        kv_shard=ShardSpec(0, kv_start * head_dim, num_kv_heads * head_dim, arch.kv_size),
        intermediate_shard=ShardSpec(0, rank * inter, inter, arch.intermediate_size),
        vocab_shard=ShardSpec(0, vocab_start, min(padded, vocab - vocab_start), vocab),
        vocab_padded=padded,
    )


def create_tp_layouts(arch: ModelArchConfig, world_size: int) -> list[TPLayout]:
    """Every rank's share, rank order."""
    return [create_tp_layout(arch, rank, world_size) for rank in range(world_size)]


def take_shard(tensor: torch.Tensor, shard: ShardSpec) -> torch.Tensor:
    """The shard's view of a full tensor (what a rank reads from the checkpoint)."""
    return tensor.narrow(shard.dim, shard.start, shard.size)


def as_dim(shard: ShardSpec, dim: int) -> ShardSpec:
    """The same range along another dimension (down_proj's columns are gate/up's rows)."""
    return ShardSpec(dim, shard.start, shard.size, shard.full)
