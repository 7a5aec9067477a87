"""Bring the registry in line with a directory of CAPABILITY.yaml manifests.

Scan, compare with what the registry holds for that directory
(:func:`capdisc.registry.policy.plan_sync`),
send only the upserts and deletes that change something, and record which manifests were
rejected and why (``capdisc status`` shows them). A broken manifest never removes the capability
it was meant to update.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import structlog

from capdisc import keys
from capdisc.errors import ManifestError
from capdisc.models import Capability, Visibility
from capdisc.redisclock import redis_now_ns
from capdisc.redistext import as_str
from capdisc.registry import outbox
from capdisc.registry.events import RegistryEvent
from capdisc.registry.manifest import ScanCache, scan_directory
from capdisc.registry.policy import StoredRecord, SyncPlan, plan_sync, with_pending
from capdisc.registry.store import owners, stored_by_source
from capdisc.retrieval.text import full_text
from capdisc.tenants import check_tenant
from capdisc_producers.publisher import Publisher, wait_for_acks

log = structlog.get_logger("capdisc.sync")


@dataclass
class SyncReport:
    """What one sync of a directory did (``root``: the directory, or the name of a source that is
    no path, such as an MCP server's URL, which a ``Path`` would mangle)."""

    root: Path | str
    plan: SyncPlan
    batch_id: str
    sent: int
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    #: Redis outages this sync waited out (it ran again after each, sending what was missing).
    outages: int = 0
    #: Repairs an import made to what it read, each naming where (``FILE:LINE: ...``).
    notes: list[str] = field(default_factory=list)
    tenant: str = ""
    source: str = ""
    #: Events of the source that earlier syncs sent (this command before an outage, or
    #: another process) and the workers had not applied when this one waited: the plan
    #: counted them as held, so the wait covers them too. How many it found, and how many
    #: were still not applied when it stopped waiting.
    earlier_sent: int = 0
    earlier_unapplied: int = 0

    @property
    def index_version(self) -> int:
        return max((int(o.get("version", 0)) for o in self.outcomes), default=0)

    @property
    def complete(self) -> bool:
        return len(self.outcomes) >= self.sent

    def summary(self) -> str:
        plan = self.plan
        resumed = (
            f" (resumed after {self.outages} Redis outage{'s' if self.outages > 1 else ''}"
            "; counts are of the last attempt)"
            if self.outages
            else ""
        )
        moved = sum(cap.id in plan.taken_over for cap in plan.upserts)
        taken = f" ({moved} taken over from other sources)" if moved else ""
        return (
            f"{self.root}: {len(plan.upserts)} upserted{taken}, {len(plan.deletes)} deleted, "
            f"{len(plan.unchanged)} unchanged, {len(plan.errors)} rejected{resumed}"
        )


#: ``progress(stage, n)``: ``n`` more events ``"sent"``, or ``"applied"`` by the workers.
Progress = Callable[[str, int], None]


def sync_directory(
    client: redis.Redis,
    publisher: Publisher,
    root: Path,
    *,
    tenant: str,
    max_bytes: int,
    wait_s: float = 0.0,
    cache: ScanCache | None = None,
    visibility: Visibility | None = None,
    take_over: bool = False,
    progress: Progress | None = None,
    lock_owner: str | None = None,
) -> SyncReport:
    """Scan ``root`` and publish what changed; with ``wait_s`` wait for the workers to apply it.
    A ``cache`` kept across calls skips re-parsing unchanged manifests. ``visibility`` applies
    to the capabilities whose manifest declares none (open to the tenant otherwise). A
    capability whose id another source owns is rejected, naming the owner, unless
    ``take_over`` (then it moves to this directory). ``progress`` as in
    :func:`publish_plan`. Planned and sent under the directory's sync lock (``lock_owner``: see
    :func:`one_sync_at_a_time`), against what is stored and what earlier syncs sent
    (:func:`stored_and_sent`)."""
    check_tenant(tenant)
    root = root.resolve()
    with one_sync_at_a_time(client, tenant, str(root), lock_owner):
        report = _plan_and_send(
            client, publisher, root, tenant, max_bytes, cache, visibility, take_over, progress
        )
    return wait_until_applied(client, report, wait_s, progress)


def _plan_and_send(
    client: redis.Redis,
    publisher: Publisher,
    root: Path,
    tenant: str,
    max_bytes: int,
    cache: ScanCache | None,
    visibility: Visibility | None,
    take_over: bool,
    progress: Progress | None,
) -> SyncReport:
    stored = stored_and_sent(client, tenant, str(root))
    scan = scan_directory(
        root,
        max_bytes=max_bytes,
        cache=cache,
        held={cap_id: Path(r.location) for cap_id, r in stored.items()},
    )
    scanned = (
        {
            path: cap.with_changes(visibility=visibility) if cap.visibility.open else cap
            for path, cap in scan.capabilities.items()
        }
        if visibility is not None
        else scan.capabilities
    )
    plan = plan_sync(
        scanned,
        scan.errors,
        stored,
        held_elsewhere(client, tenant, str(root), scanned, stored),
        take_over,
    )
    _record_errors(client, tenant, root, plan)
    return send_plan(publisher, plan, root=root, tenant=tenant, source=str(root), progress=progress)


#: How long a sync waits for another sync of the same source before it goes ahead anyway, and
#: how long the lock outlives a holder that died while holding it.
SYNC_LOCK_WAIT_S = 30.0
SYNC_LOCK_HOLD_S = 120.0
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)


