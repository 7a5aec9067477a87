"""Indexing tasks: thin shells that decode an event, validate, embed if needed and store.

The policy (what an event does) is :func:`capdisc.registry.policy.decide`; the atomic write is
:func:`capdisc.registry.store.apply_event`; this module only wires them to Celery, the embedder and
the
shared embedding cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kombu.exceptions
import numpy as np
import redis
import structlog
from celery import signals

from capdisc import keys, status
from capdisc.embedders.port import Embedder, check_vectors
from capdisc.errors import (
    AuthError,
    CapdiscError,
    EmbeddingError,
    EventDecodeError,
    ManifestError,
)
from capdisc.models import Capability
from capdisc.registry import outbox
from capdisc.registry.events import RegistryEvent
from capdisc.registry.normalize import capability_from_record
from capdisc.registry.policy import StoredRecord, retry_delay_s
from capdisc.registry.store import (
    Outcome,
    ReindexJob,
    abandon_reindex,
    apply_event,
    as_str,
    begin_reindex,
    dead_letter,
    finish_reindex,
    needing_vectors,
    record_ack,
    repair_plan,
    stage_vectors,
    tenants,
    vector_bytes,
)
from capdisc.resources import embedder_for, store_for
from capdisc.retrieval.text import combine, embedding_texts, text_hash, vector_space
from capdisc.vectorstores.port import StoredObject, VectorStore
from capdisc_workers.celery_app import app, gate, settings
from capdisc_workers.outage import RETRYABLE, Backoff, RedisHealth

log = structlog.get_logger("capdisc.indexing")
WORKER_ID = f"indexing@{socket.gethostname()}:{os.getpid()}"

_state: dict[str, Any] = {}
#: Whether this worker's loops (tasks, heartbeat, sweep, reconcile schedule) reach Redis: an
#: outage is logged once (``redis_unavailable``) and its end once (``redis_reconnected``).
_health = RedisHealth(log)
_T = TypeVar("_T")
#: Texts embedded per model call when a batch of events needs many.
EMBED_BATCH = 64


def _redis() -> redis.Redis:
    if "redis" not in _state:
        _state["redis"] = redis.Redis.from_url(settings.redis_url)
    client: redis.Redis = _state["redis"]
    return client


def _embedder() -> Embedder:
    if "embedder" not in _state:
        _state["embedder"] = embedder_for(settings)
    embedder: Embedder = _state["embedder"]
    return embedder


@app.task(name=keys.TASK_APPLY_EVENT, bind=True, acks_late=True, ignore_result=True)
def apply_event_task(self: Any, payload: str) -> dict[str, Any]:
    """Apply one encoded :class:`RegistryEvent`."""
    return _through_outage(lambda: apply_payloads(self, [payload])[0])


@app.task(name=keys.TASK_APPLY_EVENTS, bind=True, acks_late=True, ignore_result=True)
def apply_events_task(self: Any, payloads: list[str]) -> list[dict[str, Any]]:
    """Apply a batch of encoded events (see :func:`apply_payloads`)."""
    return _through_outage(lambda: apply_payloads(self, payloads))


def _through_outage(run: Callable[[], _T]) -> _T:
    """``run()``, again from the start while Redis cannot be reached (applying is idempotent:
    what was applied before the outage is stale the second time). It waits at most
    ``task_time_limit_s``, and not past a shutdown; then the Redis error stands, the task stays
    in the outbox (:func:`_forget_done_task`) and the sweep gives it to a worker later."""
    deadline = time.monotonic() + settings.task_time_limit_s
    backoff = Backoff(cap_s=2.0)
    while True:
        try:
            result = run()
        except RETRYABLE as exc:
            _health.failed("task", exc)
            if time.monotonic() >= deadline or _stop.wait(backoff.next()):
                raise
            continue
        _health.ok("task")
        return result


def apply_payloads(task: Any, payloads: list[str]) -> list[dict[str, Any]]:
    """Apply encoded events in order, embedding every capability that needs it in one model
    call. A refused event is dead-lettered alone; a failed embedding retries (then
    dead-letters) the events not yet applied, which is safe because applying is idempotent."""
    client = _redis()
    outcomes: list[dict[str, Any] | None] = []
    pending: list[tuple[int, str, RegistryEvent, Capability | None]] = []
    for payload in payloads:
        parsed = _parse(task, client, payload)
        if isinstance(parsed, dict):
            outcomes.append(parsed)
        else:
            pending.append((len(outcomes), payload, *parsed))
            outcomes.append(None)
    space = vector_space(_embedder().id)
    try:
        vectors = {**_vectors_for(needing_vectors(client, [(e, c) for _, _, e, c in pending],
                                                  space)),
                   **_vectors_for(_stored(client, [e for _, _, e, _c in pending
                                                   if e.type == "reindex"]), use_cache=False)}
        for slot, _payload, event, capability in pending:
            outcomes[slot] = _apply(task, client, event, capability, vectors, space)
        _mirror(client, [(event, outcomes[slot]) for slot, _p, event, _c in pending], space)
    except EmbeddingError as exc:
        unfinished = [(p, e) for slot, p, e, _c in pending if outcomes[slot] is None]
        return [o for o in outcomes if o is not None] + _retry_or_dead_letter(
            task, client, unfinished, exc)
    return [o for o in outcomes if o is not None]


def _parse(task: Any, client: redis.Redis, payload: str
           ) -> dict[str, Any] | tuple[RegistryEvent, Capability | None]:
    """The event and its validated capability, or the outcome of refusing it."""
    try:
        event = RegistryEvent.decode(payload, max_bytes=settings.event_max_bytes)
    except EventDecodeError as exc:
        log.warning("event_rejected", reason=str(exc), task_id=task.request.id)
        dead_letter(client, payload, str(exc))
        return {"decision": "rejected", "reason": str(exc)}
    try:
        gate.admit_event(event)  # with auth on, its token must grant write on its tenant
        return event, _capability(event)
    except (ManifestError, AuthError) as exc:
        log.warning("event_rejected", reason=str(exc), event_id=event.event_id,
                    tenant=event.tenant, capability_id=event.capability_id)
        dead_letter(client, payload, str(exc))
        _ack(client, event, {"decision": "rejected", "reason": str(exc)})
        return {"decision": "rejected", "reason": str(exc)}


def _apply(task: Any, client: redis.Redis, event: RegistryEvent, capability: Capability | None,
           vectors: dict[str, tuple[str, bytes]], space: str) -> dict[str, Any]:
    def vector_for(cap: Capability) -> bytes:
        made = vectors.get(cap.id)
        if made is not None and made[0] == cap.content_hash:
            return made[1]
        return _vectors_for([cap], use_cache=event.type != "reindex")[cap.id][1]  # a race

    outcome = apply_event(client, event, capability, vector_for, space)  # acks it too
    log.info("event_applied", event_id=event.event_id, tenant=event.tenant,
             capability_id=event.capability_id, task_id=task.request.id,
             decision=outcome.decision, index_version=outcome.version)
    return outcome.to_dict()


def _mirror(client: redis.Redis, applied: list[tuple[RegistryEvent, dict[str, Any] | None]],
            space: str) -> None:
    """With an external vector store (``vector_store: weaviate``), write what these events
    changed there too: the stored record and vector of each upsert, each delete. Redis stays
    the source of truth; a write the store refuses is logged and counted
    (``store_write_failures``), and the next publish or reindex of it writes it again."""
    store = _store()
    if store is None:
        return
    by_tenant: dict[str, tuple[list[str], list[str]]] = {}
    for event, outcome in applied:
        upserts, deletes = by_tenant.setdefault(event.tenant, ([], []))
        decision = (outcome or {}).get("decision")
        if decision in ("upsert", "reindex"):
            upserts.append(event.capability_id)
        elif decision == "delete":
            deletes.append(event.capability_id)
    for tenant, (upserts, deletes) in by_tenant.items():
        try:
            failed = _mirror_tenant(client, store, tenant, upserts, deletes, space)
        except CapdiscError as exc:
            failed = len(upserts) + len(deletes)
            log.error("store_write_failed", tenant=tenant, error=str(exc))
        if failed:
            client.hincrby(keys.COUNTERS, "store_write_failures", failed)


def _mirror_tenant(client: redis.Redis, store: VectorStore, tenant: str, upserts: list[str],
                   deletes: list[str], space: str) -> int:
    """Write one tenant's changes to the store; how many it refused."""
    store.ensure_tenant(tenant)
    objects = []
    if upserts:
        records = client.hmget(keys.caps(tenant), upserts)
        rows = client.hmget(keys.vectors(tenant, space), upserts)
        for raw, vector in zip(records, rows, strict=True):
            if raw and isinstance(vector, bytes):
                cap = Capability.from_dict(StoredRecord.from_dict(json.loads(raw)).capability)
                objects.append(StoredObject.from_capability(
                    cap, np.frombuffer(vector, dtype=np.float32)))
    report = store.upsert(tenant, objects) if objects else None
    if deletes:
        store.delete(tenant, deletes)
    for failure in report.failed if report is not None else ():
        log.error("store_write_failed", tenant=tenant, capability_id=failure.id,
                  reason=failure.reason)
    return len(report.failed) if report is not None else 0


