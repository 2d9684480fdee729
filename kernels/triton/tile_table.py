"""Kernel tunings as data: tile shapes keyed by a size of the launch.

A table holds rows (largest size, tiles) in increasing order of size; a launch takes the first
row whose bound is at least its size, and the last row (bound `sys.maxsize`) covers the rest:

    rows   (64, decode tiles), (512, mid tiles), (sys.maxsize, prefill tiles)
    size   1..64 -> decode   65..512 -> mid   513.. -> prefill

Each launcher says which size keys its table (tokens of the launch, query tokens per sequence)
and has a companion that takes the tiles as an argument, so a benchmark or a test passes
candidate tiles explicitly; the table itself never changes at run time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
MIN_DOT_DIM = 16  # tl.dot needs every tile dimension >= 16


def check_dot_tiles(**sizes: int) -> None:
    """Raise ValueError unless every named tile size is a power of two >= MIN_DOT_DIM (what
    tl.arange and tl.dot accept)."""
    for name, size in sizes.items():
        if size < MIN_DOT_DIM or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= {MIN_DOT_DIM}, got {size}")


@dataclass(frozen=True)
class TileTable(Generic[T]):
    """Tiles per range of a launch size, looked up by `lookup(size)`."""

    rows: tuple[tuple[int, T], ...]  # (largest size, tiles), bounds strictly increasing

    def __post_init__(self) -> None:
        bounds = [bound for bound, _ in self.rows]
        if not bounds or bounds[-1] != sys.maxsize:
            raise ValueError("the last row of a tile table must cover every size (sys.maxsize)")
        if any(lo >= hi for lo, hi in zip(bounds, bounds[1:], strict=False)):
            raise ValueError(f"tile table bounds must increase strictly: {bounds}")

    def lookup(self, size: int) -> T:
        """The tiles of the first row whose bound is >= size."""
        return next(tiles for bound, tiles in self.rows if size <= bound)

    def row_index(self, size: int) -> int:
        """Which row `lookup(size)` takes (launches of one row share a compiled variant)."""
        return next(i for i, (bound, _) in enumerate(self.rows) if size <= bound)
