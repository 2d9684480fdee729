"""ThreadMap: results in input order, and no error escapes while a piece still runs."""

from __future__ import annotations

import threading
import time

import pytest

from loraplex.engine.lora.task_map import ThreadMap, serial_map


def test_results_come_in_input_order() -> None:
    task_map = ThreadMap(3, "test")
    items = list(range(20))
    # Later items finish first: the order of results must not follow completion.
    assert task_map(lambda i: (time.sleep(0.001 * (20 - i)), i * i)[1], items) == [
        i * i for i in items
    ]
    assert task_map(lambda i: i, []) == [] == serial_map(lambda i: i, [])
    task_map.shutdown()


def test_an_error_waits_for_every_other_piece() -> None:
    task_map = ThreadMap(2, "test")
    finished = threading.Event()

    def piece(i: int) -> int:
        if i == 0:  # the calling thread's piece fails at once
            raise ValueError("bad piece")
        time.sleep(0.05)
        finished.set()
        return i

    with pytest.raises(ValueError, match="bad piece"):
        task_map(piece, [0, 1])
    assert finished.is_set()  # the other piece was done before the error reached the caller
    task_map.shutdown()