def _store() -> VectorStore | None:
    if "store" not in _state:
        _state["store"] = store_for(settings)
    store: VectorStore | None = _state["store"]
    return store


def _retry_or_dead_letter(task: Any, client: redis.Redis,
                          unfinished: list[tuple[str, RegistryEvent]], exc: EmbeddingError
                          ) -> list[dict[str, Any]]:
    """A failed embedding (a rate limit that outlasted the provider's own retries, a broken
    answer) is retried with backoff up to ``indexing_max_attempts`` deliveries; then the events
    not yet applied go to the dead-letter stream with the reason. Nothing stored is touched."""
    attempt = task.request.retries + 1
    if attempt < settings.indexing_max_attempts:
        log.warning("events_retry", reason=str(exc), task_id=task.request.id, attempt=attempt,
                    events=len(unfinished))
        raise task.retry(exc=exc, args=[[p for p, _e in unfinished]] if task.name ==
                         keys.TASK_APPLY_EVENTS else None,
                         countdown=retry_delay_s(attempt, settings.indexing_retry_base_s),
                         max_retries=settings.indexing_max_attempts - 1)
    reason = f"embedding failed after {attempt} attempts: {exc}"
    outcomes = []
    for payload, event in unfinished:
        log.error("event_dead_lettered", reason=reason, event_id=event.event_id,
                  tenant=event.tenant, capability_id=event.capability_id)
        dead_letter(client, payload, reason, attempt)
        outcome = {"decision": "dead_lettered", "reason": reason}
        _ack(client, event, outcome)
        outcomes.append(outcome)
    return outcomes


