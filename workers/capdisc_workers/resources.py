"""What an indexing worker works with: one :class:`Resources`, built once at start-up from the
worker's settings (:func:`capdisc_workers.celery_app.from_environment` reads them) and shared by
its tasks and threads.

It holds the settings, the gate that admits events, the Redis client, the embedder and the
optional external vector store (those three made on first use, through the factories of
:mod:`capdisc.resources`), and what the process's tasks and threads share about it: its id,
whether it reaches Redis (one :class:`~capdisc_workers.outage.RedisHealth`) and whether it is
shutting down.
"""

from __future__ import annotations

import os
import socket
import threading
from functools import cached_property

import structlog
from redis import Redis

from capdisc.embedders.port import Embedder
from capdisc.identity.gate import Gate
from capdisc.redisclock import RedisClock
from capdisc.registry.deadletters import dead_letter
from capdisc.resources import embedder_for, store_for
from capdisc.settings import Settings
from capdisc.vectorstores.port import VectorStore
from capdisc_workers.outage import RedisHealth

log = structlog.get_logger("capdisc.indexing")


class Resources:
    """The settings and adapters of one indexing worker process."""

    def __init__(self, settings: Settings, gate: Gate) -> None:
        self.settings = settings
        #: Who may write: with auth on, an event is applied only if its token grants ``write``
        #: on its tenant.
        self.gate = gate
        #: How the worker names itself in heartbeats, reconcile reports and locks.
        self.worker_id = f"indexing@{socket.gethostname()}:{os.getpid()}"
        #: Whether this worker's loops (tasks, heartbeat, sweep, reconcile schedule) reach Redis:
        #: an outage is logged once (``redis_unavailable``) and its end once
        #: (``redis_reconnected``).
        self.health = RedisHealth(log)
        #: Set when the worker shuts down: its threads and outage retries stop waiting.
        self.stopping = threading.Event()
        #: The port metrics are served on (None: not served); set when the worker is ready.
        self.metrics_port: int | None = None

    def dead_letter(
        self, client: Redis, payload: str | bytes, reason: str, attempts: int = 1, **context: str
    ) -> None:
        """Keep an event that could not be applied, within this worker's bounds on a dead
        letter's payload and on all of them (:func:`capdisc.registry.deadletters.dead_letter`;
        ``client`` may be a pipeline)."""
        dead_letter(
            client,
            payload,
            reason,
            attempts,
            self.settings.deadletter_payload_max_bytes,
            self.settings.deadletters_max_bytes,
            **context,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Resources:
        """The resources ``settings`` ask for. The gate reads its keyring here, so a missing or
        broken one stops the worker at start, and checks a token's times on Redis's clock (as
        the discovery workers do); everything else is made when first used."""
        clock = RedisClock()

        def redis_now_s() -> float:
            return clock.now_ms(resources.redis) / 1000

        resources = cls(settings, Gate.from_settings(settings, log, clock=redis_now_s))
        return resources

    @cached_property
    def redis(self) -> Redis:
        """The client the tasks use."""
        return self.connect()

    @cached_property
    def embedder(self) -> Embedder:
        return embedder_for(self.settings)

    @cached_property
    def store(self) -> VectorStore | None:
        """The external vector store the registry is mirrored to (None: Redis only)."""
        return store_for(self.settings)

    def connect(self) -> Redis:
        """A client of its own, for one of the worker's threads."""
        return Redis.from_url(self.settings.redis_url)
