"""Loading safetensors checkpoints into the fused model: single, sharded, tied, and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from loraplex.engine.model import ModelLoadError, load_model, resolve_dtype
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.llama import LlamaForCausalLM


def hf_state(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def assert_matches_hf(model: LlamaForCausalLM, state: dict[str, torch.Tensor]) -> None:
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}"
        attn, mlp = layer.self_attn, layer.mlp
        qkv = torch.cat([state[f"{p}.self_attn.{n}_proj.weight"] for n in "qkv"])
        assert torch.equal(attn.qkv_proj.weight, qkv)
        if attn.qkv_proj.bias is not None:
            qkv_bias = torch.cat([state[f"{p}.self_attn.{n}_proj.bias"] for n in "qkv"])
            assert torch.equal(attn.qkv_proj.bias, qkv_bias)
        assert torch.equal(attn.o_proj.weight, state[f"{p}.self_attn.o_proj.weight"])
        gate_up = torch.cat([state[f"{p}.mlp.gate_proj.weight"], state[f"{p}.mlp.up_proj.weight"]])
        assert torch.equal(mlp.gate_up_proj.weight, gate_up)
        assert torch.equal(mlp.down_proj.weight, state[f"{p}.mlp.down_proj.weight"])
        assert torch.equal(layer.input_layernorm.weight, state[f"{p}.input_layernorm.weight"])
        assert torch.equal(
            layer.post_attention_layernorm.weight, state[f"{p}.post_attention_layernorm.weight"]
        )
    assert torch.equal(model.model.embed_tokens.weight, state["model.embed_tokens.weight"])
    assert torch.equal(model.model.norm.weight, state["model.norm.weight"])
    assert torch.equal(model.lm_head_weight, state["lm_head.weight"])


@pytest.mark.parametrize("fixture", ["llama_checkpoint", "qwen2_checkpoint", "mistral_checkpoint"])
def test_single_file_checkpoint(fixture: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(fixture)
    model, arch = load_model(path, dtype="float32", device="cpu")
    assert arch == ModelArchConfig.from_model_dir(path)
    assert not model.training
    assert model.model.layers[0].self_attn.qkv_proj.slice_names == ("q_proj", "k_proj", "v_proj")
    assert (model.model.layers[0].self_attn.qkv_proj.bias is not None) == (
        arch.model_type == "qwen2"
    )
    assert_matches_hf(model, hf_state(path))


def test_sharded_checkpoint(llama_checkpoint: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    hf = AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=torch.float32)
    hf.save_pretrained(sharded, max_shard_size="100KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(llama_checkpoint / name, sharded / name)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 2
    model, _ = load_model(sharded, dtype="float32", device="cpu")
    assert_matches_hf(model, hf.state_dict())


def test_sharded_checkpoint_missing_shard(llama_checkpoint: Path, tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(llama_checkpoint).save_pretrained(
        sharded, max_shard_size="100KB"
    )
    shutil.copy(llama_checkpoint / "tokenizer.json", sharded / "tokenizer.json")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    (sharded / victim).unlink()
    with pytest.raises(ModelLoadError, match=victim):
        load_model(sharded, dtype="float32", device="cpu")


def test_tied_embeddings(tied_llama_checkpoint: Path) -> None:
    assert "lm_head.weight" not in load_file(tied_llama_checkpoint / "model.safetensors")
    model, arch = load_model(tied_llama_checkpoint, dtype="float32", device="cpu")
    assert arch.tie_word_embeddings and model.lm_head is None
    assert model.lm_head_weight is model.model.embed_tokens.weight
    assert_matches_hf(model, hf_state(tied_llama_checkpoint))


def test_tied_checkpoint_that_still_saves_lm_head(
    tied_llama_checkpoint: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tied_llama_checkpoint, copy)
    tensors = load_file(copy / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors["model.rotary_emb.inv_freq"] = torch.ones(8)  # old checkpoints saved this buffer
    save_file(tensors, copy / "model.safetensors")
    model, _ = load_model(copy, dtype="float32", device="cpu")
    assert model.lm_head is None


def _edit_checkpoint(src: Path, dst: Path, name: str, tensor: torch.Tensor | None) -> Path:
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    if tensor is None:
        del tensors[name]
    else:
        tensors[name] = tensor
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_missing_tensor(llama_checkpoint: Path, tmp_path: Path) -> None:
    name = "model.layers.1.self_attn.v_proj.weight"
    path = _edit_checkpoint(llama_checkpoint, tmp_path / "c", name, None)
    with pytest.raises(ModelLoadError, match=f"missing tensors: {name}"):
        load_model(path, dtype="float32", device="cpu")


def test_unexpected_tensor(llama_checkpoint: Path, tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.q_norm.weight"
    path = _edit_checkpoint(llama_checkpoint, tmp_path / "c", name, torch.ones(16))
    with pytest.raises(ModelLoadError, match=f"unexpected tensors: {name}"):
        load_model(path, dtype="float32", device="cpu")


def test_misshaped_tensor(llama_checkpoint: Path, tmp_path: Path) -> None:
    name = "model.layers.0.mlp.up_proj.weight"
    path = _edit_checkpoint(llama_checkpoint, tmp_path / "c", name, torch.ones(64, 64))
    with pytest.raises(ModelLoadError, match=rf"{name}.*\[64, 64\].*\[128, 64\]"):
        load_model(path, dtype="float32", device="cpu")


def test_dtype_resolution(llama_checkpoint: Path) -> None:
    arch = ModelArchConfig.from_model_dir(llama_checkpoint)
    bf16_arch = ModelArchConfig.from_dict(
        {**json.loads((llama_checkpoint / "config.json").read_text()), "dtype": "bfloat16"}
    )
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", bf16_arch, cpu) == torch.float32
    assert resolve_dtype("auto", bf16_arch, cuda) == torch.bfloat16
    assert resolve_dtype("auto", arch, cuda) == torch.float32
    assert resolve_dtype("float16", arch, cpu) == torch.float16
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int8", arch, cpu)
    model, _ = load_model(llama_checkpoint, dtype="bfloat16", device="cpu")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert next(model.parameters()).device == cpu