def _capability(event: RegistryEvent) -> Capability | None:
    if event.type != "upsert" or event.capability is None:
        return None
    capability = capability_from_record(event.capability, f"event {event.event_id}")
    if capability.id != event.capability_id:
        raise ManifestError(f"event {event.event_id}", "capability_id",
                            f"{event.capability_id!r} does not match the capability's id "
                            f"{capability.id!r}")
    return capability


def _stored(client: redis.Redis, events: list[RegistryEvent]) -> list[Capability]:
    """The stored capabilities the ``events`` name (those still stored)."""
    out = []
    for event in events:
        raw = client.hget(keys.caps(event.tenant), event.capability_id)
        if raw:
            out.append(Capability.from_dict(StoredRecord.from_dict(json.loads(raw)).capability))
    return out


def _vectors_for(capabilities: list[Capability], use_cache: bool = True
                 ) -> dict[str, tuple[str, bytes]]:
    """``(content hash, stored vector)`` by capability id: :func:`capdisc.retrieval.text.combine` of
    each capability's two texts. Each text's embedding comes from the shared cache (unless
    ``use_cache`` is off: a reindex that must not trust it); the misses of the whole batch are
    embedded together, in chunks of ``EMBED_BATCH``, and refresh the cache."""
    if not capabilities:
        return {}
    client, embedder = _redis(), _embedder()
    texts = [embedding_texts(c) for c in capabilities]
    flat = list(dict.fromkeys(t for pair in texts for t in pair))
    digests = [text_hash(text) for text in flat]
    cached = (client.hmget(keys.embedding_cache(embedder.id), digests) if use_cache
              else [None] * len(flat))
    rows = {text: np.frombuffer(raw, dtype=np.float32)
            for text, raw in zip(flat, cached, strict=True) if isinstance(raw, bytes)}
    missing = sorted(((text, digest) for text, digest in zip(flat, digests, strict=True)
                      if text not in rows), key=lambda pair: len(pair[0]))  # less padding
    for start in range(0, len(missing), EMBED_BATCH):
        chunk = missing[start:start + EMBED_BATCH]
        fresh = check_vectors(embedder.embed([text for text, _d in chunk]), len(chunk),
                              embedder.dim, embedder.id)
        with client.pipeline(transaction=False) as pipe:
            for (text, digest), vector in zip(chunk, fresh, strict=True):
                rows[text] = vector
                pipe.hset(keys.embedding_cache(embedder.id), digest, vector_bytes(vector))
            pipe.hincrby(keys.COUNTERS, "embedding_calls", len(chunk))
            pipe.execute()
    return {cap.id: (cap.content_hash, vector_bytes(combine(rows[full], rows[summary])))
            for cap, (full, summary) in zip(capabilities, texts, strict=True)}


