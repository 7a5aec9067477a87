"""Which heartbeats the sweep forgets: those older than ``worker_forget_after_s`` and those that
are no heartbeat at all; never a worker seen within it."""

from __future__ import annotations

from typing import Any

import pytest

from capdisc.status import gone_workers

HOUR_MS = 3_600_000


def _beat(last_seen_ms: Any) -> dict[str, Any]:
    return {"id": "w", "kind": "indexing", "last_seen_ms": last_seen_ms}


@pytest.mark.parametrize(
    ("entry", "now_ms", "forget_after_s", "gone"),
    [
        (_beat(0), HOUR_MS, 3600.0, True),
        (_beat(1), HOUR_MS, 3600.0, False),
        (_beat(HOUR_MS), HOUR_MS, 3600.0, False),
        (_beat(HOUR_MS + 5), HOUR_MS, 3600.0, False),  # another host's clock ahead
        (_beat(1000), 2000, 1.0, True),
        (None, 0, 3600.0, True),  # not JSON
        (5, 0, 3600.0, True),
        ({"id": "w", "kind": "indexing"}, 0, 3600.0, True),
        (_beat("yesterday"), 0, 3600.0, True),
    ],
)
def test_a_worker_is_forgotten_only_past_the_horizon_or_when_unreadable(
    entry: Any, now_ms: int, forget_after_s: float, gone: bool
) -> None:
    assert gone_workers({"w": entry}, now_ms, forget_after_s) == (["w"] if gone else [])
