"""Shared helpers for the benchmark scripts: figures and a running embedded stack."""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from capdisc.settings import Settings
from capdisc_producers.publisher import Publisher
from capdisc_producers.stack import Stack, running_stack
from capdisc_producers.sync import SyncReport, sync_directory

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def describe_ms(values_s: Sequence[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (
        f"median {statistics.median(ms):.1f} ms, p99 {percentile(ms, 99):.1f} ms, "
        f"min {min(ms):.1f} ms, max {max(ms):.1f} ms (n={len(ms)})"
    )


@contextmanager
def example_registry_stack(
    settings: Settings, env: Mapping[str, str]
) -> Iterator[tuple[Stack, str, Path]]:
    """The embedded stack in a temporary project holding a copy of the example registry:
    ``(stack, redis url, registry directory)``."""
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        registry = project / "registry"
        shutil.copytree(ROOT / "examples" / "registry", registry)
        with running_stack(project, settings, env) as (stack, url):
            yield stack, url, registry


def publish_registry(
    connection: redis.Redis,
    url: str,
    registry: Path,
    settings: Settings,
    token: str | None = None,
) -> SyncReport:
    """Publish ``registry`` to the stack at ``url`` as ``settings.tenant`` and wait (up to
    120 s) until it is indexed; the report carries the index version that serves it."""
    publisher = Publisher(url, token=token)
    try:
        return sync_directory(
            connection,
            publisher,
            registry,
            tenant=settings.tenant,
            max_bytes=settings.manifest_max_bytes,
            wait_s=120,
        )
    finally:
        publisher.close()


def stop_processes(processes: Sequence[subprocess.Popen[bytes] | None]) -> None:
    """SIGTERM every running process, then wait for each (SIGKILL after 15 s)."""
    running = [p for p in processes if p is not None]
    for process in running:
        if process.poll() is None:
            process.terminate()
    for process in running:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class RedisSampler:
    """Another process that samples a Redis while this one works: ``sample(client)`` again and
    again, ``pause_s`` apart, until the block ends; the results are then in ``samples``. In
    a process of its own, so that the work measured here (parsing, holding the GIL) does not
    delay it."""

    def __init__(self, url: str, sample: Callable[[redis.Redis], Any], pause_s: float) -> None:
        self.url, self.sample, self.pause_s = url, sample, pause_s
        self.stop = multiprocessing.Event()
        self.results: multiprocessing.Queue[list[Any]] = multiprocessing.Queue()
        self.process = multiprocessing.Process(target=self._run, daemon=True)
        self.samples: list[Any] = []

    def _run(self) -> None:
        client = redis.Redis.from_url(self.url, socket_timeout=120)
        samples = []
        while not self.stop.is_set():
            samples.append(self.sample(client))
            time.sleep(self.pause_s)
        self.results.put(samples)

    def __enter__(self) -> RedisSampler:
        self.process.start()
        time.sleep(0.2)  # the process started and sampling
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.samples = self.results.get(timeout=60)
        self.process.join()
