"""Keeping the registry whole: the reconcile task, the sweep of lost tasks, and the periodic
loops of the indexing workers.

:func:`reconcile_task` (queued every ``reconcile_interval_s`` by the one worker that takes the
lock, or by ``capdisc reconcile``) sweeps, then compares every tenant's records with its live
vectors: orphan vectors are dropped, records without a vector are reindexed, an abandoned full
reindex is dropped, and an external vector store that drifted is written again; last, the
shared embedding cache is pruned once it outgrows the registry. :func:`sweep`
(every ``sweep_interval_s``, at once at start) gives back the tasks of workers that are gone,
re-sends those the broker lost (:mod:`capdisc.registry.outbox`) and sends the repairs a run
left for later as the window for them drains. Each loop runs one step at a
time through :func:`periodic`, which lives through Redis going away.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import kombu.exceptions
import redis
import structlog

from capdisc import keys, status
from capdisc.errors import CapdiscError, EventDecodeError
from capdisc.redisclock import redis_now_ms
from capdisc.redistext import as_str
from capdisc.registry import counts as record_counts
from capdisc.registry import outbox
from capdisc.registry.drift import repair_plan
from capdisc.registry.events import RegistryEvent
from capdisc.registry.reindexstore import ReindexJob, abandon_reindex, resume_lanes
from capdisc.registry.store import tenants
from capdisc.registry.tombstones import prune_tombstones
from capdisc.retrieval.text import vector_space
from capdisc_workers.celery_app import app, resources
from capdisc_workers.embedding import (
    EMBED_BATCH,
    drop_unused_caches,
    embedders_in_use,
    prune_cache,
)
from capdisc_workers.mirroring import resync, rewrite_unwritten
from capdisc_workers.outage import RETRYABLE, Backoff
from capdisc_workers.reindexing import report_damaged
from capdisc_workers.resources import Resources

log = structlog.get_logger("capdisc.indexing")


@app.task(name=keys.TASK_RECONCILE, bind=True, acks_late=True, ignore_result=True)
def reconcile_task(self: Any, reply_to: str | None = None) -> dict[str, Any]:
    """Give back the tasks of workers that are gone and re-send those the broker lost
    (:func:`sweep`), then compare every tenant's records with its live vectors; drop orphan
    vectors and send reindex events for records without one. The report goes to ``capdisc
    status`` (and to ``reply_to``, a list ``capdisc reconcile`` waits on)."""
    res = resources
    client, space = res.redis, vector_space(res.embedder.id)
    report: dict[str, Any] = {
        "at_ms": int(time.time() * 1000),
        "worker": res.worker_id,
        "missing_vectors": 0,
        "orphan_vectors": 0,
        "reindex_sent": 0,
        "reindex_deferred": 0,
        "reindex_batches_resumed": 0,
        "records_counted": {},
        "repaired": {},
        "skipped": {},
        "resent_tasks": sum(sweep(res, client)),
    }
    waiting = functools.cache(partial(outbox.waiting_ids, client))
    for tenant in tenants(client):
        reason = _reconcile_tenant(res, tenant, space, report, waiting)
        if reason:
            report["skipped"][tenant] = reason
    report["embedding_cache_pruned"] = _prune_embedding_cache(res)
    report["embedding_caches_dropped"] = _drop_unused_caches(res)
    report["tombstones_pruned"] = _prune_tombstones(res)
    with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.RECONCILE_LAST, json.dumps(report))
        pipe.hincrby(
            keys.COUNTERS, "drift_repaired", report["missing_vectors"] + report["orphan_vectors"]
        )
        if reply_to:
            pipe.rpush(reply_to, json.dumps(report))
            pipe.expire(reply_to, res.settings.reply_ttl_s)
        pipe.execute()
    log.info(
        "reconciled",
        task_id=self.request.id,
        missing_vectors=report["missing_vectors"],
        orphan_vectors=report["orphan_vectors"],
        skipped=len(report["skipped"]),
    )
    return report


#: Tenant -> the capability ids events waiting in the outbox will change (read when first asked).
Waiting = Callable[[], dict[str, set[str]]]


def _reconcile_tenant(
    res: Resources, tenant: str, space: str, report: dict[str, Any], waiting: Waiting
) -> str | None:
    """Repair one tenant; the reason it was skipped, if it was."""
    client = res.redis
    _count_records(res, tenant, report)
    if _reindex_building(res, tenant, report):
        return "a full reindex is building"
    active = client.get(keys.space(tenant))
    if active and as_str(active) != space:
        return (
            f"served from {as_str(active)}, this worker embeds {space}: run "
            f"`capdisc reindex --all --tenant {tenant}` to move it"
        )
    plan = repair_plan(client, tenant, space)
    if plan is None:
        return "written to meanwhile; the next run checks it"
    _reconcile_store(res, tenant, space, report)
    if plan.missing_vectors:
        _send_reindexes(res, tenant, plan.missing_vectors, waiting, report)
    else:
        keep_backlog(client, tenant, [])  # nothing left to repair: no backlog either
    if not plan.clean:
        log.warning(
            "drift_repaired",
            tenant=tenant,
            missing_vectors=len(plan.missing_vectors),
            orphan_vectors=len(plan.orphan_vectors),
        )
        report["repaired"][tenant] = {
            "missing_vectors": plan.missing_vectors[:100],
            "orphan_vectors": plan.orphan_vectors[:100],
        }
    report["missing_vectors"] += len(plan.missing_vectors)
    report["orphan_vectors"] += len(plan.orphan_vectors)
    return None


#: How long after a recount that a write cut short the next one waits: a busy large tenant
#: is not read whole every minute.
RECOUNT_WAIT_S = 600


def _count_records(res: Resources, tenant: str, report: dict[str, Any]) -> None:
    """Count ``tenant``'s records where the counts kept beside them are missing (a registry
    written before they were kept) or no longer add up (a value overwritten outside capdisc):
    :func:`capdisc.registry.counts.recount`; where they are kept, drop those down to 0."""
    client = res.redis
    kept = record_counts.kept(client, tenant, atomic=True)
    if kept is not None and kept.emptied:
        record_counts.prune(client, tenant, kept.emptied)
    if kept is not None or client.exists(keys.record_counts_tried(tenant)):
        return
    counted = record_counts.recount(client, tenant)
    if counted is None:
        client.set(keys.record_counts_tried(tenant), 1, ex=RECOUNT_WAIT_S)
        log.info(
            "records_not_counted",
            tenant=tenant,
            reason="written to while they were read",
            next_in_s=RECOUNT_WAIT_S,
        )
        return
    report["records_counted"][tenant] = counted.total
    log.info("records_counted", tenant=tenant, records=counted.total)


def _prune_embedding_cache(res: Resources) -> int:
    """Prune the shared embedding cache once it outgrows the registry; entries deleted."""
    pruned = prune_cache(res.redis, res.embedder.id, tenants(res.redis))
    if pruned is not None:
        log.info(
            "embedding_cache_pruned",
            embedder=res.embedder.id,
            pruned=pruned,
            left=int(res.redis.hlen(keys.embedding_cache(res.embedder.id))),
        )
    return pruned or 0


def _drop_unused_caches(res: Resources) -> list[str]:
    """Delete the embedding caches of models nothing uses any more; their keys."""
    in_use = embedders_in_use(res.redis, res.embedder.id, tenants(res.redis))
    gone = drop_unused_caches(res.redis, in_use)
    if gone:
        log.info("embedding_caches_dropped", caches=gone, in_use=sorted(in_use))
    return gone


def _prune_tombstones(res: Resources) -> int:
    """Forget every tenant's tombstones older than ``tombstone_horizon_s``; how many went."""
    horizon_s = res.settings.tombstone_horizon_s
    pruned = 0
    for tenant in tenants(res.redis):
        gone = prune_tombstones(res.redis, tenant, horizon_s)
        if gone:
            log.info(
                "tombstones_pruned",
                tenant=tenant,
                pruned=gone,
                left=int(res.redis.hlen(keys.tombstones(tenant))),
                horizon_s=horizon_s,
            )
        pruned += gone
    return pruned


