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
    """`aligned_to_device` of each dtype's tensors: two copies."""
    return aligned_to_device(int64s, device), aligned_to_device(int32s, device)


def aligned_to_device(
    tensors: list[torch.Tensor], device: torch.device | str
) -> list[torch.Tensor]:
    """Host tensors of one dtype on `device` in one copy without a wait (staged through pinned
    memory), returned in order as contiguous views of their shapes, each starting
    PACK_ALIGN_BYTES-aligned. Views of one buffer: in-place writes to one never touch another."""
    device = torch.device(device)
    dtype = tensors[0].dtype
    align = PACK_ALIGN_BYTES // tensors[0].element_size()
    padding = torch.zeros(align, dtype=dtype)
    pieces: list[torch.Tensor] = []  # each tensor, then zeros up to the next aligned offset
    starts: list[int] = []  # where each tensor is among the pieces
    for t in tensors:
        starts.append(len(pieces))
        pieces.append(t.reshape(-1))
        if t.numel() % align:
            pieces.append(padding[: align - t.numel() % align])
    sizes = [piece.numel() for piece in pieces]
    # Packed straight into pinned memory: one host copy of each tensor, one transfer.
    host = torch.empty(sum(sizes), dtype=dtype, pin_memory=device.type == "cuda")
    torch.cat(pieces, out=host)
    parts = host.to(device, non_blocking=True).split(sizes)
    return [  # a view costs microseconds: only the tensors of more than one dimension take one
        parts[i] if t.dim() == 1 else parts[i].view(t.shape)
        for i, t in zip(starts, tensors, strict=True)
    ]


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
