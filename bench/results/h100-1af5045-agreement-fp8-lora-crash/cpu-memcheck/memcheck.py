"""Run the engine on CPU with every Triton kernel under TRITON_INTERPRET=1 and check each
masked load/store address against the storages of the launch's tensor arguments."""
import os, sys, random, tempfile, time
os.environ["TRITON_INTERPRET"] = "1"
from pathlib import Path
import numpy as np
import torch
import triton.runtime.interpreter as interp
from loraplex.kernels import dispatch

dispatch._use_triton = lambda t: True  # Triton (interpreted) for CPU tensors too

RANGES: list[tuple[int, int]] = []
LAUNCH = [""]
orig_init = interp.GridExecutor._init_args_hst

def init_args(self, args_dev, kwargs):
    args_hst, kwargs_hst = orig_init(self, args_dev, kwargs)
    RANGES.clear()
    LAUNCH[0] = self.fn.__name__
    def add(a):
        if isinstance(a, tuple):
            for x in a: add(x)
        elif hasattr(a, "untyped_storage"):
            s = a.untyped_storage()
            RANGES.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
    for a in args_hst: add(a)
    for a in kwargs_hst.values(): add(a)
    return args_hst, kwargs_hst
interp.GridExecutor._init_args_hst = init_args

def check(ptrs, mask, itemsize, what):
    addrs = ptrs.data[mask.data.astype(bool)] if mask is not None else ptrs.data.ravel()
    if addrs.size == 0:
        return
    addrs = addrs.astype(np.uint64)
    ok = np.zeros(addrs.shape, dtype=bool)
    for s, e in RANGES:
        ok |= (addrs >= s) & (addrs + itemsize <= e)
    if not ok.all():
        bad = addrs[~ok][:4]
        raise RuntimeError(f"OOB {what} in {LAUNCH[0]}: {len(addrs[~ok])} addresses, e.g. "
                           f"{[hex(int(b)) for b in bad]}, ranges {[(hex(s), e - s) for s, e in RANGES]}")

B = interp.InterpreterBuilder
orig_load, orig_store = B.create_masked_load, B.create_masked_store
def masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
    check(ptrs, mask, interp._get_np_dtype(ptrs.get_element_ty()).itemsize if hasattr(ptrs, "get_element_ty") else 1, "load")
    return orig_load(self, ptrs, mask, other, cache_policy, is_volatile)
def masked_store(self, ptrs, value, mask, cache_policy):
    check(ptrs, mask, value.data.dtype.itemsize, "store")
    return orig_store(self, ptrs, value, mask, cache_policy)
B.create_masked_load, B.create_masked_store = masked_load, masked_store

from loraplex.kernels import reference as _reference
from loraplex.kernels import triton as _triton_mod
for _name in _reference.__all__:
    if not hasattr(_triton_mod, _name):
        setattr(_triton_mod, _name, getattr(_reference, _name))