def _send_reindexes(
    res: Resources, tenant: str, missing: list[str], waiting: Waiting, report: dict[str, Any]
) -> None:
    """Send a reindex event for each record of ``missing`` (no vector) that no event waiting
    in the outbox will embed already: one sent by an earlier run, or an upsert. Without that,
    while a large repair was still being embedded, every run sent it again. ``waiting()``
    reads the outbox once a run, not once per tenant.

    At most :func:`repair_budget` of them wait at any time, as a producer's import waits for
    its tasks: a large drift (a lost vector hash) is not queued whole (a million events held
    twice in Redis, queue and outbox). The rest is kept in the tenant's repair backlog
    (:func:`keep_backlog`), sent a task at a time as the window drains
    (:func:`continue_repair`, :func:`top_up_repairs`)."""
    waits = waiting().get(tenant, set())
    unsent = [cap_id for cap_id in missing if cap_id not in waits]
    budget = repair_budget(res.settings.publish_max_pending_tasks, len(missing) - len(unsent))
    sent = unsent if budget is None else unsent[:budget]
    _send_repairs(res.redis, tenant, sent)
    keep_backlog(res.redis, tenant, unsent[len(sent) :])
    report["reindex_sent"] += len(sent)
    report["reindex_deferred"] += len(unsent) - len(sent)
    if len(unsent) > len(sent):
        log.warning(
            "repair_deferred",
            tenant=tenant,
            sent=len(sent),
            deferred=len(unsent) - len(sent),
            hint="the indexing workers send the rest as these are embedded (each repair "
            "task done sends the next; the sweep tops the window up)",
        )


