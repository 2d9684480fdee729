"""The Loraplex inference engine: paged KV cache, continuous batching, multi-LoRA.

Names are imported lazily, so `loraplex.engine.request` (pure Python) does not pull in the
model stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncEngine": "async_engine",
    "EngineDeadError": "errors",
    "CacheConfig": "config",
    "ConfigError": "errors",
    "EngineConfig": "config",
    "LoRAConfig": "config",
    "ModelConfig": "config",
    "SchedulerConfig": "config",
    "ParallelConfig": "config",
    "WorkerDiedError": "errors",
    "LLM": "llm",
    "LLMEngine": "llm_engine",
    "CompletionOutput": "request",
    "InvalidAdapterError": "errors",
    "InvalidParameterError": "errors",
    "LoRARequest": "request",
    "RequestOutput": "request",
    "RequestTooLongError": "errors",
    "AdapterRemovedError": "errors",
    "ChatTemplateError": "errors",
    "ModelLoadError": "errors",
    "QuantizationError": "errors",
    "UnsupportedModelError": "errors",
    "SamplingParams": "request",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'loraplex.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"loraplex.engine.{_EXPORTS[name]}"), name)