@contextlib.contextmanager
def one_sync_at_a_time(
    client: redis.Redis,
    tenant: str,
    source: str,
    owner: str | None = None,
    wait_s: float = SYNC_LOCK_WAIT_S,
    hold_s: float = SYNC_LOCK_HOLD_S,
) -> Iterator[None]:
    """Hold ``source``'s sync lock while the block plans and sends: two syncs of one source (a
    watcher and ``capdisc publish`` of its directory, two imports of one file) plan one after
    the other, the second counting what the first sent (:func:`stored_and_sent`). After
    ``wait_s`` the sync goes ahead without it, and says so: a holder that died leaves it for
    ``hold_s``. ``owner`` (default: this call) names the holder: a sync run again after Redis
    went away mid-sync, which could not release the lock, takes its own lock back at once."""
    key, token = keys.sync_lock(tenant, source), owner or uuid.uuid4().hex
    deadline, delay = time.monotonic() + wait_s, 0.005
    held = _take(client, key, token, hold_s)
    while not held and time.monotonic() < deadline:
        time.sleep(delay)  # another process holds it: nothing to await but its expiry
        delay = min(0.1, delay * 2)
        held = _take(client, key, token, hold_s)
    if not held:
        log.warning(
            "sync_lock_busy",
            tenant=tenant,
            source=source,
            waited_s=wait_s,
            hint="another sync of this source held its lock all along; syncing without it",
        )
    try:
        yield
    finally:
        if held:
            with contextlib.suppress(redis.RedisError):  # it expires in any case
                client.eval(_RELEASE, 1, key, token)


def _take(client: redis.Redis, key: str, token: str, hold_s: float) -> bool:
    """Take the lock for ``token``, or keep it if ``token`` holds it already."""
    if client.set(key, token, nx=True, px=int(hold_s * 1000)):
        return True
    held = client.get(key)
    return (
        held is not None and as_str(held) == token and bool(client.pexpire(key, int(hold_s * 1000)))
    )


def stored_and_sent(client: redis.Redis, tenant: str, source: str) -> dict[str, StoredRecord]:
    """``source``'s stored records as they will be once the workers applied what was sent and
    is not applied yet (the outbox's events), by this process or any other."""
    return with_pending(
        stored_by_source(client, tenant, source), outbox.pending_events(client, tenant), source
    )


def send_found(
    client: redis.Redis,
    publisher: Publisher,
    found: Mapping[Path, Capability],
    errors: Mapping[Path, ManifestError],
    *,
    tenant: str,
    source: str,
    root: Path | str,
    take_over: bool = False,
    delete_on_errors: bool = True,
    lock_owner: str | None = None,
    progress: Progress | None = None,
) -> tuple[SyncReport, dict[str, StoredRecord]]:
    """Plan what a catalog or a server holds now (``found``, and the entries refused with
    ``errors``) against ``source``'s records stored and sent (:func:`stored_and_sent`), and send
    the plan, under the source's lock (:func:`one_sync_at_a_time`); also the records it was
    planned against. Without ``delete_on_errors``, a read with errors deletes nothing."""
    with one_sync_at_a_time(client, tenant, source, lock_owner):
        stored = stored_and_sent(client, tenant, source)
        owned = held_elsewhere(client, tenant, source, found, stored)
        plan = plan_sync(found, errors, stored, owned, take_over)
        if errors and not delete_on_errors:
            plan.deletes = []
        report = send_plan(
            publisher, plan, root=root, tenant=tenant, source=source, progress=progress
        )
    return report, stored


