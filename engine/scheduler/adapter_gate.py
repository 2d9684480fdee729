"""AdapterGate: the scheduler's view of the LoRA manager (`engine/lora/lora_manager.py`)."""

from __future__ import annotations

from typing import Protocol

from loraplex.engine.request import Request


class AdapterGate(Protocol):
    """What the scheduler asks of the LoRA manager (pure bookkeeping, no tensors)."""

    def is_ready(self, request: Request) -> bool:
        """No adapter, or the request's adapter is ready on the GPU."""
        ...

    def is_loading(self, request: Request) -> bool:
        """The request's adapter is on its way (read from disk or copied to the GPU now)."""
        ...

    def on_scheduled(self, request: Request) -> None:
        """The request runs from this step on: its adapter must stay on the GPU."""
        ...

    def on_descheduled(self, request: Request) -> None:
        """The request stopped running (finished, aborted or preempted)."""
        ...
