"""Jobs worked through by one daemon thread, in the order they were handed over, so the thread
that hands them over (a discovery turn, a snapshot swap) never waits for them."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger("capdisc.background")
Job = TypeVar("Job")


class OneThread(Generic[Job]):
    """``handle`` run on each job submitted, on a thread named ``name`` started with the first
    one. At most ``pending`` jobs wait (0: no limit); a job beyond that is refused. A job that
    raises is logged and the thread goes on."""

    def __init__(self, name: str, handle: Callable[[Job], None], pending: int = 0) -> None:
        self.name = name
        self._handle = handle
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=pending)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, job: Job) -> bool:
        """Queue ``job``; False (and dropped) when ``pending`` jobs already wait."""
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            return False
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return True

    def wait(self, timeout_s: float) -> bool:
        """Wait until every job submitted so far has been handled; False on timeout."""
        done = self._jobs.all_tasks_done
        with done:
            return done.wait_for(lambda: not self._jobs.unfinished_tasks, timeout_s)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                self._handle(job)
            except Exception:  # the jobs are optimisations: a failed one must not end the thread
                log.exception("background_job_failed", thread=self.name)
            finally:
                self._jobs.task_done()