def _ack(client: redis.Redis, event: RegistryEvent, outcome: dict[str, Any]) -> None:
    if event.batch_id:
        record_ack(client, event.batch_id, {"event_id": event.event_id,
                                            "capability_id": event.capability_id, **outcome})


# -- full reindex (blue/green) ------------------------------------------------------------------


@app.task(name=keys.TASK_START_REINDEX, bind=True, acks_late=True, ignore_result=True)
def start_reindex_task(self: Any, tenant: str, job: str, fresh: bool = False) -> dict[str, Any]:
    """Build every vector of ``tenant`` again, into a staging space beside the live index, in
    batches other indexing workers share; the last batch swaps it in (:func:`finish_reindex`)."""
    target = vector_space(_embedder().id)
    batches = begin_reindex(_redis(), tenant, job, target, EMBED_BATCH, fresh)
    log.info("reindex_started", tenant=tenant, job=job, target=target, batches=len(batches),
             task_id=self.request.id)
    for number, ids in enumerate(batches):
        outbox.send(_redis(), app, keys.TASK_REINDEX_BATCH, [tenant, job, number, ids])
    if not batches:
        _finish(tenant, job, fresh)
    return {"job": job, "batches": len(batches), "target": target}


@app.task(name=keys.TASK_REINDEX_BATCH, bind=True, acks_late=True, ignore_result=True)
def reindex_batch_task(self: Any, tenant: str, job: str, number: int, ids: list[str]
                       ) -> dict[str, Any]:
    """Embed one batch of a full reindex into its staging space."""
    client = _redis()
    current = ReindexJob.read(client, tenant)
    if current is None or current.job != job:
        return {"job": job, "batch": number, "skipped": "superseded"}
    if current.target != vector_space(_embedder().id):
        # a worker with another embedder (a fleet mid-rollout): leave it to one that matches
        raise self.retry(countdown=retry_delay_s(self.request.retries + 1,
                                                 settings.indexing_retry_base_s),
                         max_retries=settings.indexing_max_attempts - 1)
    capabilities = _stored(client, [RegistryEvent("reindex", tenant, cap_id, 0) for cap_id in ids])
    vectors = _vectors_for(capabilities, use_cache=not current.fresh)
    last = stage_vectors(client, tenant, job, number, {k: v for k, (_h, v) in vectors.items()})
    if last:
        _finish(tenant, job, current.fresh)
    return {"job": job, "batch": number, "staged": len(vectors)}


