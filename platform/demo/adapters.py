"""Random PEFT LoRA adapters for the demo, tests and benchmarks, written directly as safetensors
+ JSON (no peft needed)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from loraplex.engine.lora.adapter import lora_module_shapes
from loraplex.engine.model.hf_config import ModelArchConfig

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_random_adapter(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    rank: int = 8,
    lora_alpha: float | None = None,
    target_modules: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
    b_std: float = 0.02,
) -> Path:
    """A random-init PEFT LoRA directory for the checkpoint in `model_dir`.

    Unlike PEFT's init (B = 0, a no-op), B is random too, so the adapter visibly changes
    outputs. Deterministic for a given seed: the same call gives the same content hash.
    """
    arch = ModelArchConfig.from_model_dir(model_dir)
    shapes = lora_module_shapes(arch)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(arch.num_hidden_layers):
        for module in target_modules:
            in_dim, out_dim = shapes[module]
            block = "self_attn" if module in ATTENTION_MODULES else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                rng.standard_normal((rank, in_dim)) / np.sqrt(in_dim)
            ).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (
                rng.standard_normal((out_dim, rank)) * b_std
            ).astype(np.float32)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": lora_alpha if lora_alpha is not None else 2 * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "target_modules": list(target_modules),
        "base_model_name_or_path": Path(model_dir).name,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
