"""Send registry events to the indexing workers, by task name, over the Celery broker.

Producers never import worker code: they know the queue and task names from
:mod:`capdisc.keys` and send the event's encoded JSON as the task's one argument. Every task is
recorded in the outbox (:mod:`capdisc.registry.outbox`) first, so one the broker loses is sent
again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
import structlog
from celery import Celery

from capdisc import keys
from capdisc.errors import IndexingBacklogError
from capdisc.rawsettings import celery_broker_url
from capdisc.registry import outbox
from capdisc.registry.events import DEFAULT_MAX_BYTES, RegistryEvent
from capdisc.tenants import check_tenant

#: Longest single blocking read (under redis-py's 5 s socket timeout).
BLOCK_SLICE_S = 1.0
#: How long the broker connection waits for Redis to connect or answer, as redis-py's own
#: connections do (kombu's wait for ever): a Redis that hangs fails a send, and the command
#: waits it out or says so, instead of hanging with it.
BROKER_SOCKET_TIMEOUT_S = 5.0
#: Events per indexing task by default: a worker embeds each chunk of a task while it writes
#: the chunks before it (a task's start and end leave the model idle, so not much fewer).
BATCH = 1024
#: A producer's own sent tasks not yet applied past which it waits to send its next: the
#: ``publish_max_pending_tasks`` setting's default.
MAX_PENDING_TASKS = 32

log = structlog.get_logger("capdisc.publisher")


class Publisher:
    """Sends :class:`RegistryEvent` objects to the ``indexing`` queue."""

    def __init__(
        self,
        broker_url: str,
        token: str | Callable[[], str] | None = None,
        max_event_bytes: int = DEFAULT_MAX_BYTES,
        max_pending_tasks: int = MAX_PENDING_TASKS,
        backlog_wait_s: float | None = None,
    ) -> None:
        #: The identity token stamped on every event sent (or what makes one per send):
        #: with auth on, indexing workers apply only events whose token grants ``write``.
        self.token = token
        #: The largest event the indexing workers decode (``event_max_bytes``).
        self.max_event_bytes = max_event_bytes
        #: Send a task only while fewer of this publisher's sent tasks wait for the workers
        #: (``publish_max_pending_tasks``; 0: any), waiting at most ``backlog_wait_s`` for room
        #: (None: as long as it takes, said once a minute) before :class:`IndexingBacklogError`.
        #: Its own only: a full reindex's batches, or another producer's, never hold it up.
        self.max_pending_tasks = max_pending_tasks
        self.backlog_wait_s = backlog_wait_s
        self._sent: list[str] = []
        self.app = Celery("capdisc-producer", broker=celery_broker_url(broker_url))
        self.app.conf.update(
            task_serializer="json",
            accept_content=["json"],
            broker_connection_retry_on_startup=True,
            broker_transport_options={
                "socket_timeout": BROKER_SOCKET_TIMEOUT_S,
                "socket_connect_timeout": BROKER_SOCKET_TIMEOUT_S,
            },
        )
        self.redis = redis.Redis.from_url(broker_url)

    def send(self, events: Iterable[RegistryEvent], batch_size: int = BATCH) -> int:
        """Send ``events`` as tasks of up to ``batch_size`` events each (a worker embeds a
        task's capabilities in one model call); returns how many events were sent. An event
        for a tenant whose name is not one is refused (:class:`TenantNameError`) before any is
        sent."""
        events = list(events)
        for tenant in {event.tenant for event in events}:
            check_tenant(tenant, "event tenant")
        token = self.token() if callable(self.token) else self.token
        for start in range(0, len(events), batch_size):  # each task encoded as it goes
            payloads = [
                (event.copy(token=token) if token else event).encode()
                for event in events[start : start + batch_size]
            ]
            self._wait_for_room()
            self._note(outbox.send(self.redis, self.app, keys.TASK_APPLY_EVENTS, [payloads]))
        return len(events)

    def _note(self, task_id: str) -> None:
        if self.max_pending_tasks:
            self._sent.append(task_id)

    def _waiting(self) -> int:
        """How many of the tasks this publisher sent the outbox still holds (not yet applied)."""
        if self._sent:
            with self.redis.pipeline(transaction=False) as pipe:
                for task_id in self._sent:
                    pipe.hexists(keys.OUTBOX, task_id)
                held = pipe.execute()
            self._sent = [task_id for task_id, there in zip(self._sent, held, strict=True) if there]
        return len(self._sent)

    def _wait_for_room(self) -> None:
        """Return once fewer than ``max_pending_tasks`` of the tasks this publisher sent wait
        for the workers (the outbox holds each until it is applied); :class:`IndexingBacklogError`
        after ``backlog_wait_s``."""
        if not self.max_pending_tasks or len(self._sent) < self.max_pending_tasks:
            return
        started = said = time.monotonic()
        delay = 0.01
        while (pending := self._waiting()) >= self.max_pending_tasks:
            waited = time.monotonic() - started
            if self.backlog_wait_s is not None and waited >= self.backlog_wait_s:
                raise IndexingBacklogError(
                    f"{pending} indexing tasks this command sent still wait for the indexing "
                    f"workers after {waited:.0f} s (it sends more once fewer than "
                    f"{self.max_pending_tasks} wait: publish_max_pending_tasks); check that an "
                    "indexing worker runs (capdisc status), then run this again: it sends only "
                    "what is missing"
                )
            if time.monotonic() - said >= 60:
                said = time.monotonic()
                log.info("indexing_backlog", pending_tasks=pending, waited_s=round(waited))
            time.sleep(delay)  # the workers apply tasks in another process: nothing to await
            delay = min(0.25, delay * 1.5)

    def oversized(self, events: Iterable[RegistryEvent]) -> dict[str, int]:
        """Capability id -> size in bytes, as sent, of each event the indexing workers would
        refuse undecoded for its size (dead-lettered with no tenant, so a wait would never
        hear of it)."""
        token = self.token() if callable(self.token) else self.token
        sizes = {
            event.capability_id: len(
                (event.copy(token=token) if token else event).encode().encode()
            )
            for event in events
        }
        return {cap_id: size for cap_id, size in sizes.items() if size > self.max_event_bytes}

    def send_raw(self, payload: str) -> None:
        """Send an already encoded event as it is (dead-letter replay, and tests of the
        workers' handling of malformed input)."""
        self._wait_for_room()
        self._note(outbox.send(self.redis, self.app, keys.TASK_APPLY_EVENT, [payload]))

    def start_reindex(self, tenant: str, job: str, fresh: bool) -> None:
        """Ask the indexing workers for a full blue/green reindex of ``tenant``."""
        check_tenant(tenant)
        outbox.send(self.redis, self.app, keys.TASK_START_REINDEX, [tenant, job, fresh])

    def reconcile(self, reply_to: str | None = None) -> None:
        """Ask an indexing worker to compare the registry with the index and repair drift."""
        self.app.send_task(
            keys.TASK_RECONCILE,
            kwargs={"reply_to": reply_to},
            queue=keys.INDEXING_QUEUE,
            ignore_result=True,
        )

    def close(self) -> None:
        self.app.close()
        self.redis.close()


def wait_for_acks(
    client: redis.Redis, batch_id: str, count: int, timeout_s: float, seen: set[str] | None = None
) -> list[dict[str, Any]]:
    """Block until ``count`` more events of ``batch_id`` are applied (or the timeout passes).
    An event delivered twice (its task redelivered after a worker died) is acknowledged twice:
    only its first outcome counts, the one written with the change itself. ``seen`` carries
    the event ids already counted across calls. Each wake-up also takes the acks already
    waiting behind the first (up to ``count``), in one round trip."""
    seen = seen if seen is not None else set()
    outcomes: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    key = keys.acks(batch_id)
    while len(outcomes) < count and (remaining := deadline - time.monotonic()) > 0:
        popped = client.blpop([key], timeout=min(BLOCK_SLICE_S, remaining))
        if not popped:
            continue
        for raw in [popped[1], *_take(client, key, count - len(outcomes) - 1)]:
            outcome = json.loads(raw)
            event_id = str(outcome.get("event_id", ""))
            if event_id and event_id in seen:
                continue
            seen.add(event_id)
            outcomes.append(outcome)
    return outcomes


def _take(client: redis.Redis, key: str, most: int) -> list[bytes]:
    """Up to ``most`` entries from the head of the list ``key``, removed (atomically)."""
    if most <= 0:
        return []
    with client.pipeline(transaction=True) as pipe:
        pipe.lrange(key, 0, most - 1)
        pipe.ltrim(key, most, -1)
        taken, _trimmed = pipe.execute()
    return list(taken)