def _send_repairs(client: redis.Redis, tenant: str, ids: list[str]) -> None:
    """One reindex event (``source`` reconciler) for each of ``ids``, in tasks of
    ``EMBED_BATCH``, recorded in the outbox."""
    seq = time.time_ns()
    payloads = [
        RegistryEvent("reindex", tenant, cap_id, seq, source="reconciler").encode()
        for cap_id in ids
    ]
    for start in range(0, len(payloads), EMBED_BATCH):
        chunk = payloads[start : start + EMBED_BATCH]
        outbox.send(client, app, keys.TASK_APPLY_EVENTS, [chunk])


#: How long the records a run left for later are kept for the sweep (each run replaces them;
#: with the periodic reconciler off, ``capdisc reconcile`` is what finds them again).
REPAIR_BACKLOG_TTL_S = 86_400
#: Backlog entries (tasks) written by one command.
_BACKLOG_WRITE = 256


def keep_backlog(client: redis.Redis, tenant: str, ids: list[str]) -> None:
    """Replace ``tenant``'s repair backlog with ``ids`` (a run found them without a vector and
    sent none of them), a task's worth an entry; none: the backlog is deleted."""
    key = keys.repair_backlog(tenant)
    entries = [
        json.dumps(ids[start : start + EMBED_BATCH]) for start in range(0, len(ids), EMBED_BATCH)
    ]
    with client.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        for start in range(0, len(entries), _BACKLOG_WRITE):
            pipe.rpush(key, *entries[start : start + _BACKLOG_WRITE])
        if entries:
            pipe.expire(key, REPAIR_BACKLOG_TTL_S)
        pipe.execute()


def top_up_repairs(res: Resources, client: redis.Redis) -> int:
    """Send, for each tenant with a repair backlog, as many of its tasks as the repair window
    has room for now (:func:`backlog_tasks_to_send`), each record only if it is still stored
    without a vector and nothing waiting will embed it; how many records were sent. Run by
    the sweep, so a large repair goes at the pace the workers embed it, not a window a
    reconcile run."""
    space = vector_space(res.embedder.id)
    with client.pipeline(transaction=False) as pipe:
        for tenant in (names := tenants(client)):
            pipe.exists(keys.repair_backlog(tenant))
        backlogged = [t for t, held in zip(names, pipe.execute(), strict=True) if held]
    if not backlogged:
        return 0
    waiting = outbox.waiting_ids(client)
    max_pending = res.settings.publish_max_pending_tasks
    return sum(
        _top_up_tenant(
            client,
            tenant,
            space,
            waiting.get(tenant, set()),
            backlog_tasks_to_send(max_pending, len(waiting.get(tenant, ()))),
        )
        for tenant in backlogged
    )


