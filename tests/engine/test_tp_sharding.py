"""Tensor-parallel sharding arithmetic (engine/distributed/sharding.py) and its config checks:
no process is started here."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from loraplex.engine.config import EngineConfig, LoRAConfig, ModelConfig, ParallelConfig
from loraplex.engine.distributed import ShardSpec, create_tp_layout, take_shard
from loraplex.engine.distributed.lora_sharding import shard_adapter, shard_module_shapes
from loraplex.engine.distributed.sharding import as_dim
from loraplex.engine.errors import ConfigError
from loraplex.engine.lora.adapter import LoRAAdapter, lora_module_shapes
from loraplex.engine.model.hf_config import ModelArchConfig


def make_arch(
    heads: int = 8, kv_heads: int = 2, inter: int = 96, vocab: int = 101
) -> ModelArchConfig:
    return ModelArchConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": heads * 4,
            "intermediate_size": inter,
            "num_hidden_layers": 1,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "vocab_size": vocab,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 64,
        }
    )


def gather(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    return torch.cat(parts, dim=dim)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_column_and_row_shards_round_trip(world_size: int) -> None:
    arch = make_arch()
    layouts = [create_tp_layout(arch, r, world_size) for r in range(world_size)]
    q = torch.randn(arch.q_size, arch.hidden_size)
    gate = torch.randn(arch.intermediate_size, arch.hidden_size)
    down = torch.randn(arch.hidden_size, arch.intermediate_size)
    assert torch.equal(gather([take_shard(q, lay.q_shard) for lay in layouts], 0), q)
    assert torch.equal(
        gather([take_shard(gate, lay.intermediate_shard) for lay in layouts], 0), gate
    )
    down_parts = [take_shard(down, as_dim(lay.intermediate_shard, 1)) for lay in layouts]
    assert torch.equal(gather(down_parts, 1), down)
    # Row-parallel: the partial products sum to the whole one (what the all-reduce does).
    x = torch.randn(3, arch.intermediate_size)
    x_parts = [take_shard(x, as_dim(lay.intermediate_shard, 1)) for lay in layouts]
    total = sum(xp @ dp.T for xp, dp in zip(x_parts, down_parts, strict=True))
    torch.testing.assert_close(total, x @ down.T)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_vocab_shards_pad_the_last_rank_and_gather_back(world_size: int) -> None:
    arch = make_arch(heads=12, kv_heads=12, inter=96, vocab=101)
    layouts = [create_tp_layout(arch, r, world_size) for r in range(world_size)]
    padded = layouts[0].vocab_padded
    assert all(lay.vocab_padded == padded for lay in layouts) and padded * world_size >= 101
    assert [lay.vocab_shard.start for lay in layouts] == [r * padded for r in range(world_size)]
    assert sum(lay.vocab_shard.size for lay in layouts) == 101
    embed = torch.randn(101, 4)
    padded_parts = []
    for lay in layouts:  # what each rank holds: its rows, zeros after them
        part = torch.zeros(padded, 4)
        part[: lay.vocab_shard.size] = take_shard(embed, lay.vocab_shard)
        padded_parts.append(part)
    logits = gather([torch.ones(2, 4) @ p.T for p in padded_parts], -1)[:, :101]
    torch.testing.assert_close(logits, torch.ones(2, 4) @ embed.T)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "world_size"),
    [(8, 2, 2), (8, 8, 4), (8, 2, 4), (8, 1, 2), (8, 2, 8), (8, 4, 8)],
)
def test_each_rank_holds_the_kv_heads_its_query_heads_use(
    heads: int, kv_heads: int, world_size: int
) -> None:
    """HF's grouping: query head h attends to KV head h // (heads / kv_heads). Replicated
    when kv_heads < world_size: one KV head per rank, shared by world_size / kv_heads ranks."""
    arch = make_arch(heads=heads, kv_heads=kv_heads)
    seen_kv = set()
    for rank in range(world_size):
        lay = create_tp_layout(arch, rank, world_size)
        assert lay.num_kv_heads == max(1, kv_heads // world_size)
        first_kv = lay.kv_shard.start // arch.head_dim
        local_group = lay.num_heads // lay.num_kv_heads
        for i in range(lay.num_heads):
            global_q = rank * lay.num_heads + i
            assert first_kv + i // local_group == global_q // (heads // kv_heads)
        seen_kv.update(range(first_kv, first_kv + lay.num_kv_heads))
    assert seen_kv == set(range(kv_heads))


@pytest.mark.parametrize(
    ("arch_kwargs", "world_size", "message"),
    [
        ({"heads": 6, "kv_heads": 6}, 4, "num_attention_heads"),
        ({"heads": 6, "kv_heads": 3}, 2, "num_key_value_heads"),
        ({"heads": 8, "kv_heads": 8, "inter": 90}, 4, "intermediate_size"),
    ],
)
def test_a_model_that_does_not_divide_is_a_config_error(
    arch_kwargs: dict[str, int], world_size: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        create_tp_layout(make_arch(**arch_kwargs), 0, world_size)


def test_the_engine_config_rejects_what_tensor_parallelism_does_not_support_yet() -> None:
    model = ModelConfig("m")
    with pytest.raises(ConfigError, match="integer > 0"):
        ParallelConfig(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="quantized"):
        EngineConfig(replace(model, quantization="fp8"), parallel=ParallelConfig(2))
    config = EngineConfig(model, lora=LoRAConfig(), parallel=ParallelConfig(2))
    assert config.parallel.tensor_parallel_size == 2 and config.lora.enable_lora
    assert EngineConfig(model).parallel == ParallelConfig(1)


def test_shard_spec_is_a_range_along_one_dim() -> None:
    t = torch.arange(12).view(3, 4)
    assert take_shard(t, ShardSpec(1, 1, 2, 4)).tolist() == [[1, 2], [5, 6], [9, 10]]


def test_adapter_shards_follow_the_layers() -> None:
    """Column-parallel slices: B's rows of the rank's outputs (A whole); row-parallel: A's
    columns of the rank's inputs (B whole). The shards' shapes are the same on every rank."""
    arch = make_arch(heads=8, kv_heads=2, inter=96)
    shapes = lora_module_shapes(arch)
    weights = {
        (0, m): (torch.randn(4, in_dim), torch.randn(out_dim, 4))
        for m, (in_dim, out_dim) in shapes.items()
    }
    adapter = LoRAAdapter(4, 8.0, 2.0, tuple(shapes), weights, "hash", 0, None)
    layouts = [create_tp_layout(arch, r, 2) for r in range(2)]
    local = [shard_module_shapes(shapes, lay) for lay in layouts]
    assert local[0] == local[1]
    assert local[0]["q_proj"] == (arch.hidden_size, arch.q_size // 2)
    assert local[0]["o_proj"] == (arch.q_size // 2, arch.hidden_size)
    assert local[0]["down_proj"] == (48, arch.hidden_size)
    shards = [shard_adapter(adapter, lay) for lay in layouts]
    for module in ("q_proj", "k_proj", "gate_proj"):
        a, b = weights[(0, module)]
        assert all(torch.equal(s.weights[(0, module)][0], a) for s in shards)
        assert torch.equal(torch.cat([s.weights[(0, module)][1] for s in shards]), b)
    for module in ("o_proj", "down_proj"):
        a, b = weights[(0, module)]
        assert torch.equal(torch.cat([s.weights[(0, module)][0] for s in shards], dim=1), a)
        assert all(torch.equal(s.weights[(0, module)][1], b) for s in shards)
        # The partial shrinks sum to the whole one (the all-reduce in LoRABatch).
        x = torch.randn(3, a.shape[1])
        parts = [
            take_shard(x, as_dim(lay.q_shard if module == "o_proj" else lay.intermediate_shard, 1))
            @ s.weights[(0, module)][0].T
            for lay, s in zip(layouts, shards, strict=True)
        ]
        torch.testing.assert_close(sum(parts), x @ a.T)
    for lay, local_shapes in zip(layouts, local, strict=True):
        for (in_dim, out_dim), module in zip(local_shapes.values(), local_shapes, strict=True):
            a, b = shard_adapter(adapter, lay).weights[(0, module)]
            assert (a.shape[1], b.shape[0]) == (in_dim, out_dim)
