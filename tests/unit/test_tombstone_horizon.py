"""Which tombstones the reconciler forgets: those of deletes applied longer ago than the
horizon, never one applied within it."""

from __future__ import annotations

import pytest

from capdisc.registry.tombstones import prune_cutoff_ms
from capdisc.settings import Settings

DAY_MS = 86_400_000


@pytest.mark.parametrize(
    ("deleted_at_ms", "now_ms", "horizon_s", "forgotten"),
    [
        (0, 7 * DAY_MS, 7 * 86400.0, True),
        (1, 7 * DAY_MS, 7 * 86400.0, False),
        (7 * DAY_MS, 7 * DAY_MS, 7 * 86400.0, False),
        (1000, 2000, 1.0, True),
        (1001, 2000, 1.0, False),
        (1999, 2000, 0.5, False),
    ],
)
def test_a_tombstone_is_forgotten_only_past_the_horizon(
    deleted_at_ms: int, now_ms: int, horizon_s: float, forgotten: bool
) -> None:
    assert (deleted_at_ms <= prune_cutoff_ms(now_ms, horizon_s)) is forgotten


def test_the_default_horizon_is_a_week() -> None:
    assert Settings().tombstone_horizon_s == 7 * 86400
