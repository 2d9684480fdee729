"""Host <-> device copies that never make the host wait for the GPU.

A copy between pageable host memory and the GPU is synchronous: the host waits until the
stream has finished everything queued before it. With async scheduling the stream still runs
the previous step while the host prepares the next one, so each copy goes through pinned
memory (PyTorch's caching host allocator keeps a pinned block until its copy is done).
"""

from __future__ import annotations

import torch


def to_device(
    values: list[int] | list[float], dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A 1-D tensor of `values` on `device`, copied without a wait."""
    device = torch.device(device)
    host = torch.tensor(values, dtype=dtype, pin_memory=device.type == "cuda")
    return host.to(device, non_blocking=True)


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
