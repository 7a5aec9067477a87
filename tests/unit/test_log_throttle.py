"""A warning anyone can cause is written a bounded number of times a window, and the next
window's first line says how many were left out."""

from __future__ import annotations

import pytest

from capdisc.logs import Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("calls", "written"),
    [(1, 1), (3, 3), (4, 3), (100, 3)],
)
def test_at_most_per_window_are_written_in_a_window(calls: int, written: int) -> None:
    throttle = Throttle(per_window=3, window_s=60, clock=Clock())

    admitted = [throttle.admit() for _ in range(calls)]

    assert sum(a is not None for a in admitted) == written


def test_the_next_windows_first_line_counts_those_left_out() -> None:
    clock = Clock()
    throttle = Throttle(per_window=3, window_s=60, clock=clock)
    for _ in range(10):
        throttle.admit()
    clock.now += 60

    assert [throttle.admit(), throttle.admit()] == [7, 0]