def continue_repair(res: Resources, payloads: list[str], task_id: str | None) -> int:
    """After a task of reconciler repairs is applied, send the next task of its tenant's
    repair backlog in its place (so the window stays full at the pace the workers embed,
    whatever the sweep's interval); how many records were sent. Any other task sends nothing.

    The task leaves the outbox here rather than after it returns, and only the delivery that
    takes it out sends: a task delivered again (its worker died before acknowledging it)
    applies again, harmlessly, and sends nothing more, so the window stays the size it was
    set to. A Redis error is logged and left to the sweep, which tops the window up as well."""
    try:
        first = RegistryEvent.decode(payloads[0]) if payloads else None
    except EventDecodeError:
        return 0
    if first is None or (first.type, first.source) != ("reindex", "reconciler"):
        return 0
    try:
        if task_id is None or not outbox.done(res.redis, task_id):
            return 0  # continued by an earlier delivery of this task, or sent by hand
        if not res.redis.exists(keys.repair_backlog(first.tenant)):
            return 0
        return _top_up_tenant(
            res.redis, first.tenant, vector_space(res.embedder.id), set(), 1, after=task_id
        )
    except redis.RedisError as exc:
        log.warning("repair_not_continued", tenant=first.tenant, error=str(exc))
        return 0


def _top_up_tenant(
    client: redis.Redis, tenant: str, space: str, waits: set[str], tasks: int, after: str = ""
) -> int:
    """Send up to ``tasks`` tasks of ``tenant``'s repair backlog, leaving out ``waits`` and the
    records repaired or deleted meanwhile; how many records were sent. ``after``: the repair
    task this continues (logged; "" for the sweep)."""
    if not tasks:
        return 0
    if client.exists(keys.reindex(tenant)) or as_str(client.get(keys.space(tenant)) or "") != space:
        return 0  # a full reindex builds every vector; or this worker embeds another space
    popped: Any = client.lpop(keys.repair_backlog(tenant), tasks)
    ids = _backlog_ids(tenant, popped or [])
    due = _still_without_vector(client, tenant, space, [i for i in ids if i not in waits])
    _send_repairs(client, tenant, due)
    if ids:
        log.info(
            "repair_topped_up",
            tenant=tenant,
            after_task=after,
            sent=len(due),
            repaired_meanwhile=len(ids) - len(due),
            tasks_left=int(client.llen(keys.repair_backlog(tenant))),
        )
    return len(due)


def _backlog_ids(tenant: str, entries: list[bytes]) -> list[str]:
    """The capability ids of backlog ``entries``; an entry that is no JSON list of ids
    (damaged, written by hand) is passed over and logged: the next reconcile run finds its
    records again."""
    ids: list[str] = []
    for entry in entries:
        try:
            found = json.loads(entry)
        except ValueError:
            found = None
        if not isinstance(found, list) or not all(isinstance(i, str) for i in found):
            log.warning(
                "repair_backlog_entry_dropped",
                tenant=tenant,
                key=keys.repair_backlog(tenant),
                reason="not a JSON list of capability ids",
                hint="nothing to do: the next reconcile run finds those records again",
            )
            continue
        ids.extend(found)
    return ids


def _still_without_vector(
    client: redis.Redis, tenant: str, space: str, ids: list[str]
) -> list[str]:
    """Those of ``ids`` still stored and still without a vector in ``space``."""
    if not ids:
        return []
    with client.pipeline(transaction=False) as pipe:
        pipe.hmget(keys.caps(tenant), ids)
        pipe.hmget(keys.vectors(tenant, space), ids)
        records, vectors = pipe.execute()
    return [
        cap_id
        for cap_id, record, vector in zip(ids, records, vectors, strict=True)
        if record is not None and vector is None
    ]