def _finish(tenant: str, job: str, fresh: bool) -> None:
    def embed(capabilities: list[Capability]) -> dict[str, bytes]:
        return {k: v for k, (_h, v) in _vectors_for(capabilities, use_cache=not fresh).items()}

    version = finish_reindex(_redis(), tenant, job, embed)
    log.info("reindex_swapped", tenant=tenant, job=job, index_version=version)
    if version is not None:
        _resync_store(_redis(), tenant, vector_space(_embedder().id))


def _resync_store(client: redis.Redis, tenant: str, space: str) -> int:
    """Write every stored capability of ``tenant`` to the external store again and delete the
    tombstoned ones there (after a reindex swap, or when the reconciler finds the store's count
    off); how many writes it refused."""
    store = _store()
    if store is None:
        return 0
    ids = sorted(as_str(i) for i in client.hkeys(keys.caps(tenant)))
    gone = sorted(as_str(i) for i in client.hkeys(keys.tombstones(tenant)))
    failed = 0
    for start in range(0, max(len(ids), len(gone)), 256):
        failed += _mirror_tenant(client, store, tenant, ids[start:start + 256],
                                 gone[start:start + 256], space)
    log.info("store_resynced", tenant=tenant, written=len(ids), deleted=len(gone),
             refused=failed)
    return failed


# -- reconciling --------------------------------------------------------------------------------


@app.task(name=keys.TASK_RECONCILE, bind=True, acks_late=True, ignore_result=True)
def reconcile_task(self: Any, reply_to: str | None = None) -> dict[str, Any]:
    """Give back the tasks of workers that are gone and re-send those the broker lost
    (:func:`sweep`), then compare every tenant's records with its live vectors; drop orphan
    vectors and send reindex events for records without one. The report goes to ``capdisc
    status`` (and to ``reply_to``, a list ``capdisc reconcile`` waits on)."""
    client, space = _redis(), vector_space(_embedder().id)
    report: dict[str, Any] = {"at_ms": int(time.time() * 1000), "worker": WORKER_ID,
                              "missing_vectors": 0, "orphan_vectors": 0, "repaired": {},
                              "skipped": {}, "resent_tasks": sum(sweep(client))}
    for tenant in tenants(client):
        reason = _reconcile_tenant(client, tenant, space, report)
        if reason:
            report["skipped"][tenant] = reason
    with client.pipeline(transaction=False) as pipe:
        pipe.set(keys.RECONCILE_LAST, json.dumps(report))
        pipe.hincrby(keys.COUNTERS, "drift_repaired",
                     report["missing_vectors"] + report["orphan_vectors"])
        if reply_to:
            pipe.rpush(reply_to, json.dumps(report))
            pipe.expire(reply_to, settings.reply_ttl_s)
        pipe.execute()
    log.info("reconciled", task_id=self.request.id, missing_vectors=report["missing_vectors"],
             orphan_vectors=report["orphan_vectors"], skipped=len(report["skipped"]))
    return report


def _resend_lost(client: redis.Redis) -> int:
    """Send again every recorded task the broker lost (:mod:`capdisc.registry.outbox`)."""
    lost = outbox.lost(client, settings.outbox_grace_s)
    for pending in lost:
        log.warning("task_resent", task_id=pending.task_id, task=pending.name,
                    sent_at_ms=pending.sent_at_ms,
                    reason="neither queued nor delivered: lost by the broker")
        outbox.resend(client, app, pending)
    return len(lost)


