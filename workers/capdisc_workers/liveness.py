"""An indexing worker's life, told to the others: its heartbeat, and what happens at start,
after each task and at shutdown.

When the worker is ready it loads its model (so the first event does not wait for it) and
starts three threads: the heartbeat, which records every ``heartbeat_interval_s`` that it is
alive and which tasks it holds (the sweep gives back what no live worker holds), and the
reconcile and sweep loops (:mod:`capdisc_workers.reconciling`). After each task that will not
run again, the task leaves the outbox. At shutdown the threads stop and the worker is forgotten.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from typing import Any

import redis
import structlog
from celery import signals

from capdisc import status
from capdisc.registry import outbox
from capdisc_workers import metrics
from capdisc_workers.celery_app import resources
from capdisc_workers.outage import RETRYABLE, Backoff, waited_out
from capdisc_workers.reconciling import periodic, reconcile_loop, sweep_loop
from capdisc_workers.resources import Resources

log = structlog.get_logger("capdisc.indexing")


@signals.worker_ready.connect
def _start(**_: Any) -> None:
    res = resources
    if res.settings.embedder != "openai":  # a remote model has nothing to load (and calls cost)
        res.embedder.embed(["warm up"])  # load the model before the first event, not during it
    res.metrics_port = metrics.serve_metrics(
        res.settings.metrics_port, res.settings.metrics_host, metrics.RegistryGauges(res.connect)
    )
    for name, loop in (
        ("heartbeat", heartbeat_loop),
        ("reconcile", reconcile_loop),
        ("sweep", sweep_loop),
    ):
        threading.Thread(target=loop, args=(res,), name=f"capdisc-{name}", daemon=True).start()


_started: dict[str, float] = {}


@signals.task_prerun.connect
def _task_started(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _started[task_id] = time.perf_counter()


@signals.task_postrun.connect
def _task_measured(
    task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any
) -> None:
    """Count the task by name and outcome (``ok``, ``retry``, ``failed``) and time it."""
    started = _started.pop(task_id or "", None)
    name = str(getattr(task, "name", "unknown"))
    outcome = {"SUCCESS": "ok", "RETRY": "retry"}.get(state or "", "failed")
    metrics.TASKS.labels(name, outcome).inc()
    if started is not None:
        metrics.TASK_SECONDS.labels(name).observe(time.perf_counter() - started)


@signals.task_postrun.connect
def forget_done_task(
    task_id: str | None = None, state: str | None = None, retval: Any = None, **_: Any
) -> None:
    """A task that will not run again (it did not ask for a retry) leaves the outbox; one that
    failed because Redis was away stays, so the sweep sends it again."""
    if not task_id or state == "RETRY":
        return
    if state == "FAILURE" and isinstance(retval, BaseException) and waited_out(retval):
        log.warning(
            "task_kept",
            task_id=task_id,
            reason=f"Redis was away or refused writes: {retval}",
            hint="the sweep sends it again once Redis is back and takes writes",
        )
        return
    try:
        outbox.done(resources.redis, task_id)
    except RETRYABLE as exc:  # kept: the sweep finds it done or sends it again (idempotent)
        resources.health.failed("task", exc)


@signals.worker_shutting_down.connect
def _stop(**_: Any) -> None:
    resources.stopping.set()
    with contextlib.suppress(redis.RedisError):
        status.forget_worker(resources.redis, resources.worker_id)


def heartbeat_loop(res: Resources) -> None:
    """Every ``heartbeat_interval_s``, record that this worker is alive and the tasks it holds
    (sooner while Redis is away, until it is back)."""
    client = res.connect()
    info = {
        "kind": "indexing",
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "embedder": res.embedder.id,
        "metrics_port": res.metrics_port,
    }
    backoff = Backoff(cap_s=res.settings.heartbeat_interval_s)

    def beat() -> None:
        status.heartbeat(client, res.worker_id, {**info, "tasks": sorted(_held_tasks())})

    while not res.stopping.is_set():
        res.stopping.wait(
            periodic(res, "heartbeat", beat, res.settings.heartbeat_interval_s, backoff)
        )


def _held_tasks() -> set[str]:
    """Ids of the tasks this worker holds: received, waiting for a retry's countdown (Celery
    keeps all of them in ``state.requests``), or running. Copied in one step (a dict's keys are
    copied without running Python code, so the consumer thread cannot change it meanwhile);
    Celery drops the received ones when its connection is lost, so they are held no longer."""
    from celery.worker import state

    return {str(task_id) for task_id in list(state.requests)}
