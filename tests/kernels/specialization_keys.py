"""The keys Triton compiles kernel variants by, recorded from real launches.

Triton keys each compiled kernel on every int argument's class of value (1, a multiple of 16,
any other) and on every pointer's 16-byte alignment, unless the kernel says not to
(`do_not_specialize`, `do_not_specialize_on_alignment`). `recorded_keys` computes them with
Triton's own specialization function on each launch's arguments (on CUDA, and on CPU under the
interpreter alike). Modules that import this one are skipped where Triton lacks that function.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

triton_compiler = pytest.importorskip("triton.backends.compiler")
libtriton = pytest.importorskip("triton._C.libtriton")
if not hasattr(libtriton, "native_specialize_impl"):
    pytest.skip("this Triton has no native_specialize_impl", allow_module_level=True)


def not_specialized(kernel: Any) -> tuple[set[str], set[str]]:
    """(int arguments kept out of the key, pointers whose alignment is kept out)."""
    names = list(inspect.signature(kernel.fn).parameters)
    options = getattr(kernel, "kwargs", None)  # the interpreter's function keeps them here
    if options is None:
        return (
            {p.name for p in kernel.params if p.do_not_specialize},
            {p.name for p in kernel.params if p.do_not_specialize_on_alignment},
        )

    def named(entries: list[int | str] | None) -> set[str]:
        return {names[e] if isinstance(e, int) else e for e in entries or ()}

    return named(options.get("do_not_specialize")), named(
        options.get("do_not_specialize_on_alignment")
    )


def specialization_key(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple:
    """What Triton compiles a variant for: each argument's specialization, and the constexprs."""
    names = list(inspect.signature(kernel.fn).parameters)
    no_value, no_alignment = not_specialized(kernel)
    key: list[object] = []
    for name, value in zip(names, args, strict=False):
        if isinstance(value, bool) or not isinstance(value, int | torch.Tensor):
            key.append(type(value).__name__)  # floats and the like: never specialized
            continue
        key.append(
            libtriton.native_specialize_impl(
                triton_compiler.BaseBackend,
                value,
                False,
                name not in no_value,
                name not in no_alignment,
            )  # fmt: skip
        )
    return (*key, tuple(sorted(kwargs.items())))


@contextmanager
def recorded_keys(kernel: Any) -> Iterator[list[tuple]]:
    """The specialization key of each launch of `kernel` inside the block."""
    keys: list[tuple] = []
    run: Callable[..., Any] = kernel.run

    def recording_run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        keys.append(specialization_key(kernel, args, kwargs))
        return run(*args, grid=grid, warmup=warmup, **kwargs)

    kernel.run = recording_run
    try:
        yield keys
    finally:
        del kernel.run