def held_elsewhere(
    client: redis.Redis,
    tenant: str,
    source: str,
    scanned: Mapping[Path, Capability],
    stored: Mapping[str, StoredRecord],
) -> dict[str, str]:
    """The other sources that hold ids ``source`` scanned (id -> owner): what
    :func:`capdisc.registry.policy.plan_sync` rejects, or takes over."""
    new_ids = {cap.id for cap in scanned.values()} - set(stored)
    return {
        cap_id: owner
        for cap_id, owner in owners(client, tenant, new_ids).items()
        if owner and owner != source
    }


#: Events sent per call of :meth:`Publisher.send` (and per progress step) by
#: :func:`publish_plan`: one task of :data:`capdisc_producers.publisher.BATCH`.
CHUNK = 1024


def publish_plan(
    client: redis.Redis,
    publisher: Publisher,
    plan: SyncPlan,
    *,
    root: Path | str,
    tenant: str,
    source: str,
    wait_s: float = 0.0,
    progress: Progress | None = None,
) -> SyncReport:
    """Send the events of ``plan`` (one batch, one sequence) and, with ``wait_s``, wait until
    the workers applied them. ``progress(stage, n)`` hears of events ``"sent"`` and
    ``"applied"`` as they go, in chunks of :data:`CHUNK`."""
    report = send_plan(publisher, plan, root=root, tenant=tenant, source=source, progress=progress)
    return wait_until_applied(client, report, wait_s, progress)


def send_plan(
    publisher: Publisher,
    plan: SyncPlan,
    *,
    root: Path | str,
    tenant: str,
    source: str,
    progress: Progress | None = None,
) -> SyncReport:
    """Send the events of ``plan``: :func:`publish_plan` without the wait."""
    check_tenant(tenant)
    batch_id = uuid.uuid4().hex
    events = events_for(plan, tenant, source, batch_id, redis_now_ns(publisher.redis))
    oversized = publisher.oversized(events)
    if oversized:
        refuse_oversized(plan, oversized, publisher.max_event_bytes, root, source)
        events = [event for event in events if event.capability_id not in oversized]
    for start in range(0, len(events), CHUNK):
        chunk = events[start : start + CHUNK]
        publisher.send(chunk)
        if progress:
            progress("sent", len(chunk))
    return SyncReport(
        root=root, plan=plan, batch_id=batch_id, sent=len(events), tenant=tenant, source=source
    )


def wait_until_applied(
    client: redis.Redis, report: SyncReport, wait_s: float, progress: Progress | None = None
) -> SyncReport:
    """``report`` with the outcomes of its events the workers applied within ``wait_s``, and
    then, within what is left of it, the source's events earlier syncs sent applied too
    (``earlier_unapplied``: those that were not)."""
    deadline = time.monotonic() + wait_s
    if wait_s > 0 and report.sent:
        report.outcomes = _wait(client, report.batch_id, report.sent, wait_s, progress)
    if wait_s > 0 and report.source:
        earlier = _earlier(client, report)
        report.earlier_sent = len(earlier)
        while earlier and time.monotonic() < deadline:
            time.sleep(EARLIER_POLL_S)
            earlier = _earlier(client, report)
        report.earlier_unapplied = len(earlier)
    return report


#: How often :func:`wait_until_applied` looks again for the earlier syncs' events.
EARLIER_POLL_S = 0.1


def _earlier(client: redis.Redis, report: SyncReport) -> list[RegistryEvent]:
    """The source's events other syncs sent that wait in the outbox (this sync's own left)."""
    return [
        event
        for event in outbox.pending_events(client, report.tenant)
        if event.source == report.source and event.batch_id != report.batch_id
    ]


