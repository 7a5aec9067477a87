"""One background thread working through handed-over jobs."""

from __future__ import annotations

import threading

from capdisc_workers.background import OneThread


def test_jobs_are_handled_in_the_order_submitted() -> None:
    seen: list[int] = []
    jobs = OneThread("test-order", seen.append)

    for n in range(5):
        jobs.submit(n)

    assert jobs.wait(10)
    assert seen == [0, 1, 2, 3, 4]


def test_a_job_that_raises_does_not_end_the_thread() -> None:
    seen: list[int] = []

    def handle(n: int) -> None:
        if n == 1:
            raise RuntimeError("broken job")
        seen.append(n)

    jobs = OneThread("test-raises", handle)
    for n in range(3):
        jobs.submit(n)

    assert jobs.wait(10)
    assert seen == [0, 2]


def test_a_job_beyond_the_pending_limit_is_refused() -> None:
    started, release = threading.Event(), threading.Event()

    def handle(_n: int) -> None:
        started.set()
        release.wait(10)

    jobs = OneThread("test-full", handle, pending=1)
    jobs.submit(0)
    assert started.wait(10)  # the thread holds job 0; one more may wait

    assert jobs.submit(1) is True
    assert jobs.submit(2) is False
    release.set()
    assert jobs.wait(10)
