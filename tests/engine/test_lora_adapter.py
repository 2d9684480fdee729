"""PEFT LoRA loading: real adapters load exactly; every malformed adapter fails with a reason.

Malformed safetensors files: test_safetensors_header.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from loraplex.engine.lora.adapter import LoRAAdapter, load_lora_adapter
from tests.engine.adapter_files import (
    ALL_MODULES,
    ARCH,
    PREFIX,
    edit_config,
    edit_weights,
    expect_invalid,
    save_adapter,
)

# ---- real PEFT adapters --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("r", "targets", "rslora"),
    [
        (4, ["q_proj", "v_proj"], False),
        (8, ["k_proj", "o_proj", "up_proj"], True),
        (16, ["gate_proj", "down_proj"], False),
        (64, ALL_MODULES, True),
        (32, "all-linear", False),
    ],
)
def test_load_matches_peft(tmp_path: Path, r: int, targets: list[str] | str, rslora: bool) -> None:
    alpha = 2.0 * r + 3
    model = save_adapter(tmp_path, targets, r=r, alpha=alpha, rslora=rslora)
    adapter = load_lora_adapter(tmp_path, ARCH, max_lora_rank=64)

    expected_targets = ALL_MODULES if targets == "all-linear" else targets
    assert adapter.rank == r and adapter.lora_alpha == alpha
    assert adapter.target_modules == tuple(m for m in ALL_MODULES if m in expected_targets)
    want_scaling = alpha / math.sqrt(r) if rslora else alpha / r
    assert math.isclose(adapter.scaling, want_scaling)
    layer0 = model.base_model.model.model.layers[0]
    some = adapter.target_modules[0]
    peft_module = getattr(
        layer0.self_attn if some.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else layer0.mlp,
        some,
    )
    assert math.isclose(adapter.scaling, peft_module.scaling["default"])

    state = model.state_dict()
    assert set(adapter.weights) == {(i, m) for i in range(2) for m in adapter.target_modules}
    for (layer, module), (a, b) in adapter.weights.items():
        block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        key = f"{PREFIX}.{layer}.{block}.{module}"
        assert a.dtype == b.dtype == state[f"{key}.lora_A.default.weight"].dtype
        assert a.device.type == "cpu"
        assert torch.equal(a, state[f"{key}.lora_A.default.weight"])
        assert torch.equal(b, state[f"{key}.lora_B.default.weight"])
    assert adapter.size_bytes == sum(
        (tmp_path / f).stat().st_size for f in ("adapter_config.json", "adapter_model.safetensors")
    )


def test_delta_equals_peft_layer_output(tmp_path: Path) -> None:
    model = save_adapter(tmp_path, ["q_proj", "down_proj"], r=8, alpha=5, rslora=True)
    adapter = load_lora_adapter(tmp_path, ARCH, max_lora_rank=64)
    layer1 = model.base_model.model.model.layers[1]
    for module, peft_layer in (
        ("q_proj", layer1.self_attn.q_proj),
        ("down_proj", layer1.mlp.down_proj),
    ):
        a, b = adapter.weights[(1, module)]
        x = torch.randn(3, a.shape[1])  # [num_tokens, in_dim]
        with torch.no_grad():
            delta = peft_layer(x) - peft_layer.base_layer(x)
        torch.testing.assert_close(adapter.scaling * (x @ a.T) @ b.T, delta)


def test_half_precision_weights_keep_their_dtype(bad_dir: Path) -> None:
    original = load_file(str(bad_dir / "adapter_model.safetensors"))
    edit_weights(bad_dir, lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}))
    adapter = load_lora_adapter(bad_dir, ARCH, 64)
    a, _ = adapter.weights[(0, "q_proj")]
    assert a.dtype == torch.bfloat16
    assert torch.equal(a, original[f"{PREFIX}.0.self_attn.q_proj.lora_A.weight"].bfloat16())


def test_content_hash(good_dir: Path, bad_dir: Path) -> None:
    base = load_lora_adapter(good_dir, ARCH, 64)
    assert len(base.content_hash) == 64
    # Reformatting the config does not change the hash; changing a weight does.
    config = json.loads((bad_dir / "adapter_config.json").read_text())
    (bad_dir / "adapter_config.json").write_text(json.dumps(config, indent=7))
    assert load_lora_adapter(bad_dir, ARCH, 64).content_hash == base.content_hash
    edit_config(bad_dir, lora_alpha=9)
    assert load_lora_adapter(bad_dir, ARCH, 64).content_hash != base.content_hash
    edit_config(bad_dir, lora_alpha=8)
    edit_weights(bad_dir, lambda t: t[f"{PREFIX}.0.mlp.down_proj.lora_B.weight"].mul_(2))
    assert load_lora_adapter(bad_dir, ARCH, 64).content_hash != base.content_hash


def test_a_registered_hash_is_kept_not_recomputed(good_dir: Path) -> None:
    adapter: LoRAAdapter = load_lora_adapter(str(good_dir), ARCH, 64, content_hash="f" * 64)
    assert adapter.content_hash == "f" * 64


# ---- files ---------------------------------------------------------------------------------


def test_pickle_bin_only_rejected(tmp_path: Path, good_dir: Path) -> None:
    shutil.copy(good_dir / "adapter_config.json", tmp_path)
    (tmp_path / "adapter_model.bin").write_bytes(b"\x80\x04\x95pickle")
    expect_invalid(tmp_path, "pickle", "adapter_model.bin")


@pytest.mark.parametrize("name", ["adapter_model.bin", "extra.pt", "x.pkl", "w.pth"])
def test_any_pickle_file_rejected(bad_dir: Path, name: str) -> None:
    (bad_dir / name).write_bytes(b"\x80\x04")
    expect_invalid(bad_dir, "pickle", name)


@pytest.mark.parametrize("missing", ["adapter_config.json", "adapter_model.safetensors"])
def test_missing_file(bad_dir: Path, missing: str) -> None:
    (bad_dir / missing).unlink()
    expect_invalid(bad_dir, "missing", missing)


def test_not_a_directory(tmp_path: Path) -> None:
    expect_invalid(tmp_path / "nope", "not a directory")


# ---- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"[" * 30_000 + b"]" * 30_000, "not valid JSON"),  # nesting bomb
        (b'{"r": 4, "r": 8, "peft_type": "LORA"}', "duplicate key 'r'"),
        (
            b'{"peft_type": "LORA", "r": 4, "lora_alpha": NaN, "target_modules": ["q_proj"]}',
            "non-finite",
        ),
        (b'{"pad": "' + b"x" * 70_000 + b'"}', "limit is 65536"),
    ],
)
def test_config_malformed(bad_dir: Path, text: bytes, fragment: str) -> None:
    (bad_dir / "adapter_config.json").write_bytes(text)
    expect_invalid(bad_dir, fragment)


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        ({"peft_type": "IA3"}, ("peft_type must be 'LORA'",)),
        ({"peft_type": None}, ("peft_type must be 'LORA'",)),
        ({"use_dora": True}, ("DoRA",)),
        ({"modules_to_save": ["lm_head"]}, ("modules_to_save",)),
        ({"bias": "all"}, ("bias must be 'none'", "'all'")),
        ({"bias": "lora_only"}, ("bias must be 'none'",)),
        ({"lora_bias": True}, ("lora_bias",)),
        ({"r": 0}, ("r must be a positive integer",)),
        ({"r": 4.0}, ("r must be a positive integer",)),
        ({"r": True}, ("r must be a positive integer",)),
        ({"r": "4"}, ("r must be a positive integer",)),
        ({"lora_alpha": -1}, ("lora_alpha must be a positive finite number",)),
        ({"lora_alpha": 0}, ("lora_alpha must be a positive finite number",)),
        ({"lora_alpha": "16"}, ("lora_alpha must be a positive finite number",)),
        ({"lora_alpha": 1e400}, ("non-finite",)),  # json.dumps writes Infinity
        ({"use_rslora": "yes"}, ("use_rslora",)),
        ({"target_modules": ["q_proj", "embed_tokens"]}, ("'embed_tokens' not supported",)),
        ({"target_modules": ["lm_head"]}, ("'lm_head' not supported",)),
        ({"target_modules": ["q_proj", "rotary_emb"]}, ("'rotary_emb' not supported",)),
        ({"target_modules": []}, ("non-empty list",)),
        ({"target_modules": None}, ("non-empty list",)),
        ({"target_modules": ".*(q_proj|v_proj)"}, ("regex string", "not supported")),
        ({"target_modules": ["model.layers.0.q_proj"]}, ("entry 'model.layers.0.q_proj'",)),
        ({"target_modules": ["mlp.q_proj"]}, ("entry 'mlp.q_proj'",)),
        (
            {"target_modules": ["model.layers.0.self_attn.q_proj", "v_proj", "down_proj"]},
            ("q_proj for layers [0] only", "subset"),
        ),
        ({"layers_to_transform": [0]}, ("layers_to_transform", "not supported")),
        ({"rank_pattern": {"q_proj": 8}}, ("rank_pattern", "not supported")),
        ({"alpha_pattern": {"q_proj": 8}}, ("alpha_pattern", "not supported")),
        ({"fan_in_fan_out": True}, ("fan_in_fan_out",)),
        ({"trainable_token_indices": [1, 2]}, ("trainable_token_indices",)),
    ],
)
def test_config_rejected(
    bad_dir: Path, changes: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    edit_config(bad_dir, **changes)
    expect_invalid(bad_dir, *fragments)


def test_target_module_paths_covering_every_layer(bad_dir: Path) -> None:
    targets = [
        "base_model.model.model.layers.1.self_attn.q_proj",
        "model.layers.0.self_attn.q_proj",
        "self_attn.v_proj",
        "down_proj",
    ]
    edit_config(bad_dir, target_modules=targets)
    adapter = load_lora_adapter(bad_dir, ARCH, 64)
    assert adapter.target_modules == ("q_proj", "v_proj", "down_proj")


def test_rank_above_limit(bad_dir: Path) -> None:
    expect_invalid(bad_dir, "r=4 exceeds max_lora_rank=2", max_lora_rank=2)


def test_real_peft_dora_rejected(tmp_path: Path) -> None:
    save_adapter(tmp_path, ["q_proj"], use_dora=True)
    expect_invalid(tmp_path, "DoRA")


def test_real_peft_embed_tokens_rejected(tmp_path: Path) -> None:
    save_adapter(tmp_path, ["q_proj", "embed_tokens"])
    expect_invalid(tmp_path, "'embed_tokens' not supported")


def test_real_peft_modules_to_save_rejected(tmp_path: Path) -> None:
    save_adapter(tmp_path, ["q_proj"], modules_to_save=["lm_head"])
    expect_invalid(tmp_path, "modules_to_save")


def test_real_peft_bias_all_rejected(tmp_path: Path) -> None:
    save_adapter(tmp_path, ["q_proj"], bias="all")
    expect_invalid(tmp_path, "bias must be 'none'")


# ---- tensors against the base model --------------------------------------------------------


def test_wrong_shape(bad_dir: Path) -> None:
    key = f"{PREFIX}.1.self_attn.v_proj.lora_B.weight"
    edit_weights(bad_dir, lambda t: t.update({key: torch.zeros(17, 4)}))
    expect_invalid(bad_dir, key, "shape [17, 4], expected [16, 4]", "another base model")


def test_rank_differs_from_config(bad_dir: Path) -> None:
    edit_config(bad_dir, r=8)
    expect_invalid(bad_dir, "rank 4 differs from r=8")


def test_adapter_for_another_base_model(tmp_path: Path) -> None:
    save_adapter(tmp_path, ["q_proj"], hidden_size=64)
    expect_invalid(tmp_path, "another base model", "expected [8, 32]")


def test_adapter_with_more_layers(bad_dir: Path) -> None:
    extra = {
        f"{PREFIX}.5.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32),
        f"{PREFIX}.5.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4),
    }
    edit_weights(bad_dir, lambda t: t.update(extra))
    expect_invalid(bad_dir, "layer 5 out of range", "2 layers")


def test_nan_values(bad_dir: Path) -> None:
    edit_weights(
        bad_dir,
        lambda t: t[f"{PREFIX}.1.mlp.down_proj.lora_A.weight"].__setitem__((0, 0), float("nan")),
    )
    expect_invalid(bad_dir, "layer 1 down_proj", "NaN or Inf")


def test_inf_values(bad_dir: Path) -> None:
    edit_weights(
        bad_dir, lambda t: t[f"{PREFIX}.0.self_attn.q_proj.lora_B.weight"].fill_(float("inf"))
    )
    expect_invalid(bad_dir, "lora_B for layer 0 q_proj", "NaN or Inf")


def test_missing_b_for_one_layer(bad_dir: Path) -> None:
    edit_weights(bad_dir, lambda t: t.pop(f"{PREFIX}.1.self_attn.q_proj.lora_B.weight"))
    expect_invalid(bad_dir, "missing lora_B for layer 1 q_proj")


def test_missing_module_in_one_layer(bad_dir: Path) -> None:
    def drop(t: dict[str, torch.Tensor]) -> None:
        for side in "AB":
            t.pop(f"{PREFIX}.0.self_attn.v_proj.lora_{side}.weight")

    edit_weights(bad_dir, drop)
    expect_invalid(bad_dir, "missing lora_A for layer 0 v_proj")


def test_tensor_for_untargeted_module(bad_dir: Path) -> None:
    extra = {f"{PREFIX}.0.self_attn.k_proj.lora_A.weight": torch.zeros(4, 32)}
    edit_weights(bad_dir, lambda t: t.update(extra))
    expect_invalid(bad_dir, "k_proj, which is not in target_modules")


@pytest.mark.parametrize(
    "name",
    [
        f"{PREFIX}.0.self_attn.q_proj.lora_A.default.weight",
        "base_model.model.model.embed_tokens.lora_embedding_A",
        "base_model.model.lm_head.lora_A.weight",
        f"{PREFIX}.0.self_attn.q_proj.lora_magnitude_vector",
        f"{PREFIX}.00.self_attn.q_proj.lora_A.weight",
        f"{PREFIX}.0.mlp.q_proj.lora_A.weight",
    ],
)
def test_unknown_tensor_name(bad_dir: Path, name: str) -> None:
    edit_weights(bad_dir, lambda t: t.update({name: torch.zeros(4, 32)}))
    expect_invalid(bad_dir, "unexpected tensor", name)
