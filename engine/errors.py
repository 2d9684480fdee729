"""Every error the engine raises on purpose, in one place.

Clients cause the `ValueError`s (bad parameters, a prompt that can never fit, an unusable
adapter); the platform maps each to one HTTP status in `platform/api/errors.py`.
"""

from __future__ import annotations

import functools
from typing import Any


class ConfigError(ValueError):
    """An engine option is out of range or inconsistent."""


class InvalidParameterError(ValueError):
    """A request parameter a client chose is invalid; `param` names it."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(f"{param}: {message}")
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Pickled whole (the engine's own process sends it to the caller's).
        return functools.partial(type(self), param=self.param), (self.message,)


class RequestTooLongError(InvalidParameterError):
    """The prompt (plus at least one generated token) can never fit the context or KV pool."""


class InvalidAdapterError(ValueError):
    """The adapter directory, its config or its weights are unusable; the message says why."""


class AdapterRemovedError(LookupError):
    """The request's adapter was removed (`remove_lora`) and its files were gone before the
    request's load could read them: like a request naming an unknown adapter, not a fault."""


class ChatTemplateError(ValueError):
    """The checkpoint has no chat template, or the messages do not fit it."""


class ModelLoadError(RuntimeError):
    """The checkpoint directory is missing a file, or a file is malformed."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint is of an architecture (or uses a feature) Loraplex does not implement."""


class QuantizationError(ModelLoadError):
    """The quantization option or the checkpoint's quantization_config is unsupported or
    inconsistent with the checkpoint's tensors."""


class EngineDeadError(RuntimeError):
    """The engine thread stopped; no request can be served."""


class WorkerDiedError(EngineDeadError):
    """A tensor-parallel worker process died or its collectives failed; the engine stopped."""
