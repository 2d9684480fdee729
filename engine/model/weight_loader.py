"""Load a Hugging Face checkpoint's safetensors into `LlamaForCausalLM`.

Only safetensors are read (never pickle). Checkpoint names map onto the model's parameters,
fused projections by row range:

    model.layers.3.self_attn.k_proj.weight  ->  model.layers.3.self_attn.qkv_proj.weight[q:q+kv]
    model.layers.3.mlp.up_proj.weight       ->  model.layers.3.mlp.gate_up_proj.weight[i:2i]

Every name, shape (and, for quantized tensors, dtype) is checked before any data is copied, so
a bad checkpoint fails fast with the offending tensor named. Quantized layers say themselves
which tensors fill them and how (`quant/`: AWQ / GPTQ packed tensors, FP8 weights and scales).

A tensor-parallel rank reads only its shard of each tensor (`WeightTarget.shard`, through
safetensors' sliced reads): no rank ever holds the whole model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from loraplex.engine.distributed.sharding import ShardSpec
from loraplex.engine.distributed.tp_group import TensorParallel
from loraplex.engine.errors import ConfigError, QuantizationError
from loraplex.engine.model.hf_config import (
    ModelArchConfig,
    ModelLoadError,
    read_config_json,
    validate_model_dir,
)
from loraplex.engine.model.layers import RMSNorm
from loraplex.engine.model.linear import MergedLinear
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.model.quant.linear_method import WeightTarget
from loraplex.engine.model.quant.quant_config import resolve_quant_config

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_INDEX_FILE = "model.safetensors.index.json"
_MAX_NAMES_IN_ERROR = 8


def check_tp_quantization(quant: object, tp: TensorParallel | int | None) -> None:
    """ConfigError for a quantized base under tensor parallelism (`tp`: the share, or the
    tensor_parallel_size), not built yet."""
    sharded = tp is not None and tp != 1
    if quant is not None and sharded:
        raise ConfigError(
            "tensor_parallel_size > 1 does not support quantized bases yet "
            "(the checkpoint or the quantization option names one)"
        )


def resolve_device(device: str | torch.device) -> torch.device:
    """ "auto" -> cuda when available, else cpu."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(
    dtype: str | torch.dtype, arch: ModelArchConfig, device: torch.device
) -> torch.dtype:
    """ "auto" -> the checkpoint's dtype on CUDA (float32 if it names none), float32 on CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        return DTYPES[arch.torch_dtype or "float32"]
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {tuple(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The checkpoint's weight files: those the shard index names, else `model*.safetensors`."""
    root = Path(model_dir)
    index = root / _INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index}: malformed shard index ({e})") from e
        files = [root / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{root}: shards named in {_INDEX_FILE} are missing: {missing}")
        return files
    files = sorted(root.glob("model*.safetensors")) or sorted(root.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{root}: no *.safetensors weights")
    return files


def checkpoint_targets(model: LlamaForCausalLM) -> dict[str, WeightTarget]:
    """Checkpoint tensor name -> what it must look like and what it fills (a parameter, a row
    range of a fused one, or a quantized layer's conversion)."""
    tensors: dict[str, torch.Tensor] = {}
    targets: dict[str, WeightTarget] = {}
    vocab = {"model.embed_tokens.weight": model.model.embed_tokens.weight}
    if model.lm_head is not None:
        vocab["lm_head.weight"] = model.lm_head
    if model.tp is None:
        tensors.update(vocab)
    else:
        shard = model.tp.layout.vocab_shard
        targets.update((name, WeightTarget.of_shard(t, shard)) for name, t in vocab.items())
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            tensors[f"{name}.weight"] = module.weight
        elif isinstance(module, MergedLinear):
            parent = name.rsplit(".", 1)[0]
            targets.update(module.method.checkpoint_targets(module, parent))
            if module.bias is not None:
                targets.update(_bias_targets(module, parent))
    targets.update((name, WeightTarget.of_tensor(t)) for name, t in tensors.items())
    return targets


def _bias_targets(module: MergedLinear, parent: str) -> dict[str, WeightTarget]:
    """Per slice; column-parallel biases are sharded with their rows, row-parallel ones are
    whole (added once, after the all-reduce)."""
    assert module.bias is not None
    targets = {}
    for i, slice_name in enumerate(module.slice_names):
        start, size = module.slice_range(slice_name)
        view = module.bias[start : start + size]
        shard = None if module.shards is None else module.shards[i]
        name = f"{parent}.{slice_name}.bias"
        if shard is None or shard.dim != 0:
            targets[name] = WeightTarget.of_tensor(view)
        else:
            targets[name] = WeightTarget.of_shard(view, shard)
    return targets


def _read(f: Any, name: str, shard: ShardSpec | None) -> torch.Tensor:
    """The whole tensor, or only the shard's rows / columns (read from the file as such)."""
    if shard is None:
        return f.get_tensor(name)
    part = f.get_slice(name)
    end = shard.start + shard.size
    return part[shard.start : end] if shard.dim == 0 else part[:, shard.start : end]


def _is_ignored(name: str, arch: ModelArchConfig) -> bool:
    # Old checkpoints saved rotary buffers; tied checkpoints sometimes still save lm_head.
    return "rotary_emb." in name or (arch.tie_word_embeddings and name == "lm_head.weight")


def _short_list(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_MAX_NAMES_IN_ERROR])
    more = len(names) - _MAX_NAMES_IN_ERROR
    return shown + (f" (and {more} more)" if more > 0 else "")


def _check_checkpoint(
    files: list[Path], targets: dict[str, WeightTarget], arch: ModelArchConfig
) -> None:
    seen: set[str] = set()
    unexpected: list[str] = []
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if _is_ignored(name, arch):
                    continue
                target = targets.get(name)
                if target is None:
                    unexpected.append(name)
                    continue
                tensor = f.get_slice(name)
                shape = tuple(tensor.get_shape())
                if shape not in target.shapes:
                    implied = " or ".join(str(list(s)) for s in target.shapes)
                    raise ModelLoadError(
                        f"{path.name}: tensor {name!r} has shape {list(shape)}, "
                        f"the config implies {implied}"
                    )
                if target.dtypes is not None and tensor.get_dtype() not in target.dtypes:
                    raise QuantizationError(
                        f"{path.name}: tensor {name!r} is {tensor.get_dtype()}, expected "
                        f"{' or '.join(target.dtypes)}"
                    )
                seen.add(name)
    if unexpected:
        raise ModelLoadError(f"checkpoint has unexpected tensors: {_short_list(unexpected)}")
    missing = [name for name, t in targets.items() if name not in seen and not t.optional]
    if missing:
        raise ModelLoadError(f"checkpoint is missing tensors: {_short_list(missing)}")


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    """Fill every parameter of `model` from the checkpoint's safetensors (a bar per shard)."""
    files = safetensors_files(model_dir)
    targets = checkpoint_targets(model)
    _check_checkpoint(files, targets, model.arch)
    for path in tqdm(files, desc="Loading safetensors", unit="shard"):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118
                if not _is_ignored(name, model.arch):
                    target = targets[name]
                    target.load(_read(f, name, target.shard))
    for module in model.modules():
        if isinstance(module, MergedLinear):
            module.method.finish_loading(module)


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    quantization: str | None = None,
    tp: TensorParallel | None = None,
) -> tuple[LlamaForCausalLM, ModelArchConfig]:
    """Build the model for a checkpoint directory and load its weights; eval mode.
    `quantization`: "fp8" | "awq" | "gptq" | None (the checkpoint's quantization_config).
    `tp`: build and load only this rank's shard."""
    root = validate_model_dir(model_dir)
    arch = ModelArchConfig.from_model_dir(root)
    quant = resolve_quant_config(quantization, read_config_json(root))
    check_tp_quantization(quant, tp)
    torch_device = resolve_device(device)
    model = LlamaForCausalLM(
        arch, resolve_dtype(dtype, arch, torch_device), torch_device, quant, tp
    )
    load_weights(model, root)
    return model.eval(), arch
