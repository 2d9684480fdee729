"""Random weights for a checkpoint's architecture (`load_format="dummy"`), as in vLLM.

For benchmarks at real shapes (e.g. Llama-3-8B) without multi-GB weight files: only
config.json (and a tokenizer) need to exist. With `quantization`, the linear layers get random
weights in that format (FP8: random weights quantized; 4-bit: random values, group size 128).
"""

from __future__ import annotations

from pathlib import Path

import torch

from loraplex.engine.distributed.tp_group import TensorParallel
from loraplex.engine.model.hf_config import ModelArchConfig, read_config_json
from loraplex.engine.model.linear import MergedLinear
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.model.quant.quant_config import resolve_quant_config
from loraplex.engine.model.weight_loader import check_tp_quantization, resolve_dtype

DUMMY_STD = 0.02


@torch.no_grad()
def create_dummy_model(
    model_dir: str | Path,
    dtype: str | torch.dtype,
    device: torch.device,
    quantization: str | None = None,
    tp: TensorParallel | None = None,
) -> tuple[LlamaForCausalLM, ModelArchConfig]:
    """With `tp`, this rank's shard, random on its own (not a shard of the TP=1 weights)."""
    arch = ModelArchConfig.from_model_dir(model_dir)
    quant = resolve_quant_config(quantization, read_config_json(model_dir), dummy=True)
    check_tp_quantization(quant, tp)
    model = LlamaForCausalLM(arch, resolve_dtype(dtype, arch, device), device, quant, tp)
    generator = torch.Generator(device).manual_seed(0)
    quantized = [m for m in model.modules() if isinstance(m, MergedLinear) and quant is not None]
    skip = {id(p) for m in quantized for name, p in m.named_parameters() if name != "bias"}
    for name, param in model.named_parameters():
        if id(param) in skip:
            continue
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, DUMMY_STD, generator=generator)
    for module in quantized:
        module.method.fill_dummy(generator)
    return model.eval(), arch
