"""The interpreter's bounds checks (interpreter_memcheck.py) catch what they are for."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.kernels.interpreter_memcheck import bounds_checked

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's checks")


def _copy_kernel() -> object:
    import triton
    import triton.language as tl

    @triton.jit
    def copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    return copy


@pytest.mark.parametrize(("x_len", "y_len", "what"), [(8, 16, "load"), (16, 8, "store")])
def test_an_access_past_every_argument_is_caught(
    triton_kernels: ModuleType, x_len: int, y_len: int, what: str
) -> None:
    copy = _copy_kernel()
    x, y = torch.ones(x_len), torch.zeros(y_len)
    with pytest.raises(Exception, match=rf"{what}\(s\) outside every tensor argument"):
        copy[(1,)](x, y, 16, BLOCK=16)  # type: ignore[index]


def test_masked_lanes_and_views_are_not_accesses(triton_kernels: ModuleType) -> None:
    copy = _copy_kernel()
    x, y = torch.arange(16.0), torch.zeros(32)
    copy[(1,)](x, y[16:], 10, BLOCK=16)  # type: ignore[index]  (a view: its storage counts)
    assert torch.equal(y[16:26], x[:10]) and not y[26:].any()


def test_the_interpreter_is_restored_when_the_context_closes() -> None:
    pytest.importorskip("triton")
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    before = (builder.create_masked_load, builder.create_masked_store)
    with bounds_checked():
        assert builder.create_masked_load is not before[0]
        assert builder.create_masked_store is not before[1]
    assert (builder.create_masked_load, builder.create_masked_store) == before
