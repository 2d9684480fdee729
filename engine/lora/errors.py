"""Errors a client can cause by supplying a LoRA adapter."""

from __future__ import annotations


class InvalidAdapterError(ValueError):
    """The adapter directory, its config or its weights are unusable; the message says why."""
