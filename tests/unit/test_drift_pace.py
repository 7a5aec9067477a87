"""The drift check in pieces waits after each HSCAN call so that its calls take at most a share
of the time."""

from __future__ import annotations

import pytest

from capdisc.registry.drift import scan_pause_s


@pytest.mark.parametrize(
    ("took_s", "duty", "expected_s"),
    [
        (0.001, 0.25, 0.003),  # a quarter of the time: three times the call's length after it
        (0.001, 0.5, 0.001),
        (0.004, 0.25, 0.012),
        (0.001, 1.0, 0.0),  # the whole time: no wait
        (0.0, 0.25, 0.0),
    ],
)
def test_the_pause_after_a_call_keeps_the_calls_to_their_share_of_the_time(
    took_s: float, duty: float, expected_s: float
) -> None:
    assert scan_pause_s(took_s, duty) == pytest.approx(expected_s)