#: Tasks of a repair backlog one sweep sends when the window is unbounded (a run with
#: ``publish_max_pending_tasks`` 0 sends everything and leaves no backlog; this bounds a
#: backlog left by a run under another setting).
UNBOUNDED_TOP_UP_TASKS = 1024


def backlog_tasks_to_send(max_pending_tasks: int, waiting: int) -> int:
    """How many tasks of a repair backlog the sweep sends when ``waiting`` events of the
    tenant wait already: whole tasks of ``EMBED_BATCH`` within ``max_pending_tasks`` (0, no
    bound: all of it, at most this many a sweep, :data:`UNBOUNDED_TOP_UP_TASKS`)."""
    budget = repair_budget(max_pending_tasks, waiting)
    return UNBOUNDED_TOP_UP_TASKS if budget is None else budget // EMBED_BATCH


def repair_budget(max_pending_tasks: int, waiting: int) -> int | None:
    """How many more reindex events a reconcile run may send for a tenant when ``waiting`` of
    its missing records already have one waiting: ``max_pending_tasks`` tasks of
    ``EMBED_BATCH`` events in all (None: no bound, ``max_pending_tasks`` 0)."""
    if max_pending_tasks <= 0:
        return None
    return max(0, max_pending_tasks * EMBED_BATCH - waiting)


def _reindex_building(res: Resources, tenant: str, report: dict[str, Any]) -> bool:
    """Whether a full reindex of ``tenant`` is still building (its stranded batches sent on,
    :func:`_resume_lanes`); one that outlived ``reindex_timeout_s`` is abandoned (and listed
    in the report)."""
    job = ReindexJob.read(res.redis, tenant)
    if job is None:
        return False
    age_s = (redis_now_ms(res.redis) - job.started_at_ms) / 1000
    if age_s <= res.settings.reindex_timeout_s:
        report["reindex_batches_resumed"] += _resume_lanes(res, job)
        return True
    if not abandon_reindex(res.redis, job):
        return True  # another reindex started meanwhile: it is building now
    log.warning(
        "reindex_abandoned",
        tenant=tenant,
        job=job.job,
        age_s=round(age_s),
        hint=f"it did not finish in reindex_timeout_s; run `capdisc reindex --all "
        f"--tenant {tenant}` again",
    )
    report.setdefault("abandoned_reindexes", []).append(job.job)
    return False


def _resume_lanes(res: Resources, job: ReindexJob) -> int:
    """Send the batches of ``job`` whose lane stopped because an indexing worker older than
    the reindex window built the batch before them (it sends no successor); how many. Without
    this, a reindex begun during a rolling upgrade stalled until ``reindex_timeout_s``."""
    resumed = resume_lanes(res.redis, job)
    for batch in resumed:
        report_damaged(job, batch)
        outbox.publish(app, batch.task_id(job), keys.TASK_REINDEX_BATCH, batch.args(job))
    if resumed:
        log.warning(
            "reindex_lanes_resumed",
            tenant=job.tenant,
            job=job.job,
            batches=[batch.number for batch in resumed],
            hint="an indexing worker older than the reindex window built the batches before "
            "them; upgrade every indexing worker",
        )
    return len(resumed)


def _reconcile_store(res: Resources, tenant: str, space: str, report: dict[str, Any]) -> None:
    """With an external store: when it holds another number of objects than Redis has
    vectors (after the orphans were dropped: the records it should hold), write them all again
    and delete the tombstoned ones (writes are idempotent); then write again the changes it did
    not take before (:func:`rewrite_unwritten`). Counted against the records instead, a value
    that is no record (it has no vector, so no object) made every run rewrite the tenant."""
    store = res.store
    if store is None:
        return
    client = res.redis
    try:
        store.ensure_tenant(tenant)
        held, stored = store.count(tenant), int(client.hlen(keys.vectors(tenant, space)))
        if held != stored:
            log.warning("store_drift", tenant=tenant, store=held, registry_vectors=stored)
            resync(client, store, tenant, space)
            report.setdefault("store_resynced", []).append(tenant)
        rewrite_unwritten(client, store, tenant, space)
    except CapdiscError as exc:
        log.error("store_reconcile_failed", tenant=tenant, error=str(exc))


