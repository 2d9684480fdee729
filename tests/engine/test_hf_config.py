"""Parsing config.json into ModelArchConfig: families, rope layouts, errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from loraplex.engine.model.hf_config import (
    ModelArchConfig,
    ModelLoadError,
    RopeConfig,
    UnsupportedModelError,
    validate_model_dir,
)
from loraplex.engine.model.rotary import compute_inv_freq

LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def llama_config(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
    }
    config.update(overrides)
    return config


def test_llama31_old_rope_layout() -> None:
    arch = ModelArchConfig.from_dict(llama_config(rope_theta=500000.0, rope_scaling=LLAMA3_SCALING))
    assert (arch.model_type, arch.head_dim, arch.q_size, arch.kv_size) == ("llama", 128, 4096, 1024)
    assert arch.rope == RopeConfig(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert arch.torch_dtype == "bfloat16"
    assert arch.eos_token_ids == (128001, 128008, 128009) and arch.bos_token_id == 128000
    assert not arch.qkv_bias and not arch.o_proj_bias and not arch.mlp_bias
    assert arch.sliding_windows == (None,) * 32 and arch.sliding_window is None


def test_new_rope_parameters_layout_parses_the_same() -> None:
    old = ModelArchConfig.from_dict(llama_config(rope_theta=500000.0, rope_scaling=LLAMA3_SCALING))
    new = ModelArchConfig.from_dict(
        llama_config(dtype="bfloat16", rope_parameters={**LLAMA3_SCALING, "rope_theta": 500000.0})
    )
    assert new == old


def test_legacy_type_key_and_defaults() -> None:
    linear = ModelArchConfig.from_dict(llama_config(rope_scaling={"type": "linear", "factor": 2}))
    assert (linear.rope.rope_type, linear.rope.factor, linear.rope.rope_theta) == (
        "linear",
        2.0,
        10000.0,
    )
    plain = ModelArchConfig.from_dict(llama_config(rope_scaling=None, eos_token_id=2))
    assert plain.rope == RopeConfig() and plain.eos_token_ids == (2,)
    assert plain.torch_dtype == "bfloat16"


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        {**LLAMA3_SCALING, "rope_theta": 500000.0},
        {
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    ],
)
def test_inv_freq_matches_transformers(rope: dict[str, Any]) -> None:
    config: dict[str, Any] = dict(
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        rope_parameters=dict(rope),
    )
    hf_config = LlamaConfig(**config)
    rope_type = rope["rope_type"]
    if rope_type == "default":
        expected = 1.0 / (10000.0 ** (torch.arange(0, 128, 2, dtype=torch.float) / 128))
        expected_scale = 1.0
    else:
        expected, expected_scale = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))
    arch = ModelArchConfig.from_dict(llama_config(**config))
    inv_freq, scale = compute_inv_freq(arch.rope, arch.head_dim)
    torch.testing.assert_close(inv_freq, expected, atol=0, rtol=0)
    assert scale == pytest.approx(expected_scale)


def test_mistral_sliding_window_and_explicit_head_dim() -> None:
    arch = ModelArchConfig.from_dict(
        llama_config(
            architectures=["MistralForCausalLM"],
            hidden_size=5120,
            head_dim=128,
            num_hidden_layers=4,
            sliding_window=4096,
            rope_theta=1000000.0,
        )
    )
    assert arch.model_type == "mistral" and arch.head_dim == 128 and arch.q_size == 4096
    assert arch.sliding_windows == (4096,) * 4 and arch.sliding_window == 4096
    assert (
        ModelArchConfig.from_dict(
            llama_config(architectures=["MistralForCausalLM"], sliding_window=None)
        ).sliding_window
        is None
    )


def test_qwen2_bias_and_sliding_layers() -> None:
    base = llama_config(
        architectures=["Qwen2ForCausalLM"],
        num_hidden_layers=4,
        sliding_window=32768,
        max_window_layers=2,
        tie_word_embeddings=True,
    )
    arch = ModelArchConfig.from_dict({**base, "use_sliding_window": False})
    assert arch.qkv_bias and not arch.o_proj_bias and arch.tie_word_embeddings
    assert arch.sliding_windows == (None,) * 4
    windowed = ModelArchConfig.from_dict({**base, "use_sliding_window": True})
    assert windowed.sliding_windows == (None, None, 32768, 32768)
    listed = ModelArchConfig.from_dict(
        {
            **base,
            "use_sliding_window": True,
            "layer_types": [
                "sliding_attention",
                "full_attention",
                "full_attention",
                "sliding_attention",
            ],
        }
    )
    assert listed.sliding_windows == (32768, None, None, 32768)


def test_llama_attention_bias_covers_o_proj() -> None:
    arch = ModelArchConfig.from_dict(llama_config(attention_bias=True, mlp_bias=True))
    assert arch.qkv_bias and arch.o_proj_bias and arch.mlp_bias


def test_unsupported_architecture_names_it_and_the_supported_ones() -> None:
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel") as info:
        ModelArchConfig.from_dict(llama_config(architectures=["GPT2LMHeadModel"]))
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "longrope"),
        ({"hidden_act": "gelu"}, "gelu"),
    ],
)
def test_unsupported_features(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        ModelArchConfig.from_dict(llama_config(**overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"num_key_value_heads": 5}, "multiple"),
        ({"rope_scaling": {"rope_type": "linear"}}, "factor"),
    ],
)
def test_malformed_config(overrides: dict[str, Any], message: str) -> None:
    config = llama_config(**overrides)
    if overrides.get("hidden_size", 0) is None:
        del config["hidden_size"]
    with pytest.raises(ModelLoadError, match=message):
        ModelArchConfig.from_dict(config)


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        validate_model_dir(tmp_path / "nope")
    with pytest.raises(ModelLoadError) as info:
        validate_model_dir(tmp_path)
    for name in ("config.json", "tokenizer.json", "safetensors"):
        assert name in str(info.value)
    (tmp_path / "config.json").write_text(json.dumps(llama_config()))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="tokenizer.json") as info:
        validate_model_dir(tmp_path)
    assert "config.json" not in str(info.value)
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        ModelArchConfig.from_model_dir(tmp_path / "nope")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert validate_model_dir(tmp_path) == tmp_path
    assert ModelArchConfig.from_model_dir(tmp_path).vocab_size == 128256
