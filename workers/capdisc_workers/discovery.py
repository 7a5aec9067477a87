"""The discovery worker: answers per-turn requests from the requests stream (not Celery: a
Redis stream hand-off costs a fraction of a Celery round trip) over each tenant's index, held in
memory and kept current by its follower (:mod:`capdisc_workers.follower`).

Threads: the main thread serves requests; the follower applies change records as deltas
(reloading a full snapshot when it sees a gap) and swaps in new immutable snapshots; a heartbeat
thread reports the versions served. Run: ``python -m capdisc_workers.discovery``; started in a
project whose ``capdisc up`` runs, it joins that stack as the indexing workers do
(:func:`capdisc.stackfile.joining_stack`).

No request ends a worker: every entry is checked at the edge (:func:`capdisc.discovery.protocol.
decode_entry`) and settled one way or another (:mod:`capdisc_workers.intake`); an unexpected
error answering one becomes an ``internal`` error reply. Redis going away ends nothing either:
each loop retries with backoff (:mod:`capdisc_workers.outage`), the consumer group is created
again if Redis lost it, and when Redis lost its data (the :data:`capdisc.keys.EPOCH` marker
changed or vanished) the worker keeps serving its snapshots until the registry is published
again, then reloads each tenant whole.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import redis
import structlog

from capdisc import keys, status
from capdisc.access import Caller, visible
from capdisc.discovery import service
from capdisc.discovery.protocol import (
    DiscoverRequest,
    Entry,
    SessionRequest,
    decode_entry,
    peek_request_id,
)
from capdisc.discovery.replies import DiscoverReply, ErrorReply, Reply, SessionReply
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.errors import (
    AuthError,
    BadRequestError,
    CapdiscError,
    ForbiddenError,
    UnknownTenantError,
)
from capdisc.identity import auth
from capdisc.identity.gate import Gate
from capdisc.logs import Throttle, configure_logging, settings_warnings_as_json
from capdisc.redisclock import RedisClock
from capdisc.redistext import as_str
from capdisc.resources import embedder_for, store_for
from capdisc.sessions import store as session_store
from capdisc.sessions.policy import holder_of
from capdisc.sessions.service import SessionService
from capdisc.settings import Settings
from capdisc.stackfile import joining_stack
from capdisc_workers import metrics
from capdisc_workers.follower import SnapshotFollower
from capdisc_workers.intake import (
    Outcome,
    RawEntry,
    RequestStream,
    answer_safely,
    quarantined,
    rejected,
)
from capdisc_workers.outage import RETRYABLE, Backoff, RedisHealth

#: How long before a request's deadline a worker waiting for its ``min_version`` stops waiting
#: and answers at the version it serves (time for the answer itself to reach the client).
ANSWER_MARGIN_MS = 250.0

log = structlog.get_logger("capdisc.discovery")


#: How long one read of the requests stream waits for entries (ms).
BLOCK_MS = 1000
#: How often a worker looks for requests a dead worker left pending.
CLAIM_EVERY_S = 0.5


class DiscoveryWorker:
    """One discovery worker process: serves requests over the snapshots of its follower."""

    def __init__(self, settings: Settings, connection: redis.Redis) -> None:
        self.settings = settings
        self.redis = connection
        embedder = embedder_for(settings)
        #: Requests' deadlines and sessions' times are on Redis's clock, shared by every worker
        #: whatever this host's clock says.
        self.clock = RedisClock()
        self.sessions = SessionService(
            connection, settings.sessions, clock=lambda: int(self.clock.now_ms(connection))
        )
        #: Who asks: with auth on, who the request's token proves (:mod:`capdisc.identity.gate`),
        #: its times checked on Redis's clock too.
        self.gate = Gate.from_settings(
            settings, log, clock=lambda: self.clock.now_ms(connection) / 1000
        )
        self.worker_id = f"discovery@{socket.gethostname()}:{os.getpid()}"
        #: The port metrics are served on (None: not served); set when the worker runs.
        self.metrics_port: int | None = None
        #: Each tenant's snapshot, kept current from the changes stream (searching an external
        #: vector store per turn with ``vector_store: weaviate``), and the query embedders.
        self.follower = SnapshotFollower(
            settings, connection, embedder, store_for(settings), worker_id=self.worker_id
        )
        self.stop = threading.Event()
        #: Whether each loop reaches Redis (one log line when it goes, one when it is back).
        self.health = RedisHealth(log)
        self.requests = RequestStream(
            connection,
            self.worker_id,
            settings.claim_idle_ms,
            settings.reply_ttl_s,
            settings.deadletter_payload_max_bytes,
            settings.deadletters_max_bytes,
        )
        #: Outcomes read and answered whose settling an outage interrupted: settled first.
        self._unsettled: list[Outcome] = []
        #: Bounds on the warnings that bad or refused requests cause, by event.
        self._throttles: dict[str, Throttle] = {}
        self._last_claim = 0.0

    # -- serving -----------------------------------------------------------------------------

    def serve(self) -> None:
        """Answer requests until stopped; Redis going away only pauses it (retried with
        backoff, said once in the log)."""
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                self._serve_once()
                self.health.ok("requests")
                backoff.reset()
            except RETRYABLE as exc:
                self.health.failed("requests", exc)
                self.stop.wait(backoff.next())
            except Exception:  # a bug here must not end the worker either
                log.exception("serve_failed")
                self.stop.wait(backoff.next())

    def _serve_once(self) -> None:
        if self._unsettled:
            self._settle(self._unsettled)
        self._handle_batch(self.requests.read(BLOCK_MS))
        if time.monotonic() - self._last_claim >= CLAIM_EVERY_S:
            self._last_claim = time.monotonic()
            self._reclaim()

    def _reclaim(self) -> None:
        """Answer the requests a dead (or stuck) worker read and never acknowledged: pending
        longer than ``claim_idle_ms``, they are claimed and served here; one already delivered
        :data:`~capdisc_workers.intake.MAX_DELIVERIES` times is quarantined instead. A request
        served twice changes a session once (its request id is remembered)."""
        to_quarantine, to_serve = self.requests.reclaim()
        if to_quarantine:
            log.warning("requests_quarantined", entries=[as_str(e[0]) for e, _n in to_quarantine])
            self._settle(
                [
                    quarantined(as_str(entry_id), fields, times)
                    for (entry_id, fields), times in to_quarantine
                ]
            )
        if to_serve:
            log.info("requests_reclaimed", count=len(to_serve))
            self._handle_batch(to_serve)

    def _handle_batch(self, entries: list[RawEntry]) -> None:
        """Answer a batch of requests and settle them (replies, dead letters, acks, deletes)
        in one transaction. Redis going away midway leaves the unanswered ones pending (they
        are reclaimed) and the answered ones to settle once it is back."""
        outcomes: list[Outcome] = []
        try:
            for entry_id, fields in entries:
                outcomes.append(self._outcome(as_str(entry_id), fields))
        finally:
            self._settle(outcomes)

    def _settle(self, outcomes: list[Outcome]) -> None:
        """Settle ``outcomes``; when Redis fails it, they are kept and settled first next time
        (replies are never dropped; a reply pushed twice is harmless, read once)."""
        try:
            self.requests.settle(outcomes)
        except redis.RedisError:
            self._unsettled = outcomes
            raise
        self._unsettled = []

    def _outcome(self, entry_id: str, fields: Any) -> Outcome:
        """How one entry read from the stream ends."""
        try:
            entry = decode_entry(fields)
        except BadRequestError as exc:
            self._warn_bounded(
                "request_rejected", entry_id=entry_id, request_id=exc.request_id, reason=str(exc)
            )
            metrics.REQUESTS.labels("unknown", BadRequestError.code).inc()
            return rejected(entry_id, fields, exc.request_id, str(exc))
        except Exception as exc:  # a bug in the checks must not take the worker down
            log.exception("request_decode_failed", entry_id=entry_id)
            return rejected(
                entry_id,
                fields,
                peek_request_id(fields),
                f"the discovery worker failed reading it ({type(exc).__name__}); "
                "the error is logged there",
            )
        if entry.expired(self.clock.now_ms(self.redis)):
            return Outcome(entry_id)  # nobody waits for it any more
        request_id = entry.request.request_id
        return Outcome(
            entry_id,
            request_id,
            answer_safely(request_id, lambda: self._handle(entry), self.worker_id),
        )

    def _handle(self, entry: Entry) -> Reply:
        """The reply to one checked request, with who served it and how long it took."""
        started = time.perf_counter()
        reply = self._reply(entry)
        took_s = time.perf_counter() - started
        op = "session" if isinstance(entry.request, SessionRequest) else "discover"
        metrics.REQUESTS.labels(op, reply.code if isinstance(reply, ErrorReply) else "ok").inc()
        metrics.REQUEST_SECONDS.labels(op).observe(took_s)
        if isinstance(reply, DiscoverReply) and reply.model_ms > 0:
            metrics.MODEL_SECONDS.observe(reply.model_ms / 1000)
        return reply.with_timing(self.worker_id, round(took_s * 1000, 3))

    def _reply(self, entry: Entry) -> Reply:
        """The reply to one checked request, served as who its token proves (with auth on);
        an error a request causes (a bad option, an unknown tenant or session, a failed
        embedding) is its error reply."""
        try:
            request = self.gate.admit(entry.request)
        except AuthError as exc:
            return self._refused(entry.request, exc)
        try:
            if isinstance(request, SessionRequest):
                return self.session_op(request)
            return self.answer(request, entry.deadline_ms)
        except CapdiscError as exc:
            log.warning(
                "request_failed",
                request_id=request.request_id,
                tenant=request.tenant,
                error=exc.code,
                reason=str(exc),
            )
            return ErrorReply.of(request.request_id, exc)

    def _refused(self, request: DiscoverRequest | SessionRequest, exc: AuthError) -> ErrorReply:
        """The reply to a request whose token proves nothing or does not allow it: the error,
        no data. The log names the token's key id and subject, never the token."""
        self._warn_bounded(
            "request_refused",
            request_id=request.request_id,
            tenant=request.tenant,
            error=exc.code,
            reason=exc.reason,
            **auth.label(request.token),
        )
        return ErrorReply.of(request.request_id, exc)

    def _warn_bounded(self, event: str, **fields: Any) -> None:
        """A warning any sender can cause, written at most :class:`Throttle`'s share a
        minute (each line says how many were left out before it)."""
        left_out = self._throttles.setdefault(event, Throttle()).admit()
        if left_out is not None:
            log.warning(event, left_out=left_out, **fields)

    def session_op(self, request: SessionRequest) -> SessionReply:
        """Record a call, or show, export or import a session's working set (of a tenant that
        has a registry: a session of another would record calls nobody can serve)."""
        if self.follower.indexes.get(request.tenant) is None and not self.redis.sismember(
            keys.TENANTS, request.tenant
        ):
            raise _unknown_tenant(request.tenant)
        self.sessions.policy.named_profile(request.profile)
        caller = Caller.of(request.roles, request.user)
        if request.op == "watch":
            self._may_watch(request.tenant, caller)
        can_see = self._can_see(request.tenant, caller)
        holder = holder_of(request.roles, request.user)
        return SessionReply(request.request_id, self.sessions.handle(request, can_see, holder))

    def _may_watch(self, tenant: str, caller: Caller) -> None:
        """A watcher reads a session's events from Redis, unfiltered, and they name each tool
        bound: only a caller who may see every capability of the tenant may watch."""
        snapshot = self.follower.indexes.get(tenant)
        if snapshot is None and self.redis.hlen(keys.caps(tenant)):
            raise ForbiddenError(
                f"this discovery worker has not loaded tenant {tenant!r} yet, so it cannot tell "
                "whether every capability is visible to you; watch again in a moment",
                "roles",
            )
        hidden = sum(
            not visible(cap.visibility, caller)
            for cap in (snapshot.capabilities.values() if snapshot is not None else ())
        )
        if hidden:
            raise ForbiddenError(
                f"watching a session of tenant {tenant!r} shows every tool it binds, and {hidden} "
                "of its capabilities are not visible to the roles and user asking; watch with a "
                "token whose roles see them all, or read the working set (it shows what you may "
                "see)",
                "roles",
            )

    def answer(self, request: DiscoverRequest, deadline_ms: int | None = None) -> DiscoverReply:
        """The reply to an admitted discover request (:func:`capdisc.discovery.service.answer`
        over this worker's snapshot of the tenant, its query embedder and sessions)."""
        snapshot = self._snapshot_for(request, deadline_ms)
        if snapshot is None:
            raise _unknown_tenant(request.tenant)
        context = service.Context(
            snapshot,
            self.follower.queries_for(snapshot.embedder_id or self.follower.embedder.id),
            self.settings.discovery,
            self.settings.sessions,
            self.sessions,
        )
        reply = service.answer(request, context)
        log.debug(
            "request_served",
            request_id=request.request_id,
            tenant=request.tenant,
            index_version=reply.index_version,
            matches=len(reply.capabilities),
        )
        return reply

    def _can_see(self, tenant: str, caller: Caller) -> Callable[[str], bool]:
        """Whether ``caller`` may see a capability id of ``tenant`` (unknown ids: no)."""
        snapshot = self.follower.indexes.get(tenant)
        caps = snapshot.capabilities if snapshot is not None else {}

        def can_see(cap_id: str) -> bool:
            cap = caps.get(cap_id)
            return cap is not None and visible(cap.visibility, caller)

        return can_see

    def _snapshot_for(
        self, request: DiscoverRequest, deadline_ms: int | None
    ) -> IndexSnapshot | None:
        """The tenant's snapshot, waiting (until the request's deadline) for ``min_version``."""
        snapshot = self.follower.indexes.get(request.tenant)
        if snapshot is not None and snapshot.version >= request.min_version:
            return snapshot
        if snapshot is None and not self.redis.sismember(keys.TENANTS, request.tenant):
            return None
        budget_s = self.settings.discover_timeout_s
        if deadline_ms:
            # stop waiting early enough that the answer, at the version served, reaches the
            # client before it gives up (else it hears nothing and reports the worker blocked)
            left_ms = deadline_ms - self.clock.now_ms(self.redis) - ANSWER_MARGIN_MS
            budget_s = min(budget_s, max(0.0, left_ms / 1000))
        return self.follower.indexes.wait_for(request.tenant, request.min_version, budget_s)

    # -- lifecycle ---------------------------------------------------------------------------

    def heartbeat_loop(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url)
        while not self.stop.is_set():
            info = {
                "kind": "discovery",
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "embedder": self.follower.embedder.id,
                "versions": self.follower.indexes.versions(),
                "searches": self.follower.indexes.search_modes(),
                "loaded_from": dict(self.follower.loaded_from),
                "metrics_port": self.metrics_port,
                **self._snapshots_written(),
            }
            try:
                status.heartbeat(client, self.worker_id, info)
                self.health.ok("heartbeat")
            except RETRYABLE as exc:
                self.health.failed("heartbeat", exc)
            except redis.RedisError as exc:
                log.warning("heartbeat_failed", error=str(exc))
            self.stop.wait(self.settings.heartbeat_interval_s)
        with contextlib.suppress(redis.RedisError):
            status.forget_worker(client, self.worker_id)

    def _snapshots_written(self) -> dict[str, dict[str, dict[str, float | str]]]:
        """The heartbeat's ``snapshots``: each tenant's last snapshot this worker wrote to
        ``snapshot_dir`` (empty before the first), and ``snapshots_failed``: each tenant whose
        last write failed, and why; nothing without a snapshot writer."""
        writer = self.follower.writer
        if writer is None:
            return {}
        return {
            "snapshots": {t: dict(w.as_dict()) for t, w in writer.last_written().items()},
            "snapshots_failed": {t: f.as_dict() for t, f in writer.last_failed().items()},
        }

    def run(self) -> None:
        if not self.gate.enabled:
            log.warning(
                "auth_off",
                hint="requests are served as the tenant, roles and user "
                "they claim: anyone who can reach Redis can ask as anyone; set "
                "CAPDISC_AUTH=on and CAPDISC_AUTH_KEYS_FILE outside development",
            )
        self.metrics_port = metrics.serve_metrics(
            self.settings.metrics_port,
            self.settings.metrics_host,
            metrics.RegistryGauges(
                lambda: redis.Redis.from_url(self.settings.redis_url),
                self.follower.indexes.versions,
            ),
        )
        self._load_when_reachable()
        threads = [
            threading.Thread(
                target=self.follower.follow_changes,
                args=(self.stop, self.health),
                name="changes",
                daemon=True,
            ),
            threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True),
        ]
        for thread in threads:
            thread.start()
        log.info(
            "discovery_worker_ready",
            worker=self.worker_id,
            versions=self.follower.indexes.versions(),
        )
        try:
            self.serve()
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=3)

    def _load_when_reachable(self) -> None:
        """Sessions kept where an earlier version kept them moved to their own keys
        (:func:`~capdisc.sessions.store.move_legacy_sessions`), then the follower's
        :meth:`~capdisc_workers.follower.SnapshotFollower.load_all`, waiting (with backoff) for
        a Redis that is not up yet."""
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                moved = session_store.move_legacy_sessions(self.redis)
                if moved:
                    log.info("sessions_moved", keys=moved, to=keys.SESSIONS_PREFIX)
                self.follower.load_all()
                self.health.ok("start")
                return
            except RETRYABLE as exc:
                self.health.failed("start", exc)
                self.stop.wait(backoff.next())


