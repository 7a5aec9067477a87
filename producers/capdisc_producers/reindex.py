"""``capdisc reindex --all``: a full, blue/green reindex of one tenant, and waiting for its swap.

The indexing workers build every vector again into a staging space beside the live index
(:func:`capdisc.registry.reindexstore.begin_reindex`), share the batches, and the last batch
swaps it in with one transaction that bumps the index version and appends a ``reload`` change
record; discovery workers build the new snapshot while they keep serving the old one, then swap
it in whole.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from capdisc import keys
from capdisc.errors import EmbeddingError
from capdisc.redistext import as_str
from capdisc.registry.reindexstore import ReindexJob, reindex_failure
from capdisc_producers.publisher import BLOCK_SLICE_S, Publisher

#: ``progress(done_batches, total_batches)`` while the staging index is built.
ReindexProgress = Callable[[int, int], None]


def start_full_reindex(
    client: redis.Redis, publisher: Publisher, tenant: str, fresh: bool = False
) -> tuple[str, str]:
    """Send the reindex of ``tenant``; returns the job id and the changes-stream position to
    follow for its swap."""
    after = latest_change(client)
    job = uuid.uuid4().hex[:12]
    publisher.start_reindex(tenant, job, fresh)
    return job, after


def latest_change(client: redis.Redis) -> str:
    """The position of the changes stream's last entry: where to follow it from."""
    last = client.xrevrange(keys.CHANGES, count=1)
    return as_str(last[0][0]) if last else "0-0"


def wait_for_swap(
    client: redis.Redis,
    tenant: str,
    job: str,
    after: str,
    timeout_s: float,
    progress: ReindexProgress | None = None,
) -> int | None:
    """The index version the reindex ``job`` swapped in at, or None if it did not within
    ``timeout_s`` (it goes on building; ``capdisc status`` shows it). An
    :class:`~capdisc.errors.EmbeddingError` with the workers' reason when they abandoned it."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        failed = reindex_failure(client, tenant, job)
        if failed:
            raise EmbeddingError(
                f"reindex {job} of tenant {tenant!r} was abandoned: {failed}; the live index "
                "is untouched: run `capdisc reindex --all` again once the embedder answers"
            )
        block_ms = max(1, int(min(BLOCK_SLICE_S, remaining) * 1000))
        batch: Any = client.xread({keys.CHANGES: after}, count=1000, block=block_ms)
        for _stream, entries in batch or []:
            for entry_id, fields in entries:
                after = as_str(entry_id)
                record = {as_str(k): as_str(v) for k, v in fields.items()}
                if record.get("tenant") == tenant and record.get("op") == "reload":
                    return int(record["version"])
        if progress:
            _report(client, tenant, job, progress)
    return None


def _report(client: redis.Redis, tenant: str, job: str, progress: ReindexProgress) -> None:
    current = ReindexJob.read(client, tenant)
    if current is not None and current.job == job:
        progress(int(client.scard(keys.reindex_done(tenant, job))), current.batches)
