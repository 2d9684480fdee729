"""The Llama-family model (Llama, Mistral, Qwen2), its config and its weight loader."""

from loraplex.engine.errors import ModelLoadError, UnsupportedModelError
from loraplex.engine.model.forward_context import AttentionMetadata, ForwardContext, LoRAApplier
from loraplex.engine.model.hf_config import (
    SUPPORTED_ARCHITECTURES,
    ModelArchConfig,
    RopeConfig,
    validate_model_dir,
)
from loraplex.engine.model.linear import MergedLinear
from loraplex.engine.model.llama import LlamaForCausalLM
from loraplex.engine.model.weight_loader import load_model, load_weights, resolve_dtype

__all__ = [
    "SUPPORTED_ARCHITECTURES",
    "AttentionMetadata",
    "ForwardContext",
    "LlamaForCausalLM",
    "LoRAApplier",
    "MergedLinear",
    "ModelArchConfig",
    "ModelLoadError",
    "RopeConfig",
    "UnsupportedModelError",
    "load_model",
    "load_weights",
    "resolve_dtype",
    "validate_model_dir",
]
