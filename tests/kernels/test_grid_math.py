"""The launchers' host-side grid math against Triton's own constexpr functions."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from loraplex.kernels.triton.grid_math import cdiv, next_power_of_2  # noqa: E402

VALUES = [*range(-70, 4200), 2**31 - 1, 2**31, 2**31 + 1, 2**40 + 3, 2**62 + 5]


def test_next_power_of_2_matches_triton() -> None:
    assert [next_power_of_2(n) for n in VALUES] == [triton.next_power_of_2(n) for n in VALUES]


@pytest.mark.parametrize("y", [1, 2, 3, 16, 64, 100, 128, 1024])
def test_cdiv_matches_triton(y: int) -> None:
    assert [cdiv(x, y) for x in VALUES] == [triton.cdiv(x, y) for x in VALUES]
