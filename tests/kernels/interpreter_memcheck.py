"""Bounds checks for Triton kernels run by the interpreter (TRITON_INTERPRET=1, on CPU).

On a GPU an out-of-bounds access is an "illegal memory access" only when it leaves mapped memory;
the interpreter reads and writes raw host addresses and notices nothing. Inside `bounds_checked()`
every load and store a kernel makes (the lanes its mask lets through) must fall inside the storage
of one of that launch's tensor arguments, or the launch raises `OutOfBoundsAccess`. This is what
CUDA's compute-sanitizer memcheck does, at the granularity of whole storages: a view's accesses
may roam its storage, an access past every argument's memory is caught.

It wraps two methods of Triton's interpreter (its argument staging and its masked load/store),
which are internal: `bounds_checked` fails loudly if they are missing, rather than check nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np


class OutOfBoundsAccess(AssertionError):
    pass


def _storage_ranges(args: Any) -> list[tuple[int, int]]:
    """[start, end) byte ranges of the storages of every tensor among `args` (nested tuples)."""
    ranges = []
    stack = list(args)
    while stack:
        arg = stack.pop()
        if isinstance(arg, tuple):
            stack.extend(arg)
        elif hasattr(arg, "untyped_storage"):
            storage = arg.untyped_storage()
            ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return ranges


def _check(
    kernel: str, ranges: list[tuple[int, int]], ptrs: Any, mask: Any, itemsize: int, what: str
) -> None:
    # Only the lanes the mask lets through (an unmasked load comes here with an all-true mask).
    addresses = np.asarray(ptrs.data[mask.data.astype(bool)], dtype=np.uint64).ravel()
    if addresses.size == 0:
        return
    inside = np.zeros(addresses.shape, dtype=bool)
    for start, end in ranges:
        inside |= (addresses >= start) & (addresses + itemsize <= end)
    if not inside.all():
        outside = addresses[~inside]
        raise OutOfBoundsAccess(
            f"{kernel}: {outside.size} {what}(s) outside every tensor argument, first at "
            f"{hex(int(outside[0]))}; arguments at "
            + ", ".join(f"[{hex(s)}, +{e - s})" for s, e in ranges)
        )


@contextmanager
def bounds_checked() -> Iterator[None]:
    """Check every interpreted launch's loads and stores while the context is open."""
    from triton.runtime import interpreter

    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    stage: Callable[..., Any] = executor._init_args_hst
    load: Callable[..., Any] = builder.create_masked_load
    store: Callable[..., Any] = builder.create_masked_store
    launch: dict[str, Any] = {"kernel": "", "ranges": []}

    def staged(self: Any, args_dev: Any, kwargs: Any) -> Any:
        args_hst, kwargs_hst = stage(self, args_dev, kwargs)
        launch["kernel"] = getattr(self.fn, "__name__", "kernel")
        launch["ranges"] = _storage_ranges((*args_hst, *kwargs_hst.values()))
        return args_hst, kwargs_hst

    def checked_load(self: Any, ptrs: Any, mask: Any, *rest: Any) -> Any:
        itemsize = interpreter._get_np_dtype(ptrs.get_element_ty()).itemsize
        _check(launch["kernel"], launch["ranges"], ptrs, mask, itemsize, "load")
        return load(self, ptrs, mask, *rest)

    def checked_store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any) -> Any:
        _check(launch["kernel"], launch["ranges"], ptrs, mask, value.data.dtype.itemsize, "store")
        return store(self, ptrs, value, mask, *rest)

    executor._init_args_hst = staged
    builder.create_masked_load = checked_load
    builder.create_masked_store = checked_store
    try:
        yield
    finally:
        executor._init_args_hst = stage
        builder.create_masked_load = load
        builder.create_masked_store = store
