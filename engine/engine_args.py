"""The flat keyword arguments of `LLM(...)` / `AsyncEngine.from_engine_args(...)` → EngineConfig."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from loraplex.engine.config import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
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
    Without `max_num_batched_tokens`, the device's default budget."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    sections["model"]["model"] = model
    if "max_num_batched_tokens" not in kwargs:
        device = resolve_device(kwargs.get("device", "auto")).type
        budget = DEFAULT_MAX_NUM_BATCHED_TOKENS.get(device, DEFAULT_MAX_NUM_BATCHED_TOKENS["cpu"])
        sections["scheduler"]["max_num_batched_tokens"] = budget
    for key, value in kwargs.items():
        owner = next(
            (name for name, cls in _SECTIONS.items() if key in {f.name for f in fields(cls)}), None
        )
        if owner is None:
            raise ConfigError(f"unknown engine argument {key!r}")
        sections[owner][key] = value
    return EngineConfig(**{name: cls(**sections[name]) for name, cls in _SECTIONS.items()})
