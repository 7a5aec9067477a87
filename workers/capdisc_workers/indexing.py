"""Indexing tasks: thin shells that decode an event, validate, embed if needed and store.

The policy (what an event does) is :func:`capdisc.registry.decide`; the atomic write is
:func:`capdisc.store.apply_event`; this module only wires them to Celery, the embedder and the
shared embedding cache.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Any

import numpy as np
import redis
import structlog
from celery import signals

from capdisc import keys, status
from capdisc.embedding import Embedder, check_vectors, embedder_for
from capdisc.errors import EmbeddingError, EventDecodeError, ManifestError
from capdisc.events import RegistryEvent
from capdisc.models import Capability
from capdisc.normalize import capability_from_record
from capdisc.registry import retry_delay_s
from capdisc.store import Outcome, apply_event, dead_letter, record_ack, vector_bytes
from capdisc.text import combine, embedding_texts, text_hash, vector_space
from capdisc_workers.celery_app import app, settings

log = structlog.get_logger("capdisc.indexing")
WORKER_ID = f"indexing@{socket.gethostname()}:{os.getpid()}"

_state: dict[str, Any] = {}


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
    client = _redis()
    try:
        event = RegistryEvent.decode(payload, max_bytes=settings.event_max_bytes)
    except EventDecodeError as exc:
        log.warning("event_rejected", reason=str(exc), task_id=self.request.id)
        dead_letter(client, payload, str(exc))
        return {"decision": "rejected", "reason": str(exc)}
    bound = log.bind(event_id=event.event_id, tenant=event.tenant,
                     capability_id=event.capability_id, task_id=self.request.id)
    try:
        capability = _capability(event)
    except ManifestError as exc:
        bound.warning("event_rejected", reason=str(exc))
        dead_letter(client, payload, str(exc))
        _ack(client, event, {"decision": "rejected", "reason": str(exc)})
        return {"decision": "rejected", "reason": str(exc)}
    try:
        outcome = apply_event(client, event, capability, _vector_for,
                              vector_space(_embedder().id))
    except EmbeddingError as exc:
        return _retry_or_dead_letter(self, client, payload, event, exc)
    bound.info("event_applied", decision=outcome.decision, index_version=outcome.version)
    _ack(client, event, outcome.to_dict())
    return outcome.to_dict()


def _retry_or_dead_letter(task: Any, client: redis.Redis, payload: str, event: RegistryEvent,
                          exc: EmbeddingError) -> dict[str, Any]:
    """A failed embedding (a rate limit that outlasted the provider's own retries, a broken
    answer) is retried with backoff up to ``indexing_max_attempts`` deliveries; then the event
    goes to the dead-letter stream with the reason. Nothing stored is touched either way."""
    attempt = task.request.retries + 1
    bound = log.bind(event_id=event.event_id, tenant=event.tenant,
                     capability_id=event.capability_id, task_id=task.request.id,
                     attempt=attempt)
    if attempt < settings.indexing_max_attempts:
        bound.warning("event_retry", reason=str(exc))
        raise task.retry(exc=exc, countdown=retry_delay_s(attempt, settings.indexing_retry_base_s),
                         max_retries=settings.indexing_max_attempts - 1)
    reason = f"embedding failed after {attempt} attempts: {exc}"
    bound.error("event_dead_lettered", reason=reason)
    dead_letter(client, payload, reason, attempt)
    outcome = {"decision": "dead_lettered", "reason": reason}
    _ack(client, event, outcome)
    return outcome


def _capability(event: RegistryEvent) -> Capability | None:
    if event.type != "upsert" or event.capability is None:
        return None
    capability = capability_from_record(event.capability, f"event {event.event_id}")
    if capability.id != event.capability_id:
        raise ManifestError(f"event {event.event_id}", "capability_id",
                            f"{event.capability_id!r} does not match the capability's id "
                            f"{capability.id!r}")
    return capability


def _vector_for(capability: Capability) -> bytes:
    """The capability's stored vector (:func:`capdisc.text.combine` of its two texts), each
    text's embedding taken from the shared cache and embedded, in one batch, only on a miss."""
    client, embedder = _redis(), _embedder()
    texts = embedding_texts(capability)
    digests = [text_hash(text) for text in texts]
    cached = client.hmget(keys.embedding_cache(embedder.id), digests)
    missing = [i for i, raw in enumerate(cached) if not isinstance(raw, bytes)]
    rows = {i: np.frombuffer(raw, dtype=np.float32) for i, raw in enumerate(cached)
            if isinstance(raw, bytes)}
    if missing:
        fresh = check_vectors(embedder.embed([texts[i] for i in missing]), len(missing),
                              embedder.dim, embedder.id)
        with client.pipeline(transaction=False) as pipe:
            for i, vector in zip(missing, fresh, strict=True):
                rows[i] = vector
                pipe.hset(keys.embedding_cache(embedder.id), digests[i], vector_bytes(vector))
            pipe.hincrby(keys.COUNTERS, "embedding_calls", len(missing))
            pipe.execute()
    return vector_bytes(combine(rows[0], rows[1]))


def _ack(client: redis.Redis, event: RegistryEvent, outcome: dict[str, Any]) -> None:
    if event.batch_id:
        record_ack(client, event.batch_id, {"event_id": event.event_id,
                                            "capability_id": event.capability_id, **outcome})


# -- heartbeat -----------------------------------------------------------------------------------

_stop = threading.Event()


@signals.worker_ready.connect
def _start_heartbeat(**_: Any) -> None:
    _embedder()  # load the model before the first event, not during it
    threading.Thread(target=_beat, name="capdisc-heartbeat", daemon=True).start()


@signals.worker_shutting_down.connect
def _stop_heartbeat(**_: Any) -> None:
    _stop.set()
    with contextlib.suppress(redis.RedisError):
        status.forget_worker(_redis(), WORKER_ID)


def _beat() -> None:
    client = redis.Redis.from_url(settings.redis_url)
    info = {"kind": "indexing", "pid": os.getpid(), "host": socket.gethostname(),
            "embedder": _embedder().id}
    while not _stop.is_set():
        try:
            status.heartbeat(client, WORKER_ID, info)
        except redis.RedisError as exc:
            log.warning("heartbeat_failed", error=str(exc))
        _stop.wait(settings.heartbeat_interval_s)


__all__ = ["Outcome", "apply_event_task"]
