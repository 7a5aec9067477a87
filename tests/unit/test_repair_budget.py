"""The reconciler keeps at most a producer's window of repair events waiting for a tenant, and
the sweep tops that window up from what a run left for later, a whole task at a time."""

from __future__ import annotations

import pytest

from capdisc_workers.embedding import EMBED_BATCH
from capdisc_workers.reconciling import (
    UNBOUNDED_TOP_UP_TASKS,
    backlog_tasks_to_send,
    repair_budget,
)


@pytest.mark.parametrize(
    ("max_pending_tasks", "waiting", "expected"),
    [
        (32, 0, 32 * EMBED_BATCH),  # nothing waiting: a whole window
        (32, 100, 32 * EMBED_BATCH - 100),  # what waits counts against it
        (32, 32 * EMBED_BATCH, 0),  # a full window waiting: nothing more
        (32, 40 * EMBED_BATCH, 0),  # more than a window (sent before the bound): nothing
        (1, 10, EMBED_BATCH - 10),
        (0, 10**6, None),  # no bound
    ],
)
def test_a_run_sends_what_the_window_leaves_beside_the_repairs_still_waiting(
    max_pending_tasks: int, waiting: int, expected: int | None
) -> None:
    assert repair_budget(max_pending_tasks, waiting) == expected


@pytest.mark.parametrize(
    ("max_pending_tasks", "waiting", "expected"),
    [
        (32, 0, 32),  # the window drained: all of it again
        (32, 31 * EMBED_BATCH, 1),  # room for one task
        (32, 31 * EMBED_BATCH + 1, 0),  # room for less than a task: wait for it
        (32, 32 * EMBED_BATCH, 0),
        (32, 40 * EMBED_BATCH, 0),
        (1, 0, 1),
        (0, 10**6, UNBOUNDED_TOP_UP_TASKS),  # no bound: a bounded step a sweep all the same
    ],
)
def test_the_sweep_sends_whole_tasks_of_the_backlog_as_the_window_has_room(
    max_pending_tasks: int, waiting: int, expected: int
) -> None:
    assert backlog_tasks_to_send(max_pending_tasks, waiting) == expected
