"""Applying registry events: the tasks that take encoded events off the indexing queue.

Each event is decoded and admitted (with auth on, its token must grant ``write`` on its tenant);
what it does is decided and written atomically by :func:`capdisc.registry.store.apply_events`
(the policy is :func:`capdisc.registry.policy.decide`), with the vectors it needs embedded
beforehand, a chunk of events at a time (:mod:`capdisc_workers.embedding`): the later chunks'
on the embedding thread while this one's are written, so the model does not wait for Redis.
What changed is then handed to the external vector store, if any
(:mod:`capdisc_workers.mirroring`). A refused event is dead-lettered; a failed embedding is
retried, then dead-lettered.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any, TypeVar

import redis
import structlog
from celery.exceptions import SoftTimeLimitExceeded

from capdisc import keys
from capdisc.errors import AuthError, EmbeddingError, EventDecodeError, ManifestError
from capdisc.models import Capability
from capdisc.registry.events import RegistryEvent
from capdisc.registry.normalize import capability_from_record
from capdisc.registry.policy import retry_delay_s
from capdisc.registry.store import (
    Outcome,
    apply_events,
    needing_vectors,
    record_ack,
    record_acks,
    transaction_runs,
)
from capdisc.retrieval.text import vector_space
from capdisc_workers import metrics
from capdisc_workers.celery_app import app, resources
from capdisc_workers.embedding import ahead, chunk_bounds, stored_capabilities, vectors_for
from capdisc_workers.mirroring import mirror
from capdisc_workers.outage import Backoff, waited_out
from capdisc_workers.reconciling import continue_repair
from capdisc_workers.resources import Resources

log = structlog.get_logger("capdisc.indexing")
_T = TypeVar("_T")
#: An event waiting to be applied: its place among the outcomes, its payload, the event and
#: its validated capability.
_Pending = tuple[int, str, RegistryEvent, Capability | None]


@app.task(name=keys.TASK_APPLY_EVENT, bind=True, acks_late=True, ignore_result=True)
def apply_event_task(self: Any, payload: str) -> dict[str, Any]:
    """Apply one encoded :class:`RegistryEvent`."""
    return _counted(
        [_through_outage(resources, lambda: apply_payloads(resources, self, [payload])[0])]
    )[0]


@app.task(name=keys.TASK_APPLY_EVENTS, bind=True, acks_late=True, ignore_result=True)
def apply_events_task(self: Any, payloads: list[str]) -> list[dict[str, Any]]:
    """Apply a batch of encoded events (see :func:`apply_payloads`); a batch of reconciler
    repairs then sends the next of its tenant's backlog (:func:`continue_repair`)."""
    outcomes = _through_outage(resources, lambda: apply_payloads(resources, self, payloads))
    continue_repair(resources, payloads, self.request.id)
    return _counted(outcomes)


