"""Argument checks shared by the kernel launchers, Triton's and `cuda/`'s: each raises ValueError
naming its op. Outside `triton/`, so importing it never imports Triton."""

from __future__ import annotations

import torch


def check(op: str, cond: bool, msg: str, *args: object) -> None:
    """Raise ValueError("op: msg % args") unless `cond`. The message is formatted only on
    failure: launchers check every launch, and eager f-strings cost more than the checks."""
    if not cond:
        raise ValueError(f"{op}: {msg % args if args else msg}")


def check_one_device(op: str, *tensors: torch.Tensor) -> None:
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        devices = {t.device for t in tensors}
        raise ValueError(f"{op}: all tensors must be on one device, got {devices}")


def check_contiguous_last_dim(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        check(op, t.stride(-1) == 1, "%s needs a contiguous last dim", name)
