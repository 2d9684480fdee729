"""Argument checks shared by the Triton launchers: each raises ValueError naming its op."""

from __future__ import annotations

import torch


def check(op: str, cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(f"{op}: {msg}")


def check_one_device(op: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    check(op, len(devices) == 1, f"all tensors must be on one device, got {devices}")


def check_contiguous_last_dim(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        check(op, t.stride(-1) == 1, f"{name} needs a contiguous last dim")
