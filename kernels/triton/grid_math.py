"""Integer math of the launchers' grids and tile sizes, on the host.

`triton.cdiv` and `triton.next_power_of_2` are constexpr functions: callable in kernels and on
the host alike, but each host call first unwraps its arguments, ~2 us per call on a development CPU
against ~0.03 us for the plain expression. Launchers call them a few times per launch, and a
forward makes hundreds of launches, so the launchers use these instead (the same results, 0 and
negatives included)."""

from __future__ import annotations


def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for y > 0."""
    return (x + (y - 1)) // y


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n; 0 for n <= 0, as Triton's (n < 2**64)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
