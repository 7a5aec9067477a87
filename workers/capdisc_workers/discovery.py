"""The discovery worker: holds each tenant's index in memory, follows the changes stream, and
answers per-turn requests from the requests stream (not Celery: a Redis stream hand-off costs a
fraction of a Celery round trip).

Threads: the main thread serves requests; a follower applies change records as deltas (reloading
a full snapshot when it sees a gap) and swaps in new immutable snapshots; a heartbeat thread
reports the versions served. Run: ``python -m capdisc_workers.discovery``.

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
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

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
from capdisc.discovery.snapshot import IndexSnapshot, hybrid_retriever, store_retriever
from capdisc.embedders.port import CachedQueryEmbedder, Matrix
from capdisc.errors import AuthError, BadRequestError, CapdiscError, UnknownTenantError
from capdisc.identity import auth
from capdisc.identity.gate import Gate
from capdisc.logs import configure_logging
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry.events import TENANT_RE
from capdisc.registry.flags import Mark, Policy, mark, parse_policy, serving, treatment
from capdisc.registry.policy import coalesce_window_s
from capdisc.registry.store import Delta, read_delta, read_snapshot
from capdisc.resources import embedder_for, embedder_for_id, store_for
from capdisc.retrieval.probes import PROBES
from capdisc.retrieval.text import embedder_id_of, vector_space
from capdisc.sessions.service import SessionService
from capdisc.settings import Settings
from capdisc_workers.intake import (
    Outcome,
    RawEntry,
    RequestStream,
    answer_safely,
    quarantined,
    rejected,
)
from capdisc_workers.outage import RETRYABLE, Backoff, RedisHealth

log = structlog.get_logger("capdisc.discovery")
BLOCK_MS = 1000
#: How often a worker looks for requests a dead worker left pending.
CLAIM_EVERY_S = 0.5
#: Approximate length the served stream is trimmed to.
SERVED_MAXLEN = 10_000


class Indexes:
    """The snapshots a worker serves, one per tenant, swapped whole under a condition."""

    def __init__(self) -> None:
        self._snapshots: dict[str, IndexSnapshot] = {}
        self.changed = threading.Condition()

    def get(self, tenant: str) -> IndexSnapshot | None:
        return self._snapshots.get(tenant)

    def put(self, snapshot: IndexSnapshot) -> None:
        with self.changed:
            self._snapshots[snapshot.tenant] = snapshot
            self.changed.notify_all()

    def versions(self) -> dict[str, int]:
        return {t: s.version for t, s in self._snapshots.items()}

    def wait_for(self, tenant: str, version: int, timeout_s: float) -> IndexSnapshot | None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                snap = self._snapshots.get(tenant)
                remaining = deadline - time.monotonic()
                if (snap is not None and snap.version >= version) or remaining <= 0:
                    return snap
                self.changed.wait(remaining)


class RedisQueryVectors:
    """The query-vector cache shared by discovery workers, in Redis (keys expire)."""

    def __init__(self, connection: redis.Redis, ttl_s: int) -> None:
        self._redis = connection
        self._ttl_s = ttl_s

    def get(self, key: str) -> bytes | None:
        try:
            value = self._redis.get(keys.query_vectors(key))
        except redis.RedisError as exc:  # the cache is an optimisation: embed instead
            log.warning("query_cache_unavailable", error=str(exc))
            return None
        return value if isinstance(value, bytes) else None

    def put(self, key: str, value: bytes) -> None:
        try:
            self._redis.set(keys.query_vectors(key), value, ex=self._ttl_s)
        except redis.RedisError as exc:
            log.warning("query_cache_unavailable", error=str(exc))


class DiscoveryWorker:
    """One discovery worker process."""

    def __init__(self, settings: Settings, connection: redis.Redis) -> None:
        self.settings = settings
        self.redis = connection
        self.embedder = embedder_for(settings)
        self.space = vector_space(self.embedder.id)
        #: Query embedders (and probe vectors) by embedder id: a full reindex onto another
        #: model swaps a tenant to vectors this worker's configured embedder did not make.
        self._queries: dict[str, CachedQueryEmbedder] = {}
        self._probes: dict[str, Matrix] = {}
        #: The vector space each tenant is served from (set at every full load).
        self.spaces: dict[str, str] = {}
        #: Tenants whose last load failed, with the stored version it failed at.
        self.failed: dict[str, int] = {}
        self._lock = threading.Lock()
        self.indexes = Indexes()
        self.sessions = SessionService(connection, settings.sessions)
        #: Who asks: with auth on, who the request's token proves (:mod:`capdisc.identity.gate`).
        self.gate = Gate.from_settings(settings)
        #: An external vector store searched per turn (``vector_store: weaviate``), or None.
        self.store = store_for(settings)
        self.worker_id = f"discovery@{socket.gethostname()}:{os.getpid()}"
        self.stop = threading.Event()
        self.changes_id = "0-0"
        #: Whether each loop reaches Redis (one log line when it goes, one when it is back).
        self.health = RedisHealth(log)
        self.requests = RequestStream(
            connection, self.worker_id, settings.claim_idle_ms, settings.reply_ttl_s
        )
        #: Outcomes read and answered whose settling an outage interrupted: settled first.
        self._unsettled: list[Outcome] = []
        self._last_claim = 0.0
        #: The Redis data generation (:data:`keys.EPOCH`) the snapshots were loaded from.
        self.epoch: str | None = None
        #: Tenants served from an earlier generation (Redis lost its data since): reloaded
        #: whole once published again, served from the old snapshot until then.
        self.stale: set[str] = set()
        #: How long the last snapshot rebuild took: the coalescing window of the next burst.
        self.last_build_s = 0.0
        #: When the last rebuild ended (monotonic): a burst is rebuilds back to back.
        self.last_build_end = 0.0

    # -- loading and hot reload ----------------------------------------------------------------

    def queries_for(self, embedder_id: str) -> CachedQueryEmbedder:
        """The cached query embedder of ``embedder_id`` (made on first use)."""
        with self._lock:
            return self._queries.get(embedder_id) or self._add_queries(embedder_id)

    def _add_queries(self, embedder_id: str) -> CachedQueryEmbedder:
        if embedder_id not in self._queries:
            inner = (
                self.embedder
                if embedder_id == self.embedder.id
                else embedder_for_id(embedder_id, self.settings)
            )
            shared = (
                RedisQueryVectors(self.redis, self.settings.query_cache_ttl_s)
                if self.settings.query_cache_ttl_s
                else None
            )
            self._queries[embedder_id] = CachedQueryEmbedder(
                inner, self.settings.query_cache_size, shared
            )
            self._probes[embedder_id] = inner.embed(list(PROBES))  # also loads the model
        return self._queries[embedder_id]

    def load_all(self) -> None:
        self.queries_for(self.embedder.id)
        self.epoch = current_epoch(self.redis)
        last = self.redis.xrevrange(keys.CHANGES, count=1)
        self.changes_id = as_str(last[0][0]) if last else "0-0"
        for tenant in sorted(as_str(t) for t in self.redis.smembers(keys.TENANTS)):
            self.reload(tenant)

    def reload(self, tenant: str) -> IndexSnapshot | None:
        """Load ``tenant`` whole; on failure keep serving what it served and say why (once per
        stored version: the catch-up does not retry a version that failed)."""
        try:
            return self._load(tenant)
        except (CapdiscError, ValueError, KeyError) as exc:
            failed_at = int(self.redis.get(keys.version(tenant)) or 0)
            self.failed[tenant] = failed_at
            log.error(
                "index_load_failed",
                tenant=tenant,
                index_version=failed_at,
                error=str(exc),
                hint="the tenant keeps its last good index; fix the "
                "cause, then publish or reindex to retry",
            )
            return None

    def _load(self, tenant: str) -> IndexSnapshot:
        snap = read_snapshot(self.redis, tenant, self.space)
        embedder_id = embedder_id_of(snap.space)
        queries = self.queries_for(embedder_id)
        served = serving(snap.flags, self.policy(tenant, snap.policy))
        entries = [
            (Capability.from_dict(r.capability), snap.vectors[cid])
            for cid, r in snap.records.items()
            if cid in snap.vectors and cid not in served.withheld
        ]
        started = time.monotonic()
        factory = (
            store_retriever(self.store, tenant) if self.store is not None else hybrid_retriever
        )
        index = IndexSnapshot.build(
            tenant,
            snap.version,
            queries.inner.dim,
            entries,
            embedder_id,
            factory,
            probes=self._probes[embedder_id],
            marks=served.marks,
        )
        self.last_build_s = time.monotonic() - started
        self.last_build_end = time.monotonic()
        self.spaces[tenant] = snap.space
        self._swap_in(index)
        self.stale.discard(tenant)
        log.info(
            "index_loaded",
            tenant=tenant,
            index_version=index.version,
            capabilities=len(index),
            vector_space=snap.space,
            withheld=len(served.withheld),
            marked=len(served.marks),
        )
        missing = sum(cid not in snap.vectors for cid in snap.records)
        if missing:
            log.warning(
                "capabilities_without_vectors",
                tenant=tenant,
                vector_space=snap.space,
                missing=missing,
                hint="they were indexed by another embedder or an earlier version; "
                f"run `capdisc reindex --all --tenant {tenant}` to embed them all "
                "beside the live index and swap",
            )
        return index

    def _swap_in(self, index: IndexSnapshot) -> None:
        """Serve ``index`` from now on, and say so on the served stream (what ``capdisc
        status`` and the change-to-served benchmark read: when each worker serves what)."""
        self.indexes.put(index)
        try:
            self.redis.xadd(
                keys.SERVED,
                {
                    "worker": self.worker_id,
                    "tenant": index.tenant,
                    "version": index.version,
                    "at_ms": f"{time.time() * 1000:.3f}",
                },
                maxlen=SERVED_MAXLEN,
                approximate=True,
            )
        except redis.RedisError as exc:
            log.warning("served_notice_failed", error=str(exc))

    def follow_changes(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url)
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                self._check_epoch(client)
                batch: Any = client.xread(
                    {keys.CHANGES: self.changes_id}, count=1000, block=BLOCK_MS
                )
                self._follow(client, _change_records(batch))
                self.health.ok("changes")
                backoff.reset()
            except RETRYABLE as exc:
                self.health.failed("changes", exc)
                self.stop.wait(backoff.next())
            except Exception:  # the follower must outlive any one bad change
                log.exception("changes_apply_failed")
                self.stop.wait(0.5)

    def _check_epoch(self, client: redis.Redis) -> None:
        """Notice that Redis lost its data (its epoch marker changed or vanished): from then
        on, follow the new changes stream from its start, and reload each tenant whole once it
        is published again and its changes are quiet, serving the old snapshot until then."""
        epoch = current_epoch(client)
        if epoch == self.epoch:
            return
        log.warning(
            "redis_data_lost",
            previous_epoch=self.epoch,
            epoch=epoch,
            serving=self.indexes.versions(),
            hint="serving the last snapshots until the registry is published again",
        )
        self.epoch = epoch
        self.changes_id = "0-0"
        self.stale = set(self.indexes.versions())
        self.failed.clear()

    def _follow(
        self, client: redis.Redis, entries: list[tuple[str, dict[str, str] | None]]
    ) -> None:
        if entries:
            self.apply_changes(entries + self._more_changes(client, entries[-1][0]))
        else:
            self._catch_up(client)

    def _more_changes(
        self, client: redis.Redis, after: str
    ) -> list[tuple[str, dict[str, str] | None]]:
        """During a burst, the change records that arrive within :func:`coalesce_window_s`
        of the last rebuild's cost: many events, one rebuild (at most about half the time
        spent rebuilding however fast events come)."""
        idle_s = time.monotonic() - self.last_build_end
        deadline = time.monotonic() + coalesce_window_s(self.last_build_s, idle_s)
        more: list[tuple[str, dict[str, str] | None]] = []
        while (remaining := deadline - time.monotonic()) > 0.001 and len(more) < 50_000:
            batch: Any = client.xread(
                {keys.CHANGES: after}, count=1000, block=max(1, int(remaining * 1000))
            )
            items = _change_records(batch)
            if not items:
                break
            more += items
            after = items[-1][0]
        return more

    def apply_changes(self, entries: list[tuple[str, dict[str, str] | None]]) -> None:
        """Apply change records as deltas, one new snapshot per tenant per batch (an unreadable
        record is skipped: the catch-up reloads a tenant whose version it missed)."""
        by_tenant: dict[str, list[dict[str, str]]] = defaultdict(list)
        for entry_id, fields in entries:
            if fields is not None:
                by_tenant[fields["tenant"]].append(fields)
            self.changes_id = entry_id
        for tenant, changes in by_tenant.items():
            self._apply_tenant(tenant, changes)

    def _apply_tenant(self, tenant: str, changes: list[dict[str, str]]) -> None:
        if tenant in self.stale:  # being published again after Redis lost its data: the
            return  # catch-up reloads it whole once the changes are quiet
        current = self.indexes.get(tenant)
        fresh = [c for c in changes if current is None or int(c["version"]) > current.version]
        if not fresh:
            return
        first = int(fresh[0]["version"])
        if current is None or first != current.version + 1 or not _contiguous(fresh):
            log.info(
                "index_gap", tenant=tenant, have=current.version if current else None, got=first
            )
            self.reload(tenant)
            return
        if any(c.get("op") == "reload" for c in fresh):  # a full reindex swapped in
            self.reload(tenant)
            return
        ids = list(dict.fromkeys(c["id"] for c in fresh))
        space = self.spaces.get(tenant, self.space)
        upserts, deletes, marks = self._changes(
            tenant, ids, read_delta(self.redis, tenant, ids, space)
        )
        version = int(fresh[-1]["version"])
        started = time.monotonic()
        self._swap_in(current.with_changes(version, upserts, deletes, marks))
        self.last_build_s = time.monotonic() - started
        self.last_build_end = time.monotonic()
        log.info(
            "index_updated",
            tenant=tenant,
            index_version=version,
            upserts=len(upserts),
            deletes=len(deletes),
        )

    def _changes(
        self, tenant: str, ids: list[str], delta: Delta
    ) -> tuple[list[tuple[Capability, bytes]], list[str], dict[str, Mark]]:
        """The upserts (with their marks) and deletes a read of changed ``ids`` makes: a
        capability gone, or withheld by the tenant's poisoning policy, is deleted."""
        policy = self.policy(tenant, delta.policy)
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

    def policy(self, tenant: str, stored: str | None) -> Policy:
        """``tenant``'s poisoning policy: its own (``stored``), else this worker's setting. A
        stored value that is not a policy (written by hand) quarantines, and says so."""
        if stored is None:
            return self.settings.poisoning_policy
        try:
            return parse_policy(stored)
        except CapdiscError as exc:
            log.warning(
                "poisoning_policy_unreadable",
                tenant=tenant,
                error=str(exc),
                hint="serving as quarantine; set it with `capdisc policy set`",
            )
            return "quarantine"

    def _catch_up(self, client: redis.Redis) -> None:
        """Level-triggered safety net, run when the changes stream is idle: a tenant whose
        stored version is ahead of ours (a change record trimmed away or missed) or behind it
        (its data was reset), that we do not serve yet, or that was published again after
        Redis lost its data is reloaded whole (:func:`needs_reload`)."""
        served = self.indexes.versions()
        tenants = sorted(as_str(t) for t in client.smembers(keys.TENANTS))
        stored = client.mget([keys.version(t) for t in tenants]) if tenants else []
        for tenant, raw in zip(tenants, stored, strict=True):
            stale = tenant in self.stale
            if needs_reload(
                served.get(tenant), _version(raw), stale=stale, failed_at=self.failed.get(tenant)
            ):
                if stale:
                    log.info(
                        "index_reload_after_data_loss", tenant=tenant, index_version=_version(raw)
                    )
                self.reload(tenant)

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
            log.warning(
                "request_rejected", entry_id=entry_id, request_id=exc.request_id, reason=str(exc)
            )
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
        if entry.expired(time.time() * 1000):
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
        return reply.with_timing(self.worker_id, round((time.perf_counter() - started) * 1000, 3))

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
        log.warning(
            "request_refused",
            request_id=request.request_id,
            tenant=request.tenant,
            error=exc.code,
            reason=exc.reason,
            **auth.label(request.token),
        )
        return ErrorReply.of(request.request_id, exc)

    def session_op(self, request: SessionRequest) -> SessionReply:
        """Record a call, or show, export or import a session's working set."""
        can_see = self._can_see(request.tenant, Caller.of(request.roles, request.user))
        return SessionReply(request.request_id, self.sessions.handle(request, can_see))

    def answer(self, request: DiscoverRequest, deadline_ms: int | None = None) -> DiscoverReply:
        """The reply to an admitted discover request (:func:`capdisc.discovery.service.answer`
        over this worker's snapshot of the tenant, its query embedder and sessions)."""
        snapshot = self._snapshot_for(request, deadline_ms)
        if snapshot is None:
            raise UnknownTenantError(
                f"tenant {request.tenant!r} has no registry; publish to "
                "it first (capdisc publish PATH --tenant NAME)"
            )
        context = service.Context(
            snapshot,
            self.queries_for(snapshot.embedder_id or self.embedder.id),
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
        snapshot = self.indexes.get(tenant)
        caps = snapshot.capabilities if snapshot is not None else {}

        def can_see(cap_id: str) -> bool:
            cap = caps.get(cap_id)
            return cap is not None and visible(cap.visibility, caller)

        return can_see

    def _snapshot_for(
        self, request: DiscoverRequest, deadline_ms: int | None
    ) -> IndexSnapshot | None:
        """The tenant's snapshot, waiting (until the request's deadline) for ``min_version``."""
        snapshot = self.indexes.get(request.tenant)
        if snapshot is not None and snapshot.version >= request.min_version:
            return snapshot
        if snapshot is None and not self.redis.sismember(keys.TENANTS, request.tenant):
            return None
        budget_s = self.settings.discover_timeout_s
        if deadline_ms:
            budget_s = min(budget_s, max(0.0, deadline_ms / 1000 - time.time()))
        return self.indexes.wait_for(request.tenant, request.min_version, budget_s)

    # -- lifecycle ---------------------------------------------------------------------------

    def heartbeat_loop(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url)
        while not self.stop.is_set():
            info = {
                "kind": "discovery",
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "embedder": self.embedder.id,
                "versions": self.indexes.versions(),
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

    def run(self) -> None:
        if not self.gate.enabled:
            log.warning(
                "auth_off",
                hint="requests are served as the tenant, roles and user "
                "they claim: anyone who can reach Redis can ask as anyone; set "
                "CAPDISC_AUTH=on and CAPDISC_AUTH_KEYS_FILE outside development",
            )
        self._load_when_reachable()
        threads = [
            threading.Thread(target=self.follow_changes, name="changes", daemon=True),
            threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True),
        ]
        for thread in threads:
            thread.start()
        log.info("discovery_worker_ready", worker=self.worker_id, versions=self.indexes.versions())
        try:
            self.serve()
        finally:
            self.stop.set()
            for thread in threads:
                thread.join(timeout=3)

    def _load_when_reachable(self) -> None:
        """:meth:`load_all`, waiting (with backoff) for a Redis that is not up yet."""
        backoff = Backoff()
        while not self.stop.is_set():
            try:
                self.load_all()
                self.health.ok("start")
                return
            except RETRYABLE as exc:
                self.health.failed("start", exc)
                self.stop.wait(backoff.next())


def needs_reload(served: int | None, stored: int, *, stale: bool, failed_at: int | None) -> bool:
    """Whether the catch-up reloads a tenant whose stored version is ``stored`` and of which
    this worker serves version ``served`` (None: none yet). ``stale``: served from before Redis
    lost its data (reloaded once published again). A version whose load failed is not retried."""
    if failed_at == stored:
        return False
    if stale:
        return stored > 0
    if served is None:
        return True
    return stored > served or 0 < stored < served


def current_epoch(client: redis.Redis) -> str:
    """This Redis's data generation (:data:`keys.EPOCH`), set here when missing."""
    epoch = client.get(keys.EPOCH)
    if epoch is None:
        client.set(keys.EPOCH, uuid.uuid4().hex, nx=True)  # the first worker to look wins
        epoch = client.get(keys.EPOCH)
    return as_str(epoch)


def _change_records(batch: Any) -> list[tuple[str, dict[str, str] | None]]:
    """``(entry id, fields)`` of every record in an XREAD reply (None when it timed out);
    the fields are None for a record that cannot be read."""
    return [
        (as_str(eid), _change_record(as_str(eid), fields))
        for _stream, items in batch or []
        for eid, fields in items
    ]


def _change_record(entry_id: str, raw: Any) -> dict[str, str] | None:
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


def _version(raw: Any) -> int:
    """A stored version (0 when missing or unreadable)."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def _contiguous(changes: list[dict[str, str]]) -> bool:
    versions = [int(c["version"]) for c in changes]
    return versions == list(range(versions[0], versions[0] + len(versions)))


def main() -> None:
    settings = Settings.load()
    configure_logging(settings.log_level, settings.log_format)
    worker = DiscoveryWorker(settings, redis.Redis.from_url(settings.redis_url))
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    try:
        worker.run()
    except KeyboardInterrupt:
        worker.stop.set()


if __name__ == "__main__":
    main()
