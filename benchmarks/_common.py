"""Shared helpers for the benchmark scripts: figures and a running embedded stack."""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from capdisc.settings import Settings
from capdisc_producers.stack import Stack, running_stack

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def describe_ms(values_s: Sequence[float]) -> str:
    ms = [v * 1000 for v in values_s]
    return (f"median {statistics.median(ms):.1f} ms, p99 {percentile(ms, 99):.1f} ms, "
            f"min {min(ms):.1f} ms, max {max(ms):.1f} ms (n={len(ms)})")


@contextmanager
def example_registry_stack(settings: Settings, env: Mapping[str, str]
                           ) -> Iterator[tuple[Stack, str, Path]]:
    """The embedded stack in a temporary project holding a copy of the example registry:
    ``(stack, redis url, registry directory)``."""
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        registry = project / "registry"
        shutil.copytree(ROOT / "examples" / "registry", registry)
        with running_stack(project, settings, env) as (stack, url):
            yield stack, url, registry
