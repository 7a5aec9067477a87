"""Shared helpers for the benchmark scripts: figures and a running embedded stack."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


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
