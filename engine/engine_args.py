"""The flat keyword arguments of `LLM(...)` / `AsyncEngine.from_engine_args(...)` → EngineConfig."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from loraplex.engine.config import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
)
from loraplex.engine.errors import ConfigError
from loraplex.engine.model.weight_loader import resolve_device

_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "lora": LoRAConfig,
    "parallel": ParallelConfig,
}


def create_engine_config(model: str, **kwargs: Any) -> EngineConfig:
    """Route each keyword to the config section that declares it; unknown ones are an error.
    Without `max_num_seqs` or `max_num_batched_tokens` (or given as None), the device's default."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    sections["model"]["model"] = model
    device = resolve_device(kwargs.get("device", "auto")).type
    for key, defaults in (
        ("max_num_seqs", DEFAULT_MAX_NUM_SEQS),
        ("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS),
    ):
        if kwargs.get(key) is None:
            kwargs.pop(key, None)
            sections["scheduler"][key] = defaults.get(device, defaults["cpu"])
    for key, value in kwargs.items():
        owner = next(
            (name for name, cls in _SECTIONS.items() if key in {f.name for f in fields(cls)}), None
        )
        if owner is None:
            raise ConfigError(f"unknown engine argument {key!r}")
        sections[owner][key] = value
    return EngineConfig(**{name: cls(**sections[name]) for name, cls in _SECTIONS.items()})
