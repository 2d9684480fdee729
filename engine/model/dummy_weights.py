"""Random weights for a checkpoint's architecture (`load_format="dummy"`), as in vLLM.

For benchmarks at real shapes (e.g. Llama-3-8B) without multi-GB weight files: only
config.json (and a tokenizer) need to exist.
"""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.model.weight_loader import resolve_dtype

DUMMY_STD = 0.02


@torch.no_grad()
def create_dummy_model(
    model_dir: str | Path, dtype: str | torch.dtype, device: torch.device
) -> tuple[LlamaForCausalLM, ModelArchConfig]:
    arch = ModelArchConfig.from_model_dir(model_dir)
    model = LlamaForCausalLM(arch, resolve_dtype(dtype, arch, device), device)
    generator = torch.Generator(device).manual_seed(0)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, DUMMY_STD, generator=generator)
    return model.eval(), arch