# -- the sweep ----------------------------------------------------------------------------------


def sweep(res: Resources, client: redis.Redis) -> tuple[int, int]:
    """Put back in the queue every delivery no live worker holds, then re-send the recorded
    tasks that are neither queued nor delivered; how many of each. Last, send what the repair
    window has room for of the records reconcile runs left for later (:func:`top_up_repairs`)."""
    settings = res.settings
    heartbeats, now_ms = status.read_heartbeats(client), redis_now_ms(client)
    _forget_gone_workers(res, client, heartbeats, now_ms)
    workers = outbox.holders(h for h in heartbeats.values() if isinstance(h, dict))
    restored = 0
    for delivery in outbox.orphans(
        outbox.deliveries(client),
        workers,
        now_ms,
        settings.outbox_grace_s,
        settings.worker_stale_after_s,
    ):
        if outbox.restore(client, delivery):
            restored += 1
            log.warning(
                "task_restored",
                task_id=delivery.task_id,
                delivered_at_ms=delivery.delivered_at_ms,
                reason="delivered to a worker that is gone or lost its connection",
            )
    resent = _resend_lost(res, client)
    if restored or resent:
        client.hincrby(keys.COUNTERS, "tasks_resent", restored + resent)
    top_up_repairs(res, client)
    return restored, resent


def _forget_gone_workers(
    res: Resources, client: redis.Redis, heartbeats: dict[str, Any], now_ms: int
) -> None:
    """Forget the heartbeats of workers gone longer than ``worker_forget_after_s``."""
    forget_after_s = res.settings.worker_forget_after_s
    gone = status.forget_gone_workers(client, heartbeats, now_ms, forget_after_s)
    if gone:
        log.info(
            "workers_forgotten",
            count=len(gone),
            workers=gone[:20],
            forget_after_s=forget_after_s,
            reason="no heartbeat for worker_forget_after_s (killed, or its host is gone)",
        )


def _resend_lost(res: Resources, client: redis.Redis) -> int:
    """Send again every recorded task the broker lost (:mod:`capdisc.registry.outbox`)."""
    now_ms = redis_now_ms(client)
    lost = outbox.lost(client, res.settings.outbox_grace_s, now_ms, _dropped)
    for pending in lost:
        if pending.untaken_s(now_ms) > res.settings.outbox_give_up_s:
            _give_up(res, client, pending, now_ms)
            continue
        log.warning(
            "task_resent",
            task_id=pending.task_id,
            task=pending.name,
            sent_at_ms=pending.sent_at_ms,
            reason="neither queued nor delivered: lost by the broker",
        )
        outbox.resend(client, app, pending)
    return len(lost)


def _dropped(task_id: str) -> None:
    log.warning(
        "outbox_entry_dropped",
        task_id=task_id,
        reason="the outbox entry is no task record (written by hand or damaged), so it can "
        "be neither sent again nor finished",
    )


def _give_up(res: Resources, client: redis.Redis, pending: outbox.Pending, now_ms: int) -> None:
    """Stop sending a task no indexing worker takes: keep it in the dead letters, saying why."""
    reason = (
        f"no indexing worker took task {pending.name!r} in {pending.untaken_s(now_ms):.0f} s "
        f"of sending it again (outbox_give_up_s {res.settings.outbox_give_up_s:g}): the "
        "workers do not know that task, so a producer is probably newer than they are; "
        "upgrade the indexing workers, then publish again"
    )
    res.dead_letter(
        client,
        json.dumps({"task": pending.name, "args": pending.args, "kwargs": pending.kwargs}),
        reason,
        source=keys.OUTBOX,
        task_id=pending.task_id,
    )
    outbox.done(client, pending.task_id)
    log.error("task_given_up", task_id=pending.task_id, task=pending.name, reason=reason)


