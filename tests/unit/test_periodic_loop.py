"""A worker's periodic loop outlives a step that fails in a way nobody foresaw."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import structlog

from capdisc_workers.outage import RedisHealth
from capdisc_workers.reconciling import periodic


def test_a_step_that_raises_an_unforeseen_error_is_logged_and_the_loop_goes_on() -> None:
    res = SimpleNamespace(
        health=RedisHealth(structlog.get_logger("test")), stopping=threading.Event()
    )

    def step() -> None:
        raise ValueError("a damaged entry")

    assert periodic(res, "sweep", step, 5.0) == 5.0  # type: ignore[arg-type]
