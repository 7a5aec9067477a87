"""A sweep that grows slow puts off the next, so that sweeping stays a small share of the time."""

from __future__ import annotations

import pytest

from capdisc_workers.reconciling import sweep_pause_s


@pytest.mark.parametrize(
    ("interval_s", "took_s", "expected_s"),
    [
        (5.0, 0.0, 5.0),  # an empty outbox: the interval
        (5.0, 0.1, 5.0),  # 100,000 capabilities reindexing: within the duty, the interval
        (5.0, 0.25, 5.0),  # exactly the duty
        (5.0, 1.0, 20.0),  # a million reindexing: put off to keep 5% of the time
        (60.0, 1.0, 60.0),  # a long interval already keeps the share
    ],
)
def test_the_next_sweep_waits_the_interval_or_long_enough_to_keep_the_duty(
    interval_s: float, took_s: float, expected_s: float
) -> None:
    assert sweep_pause_s(interval_s, took_s, duty=0.05) == pytest.approx(expected_s)
