"""The engine's adapter validator, for registration (`crud.register_adapter` takes it as a
parameter so that the registry itself does not depend on the engine)."""

from __future__ import annotations

from pathlib import Path

from loraplex.engine.lora.adapter import load_lora_adapter
from loraplex.engine.model.hf_config import ModelArchConfig
from loraplex.platform.crud.adapters import AdapterValidator, ValidatedAdapter


def engine_adapter_validator(model_dir: str | Path, max_lora_rank: int) -> AdapterValidator:
    """Validates an adapter exactly as the engine will load it, against the base model."""
    arch = ModelArchConfig.from_model_dir(model_dir)

    def validate(path: Path) -> ValidatedAdapter:
        return load_lora_adapter(path, arch, max_lora_rank)

    return validate
