"""Reading the changes stream, and bringing a tenant's snapshot on disk up to date with it.

Used by the discovery worker (:mod:`capdisc_workers.follower`), which follows the stream and, at
start, applies the changes made since the snapshot it maps; and by the child process that
applies a large tenant's changes apart from the worker (:mod:`capdisc_workers.buildapart`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import structlog

from capdisc import keys
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.discovery.snapshotfile import SnapshotHeader, Wanted, build_fingerprint
from capdisc.errors import SnapshotError
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry.events import TENANT_RE
from capdisc.registry.flags import Mark, Policy, mark, treatment
from capdisc.registry.store import Delta, read_delta
from capdisc.retrieval.text import embedder_id_of

log = structlog.get_logger("capdisc.discovery")

#: One record read from the changes stream: its entry id and its checked fields (None for a
#: record that cannot be read).
Change = tuple[str, dict[str, str] | None]
#: What a read of changed ids makes: upserts (capability, vector), deletes, and the upserts'
#: marks.
Changes = tuple[list[tuple[Capability, bytes]], list[str], dict[str, Mark]]


def wanted_now(
    client: redis.Redis, tenant: str, default_space: str, policy: Callable[[str | None], Policy]
) -> Wanted | None:
    """What a snapshot of ``tenant`` must match to be served now, read in one transaction: its
    active vector space (``default_space`` when none is stored), Redis epoch, stored version,
    poisoning policy (``policy`` of the stored value) and this code's build; None when Redis
    holds no epoch marker yet."""
    with client.pipeline(transaction=True) as pipe:
        pipe.get(keys.version(tenant))
        pipe.get(keys.space(tenant))
        pipe.get(keys.poisoning_policy(tenant))
        pipe.get(keys.EPOCH)
        stored, active, stored_policy, epoch = pipe.execute()
    if epoch is None:
        return None
    space = as_str(active) if active else default_space
    return Wanted(
        tenant,
        space,
        as_str(epoch),
        stored_version(stored),
        policy(as_str(stored_policy) if stored_policy is not None else None),
        build_fingerprint(embedder_id_of(space)),
    )


def stored_version(raw: Any) -> int:
    """A stored version (0 when missing or unreadable)."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def change_records(batch: Any) -> list[Change]:
    """``(entry id, fields)`` of every record in an XREAD reply (None when it timed out);
    the fields are None for a record that cannot be read."""
    return [
        (as_str(eid), change_record(as_str(eid), fields))
        for _stream, items in batch or []
        for eid, fields in items
    ]


def change_record(entry_id: str, raw: Any) -> dict[str, str] | None:
    """A change record's fields, checked: ``tenant`` a tenant name, ``version`` a number,
    ``op`` and ``id`` text; None (and a warning) otherwise."""
    try:
        fields = {k.decode(): v.decode() for k, v in raw.items()}
    except (AttributeError, UnicodeDecodeError):
        fields = {}
    tenant, version = fields.get("tenant", ""), fields.get("version", "")
    if (
        TENANT_RE.fullmatch(tenant)
        and version.isdigit()
        and len(version) <= 16
        and "op" in fields
        and "id" in fields
    ):
        return fields
    log.warning(
        "change_record_skipped",
        entry_id=entry_id,
        fields=repr(raw)[:200],
        hint="not a change record the indexing workers write; skipped",
    )
    return None


def changes_after(client: redis.Redis, after: str, page: int = 10_000) -> list[Change]:
    """Every change record on the stream after entry ``after``, in order."""
    records: list[Change] = []
    start = after
    while True:
        batch: Any = client.xrange(keys.CHANGES, min=start, max="+", count=page)
        records += [
            (entry_id, change_record(entry_id, fields))
            for raw_id, fields in batch
            if (entry_id := as_str(raw_id)) != start
        ]
        if len(batch) < page:
            return records
        start = as_str(batch[-1][0])


def changes_of(ids: list[str], delta: Delta, policy: Policy) -> Changes:
    """The upserts (with their marks) and deletes a read of changed ``ids`` makes under
    ``policy``: a capability gone, or withheld by the policy, is deleted."""
    upserts, deletes, marks = [], [], {}
    for cap_id, (record, vector) in zip(ids, delta.entries, strict=True):
        flag = delta.flags.get(cap_id)
        if record is None or treatment(flag, policy) == "withhold":
            deletes.append(cap_id)
        elif vector is not None:
            upserts.append((Capability.from_dict(record.capability), vector))
            if (marked := mark(flag, policy)) is not None:
                marks[cap_id] = marked
        # else: changed by a writer of another vector space (a model change building):
        # the previous version keeps serving until the reindex swaps in
    return upserts, deletes, marks


def since(
    client: redis.Redis,
    snapshot: IndexSnapshot,
    header: SnapshotHeader,
    wanted: Wanted,
    path: Path,
    policy: Callable[[str | None], Policy],
) -> tuple[IndexSnapshot, str, int]:
    """``snapshot`` (read from ``path``) with the changes of its tenant after
    ``header.changes_id`` applied, the stream entry it is then current to, and how many changes
    that was; ``policy``: the tenant's poisoning policy from its stored value. A
    :class:`SnapshotError` when they do not all follow on from the snapshot's version up to the
    stored one (the stream was trimmed) or one of them reloads the tenant whole."""
    tenant = header.tenant
    records = changes_after(client, header.changes_id)
    last_id = records[-1][0] if records else header.changes_id
    fresh = [
        fields
        for _entry_id, fields in records
        if fields is not None
        and fields["tenant"] == tenant
        and int(fields["version"]) > header.version
    ]
    versions = [int(f["version"]) for f in fresh]
    expected = list(range(header.version + 1, header.version + 1 + len(versions)))
    if versions != expected or (versions[-1] if versions else header.version) < (
        wanted.stored_version
    ):
        raise SnapshotError(
            f"the changes stream no longer holds every change since its version "
            f"{header.version} (trimmed); Redis is at {wanted.stored_version}",
            path,
        )
    if any(f["op"] == "reload" for f in fresh):
        raise SnapshotError(
            "the tenant was reindexed or its poisoning policy set since it was written", path
        )
    if not fresh:
        return snapshot, last_id, 0
    ids = list(dict.fromkeys(f["id"] for f in fresh))
    delta = read_delta(client, tenant, ids, wanted.space)
    upserts, deletes, marks = changes_of(ids, delta, policy(delta.policy))
    try:
        changed = snapshot.with_changes(versions[-1], upserts, deletes, marks)
    except Exception as exc:  # a fault applying them must not keep the worker from starting
        log.exception("snapshot_changes_failed", tenant=tenant, path=str(path))
        raise SnapshotError(
            f"its {len(fresh)} changes since could not be applied ({type(exc).__name__}: "
            f"{exc}; the worker log has the traceback)",
            path,
        ) from exc
    return changed, last_id, len(fresh)