def _reconcile_tenant(client: redis.Redis, tenant: str, space: str, report: dict[str, Any]
                      ) -> str | None:
    """Repair one tenant; the reason it was skipped, if it was."""
    job = ReindexJob.read(client, tenant)
    if job is not None:
        age_s = time.time() - job.started_at_ms / 1000
        if age_s <= settings.reindex_timeout_s:
            return "a full reindex is building"
        abandon_reindex(client, job)
        log.warning("reindex_abandoned", tenant=tenant, job=job.job, age_s=round(age_s),
                    hint=f"it did not finish in reindex_timeout_s; run `capdisc reindex --all "
                         f"--tenant {tenant}` again")
        report.setdefault("abandoned_reindexes", []).append(job.job)
    active = client.get(keys.space(tenant))
    if active and as_str(active) != space:
        return (f"served from {as_str(active)}, this worker embeds {space}: run "
                f"`capdisc reindex --all --tenant {tenant}` to move it")
    plan = repair_plan(client, tenant, space)
    if plan is None:
        return "written to meanwhile; the next run checks it"
    _reconcile_store(client, tenant, space, report)
    if plan.missing_vectors:
        seq = time.time_ns()
        payloads = [RegistryEvent("reindex", tenant, cap_id, seq, source="reconciler").encode()
                    for cap_id in plan.missing_vectors]
        for start in range(0, len(payloads), EMBED_BATCH):
            outbox.send(client, app, keys.TASK_APPLY_EVENTS, [payloads[start:start + EMBED_BATCH]])
    if not plan.clean:
        log.warning("drift_repaired", tenant=tenant, missing_vectors=len(plan.missing_vectors),
                    orphan_vectors=len(plan.orphan_vectors))
        report["repaired"][tenant] = {"missing_vectors": plan.missing_vectors[:100],
                                      "orphan_vectors": plan.orphan_vectors[:100]}
    report["missing_vectors"] += len(plan.missing_vectors)
    report["orphan_vectors"] += len(plan.orphan_vectors)
    return None


def _reconcile_store(client: redis.Redis, tenant: str, space: str,
                     report: dict[str, Any]) -> None:
    """With an external store: when it holds another number of objects than Redis has
    records, write them all again and delete the tombstoned ones (writes are idempotent)."""
    store = _store()
    if store is None:
        return
    try:
        store.ensure_tenant(tenant)
        held, stored = store.count(tenant), int(client.hlen(keys.caps(tenant)))
        if held != stored:
            log.warning("store_drift", tenant=tenant, store=held, registry=stored)
            _resync_store(client, tenant, space)
            report.setdefault("store_resynced", []).append(tenant)
    except CapdiscError as exc:
        log.error("store_reconcile_failed", tenant=tenant, error=str(exc))


def _reconcile_loop() -> None:
    """Every ``reconcile_interval_s``, the one indexing worker that takes the lock queues a
    reconcile run (so it runs like any task: acknowledged late, redelivered if lost)."""
    interval_s = settings.reconcile_interval_s
    client = redis.Redis.from_url(settings.redis_url)

    def schedule() -> None:
        if client.set(keys.RECONCILE_LOCK, WORKER_ID, nx=True, ex=max(1, int(interval_s))):
            reconcile_task.apply_async(queue=keys.INDEXING_QUEUE)

    while interval_s > 0 and not _stop.is_set():
        _stop.wait(_periodic("reconcile", schedule, interval_s))


def _periodic(loop: str, step: Callable[[], None], interval_s: float,
              backoff: Backoff | None = None) -> float:
    """One run of a worker thread's ``step``; how long to wait before the next. While Redis is
    away the thread retries sooner (with ``backoff``, up to its interval) and the outage is
    logged once for the whole worker, not at every attempt."""
    try:
        step()
    except RETRYABLE as exc:
        _health.failed(loop, exc)
        return min(interval_s, backoff.next()) if backoff else interval_s
    except (redis.RedisError, kombu.exceptions.OperationalError) as exc:
        log.warning(f"{loop}_failed", error=str(exc))
        return interval_s
    _health.ok(loop)
    if backoff:
        backoff.reset()
    return interval_s


