"""Kernel tests: Triton vs reference, on CUDA when present, else under TRITON_INTERPRET=1.

The interpreter mode is fixed when a kernel module is imported (at `@triton.jit` time), so the
variable is set here, before any test module imports triton or loraplex.kernels.triton.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
