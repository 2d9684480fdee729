"""Each tensor-parallel rank loads only its shard, straight from the safetensors files, and the
shards are the right slices of the checkpoint. No process is started: loading needs no
collective, so a rank's model is built here with a group it never uses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from loraplex.engine import LLM
from loraplex.engine.distributed import TensorParallel, TPGroup, create_tp_layout
from loraplex.engine.errors import ConfigError
from loraplex.engine.model import weight_loader
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.weight_loader import load_model
from tests.checkpoints import CheckpointFactory

TP = 2


def rank_share(checkpoint: Path, rank: int) -> TensorParallel:
    arch = ModelArchConfig.from_model_dir(checkpoint)
    return TensorParallel(TPGroup(rank, TP), create_tp_layout(arch, rank, TP))


@pytest.mark.parametrize(
    ("arch_name", "kwargs"),
    [
        ("llama", {"num_heads": 4, "num_kv_heads": 1, "vocab_size": 501}),
        ("qwen2", {"num_kv_heads": 2, "tie_word_embeddings": True}),
    ],
    ids=["llama-mqa-odd-vocab", "qwen2-bias-tied"],
)
def test_each_rank_holds_its_slices_of_the_checkpoint(
    arch_name: str,
    kwargs: dict[str, object],
    checkpoint_factory: CheckpointFactory,
) -> None:
    checkpoint = checkpoint_factory(arch_name, **kwargs)
    full = load_file(str(checkpoint / "model.safetensors"))
    for rank in range(TP):
        tp = rank_share(checkpoint, rank)
        model, arch = load_model(checkpoint, "float32", "cpu", tp=tp)
        lay = tp.layout
        q, kv, inter = lay.q_shard, lay.kv_shard, lay.intermediate_shard
        attn = model.model.layers[1].self_attn
        prefix = "model.layers.1.self_attn"
        qkv = attn.qkv_proj.weight
        assert qkv.shape == (lay.q_size + 2 * lay.kv_size, arch.hidden_size)
        w = full[f"{prefix}.q_proj.weight"][q.start : q.start + q.size]
        assert torch.equal(qkv[: lay.q_size], w)
        k = full[f"{prefix}.k_proj.weight"][kv.start : kv.start + kv.size]
        assert torch.equal(qkv[lay.q_size : lay.q_size + lay.kv_size], k)
        o = full[f"{prefix}.o_proj.weight"][:, q.start : q.start + q.size]
        assert torch.equal(attn.o_proj.weight, o)
        if arch.qkv_bias:
            bias = full[f"{prefix}.v_proj.bias"][kv.start : kv.start + kv.size]
            assert torch.equal(attn.qkv_proj.bias[lay.q_size + lay.kv_size :], bias)
        mlp = model.model.layers[1].mlp
        up = full["model.layers.1.mlp.up_proj.weight"][inter.start : inter.start + inter.size]
        assert torch.equal(mlp.gate_up_proj.weight[lay.intermediate_size :], up)
        down = full["model.layers.1.mlp.down_proj.weight"][
            :, inter.start : inter.start + inter.size
        ]
        assert torch.equal(mlp.down_proj.weight, down)
        vocab = lay.vocab_shard
        embed = model.model.embed_tokens.weight
        assert embed.shape[0] == lay.vocab_padded
        rows = full["model.embed_tokens.weight"][vocab.start : vocab.start + vocab.size]
        assert torch.equal(embed[: vocab.size], rows)
        assert not embed[vocab.size :].any(), "the padding rows stay zero"
        if model.lm_head is not None:
            rows = full["lm_head.weight"][vocab.start : vocab.start + vocab.size]
            assert torch.equal(model.lm_head[: vocab.size], rows)
        # Norms are whole on every rank.
        norm = full["model.layers.1.input_layernorm.weight"]
        assert torch.equal(model.model.layers[1].input_layernorm.weight, norm)


def test_sharded_tensors_are_read_as_slices_never_whole(
    checkpoint_factory: CheckpointFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the norms (replicated) are read whole; every sharded tensor through get_slice."""
    checkpoint = checkpoint_factory("llama", num_heads=4, num_kv_heads=1, vocab_size=501)
    whole: list[str] = []

    class Spy:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __enter__(self) -> Spy:
            self.handle = self.inner.__enter__()  # type: ignore[attr-defined]
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)  # type: ignore[attr-defined]

        def keys(self) -> list[str]:
            return self.handle.keys()

        def get_slice(self, name: str) -> object:
            return self.handle.get_slice(name)

        def get_tensor(self, name: str) -> torch.Tensor:
            whole.append(name)
            return self.handle.get_tensor(name)

    monkeypatch.setattr(weight_loader, "safe_open", lambda *a, **k: Spy(safe_open(*a, **k)))
    load_model(checkpoint, "float32", "cpu", tp=rank_share(checkpoint, 1))
    assert whole and all(name.endswith("norm.weight") for name in whole), whole


def test_what_tensor_parallelism_cannot_run_fails_before_any_process_starts(
    checkpoint_factory: CheckpointFactory, tmp_path: Path
) -> None:
    checkpoint = checkpoint_factory("llama", num_heads=4, num_kv_heads=2)
    with pytest.raises(ConfigError, match="num_attention_heads"):
        LLM(str(checkpoint), device="cpu", enable_lora=False, tensor_parallel_size=3)
    # A checkpoint whose config.json names a quantization.
    quantized = tmp_path / "awq"
    shutil.copytree(checkpoint, quantized)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True
    }  # fmt: skip
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="quantized"):
        LLM(str(quantized), device="cpu", enable_lora=False, tensor_parallel_size=2)
