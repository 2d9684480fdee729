"""The `quantization` option and config.json's quantization_config -> QuantConfig, and the
typed errors for what is not supported."""

from __future__ import annotations

from typing import Any

import pytest

from loraplex.engine.config import ModelConfig
from loraplex.engine.errors import ConfigError, ModelLoadError
from loraplex.engine.model.quant import (
    Fp8Config,
    Int4Config,
    QuantizationError,
    resolve_quant_config,
)

AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "GEMM", "zero_point": True}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": True}
FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic"}
CT_FP8 = {
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": False},
        }
    },
}


def config_json(quant: dict[str, Any] | None) -> dict[str, Any]:
    return {} if quant is None else {"quantization_config": quant}


def test_no_option_and_no_config_is_unquantized() -> None:
    assert resolve_quant_config(None, {}) is None


def test_fp8_option_quantizes_a_16_bit_checkpoint_online() -> None:
    assert resolve_quant_config("fp8", {}) == Fp8Config(checkpoint_format="online")


@pytest.mark.parametrize("option", [None, "awq"])
def test_awq_is_detected_from_the_checkpoint(option: str | None) -> None:
    assert resolve_quant_config(option, config_json(AWQ)) == Int4Config("awq", 128)


def test_gptq_act_order_and_format() -> None:
    quant = resolve_quant_config(None, config_json(GPTQ))
    assert quant == Int4Config("gptq", 64, desc_act=True, zero_offset=1)
    v2 = resolve_quant_config("gptq", config_json({**GPTQ, "checkpoint_format": "gptq_v2"}))
    assert isinstance(v2, Int4Config) and v2.zero_offset == 0


def test_fp8_checkpoints() -> None:
    assert resolve_quant_config(None, config_json(FP8)) == Fp8Config(checkpoint_format="fp8")
    quant = resolve_quant_config("fp8", config_json(CT_FP8))
    assert quant == Fp8Config(
        "compressed-tensors", weight_scale_per_channel=False, has_input_scale=True
    )


def test_dummy_weights_take_a_4_bit_option_without_config() -> None:
    assert resolve_quant_config("gptq", {}, dummy=True) == Int4Config("gptq", 128)


@pytest.mark.parametrize(
    ("option", "quant", "message"),
    [
        ("int8", None, "unknown quantization 'int8'"),
        (None, {"quant_method": "bitsandbytes"}, "unknown quant_method 'bitsandbytes'"),
        ("awq", None, "needs a checkpoint quantized with it"),
        ("gptq", AWQ, "the checkpoint is quantized with 'awq'"),
        (None, {**AWQ, "bits": 8}, "only 4-bit weights"),
        (None, {**GPTQ, "bits": 3}, "only 4-bit weights"),
        (None, {**AWQ, "version": "gemv"}, "only 'gemm' packing"),
        (None, {**AWQ, "zero_point": False}, "without zero points"),
        (None, {**AWQ, "group_size": 12}, "multiple of 8"),
        (None, {**AWQ, "group_size": "big"}, "must be an integer"),
        (None, {k: v for k, v in GPTQ.items() if k != "group_size"}, "no group size"),
        (None, {**GPTQ, "checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
        (None, {**AWQ, "modules_to_not_convert": ["gate"]}, "modules_to_not_convert"),
        (None, {**FP8, "weight_block_size": [128, 128]}, "block-wise"),
        (None, {**CT_FP8, "ignore": ["lm_head", "model.layers.0.mlp.down_proj"]}, "ignored"),
        (None, {**CT_FP8, "config_groups": {}}, "exactly one config group"),
        (None, {**CT_FP8, "kv_cache_scheme": {"num_bits": 8}}, "quantized KV cache"),
        (None, "awq", "must be an object"),
    ],
)
def test_bad_quantization_configs_raise(option: str | None, quant: Any, message: str) -> None:
    with pytest.raises(QuantizationError, match=message) as info:
        resolve_quant_config(option, config_json(quant))
    assert isinstance(info.value, ModelLoadError)  # the loader's error family


def test_compressed_tensors_int_weights_are_refused() -> None:
    group = CT_FP8["config_groups"]["group_0"]  # type: ignore[index]
    bad = {**CT_FP8, "config_groups": {"g": {**group, "weights": {"num_bits": 4, "type": "int"}}}}
    with pytest.raises(QuantizationError, match="only 8-bit float"):
        resolve_quant_config(None, config_json(bad))


def test_group_size_must_divide_the_input_dim() -> None:
    with pytest.raises(QuantizationError, match="does not divide the input dim 96"):
        Int4Config("awq", 64).groups(96)
    assert Int4Config("gptq", -1).groups(96) == 1


def test_model_config_checks_the_option() -> None:
    assert ModelConfig("m", quantization="fp8").quantization == "fp8"
    with pytest.raises(ConfigError, match="quantization"):
        ModelConfig("m", quantization="int3")  # type: ignore[arg-type]
