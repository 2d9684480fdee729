"""A tiny Llama's real PEFT LoRA adapters on disk, and the tools the adapter tests break them with.

`ARCH` is the tiny model's architecture, the base every adapter here is validated against.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.adapter import load_lora_adapter
from loraplex.engine.model.hf_config import ModelArchConfig

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PREFIX = "base_model.model.model.layers"


def tiny_llama_config(hidden_size: int = 32) -> Any:
    return transformers.LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=64,
        architectures=["LlamaForCausalLM"],
    )


def arch_of(hf_config: Any) -> ModelArchConfig:
    return ModelArchConfig.from_dict(hf_config.to_dict())


ARCH = arch_of(tiny_llama_config())


def make_peft_model(
    targets: list[str] | str,
    r: int = 8,
    alpha: float = 16,
    rslora: bool = False,
    hidden_size: int = 32,
    **extra: Any,
) -> Any:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config(hidden_size))
    config = peft.LoraConfig(
        r=r, lora_alpha=alpha, target_modules=targets, use_rslora=rslora,
        init_lora_weights=False, **extra,
    )  # fmt: skip
    return peft.get_peft_model(model, config)


def save_adapter(path: Path, targets: list[str] | str, **kwargs: Any) -> Any:
    model = make_peft_model(targets, **kwargs)
    model.save_pretrained(str(path))
    return model


def edit_config(path: Path, **changes: Any) -> None:
    file = path / "adapter_config.json"
    config = json.loads(file.read_text())
    config.update(changes)
    file.write_text(json.dumps(config))


def edit_weights(path: Path, fn: Callable[[dict[str, torch.Tensor]], object]) -> None:
    file = path / "adapter_model.safetensors"
    tensors = load_file(str(file))
    fn(tensors)
    save_file(tensors, str(file))


def write_raw_safetensors(
    path: Path,
    header: dict[str, Any],
    data: bytes,
    header_len: int | None = None,
    header_json: bytes | None = None,
) -> None:
    blob = header_json if header_json is not None else json.dumps(header).encode()
    length = len(blob) if header_len is None else header_len
    (path / "adapter_model.safetensors").write_bytes(struct.pack("<Q", length) + blob + data)


def expect_invalid(path: Path, *fragments: str, max_lora_rank: int = 64) -> str:
    with pytest.raises(InvalidAdapterError) as info:
        load_lora_adapter(path, ARCH, max_lora_rank)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def f32_entry(shape: list[int], begin: int) -> dict[str, Any]:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + 4 * math.prod(shape)]}