def refuse_oversized(
    plan: SyncPlan, oversized: Mapping[str, int], limit: int, root: Path | str, source: str
) -> None:
    """Move each upsert whose event the indexing workers would refuse for its size
    (``oversized``: id -> bytes) from the plan's upserts to its errors, naming it and saying
    what to do; the version stored, if any, stays."""
    plan.upserts = [cap for cap in plan.upserts if cap.id not in oversized]
    for cap_id, size in oversized.items():
        plan.errors[Path(f"{root}#{cap_id}")] = ManifestError(
            f"{source} {cap_id}",
            None,
            f"is {size} bytes as a registry event, the limit is {limit}; shorten its schema "
            "or description, or raise CAPDISC_EVENT_MAX_BYTES for the indexing workers and "
            "this command alike",
        )


def _wait(
    client: redis.Redis, batch_id: str, count: int, wait_s: float, progress: Progress | None
) -> list[dict[str, Any]]:
    outcomes: list[dict[str, Any]] = []
    seen: set[str] = set()
    deadline = time.monotonic() + wait_s
    while len(outcomes) < count and (remaining := deadline - time.monotonic()) > 0:
        got = wait_for_acks(
            client, batch_id, min(CHUNK, count - len(outcomes)), min(remaining, 5.0), seen
        )
        outcomes += got
        if progress and got:
            progress("applied", len(got))
    return outcomes


def events_for(
    plan: SyncPlan, tenant: str, source: str, batch_id: str, seq: int
) -> list[RegistryEvent]:
    """The upsert, delete and reindex events of ``plan``, all with sequence ``seq`` (now, on
    Redis's clock: a producer whose clock is behind another's still orders after it). Those of
    ``plan.taken_over`` say ``take_over``. The upserts go shortest embedding text first (each
    capability once, so their order changes nothing stored): the capabilities of one task, and
    of one model call, are then of similar length, and the model pads little."""
    taken = set(plan.taken_over)
    upserts = sorted(plan.upserts, key=lambda cap: len(full_text(cap)))
    events = [
        RegistryEvent(
            type="upsert",
            tenant=tenant,
            capability_id=cap.id,
            seq=seq,
            source=source,
            capability=cap.to_dict(),
            batch_id=batch_id,
            take_over=cap.id in taken,
        )
        for cap in upserts
    ]
    events += [
        RegistryEvent(
            type="delete",
            tenant=tenant,
            capability_id=cap_id,
            seq=seq,
            source=source,
            batch_id=batch_id,
            take_over=cap_id in taken,
        )
        for cap_id in plan.deletes
    ]
    events += [
        RegistryEvent(
            type="reindex",
            tenant=tenant,
            capability_id=cap_id,
            seq=seq,
            source=source,
            batch_id=batch_id,
        )
        for cap_id in plan.reindexes
    ]
    return events


def _record_errors(client: redis.Redis, tenant: str, root: Path, plan: SyncPlan) -> None:
    key = keys.manifest_errors(tenant)
    stale = [k for k in _errors_under(client, key, root) if Path(as_str(k)) not in plan.errors]
    with client.pipeline(transaction=True) as pipe:
        if stale:
            pipe.hdel(key, *stale)
        for path, error in plan.errors.items():
            pipe.hset(key, str(path), str(error))
        pipe.sadd(keys.TENANTS, tenant)
        pipe.execute()


def forget_manifest_errors(client: redis.Redis, tenant: str, root: Path) -> int:
    """Forget the rejections recorded for manifests under ``root`` (a registry directory whose
    capabilities are being deleted); how many there were."""
    key = keys.manifest_errors(tenant)
    stale = _errors_under(client, key, root)
    return int(client.hdel(key, *stale)) if stale else 0


def forget_all_manifest_errors(client: redis.Redis, tenant: str) -> int:
    """Forget every rejection recorded for ``tenant``'s manifests (its whole registry is being
    deleted); how many there were."""
    key = keys.manifest_errors(tenant)
    with client.pipeline(transaction=True) as pipe:
        pipe.hlen(key)
        pipe.delete(key)
        count, _deleted = pipe.execute()
    return int(count)


def _errors_under(client: redis.Redis, key: str, root: Path) -> list[bytes | str]:
    """The manifest paths in ``key``'s hash that lie under directory ``root`` (not merely
    share its prefix: ``/reg`` is not ``/reg2``)."""
    return [k for k in client.hkeys(key) if Path(as_str(k)).is_relative_to(root)]
