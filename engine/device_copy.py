"""Host <-> device copies that never make the host wait for the GPU.

A copy between pageable host memory and the GPU is synchronous: the host waits until the
stream has finished everything queued before it. With async scheduling the stream still runs
the previous step while the host prepares the next one, so each copy goes through pinned
memory (PyTorch's caching host allocator keeps a pinned block until its copy is done).
"""

from __future__ import annotations

import array

import torch


def to_device(
    values: list[int] | list[float], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A 1-D tensor of `values` on `device`, copied without a wait."""
    device = torch.device(device)
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


def host_ints(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A 1-D host tensor of Python ints, through an `array` (a C loop): torch.tensor of a list
    costs several times more per element, and a step's lists hold thousands."""
    if not values:
        return torch.zeros(0, dtype=dtype)
    return torch.frombuffer(array.array(_ARRAY_CODES[dtype], values), dtype=dtype)


_ARRAY_CODES = {torch.int64: "q", torch.int32: "i"}


# Each packed tensor starts on this many bytes: Triton specializes a kernel on whether its
# pointers are 16-byte aligned, so a view at an odd offset would compile (and run) another one.
PACK_ALIGN_BYTES = 16


def packed_to_device(
    int64s: list[torch.Tensor], int32s: list[torch.Tensor], device: torch.device | str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Host tensors on `device` in two copies without a wait (one per dtype, staged through
    pinned memory), returned in order as contiguous views of their shapes, each starting
    PACK_ALIGN_BYTES-aligned. Views of one buffer: in-place writes to one never touch another."""
    return _packed(int64s, device), _packed(int32s, device)


def _packed(tensors: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    device = torch.device(device)
    align = PACK_ALIGN_BYTES // tensors[0].element_size()
    sizes = [-(-t.numel() // align) * align for t in tensors]  # each padded to the alignment
    # Packed straight into pinned memory: one host copy of each tensor, one transfer.
    host = torch.zeros(sum(sizes), dtype=tensors[0].dtype, pin_memory=device.type == "cuda")
    for chunk, t in zip(host.split(sizes), tensors, strict=True):
        chunk[: t.numel()] = t.reshape(-1)
    parts = host.to(device, non_blocking=True).split(sizes)
    return [part[: t.numel()].view(t.shape) for part, t in zip(parts, tensors, strict=True)]


def tensor_to_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device`, copied without a wait (staged through pinned memory)."""
    device = torch.device(device)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def copy_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Start copying a device tensor to pinned host memory; read it only once the stream has
    passed this point (e.g. after an event recorded now has completed). A host tensor is
    returned as it is."""
    if tensor.device.type != "cuda":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)