# -- the periodic loops -------------------------------------------------------------------------


def reconcile_loop(res: Resources) -> None:
    """Every ``reconcile_interval_s``, the one indexing worker that takes the lock queues a
    reconcile run (so it runs like any task: acknowledged late, redelivered if lost)."""
    interval_s = res.settings.reconcile_interval_s
    client = res.connect()

    def schedule() -> None:
        if client.set(keys.RECONCILE_LOCK, res.worker_id, nx=True, ex=max(1, int(interval_s))):
            reconcile_task.apply_async(queue=keys.INDEXING_QUEUE)

    # retried soon once Redis is back: until this loop reaches it again the worker counts the
    # outage as going on (no redis_reconnected), which at the interval took up to a minute
    backoff = Backoff(first_s=0.5, cap_s=interval_s)
    while interval_s > 0 and not res.stopping.is_set():
        res.stopping.wait(periodic(res, "reconcile", schedule, interval_s, backoff))


#: The largest share of the time the fleet spends sweeping. A sweep reads the whole indexing
#: queue and outbox: with thousands of tasks waiting (a full reindex of a million capabilities
#: queues about 15,000) one takes seconds of a worker's core and holds Redis for each read, so
#: the next is put off until this share holds.
SWEEP_DUTY = 0.05


def sweep_pause_s(interval_s: float, took_s: float, duty: float = SWEEP_DUTY) -> float:
    """How long after a sweep that took ``took_s`` the next one waits: the interval, or longer
    so that sweeping takes at most ``duty`` of the time."""
    return max(interval_s, took_s / duty)


def sweep_loop(res: Resources) -> None:
    """Every ``sweep_interval_s`` (at once at start; later when sweeps grow slow,
    :func:`sweep_pause_s`), the one indexing worker that takes the lock gives back the tasks of
    workers that are gone and re-sends the tasks the broker lost."""
    interval_s = res.settings.sweep_interval_s
    client = res.connect()

    def step() -> None:
        if client.set(keys.SWEEP_LOCK, res.worker_id, nx=True, px=max(100, int(interval_s * 900))):
            started = time.monotonic()
            sweep(res, client)
            _put_off_next_sweep(client, res, interval_s, time.monotonic() - started)

    backoff = Backoff(first_s=0.5, cap_s=interval_s)  # sweep soon once Redis is back
    while interval_s > 0 and not res.stopping.is_set():
        res.stopping.wait(periodic(res, "sweep", step, interval_s, backoff))


def _put_off_next_sweep(
    client: redis.Redis, res: Resources, interval_s: float, took_s: float
) -> None:
    """Hold the sweep lock (no worker of the fleet sweeps) for :func:`sweep_pause_s`, when that
    is longer than the interval."""
    pause_s = sweep_pause_s(interval_s, took_s)
    if pause_s > interval_s:
        client.set(keys.SWEEP_LOCK, res.worker_id, px=int(pause_s * 900))
        log.info("sweep_put_off", took_s=round(took_s, 3), next_in_s=round(pause_s * 0.9, 1))


def periodic(
    res: Resources,
    loop: str,
    step: Callable[[], None],
    interval_s: float,
    backoff: Backoff | None = None,
) -> float:
    """One run of a worker thread's ``step``; how long to wait before the next. While Redis is
    away the thread retries sooner (with ``backoff``, up to its interval) and the outage is
    logged once for the whole worker, not at every attempt."""
    try:
        step()
    except RETRYABLE as exc:
        res.health.failed(loop, exc)
        return min(interval_s, backoff.next()) if backoff else interval_s
    except (redis.RedisError, kombu.exceptions.OperationalError) as exc:
        log.warning(f"{loop}_failed", error=str(exc))
        return interval_s
    except Exception:  # a bug or a damaged entry must not end the loop's thread for good
        log.exception(f"{loop}_failed")
        return interval_s
    res.health.ok(loop)
    if backoff:
        backoff.reset()
    return interval_s
