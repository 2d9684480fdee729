"""Load a Hugging Face checkpoint's safetensors into `LlamaForCausalLM`.

Only safetensors are read (never pickle). Checkpoint names map onto the model's parameters,
fused projections by row range:

    model.layers.3.self_attn.k_proj.weight  ->  model.layers.3.self_attn.qkv_proj.weight[q:q+kv]
    model.layers.3.mlp.up_proj.weight       ->  model.layers.3.mlp.gate_up_proj.weight[i:2i]

Every name and shape is checked before any data is copied, so a bad checkpoint fails fast with
the offending tensor named.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from loraplex.engine.model.hf_config import ModelArchConfig, ModelLoadError, validate_model_dir
from loraplex.engine.model.layers import RMSNorm
from loraplex.engine.model.linear import MergedLinear
from loraplex.engine.model.llama import LlamaForCausalLM

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_INDEX_FILE = "model.safetensors.index.json"
_MAX_NAMES_IN_ERROR = 8


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


def checkpoint_targets(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """Checkpoint tensor name -> the parameter (or row range of a fused one) it fills."""
    targets: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": model.model.embed_tokens.weight
    }
    if model.lm_head is not None:
        targets["lm_head.weight"] = model.lm_head
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            targets[f"{name}.weight"] = module.weight
        elif isinstance(module, MergedLinear):
            parent = name.rsplit(".", 1)[0]
            for slice_name in module.slice_names:
                start, size = module.slice_range(slice_name)
                targets[f"{parent}.{slice_name}.weight"] = module.weight[start : start + size]
                if module.bias is not None:
                    targets[f"{parent}.{slice_name}.bias"] = module.bias[start : start + size]
    return targets


def _is_ignored(name: str, arch: ModelArchConfig) -> bool:
    # Old checkpoints saved rotary buffers; tied checkpoints sometimes still save lm_head.
    return "rotary_emb." in name or (arch.tie_word_embeddings and name == "lm_head.weight")


def _short_list(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_MAX_NAMES_IN_ERROR])
    more = len(names) - _MAX_NAMES_IN_ERROR
    return shown + (f" (and {more} more)" if more > 0 else "")


def _check_checkpoint(
    files: list[Path], targets: dict[str, torch.Tensor], arch: ModelArchConfig
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
                shape = tuple(f.get_slice(name).get_shape())
                if shape != tuple(target.shape):
                    raise ModelLoadError(
                        f"{path.name}: tensor {name!r} has shape {list(shape)}, "
                        f"the config implies {list(target.shape)}"
                    )
                seen.add(name)
    if unexpected:
        raise ModelLoadError(f"checkpoint has unexpected tensors: {_short_list(unexpected)}")
    missing = [name for name in targets if name not in seen]
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
                    targets[name].copy_(f.get_tensor(name))


def load_model(
    model_dir: str | Path, dtype: str | torch.dtype = "auto", device: str | torch.device = "auto"
) -> tuple[LlamaForCausalLM, ModelArchConfig]:
    """Build the model for a checkpoint directory and load its weights; eval mode."""
    root = validate_model_dir(model_dir)
    arch = ModelArchConfig.from_model_dir(root)
    torch_device = resolve_device(device)
    model = LlamaForCausalLM(arch, resolve_dtype(dtype, arch, torch_device), torch_device)
    load_weights(model, root)
    return model.eval(), arch