def _counted(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``outcomes``, each counted by its decision (``capdisc_events_total``)."""
    for outcome in outcomes:
        metrics.EVENTS.labels(str(outcome.get("decision", "unknown"))).inc()
    return outcomes


def _through_outage(res: Resources, run: Callable[[], _T]) -> _T:
    """``run()``, again from the start while Redis cannot be reached (applying is idempotent:
    what was applied before the outage is stale the second time). It waits at most
    ``task_time_limit_s``, and not past a shutdown; then the Redis error stands, the task stays
    in the outbox (:func:`capdisc_workers.liveness.forget_done_task`) and the sweep gives it to
    a worker later."""
    deadline = time.monotonic() + res.settings.task_time_limit_s
    backoff = Backoff(cap_s=2.0)
    while True:
        try:
            result = run()
        except redis.RedisError as exc:
            if not waited_out(exc):
                raise
            res.health.failed("task", exc)
            if time.monotonic() >= deadline or res.stopping.wait(backoff.next()):
                raise
            continue
        res.health.ok("task")
        return result


def apply_payloads(res: Resources, task: Any, payloads: list[str]) -> list[dict[str, Any]]:
    """Apply encoded events in order, a chunk at a time (:func:`chunk_bounds`), each chunk's
    vectors made on the embedding thread (in order, as soon as the chunk is parsed) while the
    chunks before it are written. A refused event is dead-lettered alone; a failed embedding
    retries (then dead-letters) the events not yet applied, which is safe because applying is
    idempotent."""
    client = res.redis
    space = vector_space(res.embedder.id)
    outcomes: list[dict[str, Any] | None] = []
    parsed: list[list[_Pending]] = []
    making: list[Future[dict[str, tuple[str, bytes]]]] = []
    try:
        for start, end in chunk_bounds(len(payloads)):
            chunk = _parse_chunk(res, task, client, payloads[start:end], outcomes)
            parsed.append(chunk)
            making.append(ahead(partial(_vectors_needed, res, chunk, space)))
        pending = [entry for chunk in parsed for entry in chunk]
        try:
            for chunk, vectors in zip(parsed, making, strict=True):
                try:
                    made = vectors.result()
                    for run in _runs(chunk):
                        applied = _apply(res, task, run, made, space)
                        for (slot, *_rest), outcome in zip(run, applied, strict=True):
                            outcomes[slot] = outcome
                finally:
                    _settle(res, chunk, outcomes, space)
        except EmbeddingError as exc:
            unfinished = [(p, e) for slot, p, e, _c in pending if outcomes[slot] is None]
            return [o for o in outcomes if o is not None] + _retry_or_dead_letter(
                res, task, unfinished, exc
            )
        except (redis.RedisError, SoftTimeLimitExceeded):
            raise  # an outage is waited out whole; a task past its time limit ends as Celery says
        except Exception as exc:  # a fault of capdisc or of an adapter: keep the events anyway
            log.exception("events_failed_unexpectedly", task_id=task.request.id)
            unfinished = [(p, e) for slot, p, e, _c in pending if outcomes[slot] is None]
            return [o for o in outcomes if o is not None] + _retry_or_dead_letter(
                res, task, unfinished, exc
            )
    finally:
        for future in making:
            future.cancel()  # those not started, after a failure: nothing left to apply them
    return [o for o in outcomes if o is not None]


def _parse_chunk(
    res: Resources,
    task: Any,
    client: redis.Redis,
    payloads: list[str],
    outcomes: list[dict[str, Any] | None],
) -> list[_Pending]:
    """The events of ``payloads`` to apply, each with its place in ``outcomes`` (where the
    outcome of each one refused goes at once)."""
    pending: list[_Pending] = []
    for payload in payloads:
        parsed = _parse(res, task, client, payload)
        if isinstance(parsed, dict):
            outcomes.append(parsed)
        else:
            pending.append((len(outcomes), payload, *parsed))
            outcomes.append(None)
    return pending


def _parse(
    res: Resources, task: Any, client: redis.Redis, payload: str
) -> dict[str, Any] | tuple[RegistryEvent, Capability | None]:
    """The event and its validated capability, or the outcome of refusing it."""
    try:
        event = RegistryEvent.decode(payload, max_bytes=res.settings.event_max_bytes)
    except EventDecodeError as exc:
        log.warning("event_rejected", reason=str(exc), task_id=task.request.id)
        res.dead_letter(client, payload, str(exc))
        return {"decision": "rejected", "reason": str(exc)}
    try:
        res.gate.admit_event(event)  # with auth on, its token must grant write on its tenant
        return event, _capability(event)
    except (ManifestError, AuthError) as exc:
        log.warning(
            "event_rejected",
            reason=str(exc),
            event_id=event.event_id,
            tenant=event.tenant,
            capability_id=event.capability_id,
        )
        res.dead_letter(client, payload, str(exc))
        _ack(client, event, {"decision": "rejected", "reason": str(exc)})
        return {"decision": "rejected", "reason": str(exc)}


def _capability(event: RegistryEvent) -> Capability | None:
    if event.type != "upsert" or event.capability is None:
        return None
    capability = capability_from_record(event.capability, f"event {event.event_id}")
    if capability.id != event.capability_id:
        raise ManifestError(
            f"event {event.event_id}",
            "capability_id",
            f"{event.capability_id!r} does not match the capability's id {capability.id!r}",
        )
    return capability


def _vectors_needed(
    res: Resources, pending: list[_Pending], space: str
) -> dict[str, tuple[str, bytes]]:
    """The vectors applying ``pending`` will store, made in one batch: the new or changed
    capabilities' (through the embedding cache) and the stored ones reindex events name (not
    trusting the cache)."""
    client, embedder = res.redis, res.embedder
    changed = vectors_for(
        client, embedder, needing_vectors(client, [(e, c) for _, _, e, c in pending], space)
    )
    stored = stored_capabilities(
        client, [(e.tenant, e.capability_id) for _, _, e, _c in pending if e.type == "reindex"]
    )
    return {**changed, **vectors_for(client, embedder, stored, use_cache=False)}


def _runs(chunk: list[_Pending]) -> list[list[_Pending]]:
    """``chunk`` cut where :func:`capdisc.registry.store.apply_events` starts a transaction, so
    each run's outcomes are kept as soon as it is written."""
    runs, start = [], 0
    for run in transaction_runs((event, capability) for _s, _p, event, capability in chunk):
        runs.append(chunk[start : start + len(run)])
        start += len(run)
    return runs


