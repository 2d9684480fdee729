"""Timing helpers of the kernel benchmarks: triton's do_bench, eager or on a CUDA graph."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from triton.testing import do_bench


def bench_us(fn: Callable[[], Any]) -> float:
    """Median time of one call in microseconds (do_bench flushes L2 before each run)."""
    return float(do_bench(fn, warmup=10, rep=50)) * 1e3


def graph_us(fn: Callable[[], Any], repeats: int = 1) -> float:
    """Microseconds of one replay of a CUDA graph of `repeats` calls of fn (run once first, to
    compile and warm up, outside the capture)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            fn()
    return bench_us(graph.replay)