def _unknown_tenant(tenant: str) -> UnknownTenantError:
    return UnknownTenantError(
        f"tenant {tenant!r} has no registry; publish to it first (capdisc publish PATH --tenant "
        "NAME)"
    )


def main() -> None:
    try:
        with settings_warnings_as_json():
            settings = joining_stack(Settings.load(), os.environ, Path.cwd())
    except CapdiscError as exc:
        configure_logging()
        _not_started(exc)
    configure_logging(settings.log_level, settings.log_format)
    try:
        worker = DiscoveryWorker(settings, redis.Redis.from_url(settings.redis_url))
    except CapdiscError as exc:  # a missing keyring or API key, an unusable snapshot_dir, ...
        _not_started(exc)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop.set()
    except redis.exceptions.NoPermissionError as exc:  # no retry makes the ACL allow it
        worker.stop.set()
        log.error(
            "redis_permission_refused",
            error=str(exc),
            hint="the Redis user of CAPDISC_REDIS_URL may not do what a discovery worker "
            "does; run it as the capdisc-discovery user of infra/redis-users.acl",
        )
        sys.exit(2)


def _not_started(exc: CapdiscError) -> NoReturn:
    """One line saying what stops the worker from starting (not a traceback), and exit 2."""
    log.error("worker_not_started", reason=str(exc))
    sys.exit(2)


if __name__ == "__main__":
    main()
