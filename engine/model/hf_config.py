"""The checkpoint's architecture, parsed from a Hugging Face `config.json`.

One `ModelArchConfig` serves the three Llama-family decoders Loraplex runs (Llama, Mistral,
Qwen2). Both rope layouts are accepted: the older `rope_theta` + `rope_scaling` keys and the
newer `rope_parameters` dict that transformers 5 writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.engine.errors import ModelLoadError, UnsupportedModelError

SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
# "dynamic" NTK only rescales past max_position_embeddings, so within it it is the default rope.
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
_DTYPE_NAMES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class RopeConfig:
    rope_type: str = "default"  # one of SUPPORTED_ROPE_TYPES
    rope_theta: float = 10000.0
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelArchConfig:
    architecture: str
    model_type: str  # llama | mistral | qwen2
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    # Per layer: the attention window (keys within the last `w` positions) or None for full.
    sliding_windows: tuple[int | None, ...]
    rope: RopeConfig
    torch_dtype: str | None  # the checkpoint's dtype, if it says
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        for name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "max_position_embeddings",
        ):
            if getattr(self, name) <= 0:
                raise ModelLoadError(f"config.json: {name} must be > 0")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(
                "config.json: num_attention_heads must be a multiple of num_key_value_heads"
            )
        if len(self.sliding_windows) != self.num_hidden_layers:
            raise ModelLoadError("config.json: layer_types must have one entry per layer")

    @property
    def sliding_window(self) -> int | None:
        """The largest window any layer uses (None when every layer attends fully)."""
        windows = [w for w in self.sliding_windows if w is not None]
        return max(windows) if windows else None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelArchConfig:
        """Parse a `config.json` dict; raises `UnsupportedModelError` for other architectures."""
        return _parse(config)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ModelArchConfig:
        """Read `model_dir/config.json`."""
        return _parse(read_config_json(model_dir))


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """`model_dir/config.json` as a dict (ModelLoadError if missing or malformed)."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{model_dir}: config.json is missing")
    return _read_json(path)


def validate_model_dir(model_dir: str | Path) -> Path:
    """Check that a checkpoint directory has config.json, *.safetensors and tokenizer.json."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelLoadError(f"model directory {str(root)!r} does not exist")
    missing = [name for name in ("config.json", "tokenizer.json") if not (root / name).is_file()]
    if not any(root.glob("*.safetensors")):
        missing.append("*.safetensors weights (pickled .bin checkpoints are not loaded)")
    if missing:
        raise ModelLoadError(f"{root}: missing {', '.join(missing)}")
    return root


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot read JSON ({e})") from e
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return data


def _parse(c: dict[str, Any]) -> ModelArchConfig:
    architectures = c.get("architectures") or []
    arch = next((a for a in architectures if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise UnsupportedModelError(
            f"unsupported architecture {architectures or c.get('model_type')!r}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    model_type = SUPPORTED_ARCHITECTURES[arch]
    if c.get("hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"unsupported hidden_act {c.get('hidden_act')!r} (only silu)")
    try:
        hidden_size = int(c["hidden_size"])
        num_heads = int(c["num_attention_heads"])
        num_layers = int(c["num_hidden_layers"])
        head_dim = int(c.get("head_dim") or hidden_size // num_heads)
        max_pos = int(c.get("max_position_embeddings", 4096))
        attention_bias = bool(c.get("attention_bias", False))
        return ModelArchConfig(
            architecture=arch,
            model_type=model_type,
            hidden_size=hidden_size,
            intermediate_size=int(c["intermediate_size"]),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=int(c.get("num_key_value_heads") or num_heads),
            head_dim=head_dim,
            vocab_size=int(c["vocab_size"]),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            # Qwen2 always has q/k/v bias and never an o_proj bias; Llama's flag covers both.
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_proj_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=bool(c.get("mlp_bias", False)) if model_type == "llama" else False,
            sliding_windows=_parse_sliding_windows(c, model_type, num_layers),
            rope=_parse_rope(c, max_pos),
            torch_dtype=_parse_dtype(c),
            bos_token_id=_optional_int(c.get("bos_token_id")),
            eos_token_ids=_parse_token_ids(c.get("eos_token_id")),
        )
    except KeyError as e:
        raise ModelLoadError(f"config.json: missing key {e.args[0]!r}") from e
    except (TypeError, ValueError) as e:
        raise ModelLoadError(f"config.json: malformed value ({e})") from e


def _parse_sliding_windows(
    c: dict[str, Any], model_type: str, num_layers: int
) -> tuple[int | None, ...]:
    window = c.get("sliding_window")
    if model_type == "llama" or window is None:
        return (None,) * num_layers
    if model_type == "mistral":
        return (int(window),) * num_layers
    # qwen2: windowed only with use_sliding_window, and only layers >= max_window_layers
    # (or as `layer_types` says, when the config lists them).
    if not c.get("use_sliding_window", False):
        return (None,) * num_layers
    layer_types = c.get("layer_types")
    if layer_types is None:
        first = int(c.get("max_window_layers", num_layers))
        layer_types = [
            "sliding_attention" if i >= first else "full_attention" for i in range(num_layers)
        ]
    return tuple(int(window) if t == "sliding_attention" else None for t in layer_types)


def _parse_rope(c: dict[str, Any], max_pos: int) -> RopeConfig:
    params = c.get("rope_parameters")
    if isinstance(params, dict) and params:
        if any(isinstance(v, dict) for v in params.values()):
            raise UnsupportedModelError("per-layer-type rope_parameters are not supported")
        p = dict(params)
        theta = p.get("rope_theta", c.get("rope_theta", 10000.0))
    else:
        p = dict(c.get("rope_scaling") or {})
        theta = c.get("rope_theta", 10000.0)
    rope_type = str(p.get("rope_type") or p.get("type") or "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if p.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial_rotary_factor != 1 is not supported")
    original_max = p.get(
        "original_max_position_embeddings", c.get("original_max_position_embeddings")
    )
    if rope_type in ("llama3", "yarn") and original_max is None:
        original_max = max_pos
    factor = p.get("factor")
    if factor is None and rope_type == "yarn" and original_max:
        factor = max_pos / int(original_max)
    if rope_type in ("linear", "llama3") and factor is None:
        raise ModelLoadError(f"config.json: rope type {rope_type!r} needs a 'factor'")
    return RopeConfig(
        rope_type=rope_type,
        rope_theta=float(theta),
        factor=float(factor if factor is not None else 1.0),
        low_freq_factor=float(p.get("low_freq_factor", 1.0)),
        high_freq_factor=float(p.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=_optional_int(original_max),
        beta_fast=float(p.get("beta_fast") or 32.0),
        beta_slow=float(p.get("beta_slow") or 1.0),
        attention_factor=_optional_float(p.get("attention_factor")),
        mscale=_optional_float(p.get("mscale")),
        mscale_all_dim=_optional_float(p.get("mscale_all_dim")),
        truncate=bool(p.get("truncate", True)),
    )


def _parse_dtype(c: dict[str, Any]) -> str | None:
    name = c.get("dtype") or c.get("torch_dtype")
    if name is None:
        return None
    name = str(name).removeprefix("torch.")
    return name if name in _DTYPE_NAMES else None


def _parse_token_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    return tuple(dict.fromkeys(int(v) for v in values if v is not None))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
