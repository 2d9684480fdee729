"""Kernel tests: Triton vs reference, on CUDA when present, else under TRITON_INTERPRET=1.

Interpreter mode is fixed per function when it is decorated with `@triton.jit`, including
triton's own library functions (tl.sum, tl.max, ...) decorated when triton is first imported.
So TRITON_INTERPRET must be set before anything imports triton. This file sets it for runs of
tests/kernels alone; in a full run other tests (through torch._dynamo) may import triton first,
so tests/conftest.py must set it too, before any other import.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

from tests.kernels.interpreter_memcheck import bounds_checked

TRITON_IMPORTED_TOO_EARLY = False
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    TRITON_IMPORTED_TOO_EARLY = "triton" in sys.modules
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def triton_kernels() -> Iterator[ModuleType]:
    """loraplex.kernels.triton, or a skip if Triton is missing; a failure if it cannot run. On
    CPU (the interpreter) every load and store of the test's launches is bounds-checked."""
    pytest.importorskip("triton", reason="Triton is not installed")
    if TRITON_IMPORTED_TOO_EARLY:
        pytest.fail(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run on "
            "CPU; set TRITON_INTERPRET=1 (when CUDA is absent) at the top of tests/conftest.py"
        )
    from loraplex.kernels import triton as triton_kernels

    if torch.cuda.is_available():
        yield triton_kernels
        return
    with bounds_checked():
        yield triton_kernels