def _sweep_loop() -> None:
    """Every ``sweep_interval_s`` (at once at start), the one indexing worker that takes the lock
    gives back the tasks of workers that are gone and re-sends the tasks the broker lost."""
    interval_s = settings.sweep_interval_s
    client = redis.Redis.from_url(settings.redis_url)

    def step() -> None:
        if client.set(keys.SWEEP_LOCK, WORKER_ID, nx=True, px=max(100, int(interval_s * 900))):
            sweep(client)

    backoff = Backoff(first_s=0.5, cap_s=interval_s)  # sweep soon once Redis is back
    while interval_s > 0 and not _stop.is_set():
        _stop.wait(_periodic("sweep", step, interval_s, backoff))


def sweep(client: redis.Redis) -> tuple[int, int]:
    """Put back in the queue every delivery no live worker holds, then re-send the recorded
    tasks that are neither queued nor delivered; how many of each."""
    workers = outbox.holders(json.loads(v) for v in client.hvals(keys.WORKERS))
    restored = 0
    for delivery in outbox.orphans(outbox.deliveries(client), workers, int(time.time() * 1000),
                                   settings.outbox_grace_s, settings.worker_stale_after_s):
        if outbox.restore(client, delivery):
            restored += 1
            log.warning("task_restored", task_id=delivery.task_id,
                        delivered_at_ms=delivery.delivered_at_ms,
                        reason="delivered to a worker that is gone or lost its connection")
    resent = _resend_lost(client)
    if restored or resent:
        client.hincrby(keys.COUNTERS, "tasks_resent", restored + resent)
    return restored, resent


# -- heartbeat -----------------------------------------------------------------------------------

_stop = threading.Event()


@signals.worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    if settings.embedder != "openai":  # a remote model has nothing to load (and calls cost)
        _embedder().embed(["warm up"])  # load the model before the first event, not during it
    threading.Thread(target=_beat, name="capdisc-heartbeat", daemon=True).start()
    threading.Thread(target=_reconcile_loop, name="capdisc-reconcile", daemon=True).start()
    threading.Thread(target=_sweep_loop, name="capdisc-sweep", daemon=True).start()


@signals.task_postrun.connect
def _forget_done_task(task_id: str | None = None, state: str | None = None,
                      retval: Any = None, **_: Any) -> None:
    """A task that will not run again (it did not ask for a retry) leaves the outbox; one that
    failed because Redis was away stays, so the sweep sends it again."""
    if not task_id or state == "RETRY":
        return
    if state == "FAILURE" and isinstance(retval, RETRYABLE):
        log.warning("task_kept", task_id=task_id, reason=f"Redis was away: {retval}",
                    hint="the sweep sends it again once Redis is back")
        return
    try:
        outbox.done(_redis(), task_id)
    except RETRYABLE as exc:  # kept: the sweep finds it done or sends it again (idempotent)
        _health.failed("task", exc)


@signals.worker_shutting_down.connect
def _stop_heartbeat(**_: Any) -> None:
    _stop.set()
    with contextlib.suppress(redis.RedisError):
        status.forget_worker(_redis(), WORKER_ID)


def _beat() -> None:
    client = redis.Redis.from_url(settings.redis_url)
    info = {"kind": "indexing", "pid": os.getpid(), "host": socket.gethostname(),
            "embedder": _embedder().id}
    backoff = Backoff(cap_s=settings.heartbeat_interval_s)

    def beat() -> None:
        status.heartbeat(client, WORKER_ID, {**info, "tasks": sorted(_held_tasks())})

    while not _stop.is_set():
        _stop.wait(_periodic("heartbeat", beat, settings.heartbeat_interval_s, backoff))


def _held_tasks() -> set[str]:
    """Ids of the tasks this worker holds: received, waiting for a retry's countdown (Celery
    keeps all of them in ``state.requests``), or running. Copied in one step (a dict's keys are
    copied without running Python code, so the consumer thread cannot change it meanwhile);
    Celery drops the received ones when its connection is lost, so they are held no longer."""
    from celery.worker import state

    return {str(task_id) for task_id in list(state.requests)}


__all__ = ["Outcome", "apply_event_task"]