def _apply(
    res: Resources,
    task: Any,
    run: list[_Pending],
    vectors: dict[str, tuple[str, bytes]],
    space: str,
) -> list[dict[str, Any]]:
    """Apply one transaction's events (:func:`capdisc.registry.store.apply_events`) with the
    vectors made for their chunk; their outcomes, in order."""
    reindexed = {event.capability_id for _s, _p, event, _c in run if event.type == "reindex"}

    def vector_for(cap: Capability) -> bytes:
        made = vectors.get(cap.id)
        if made is not None and made[0] == cap.content_hash:
            return made[1]
        # not foreseen by the batch (a write raced it): embedded alone
        again = vectors_for(res.redis, res.embedder, [cap], use_cache=cap.id not in reindexed)
        return again[cap.id][1]

    # acknowledged with the write, or with an external store once it holds the change too
    applied = apply_events(
        res.redis,
        [(event, capability) for _s, _p, event, capability in run],
        vector_for,
        space,
        acknowledge=res.store is None,
    )
    log_applied(run[0][2].tenant, task.request.id, applied)
    return [outcome.to_dict() for outcome in applied]


#: Decisions a bulk load is made of: logged one line a transaction (``events_applied``, with
#: their counts), each event at DEBUG. A line per event cost the indexing worker about 0.6 ms
#: of CPU an event, beside the model, in a 4,000-capability import (py-spy).
ROUTINE_DECISIONS = frozenset({"upsert", "unchanged", "delete", "reindex"})


def log_applied(tenant: str, task_id: str, applied: list[Outcome]) -> None:
    """One ``events_applied`` line for a transaction's outcomes; each outcome as
    ``event_applied``, at INFO when it is out of the ordinary (a stale, refused or absent
    event, or one with a reason such as a take-over), else at DEBUG."""
    for outcome in applied:
        routine = outcome.decision in ROUTINE_DECISIONS and not outcome.reason
        (log.debug if routine else log.info)(
            "event_applied",
            event_id=outcome.event_id,
            tenant=tenant,
            capability_id=outcome.capability_id,
            task_id=task_id,
            decision=outcome.decision,
            index_version=outcome.version,
            **({"reason": outcome.reason} if outcome.reason else {}),
        )
    if applied:
        log.info(
            "events_applied",
            tenant=tenant,
            task_id=task_id,
            events=len(applied),
            decisions=dict(Counter(outcome.decision for outcome in applied)),
            index_version=max(outcome.version for outcome in applied),
        )


def _settle(
    res: Resources, chunk: list[_Pending], outcomes: list[dict[str, Any] | None], space: str
) -> None:
    """Write what the chunk's applied events changed to the external vector store, if any,
    then acknowledge them: a producer that has an event's acknowledgement finds the change in
    the store as well as in Redis. (Without a store each event was acknowledged with its
    write.) A worker killed in between leaves the events unacknowledged: the task runs again,
    finds them applied, and acknowledges them then; the reconciler writes the store again."""
    if res.store is None:
        return
    applied = [(event, outcomes[slot]) for slot, _p, event, _c in chunk if outcomes[slot]]
    mirror(res.redis, res.store, applied, space)
    record_acks(
        res.redis,
        [(event.batch_id, outcome) for event, outcome in applied if event.batch_id and outcome],
    )


def _retry_or_dead_letter(
    res: Resources, task: Any, unfinished: list[tuple[str, RegistryEvent]], exc: Exception
) -> list[dict[str, Any]]:
    """A failed embedding (a rate limit that outlasted the provider's own retries, a broken
    answer), or any other unexpected error, is retried with backoff up to
    ``indexing_max_attempts`` deliveries; then the events not yet applied go to the dead-letter
    stream with the reason. Nothing stored is touched."""
    attempt = task.request.retries + 1
    settings = res.settings
    if attempt < settings.indexing_max_attempts:
        log.warning(
            "events_retry",
            reason=str(exc),
            task_id=task.request.id,
            attempt=attempt,
            events=len(unfinished),
        )
        raise task.retry(
            exc=exc,
            args=[[p for p, _e in unfinished]] if task.name == keys.TASK_APPLY_EVENTS else None,
            countdown=retry_delay_s(attempt, settings.indexing_retry_base_s),
            max_retries=settings.indexing_max_attempts - 1,
        )
    reason = (
        f"embedding failed after {attempt} attempts: {exc}"
        if isinstance(exc, EmbeddingError)
        else f"applying failed after {attempt} attempts: {type(exc).__name__}: {exc}"
    )
    outcomes = []
    for payload, event in unfinished:
        log.error(
            "event_dead_lettered",
            reason=reason,
            event_id=event.event_id,
            tenant=event.tenant,
            capability_id=event.capability_id,
        )
        res.dead_letter(res.redis, payload, reason, attempt)
        outcome = {"decision": "dead_lettered", "reason": reason}
        _ack(res.redis, event, outcome)
        outcomes.append(outcome)
    return outcomes


def _ack(client: redis.Redis, event: RegistryEvent, outcome: dict[str, Any]) -> None:
    if event.batch_id:
        record_ack(
            client,
            event.batch_id,
            {"event_id": event.event_id, "capability_id": event.capability_id, **outcome},
        )


__all__ = ["Outcome", "apply_event_task", "apply_events_task", "apply_payloads"]
