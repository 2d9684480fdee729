"""Parse a PEFT `adapter_config.json`, interpreting allow-listed keys only.

We serve plain LoRA on the attention and MLP projections. Keys that would change what the
adapter computes (DoRA, biases, extra trained modules, per-layer ranks, ...) are rejected rather
than silently ignored: ignoring them would serve outputs that differ from what the tenant
trained. Keys that only matter for training or initialisation are ignored.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from loraplex.engine.errors import InvalidAdapterError
from loraplex.engine.lora.safetensors_header import loads_strict_json

MAX_CONFIG_BYTES = 64 * 1024
# In layer order; the canonical order of `target_modules`.
SUPPORTED_TARGET_MODULES = (
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
)  # fmt: skip
_BLOCK_OF = {
    m: "self_attn" if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
    for m in SUPPORTED_TARGET_MODULES
}
# PEFT's shorthand for every linear layer except the output head.
_ALL_LINEAR = "all-linear"
_TARGET_ENTRY = re.compile(
    r"(?:(?:(?:base_model\.model\.)?model\.layers\.(?P<layer>0|[1-9][0-9]{0,5})\.)?"
    r"(?P<block>self_attn|mlp)\.)?"
    r"(?P<module>" + "|".join(SUPPORTED_TARGET_MODULES) + ")"
)
# Keys that change the adapter's forward pass (or which weights it holds) unless neutral.
_UNSUPPORTED_KEYS: dict[str, str] = {
    "use_dora": "DoRA (use_dora) is not supported",
    "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
    "layers_to_transform": "layers_to_transform (adapting a subset of layers) is not supported",
    "rank_pattern": "rank_pattern (per-module ranks) is not supported",
    "alpha_pattern": "alpha_pattern (per-module alphas) is not supported",
    "exclude_modules": "exclude_modules is not supported",
    "fan_in_fan_out": "fan_in_fan_out (transposed weights) is not supported",
    "lora_bias": "lora_bias (a bias on lora_B) is not supported",
    "use_qalora": "QA-LoRA (use_qalora) is not supported",
    "layer_replication": "layer_replication is not supported",
    "target_parameters": "target_parameters is not supported",
    "trainable_token_indices": "trainable_token_indices (trained embeddings) is not supported",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported",
    "megatron_config": "megatron_config is not supported",
    "arrow_config": "arrow routing (arrow_config) is not supported",
    "use_bdlora": "block-diagonal LoRA (use_bdlora) is not supported",
    "kasa_config": "KaSA (kasa_config) is not supported",
    "monteclora_config": "MonteCLoRA (monteclora_config) is not supported",
}


@dataclass(frozen=True)
class LoRAAdapterConfig:
    """The interpreted subset of a validated `adapter_config.json`."""

    rank: int
    lora_alpha: float
    use_rslora: bool
    target_modules: tuple[str, ...]  # in SUPPORTED_TARGET_MODULES order
    # Per target module: the layers it names, or None for every layer.
    target_layers: dict[str, tuple[int, ...] | None]
    base_model_name_or_path: str | None
    canonical_json: bytes  # sorted keys, no whitespace: what the content hash covers

    @property
    def scaling(self) -> float:
        """PEFT's scale on B @ A: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.lora_alpha / (math.sqrt(self.rank) if self.use_rslora else self.rank)


def _is_neutral(value: Any) -> bool:
    # PEFT writes null, false, {} or [] for an unused feature.
    return value is None or value is False or value == {} or value == [] or value == ""


def _parse_target_entry(entry: str) -> tuple[str, int | None]:
    # "q_proj" → all layers; "model.layers.3.self_attn.q_proj" → layer 3 only (PEFT matches list
    # entries as whole names or dotted suffixes, and writes full paths after "all-linear").
    match = _TARGET_ENTRY.fullmatch(entry)
    module = match["module"] if match else None
    if (
        match is None
        or module is None
        or (match["block"] is not None and match["block"] != _BLOCK_OF[module])
    ):
        raise InvalidAdapterError(
            f"target_modules entry {entry[:100]!r} not supported; "
            f"allowed: {list(SUPPORTED_TARGET_MODULES)}"
        )
    layer = match["layer"]
    return module, None if layer is None else int(layer)


def _parse_target_modules(value: Any) -> dict[str, tuple[int, ...] | None]:
    if isinstance(value, str):
        if value == _ALL_LINEAR:
            return dict.fromkeys(SUPPORTED_TARGET_MODULES)
        # A string is a regex over full module paths in PEFT; evaluating a client's regex is a
        # ReDoS risk, so only the exact shorthand above is accepted.
        raise InvalidAdapterError(
            f"target_modules as a regex string ({value[:100]!r}) is not supported; "
            f"give a list of module names from {list(SUPPORTED_TARGET_MODULES)}"
        )
    if not isinstance(value, list) or not value or not all(isinstance(m, str) for m in value):
        raise InvalidAdapterError("target_modules must be a non-empty list of module names")
    layers: dict[str, set[int] | None] = {}
    for entry in value:
        module, layer = _parse_target_entry(entry)
        known = layers.get(module, set())
        layers[module] = None if layer is None or known is None else known | {layer}
    return {
        m: None if layers[m] is None else tuple(sorted(layers[m] or ()))
        for m in SUPPORTED_TARGET_MODULES
        if m in layers
    }


def parse_adapter_config(data: bytes, max_lora_rank: int) -> LoRAAdapterConfig:
    """Validate `adapter_config.json` bytes; raise `InvalidAdapterError` naming the problem."""
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidAdapterError(
            f"adapter_config.json is {len(data)} bytes; the limit is {MAX_CONFIG_BYTES}"
        )
    config = loads_strict_json(data, "adapter_config.json")
    if not isinstance(config, dict):
        raise InvalidAdapterError("adapter_config.json must be a JSON object")
    if config.get("peft_type") != "LORA":
        raise InvalidAdapterError(
            f"peft_type must be 'LORA', got {str(config.get('peft_type'))[:50]!r}"
        )
    for key, message in _UNSUPPORTED_KEYS.items():
        if not _is_neutral(config.get(key)):
            raise InvalidAdapterError(message)
    bias = config.get("bias", "none")
    if bias != "none":
        raise InvalidAdapterError(f"bias must be 'none', got {str(bias)[:50]!r}")

    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise InvalidAdapterError(f"r must be a positive integer, got {str(rank)[:50]!r}")
    if rank > max_lora_rank:
        raise InvalidAdapterError(f"rank r={rank} exceeds max_lora_rank={max_lora_rank}")
    alpha = config.get("lora_alpha", 8)  # PEFT's default
    if (
        not isinstance(alpha, (int, float))
        or isinstance(alpha, bool)
        or not (math.isfinite(alpha) and alpha > 0)
    ):
        raise InvalidAdapterError(
            f"lora_alpha must be a positive finite number, got {str(alpha)[:50]!r}"
        )
    use_rslora = config.get("use_rslora", False)
    if not isinstance(use_rslora, bool):
        raise InvalidAdapterError("use_rslora must be true or false")
    base = config.get("base_model_name_or_path")
    target_layers = _parse_target_modules(config.get("target_modules"))
    return LoRAAdapterConfig(
        rank=rank,
        lora_alpha=float(alpha),
        use_rslora=use_rslora,
        target_modules=tuple(target_layers),
        target_layers=target_layers,
        base_model_name_or_path=base if isinstance(base, str) else None,
        canonical_json=json.dumps(
            config, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8"),
    )
