"""``capdisc import jsonl``: a bulk catalog (the ``tools.jsonl`` format of ``shared/data``) as
one source of capabilities.

Like a directory sync: only new or changed capabilities are sent (an unchanged re-import sends
nothing and embeds nothing), and capabilities of the same source that the file no longer has
are deleted, unless some line of the file was refused (a broken line never removes what it may
have been meant to update). Each line is read on its own (:mod:`capdisc.registry.catalogs`): a
refused line is reported with its number and reason, the repairs made to the others are kept
as the report's notes.
"""

from __future__ import annotations

from pathlib import Path

import redis

from capdisc.registry.catalogs import read_jsonl_catalog
from capdisc.tenants import check_tenant
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import Progress, SyncReport, send_found, wait_until_applied


def import_jsonl(
    client: redis.Redis,
    publisher: Publisher,
    path: Path,
    *,
    tenant: str,
    source: str | None = None,
    wait_s: float = 0.0,
    progress: Progress | None = None,
    take_over: bool = False,
    lock_owner: str | None = None,
) -> SyncReport:
    """Publish what changed in the catalog at ``path``; with ``wait_s`` wait until applied
    (``progress`` as in :func:`capdisc_producers.sync.publish_plan`). A tool whose id another
    source owns is rejected, naming the owner, unless ``take_over``. ``lock_owner``: as in
    :func:`capdisc_producers.sync.one_sync_at_a_time`."""
    check_tenant(tenant)
    path = path.resolve()
    source = source or f"jsonl:{path}"
    read = read_jsonl_catalog(path, source)
    found, errors = read.found, read.errors
    sent, _stored = send_found(
        client,
        publisher,
        found,
        errors,
        tenant=tenant,
        source=source,
        root=path,
        take_over=take_over,
        delete_on_errors=False,
        lock_owner=lock_owner,
        progress=progress,
    )
    report = wait_until_applied(client, sent, wait_s, progress)
    report.notes = [f"{path}:{note.line}: {note.text}" for note in read.notes]
    return report
