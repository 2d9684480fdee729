"""Load a PEFT LoRA directory into validated float32 A/B pairs, never unpickling anything.

A directory holds `adapter_config.json` and `adapter_model.safetensors`. Both files are read
once; the same bytes are validated, hashed and loaded, so a file swapped on disk mid-load cannot
slip past the checks. Shapes, not the config's `base_model_name_or_path`, decide whether the
adapter fits the base model.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import torch

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.adapter_config import (
    SUPPORTED_TARGET_MODULES,
    LoRAAdapterConfig,
    parse_adapter_config,
)
from loraplex.engine.lora.safetensors_header import (
    MAX_HEADER_BYTES,
    TensorInfo,
    data_section_start,
    parse_safetensors_header,
)

__all__ = [
    "AdapterFileHeader",
    "ArchLike",
    "LoRAAdapter",
    "load_lora_adapter",
    "lora_module_shapes",
    "read_adapter_header",
]

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# Pickle-based formats: loading them can run arbitrary code, so their presence is an error.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_HASH_DOMAIN = b"loraplex-lora-adapter-v1\0"
# PEFT's names for a Llama-family causal LM; no adapter name segment (PEFT strips "default").
_TENSOR_NAME = re.compile(
    r"base_model\.model\.model\.layers\.(0|[1-9][0-9]{0,5})\."
    r"(self_attn\.(?:q_proj|k_proj|v_proj|o_proj)|mlp\.(?:gate_proj|up_proj|down_proj))"
    r"\.lora_([AB])\.weight"
)

LayerModule = tuple[int, str]  # (layer_idx, module), e.g. (0, "q_proj")
ReadBuffer = Callable[[int], torch.Tensor]  # num_bytes -> a uint8 tensor at least that long


class ArchLike(Protocol):
    """What the loader needs from the base model (`model.hf_config.ModelArchConfig` fits)."""

    @property
    def model_type(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...


@dataclass(frozen=True)
class LoRAAdapter:
    """A validated adapter: `weights[(layer_idx, module)] = (A [r, in_dim], B [out_dim, r])`,
    on the CPU in the file's dtype (fp32, fp16 or bf16). The delta of a module is
    `scaling * x @ A.T @ B.T`."""

    rank: int
    lora_alpha: float
    scaling: float
    target_modules: tuple[str, ...]  # in SUPPORTED_TARGET_MODULES order
    weights: dict[LayerModule, tuple[torch.Tensor, torch.Tensor]]
    # sha256 over a domain tag, the config's canonical JSON (length-prefixed) and the
    # safetensors bytes: equal hashes mean the same adapter whatever its name or path.
    content_hash: str
    size_bytes: int  # adapter_config.json + adapter_model.safetensors on disk
    base_model_name_or_path: str | None  # informational only


def lora_module_shapes(arch: ArchLike) -> dict[str, tuple[int, int]]:
    """(in_dim, out_dim) of each adaptable projection of the base model."""
    q_dim = arch.num_attention_heads * arch.head_dim
    kv_dim = arch.num_key_value_heads * arch.head_dim
    h, i = arch.hidden_size, arch.intermediate_size
    return {
        "q_proj": (h, q_dim),
        "k_proj": (h, kv_dim),
        "v_proj": (h, kv_dim),
        "o_proj": (q_dim, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def _read_weights(file: Path, buffer_for: ReadBuffer | None = None) -> torch.Tensor:
    """The whole file as a uint8 tensor, read once into memory the tensors can then view:
    `buffer_for(num_bytes)`'s, else memory of its own."""
    with file.open("rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        data = torch.empty(size, dtype=torch.uint8) if buffer_for is None else buffer_for(size)
        data = data[:size]  # [file bytes]
        view = data.numpy().data  # [file bytes], shares memory
        num_read = 0
        while num_read < len(view) and (n := f.readinto(view[num_read:])):
            num_read += n
        rest = f.read()
    if rest:  # the file grew since fstat: keep all of it, as read_bytes would
        data = torch.cat([data, torch.frombuffer(bytearray(rest), dtype=torch.uint8)])
    return data[: num_read + len(rest)]  # shorter if it shrank


def _check_directory(path: Path) -> None:
    if not path.is_dir():
        raise InvalidAdapterError("adapter path is not a directory")
    pickles = sorted(p.name for p in path.iterdir() if p.name.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise InvalidAdapterError(
            f"pickle-based weight files are not accepted ({', '.join(pickles[:5])}); "
            f"provide {WEIGHTS_FILE}"
        )
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (path / name).is_file():  # also refuses FIFOs and devices, which could block
            raise InvalidAdapterError(f"adapter directory is missing {name}")


def _read_files(path: Path, buffer_for: ReadBuffer | None = None) -> tuple[bytes, torch.Tensor]:
    _check_directory(path)
    return (path / CONFIG_FILE).read_bytes(), _read_weights(path / WEIGHTS_FILE, buffer_for)


@dataclass(frozen=True)
class AdapterFileHeader:
    """An adapter directory's config and weights header, validated; the weights not read yet
    (engine/lora/staged_read.py reads them straight into their pages)."""

    config: LoRAAdapterConfig
    tensors: dict[str, TensorInfo]
    index: dict[tuple[int, str, str], str]  # (layer_idx, module, "A" | "B") -> tensor name
    weights_file: Path
    data_start: int  # where the data section begins in the weights file
    file_id: tuple[int, int, int]  # (inode, size, mtime_ns) when the header was read


def file_id(f: BinaryIO) -> tuple[int, int, int]:
    """Which file, as it is now: a file replaced or rewritten since differs."""
    st = os.fstat(f.fileno())
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_adapter_header(path: str | Path, arch: ArchLike, max_lora_rank: int) -> AdapterFileHeader:
    """Read and validate everything about an adapter but its weights' values: the checks of
    `load_lora_adapter` short of the NaN/Inf test, which needs the data."""
    path = Path(path)
    _check_directory(path)
    config_bytes = (path / CONFIG_FILE).read_bytes()
    config = parse_adapter_config(config_bytes, max_lora_rank)
    weights_file = path / WEIGHTS_FILE
    with weights_file.open("rb", buffering=0) as f:
        identity = file_id(f)
        prefix = f.read(8)
        if len(prefix) == 8:
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len <= min(MAX_HEADER_BYTES, identity[1] - 8):  # else the parse says why
                prefix += f.read(header_len)
    tensors = parse_safetensors_header(prefix, identity[1])
    index = _index_tensors(tensors, config, arch)
    return AdapterFileHeader(
        config, tensors, index, weights_file, data_section_start(prefix), identity
    )


def _shape_message(
    name: str,
    got: tuple[int, ...],
    want: tuple[int, int],
    side: str,
    config: LoRAAdapterConfig,
    arch: ArchLike,
) -> str:
    prefix = f"tensor {name!r} has shape {list(got)}, expected {list(want)}"
    rank_dim = 0 if side == "A" else 1
    if len(got) == 2 and got[1 - rank_dim] == want[1 - rank_dim]:
        return f"{prefix}: its rank {got[rank_dim]} differs from r={config.rank} in the config"
    return (
        f"{prefix} for this {arch.model_type} base model (hidden_size {arch.hidden_size}); "
        "the adapter was likely trained for another base model (its config names "
        f"{config.base_model_name_or_path!r})"
    )


def _check_target_layers(config: LoRAAdapterConfig, num_layers: int) -> None:
    for module, layers in config.target_layers.items():
        if layers is not None and layers != tuple(range(num_layers)):
            raise InvalidAdapterError(
                f"target_modules names {module} for layers {list(layers)[:10]} only; the base "
                f"model has {num_layers} layers and adapting a subset of them is not supported"
            )


def _index_tensors(
    tensors: dict[str, TensorInfo], config: LoRAAdapterConfig, arch: ArchLike
) -> dict[tuple[int, str, str], str]:
    # (layer_idx, module, "A" | "B") -> tensor name; checks names and shapes before loading.
    _check_target_layers(config, arch.num_hidden_layers)
    shapes = lora_module_shapes(arch)
    index: dict[tuple[int, str, str], str] = {}
    for name, info in tensors.items():
        match = _TENSOR_NAME.fullmatch(name)
        if match is None:
            raise InvalidAdapterError(
                f"unexpected tensor {name[:200]!r}: expected "
                "base_model.model.model.layers.<i>.{self_attn|mlp}.<module>.lora_{A|B}.weight"
            )
        layer, module, side = int(match[1]), match[2].split(".")[1], match[3]
        if layer >= arch.num_hidden_layers:
            raise InvalidAdapterError(
                f"tensor {name!r}: layer {layer} out of range; the base model has "
                f"{arch.num_hidden_layers} layers"
            )
        if module not in config.target_modules:
            raise InvalidAdapterError(
                f"tensor {name!r} is for {module}, which is not in target_modules "
                f"{list(config.target_modules)}"
            )
        in_dim, out_dim = shapes[module]
        want = (config.rank, in_dim) if side == "A" else (out_dim, config.rank)
        if info.shape != want:
            raise InvalidAdapterError(_shape_message(name, info.shape, want, side, config, arch))
        index[(layer, module, side)] = name
    for layer in range(arch.num_hidden_layers):
        for module in config.target_modules:
            for side in "AB":
                if (layer, module, side) not in index:
                    raise InvalidAdapterError(
                        f"missing lora_{side} for layer {layer} {module}: every target module "
                        "needs both lora_A and lora_B in every layer"
                    )
    return index


def _content_hash(config: LoRAAdapterConfig, weights_bytes: memoryview) -> str:
    h = hashlib.sha256(_HASH_DOMAIN)
    h.update(len(config.canonical_json).to_bytes(8, "little"))
    h.update(config.canonical_json)
    h.update(weights_bytes)
    return h.hexdigest()


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# Exponent bits of each float dtype: all set means Inf or NaN. Testing them on the integer view
# is one cheap pass; torch.isfinite on CPU bf16 is orders of magnitude slower.
_EXPONENT_BITS: dict[torch.dtype, tuple[torch.dtype, int]] = {
    torch.bfloat16: (torch.int16, 0x7F80),
    torch.float16: (torch.int16, 0x7C00),
    torch.float32: (torch.int32, 0x7F800000),
}


def has_non_finite(t: torch.Tensor) -> bool:
    """True if `t` (bf16, fp16 or fp32) holds an Inf or a NaN.

    A finite sum proves there is none (Inf and NaN propagate through every addition), and a sum
    is the cheapest full pass there is. Only a non-finite sum (Inf, NaN, or large finite values
    overflowing) runs the exact test of every element's exponent bits."""
    if t.numel() == 0 or torch.isfinite(t.sum()):
        return False
    int_dtype, mask = _EXPONENT_BITS[t.dtype]
    return bool(((t.view(int_dtype) & mask) == mask).any())


def _view(data: torch.Tensor, begin: int, end: int, dtype: str) -> torch.Tensor:
    """data[begin:end] (uint8) as a flat tensor of `dtype`: a view, unless the bytes are not
    aligned to the dtype (our writers align them; a copy then)."""
    assert sys.byteorder == "little"  # safetensors is little-endian, and so is every host we run
    raw = data[begin:end]
    if begin % DTYPES[dtype].itemsize:
        raw = raw.clone()
    return raw.view(DTYPES[dtype])


def _tensor_views(
    data: torch.Tensor, start: int, tensors: dict[str, TensorInfo]
) -> dict[str, torch.Tensor]:
    """Every tensor of the file `data` [file bytes] as a view of it, no copy: the header check
    proved each entry lies inside the data section (from `start`) and that no two overlap."""
    return {
        name: _view(data, start + t.begin, start + t.end, t.dtype).view(t.shape)
        for name, t in tensors.items()
    }


def _check_finite(
    data: torch.Tensor,
    start: int,
    tensors: dict[str, TensorInfo],
    views: dict[str, torch.Tensor],
    index: dict[tuple[int, str, str], str],
) -> None:
    """Raise naming the first tensor with an Inf or a NaN. One pass over each run of same-dtype
    tensors in the data section (the whole of it for a single-dtype file); tensors one at a
    time only to name the culprit."""
    runs: list[tuple[str, int, int]] = []  # (dtype, begin, end), in file order
    for t in sorted(tensors.values(), key=lambda t: t.begin):  # they tile the data section
        if runs and runs[-1][0] == t.dtype:
            runs[-1] = (t.dtype, runs[-1][1], t.end)
        else:
            runs.append((t.dtype, t.begin, t.end))
    if not any(has_non_finite(_view(data, start + b, start + e, d)) for d, b, e in runs):
        return
    for (layer, module, side), name in sorted(index.items()):
        if has_non_finite(views[name]):
            raise InvalidAdapterError(
                f"lora_{side} for layer {layer} {module} contains NaN or Inf values"
            )


def load_lora_adapter(
    path: str | Path,
    arch: ArchLike,
    max_lora_rank: int,
    content_hash: str | None = None,
    buffer_for: ReadBuffer | None = None,
) -> LoRAAdapter:
    """Read, validate and load a PEFT LoRA directory for the base model `arch`.

    Raises `InvalidAdapterError` (a `ValueError`) naming the problem for anything a client can
    get wrong: missing or pickle files, a bad config, a malformed safetensors file, unexpected
    tensor names, shapes that do not fit `arch`, a rank above `max_lora_rank`, NaN/Inf values.

    `content_hash`: the hash computed when the adapter was registered (the platform stores
    adapters content-addressed). It is kept, not recomputed: hashing is the slowest part of a
    load, and every other check still runs on the bytes read now.

    The weights are views of the file's bytes as read (one read, no copy), in its dtype: into
    `buffer_for(num_bytes)` (a uint8 tensor of at least that many bytes) when given, which the
    caller must not reuse while it still uses the adapter.
    """
    config_bytes, data = _read_files(Path(path), buffer_for)
    config = parse_adapter_config(config_bytes, max_lora_rank)
    weights_bytes = data.numpy().data  # [file bytes], shares memory
    tensors = parse_safetensors_header(weights_bytes)
    index = _index_tensors(tensors, config, arch)
    start = data_section_start(weights_bytes)
    views = _tensor_views(data, start, tensors)
    _check_finite(data, start, tensors, views, index)
    weights: dict[LayerModule, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in range(arch.num_hidden_layers):
        for module in config.target_modules:
            a, b = (views[index[(layer, module, side)]] for side in "AB")
            weights[(layer, module)] = (a, b)  # A [r, in_dim], B [out_dim, r]

    assert set(config.target_modules) <= set(SUPPORTED_TARGET_MODULES)
    return LoRAAdapter(
        rank=config.rank,
        lora_alpha=config.lora_alpha,
        scaling=config.scaling,
        target_modules=config.target_modules,
        weights=weights,
        content_hash=content_hash or _content_hash(config, weights_bytes),
        size_bytes=len(config_bytes) + len(weights_bytes),
        base_model_name_or_path=config.base_model_name_or_path,
    )
