"""``capdisc import jsonl``: a bulk catalog (the ``tools.jsonl`` format of ``shared/data``) as
one source of capabilities.

Like a directory sync: only new or changed capabilities are sent (an unchanged re-import sends
nothing and embeds nothing), and capabilities of the same source that the file no longer has
are deleted, unless some line of the file failed to parse (a broken line never removes what it
may have been meant to update). Events go out in chunks, so a progress callback can follow.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import redis

from capdisc.evaluation import read_jsonl_catalog
from capdisc.registry import plan_sync
from capdisc.store import stored_by_source
from capdisc_producers.publisher import Publisher, wait_for_acks
from capdisc_producers.sync import SyncReport, events_for

#: Events sent per broker round trip (and per progress step).
CHUNK = 500

Progress = Callable[[str, int], None]


def import_jsonl(client: redis.Redis, publisher: Publisher, path: Path, *, tenant: str,
                 source: str | None = None, wait_s: float = 0.0,
                 progress: Progress | None = None) -> SyncReport:
    """Publish what changed in the catalog at ``path``; with ``wait_s`` wait until applied.
    ``progress(stage, n)`` is told how many events were sent (``"sent"``) and applied
    (``"applied"``) as it goes."""
    path = path.resolve()
    source = source or f"jsonl:{path}"
    found, errors = read_jsonl_catalog(path, source)
    plan = plan_sync(found, errors, stored_by_source(client, tenant, source))
    if errors:
        plan = replace(plan, deletes=[])
    batch_id = uuid.uuid4().hex
    events = events_for(plan, tenant, source, batch_id, seq=time.time_ns())
    for start in range(0, len(events), CHUNK):
        chunk = events[start:start + CHUNK]
        publisher.send(chunk)
        if progress:
            progress("sent", len(chunk))
    report = SyncReport(root=path, plan=plan, batch_id=batch_id, sent=len(events))
    if wait_s > 0 and events:
        report.outcomes = _wait(client, batch_id, len(events), wait_s, progress)
    return report


def _wait(client: redis.Redis, batch_id: str, count: int, wait_s: float,
          progress: Progress | None) -> list[dict[str, object]]:
    outcomes: list[dict[str, object]] = []
    deadline = time.monotonic() + wait_s
    while len(outcomes) < count and (remaining := deadline - time.monotonic()) > 0:
        got = wait_for_acks(client, batch_id, min(CHUNK, count - len(outcomes)),
                            min(remaining, 5.0))
        outcomes += got
        if progress and got:
            progress("applied", len(got))
    return outcomes
