"""The flat keyword arguments of `LLM(...)` / `AsyncEngine.from_engine_args(...)` → EngineConfig."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from loraplex.engine.config import (
    CacheConfig,
    EngineConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
)
from loraplex.engine.errors import ConfigError

_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "lora": LoRAConfig,
}


def create_engine_config(model: str, **kwargs: Any) -> EngineConfig:
    """Route each keyword to the config section that declares it; unknown ones are an error."""
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    sections["model"]["model"] = model
    for key, value in kwargs.items():
        owner = next(
            (name for name, cls in _SECTIONS.items() if key in {f.name for f in fields(cls)}), None
        )
        if owner is None:
            raise ConfigError(f"unknown engine argument {key!r}")
        sections[owner][key] = value
    return EngineConfig(**{name: cls(**sections[name]) for name, cls in _SECTIONS.items()})
