"""A discovery worker's snapshot follower: it keeps each tenant's :class:`IndexSnapshot` current
for the worker's serving thread (:mod:`capdisc_workers.discovery`) to answer from.

At start it loads every tenant whole; then, on its own thread, it follows the
:data:`capdisc.keys.CHANGES` stream and applies change records as deltas, one new immutable
snapshot per tenant per batch (coalescing a burst into one rebuild), reloading a tenant whole
when it sees a gap or a full reindex. When the stream is idle a catch-up reloads any tenant
whose stored version is not the one served. A tenant whose load fails keeps serving its last
good snapshot. When Redis lost its data (the :data:`capdisc.keys.EPOCH` marker changed or
vanished) the old snapshots keep serving until the registry is published again, then each
tenant is reloaded whole.

With ``snapshot_dir`` set, a tenant loaded whole is first looked for on disk
(:mod:`capdisc.discovery.snapshotfile`): the newest snapshot that fits (same Redis epoch,
vector space, build and poisoning policy, not newer than Redis) is mapped, graph included, and
the changes made since it was written are applied as one delta; anything that does not fit (or
a changes stream that no longer reaches back to it) is logged and the tenant is loaded from
Redis as before. Every snapshot swapped in is offered to the worker's
:class:`~capdisc_workers.snapshots.SnapshotWriter`. A tenant of at least ``map_above``
capabilities is loaded from Redis, and has its changes applied, by a child process that writes
the result as a snapshot this worker then maps (:mod:`capdisc_workers.buildapart`): the worker
never holds a heap index of it beside the mapped one.

Each snapshot swapped in is warmed with the query texts the one it replaced remembered last
(:class:`SnapshotWarmer`, on a thread of its own). It also holds the query embedders, one per
embedder id (a reindex onto another model serves a tenant from vectors of another embedder),
in front of the query-vector cache the discovery workers share in Redis
(:class:`RedisQueryVectors`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
import structlog

from capdisc import keys
from capdisc.discovery.snapshot import (
    IndexSnapshot,
    RecentTexts,
    hybrid_retriever,
    store_retriever,
)
from capdisc.discovery.snapshotfile import (
    load_snapshot,
    open_newest,
    read_header,
)
from capdisc.embedders.port import CachedQueryEmbedder, Embedder, Matrix
from capdisc.errors import CapdiscError, SnapshotError
from capdisc.models import Capability
from capdisc.redisclock import RedisClock
from capdisc.redistext import as_str
from capdisc.registry.flags import Policy, serving
from capdisc.registry.policy import coalesce_window_s
from capdisc.registry.store import Snapshot, read_delta, read_snapshot
from capdisc.resources import embedder_for_id
from capdisc.retrieval.probes import PROBES
from capdisc.retrieval.text import embedder_id_of, vector_space
from capdisc.settings import Settings
from capdisc.vectorstores.port import VectorStore
from capdisc_workers.background import OneThread
from capdisc_workers.buildapart import Outcome, build_apart, policy_of
from capdisc_workers.catchup import (
    Change,
    change_records,
    changes_of,
    since,
    stored_version,
    wanted_now,
)
from capdisc_workers.heap import collection_paused, release_freed_memory
from capdisc_workers.outage import RETRYABLE, Backoff, RedisHealth
from capdisc_workers.snapshots import SnapshotWriter

log = structlog.get_logger("capdisc.discovery")
#: How long one read of the changes stream waits for records (ms).
BLOCK_MS = 1000
#: Approximate length the served stream is trimmed to.
SERVED_MAXLEN = 10_000
#: Shared query-vector writes that may wait for the writer thread (more are dropped).
PENDING_WRITES = 1024


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

    def search_modes(self) -> dict[str, str]:
        """Per tenant, how its queries are searched (``graph`` or ``exact``)."""
        return {t: s.search_mode for t, s in self._snapshots.items()}

    def wait_for(self, tenant: str, version: int, timeout_s: float) -> IndexSnapshot | None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                snap = self._snapshots.get(tenant)
                remaining = deadline - time.monotonic()
                if (snap is not None and snap.version >= version) or remaining <= 0:
                    return snap
                self.changed.wait(remaining)


class SnapshotWarmer:
    """Warms each snapshot swapped in with the ``limit`` query texts the one it replaced
    remembered last (their BM25 figures: :meth:`IndexSnapshot.warm`), on a thread of its own,
    one at a time, in the order they were swapped in. A warm stops as soon as its snapshot is
    no longer the one served; the snapshot replaced is not kept for it."""

    def __init__(self, indexes: Indexes, limit: int) -> None:
        self.indexes = indexes
        self.limit = limit
        self._jobs: OneThread[tuple[IndexSnapshot, RecentTexts]] = OneThread("warm", self._warm)

    def submit(self, new: IndexSnapshot, old: IndexSnapshot) -> None:
        texts = old.recent_texts(self.limit) if new is not old else []
        if texts:
            self._jobs.submit((new, texts))

    def wait(self, timeout_s: float) -> bool:
        """Wait until every warm submitted so far has ended; False on timeout."""
        return self._jobs.wait(timeout_s)

    def _warm(self, job: tuple[IndexSnapshot, RecentTexts]) -> None:
        new, texts = job
        started = time.perf_counter()
        made = new.warm(texts, lambda: self.indexes.get(new.tenant) is new)
        if made:
            log.info(
                "snapshot_warmed",
                tenant=new.tenant,
                index_version=new.version,
                texts=made,
                took_s=round(time.perf_counter() - started, 3),
            )


class RedisQueryVectors:
    """The query-vector cache shared by discovery workers, in Redis (keys expire).

    A read is made on the turn that asks; a write is handed to a thread of its own, so the
    turn that embedded a query is answered without waiting for Redis to store its vectors. At
    most :data:`PENDING_WRITES` writes wait; beyond that a write is dropped (it is a cache: the
    next worker to see the query embeds it). Each write is also recorded in
    :data:`~capdisc.keys.QUERY_VECTORS_INDEX`, and the oldest entries are dropped once more
    than ``max_entries`` are stored, so the cache's memory is bounded whatever the rate of new
    queries."""

    def __init__(self, connection: redis.Redis, ttl_s: int, max_entries: int) -> None:
        self._redis = connection
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = RedisClock()
        self._writes: OneThread[tuple[str, bytes]] = OneThread(
            "query-vectors", self._write, PENDING_WRITES
        )

    def get(self, key: str) -> bytes | None:
        try:
            value = self._redis.get(keys.query_vectors(key))
        except redis.RedisError as exc:  # the cache is an optimisation: embed instead
            log.warning("query_cache_unavailable", error=str(exc))
            return None
        return value if isinstance(value, bytes) else None

    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` soon (on the writer thread)."""
        if not self._writes.submit((key, value)):
            log.debug("query_cache_write_dropped", pending=PENDING_WRITES)

    def flush(self, timeout_s: float) -> bool:
        """Wait until every write handed over so far is made (or failed); False on timeout."""
        return self._writes.wait(timeout_s)

    def _write(self, job: tuple[str, bytes]) -> None:
        key, value = job
        try:
            self._store(key, value)
        except redis.RedisError as exc:
            log.warning("query_cache_unavailable", error=str(exc))

    def _store(self, key: str, value: bytes) -> None:
        now_s = self._clock.now_ms(self._redis) / 1000
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(keys.query_vectors(key), value, ex=self._ttl_s)
        pipe.zadd(keys.QUERY_VECTORS_INDEX, {key: now_s})
        pipe.zremrangebyscore(keys.QUERY_VECTORS_INDEX, "-inf", now_s - self._ttl_s)
        pipe.expire(keys.QUERY_VECTORS_INDEX, self._ttl_s)
        pipe.zcard(keys.QUERY_VECTORS_INDEX)
        stored = int(pipe.execute()[-1])
        if stored > self._max_entries:
            self._drop_oldest(stored - self._max_entries)

    def _drop_oldest(self, count: int) -> None:
        oldest: list[tuple[bytes, float]] = self._redis.zpopmin(  # type: ignore[assignment]
            keys.QUERY_VECTORS_INDEX, count
        )
        if oldest:
            self._redis.delete(*(keys.query_vectors(as_str(pair[0])) for pair in oldest))


class SnapshotFollower:
    """The snapshots one discovery worker serves, kept current from the changes stream, and
    its query embedders."""

    def __init__(
        self,
        settings: Settings,
        connection: redis.Redis,
        embedder: Embedder,
        store: VectorStore | None,
        *,
        worker_id: str,
    ) -> None:
        self.settings = settings
        self.redis = connection
        self.embedder = embedder
        self.space = vector_space(embedder.id)
        #: An external vector store searched per turn (``vector_store: weaviate``), or None.
        self.store = store
        #: The worker named on the served stream for each snapshot swapped in.
        self.worker_id = worker_id
        #: Query embedders (and probe vectors) by embedder id: a full reindex onto another
        #: model swaps a tenant to vectors this worker's configured embedder did not make.
        self._queries: dict[str, CachedQueryEmbedder] = {}
        self._probes: dict[str, Matrix] = {}
        self._lock = threading.Lock()
        self.indexes = Indexes()
        #: Warms each snapshot swapped in from the one it replaced.
        self.warmer = SnapshotWarmer(self.indexes, settings.warm_texts)
        #: The vector space each tenant is served from (set at every full load).
        self.spaces: dict[str, str] = {}
        #: Tenants whose last load failed, with the stored version it failed at.
        self.failed: dict[str, int] = {}
        #: Where the changes stream is read from next: the last record applied (at start, the
        #: stream's end).
        self.changes_id = "0-0"
        #: The Redis data generation (:data:`keys.EPOCH`) the snapshots were loaded from.
        self.epoch: str | None = None
        #: Tenants served from an earlier generation (Redis lost its data since): reloaded
        #: whole once published again, served from the old snapshot until then.
        self.stale: set[str] = set()
        #: How long the last snapshot rebuild took: the coalescing window of the next burst.
        self.last_build_s = 0.0
        #: When the last rebuild ended (monotonic): a burst is rebuilds back to back.
        self.last_build_end = 0.0
        #: The poisoning policy each tenant was loaded under (what a snapshot file records).
        self.policies: dict[str, str] = {}
        #: Where each tenant was last loaded whole from: ``snapshot`` (a file on disk) or
        #: ``redis`` (the heartbeat and ``capdisc status`` show it).
        self.loaded_from: dict[str, str] = {}
        #: Writes the snapshots swapped in to ``snapshot_dir`` (None: no snapshots on disk,
        #: or searched in an external store).
        self.writer = (
            SnapshotWriter(
                settings.snapshot_dir,
                keep=settings.snapshot_keep,
                interval_s=settings.snapshot_interval_s,
            )
            if settings.snapshot_dir is not None and store is None
            else None
        )

    # -- query embedders ---------------------------------------------------------------------

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
                RedisQueryVectors(
                    self.redis,
                    self.settings.query_cache_ttl_s,
                    self.settings.query_cache_max_entries,
                )
                if self.settings.query_cache_ttl_s
                else None
            )
            self._queries[embedder_id] = CachedQueryEmbedder(
                inner, self.settings.query_cache_size, shared
            )
            self._probes[embedder_id] = inner.embed(list(PROBES))  # also loads the model
        return self._queries[embedder_id]

    # -- loading -----------------------------------------------------------------------------

    def load_all(self) -> None:
        """Load every tenant whole (and the configured embedder's model), then follow the
        changes stream from its current end."""
        self.queries_for(self.embedder.id)
        self.epoch = current_epoch(self.redis)
        last = self.redis.xrevrange(keys.CHANGES, count=1)
        self.changes_id = as_str(last[0][0]) if last else "0-0"
        for tenant in sorted(as_str(t) for t in self.redis.smembers(keys.TENANTS)):
            self.reload(tenant)

    def reload(self, tenant: str) -> IndexSnapshot | None:
        """Load ``tenant`` whole (from a snapshot on disk when one fits, else from Redis); on
        failure keep serving what it served and say why (once per stored version: the catch-up
        does not retry a version that failed)."""
        try:
            with collection_paused():  # a load's objects live on: no collector passes
                loaded = (
                    self._load_from_disk(tenant)
                    or self._load_built_apart(tenant)
                    or self._load(tenant)
                )
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
        release_freed_memory()  # the parsed records and the previous index
        return loaded

    def _load_from_disk(self, tenant: str) -> IndexSnapshot | None:
        """``tenant`` from the newest snapshot on disk that fits what Redis holds now, brought
        up to date with the changes made since it was written (as one delta); None, having
        said why, when none fits or the changes since cannot all be read (it is then loaded
        from Redis), or when no snapshot directory is set."""
        root = self.settings.snapshot_dir
        if root is None or self.store is not None:
            return None
        started = time.monotonic()
        wanted = wanted_now(self.redis, tenant, self.space, lambda p: self.policy(tenant, p))
        if wanted is None:
            return None
        space = wanted.space
        embedder_id = embedder_id_of(space)
        self.queries_for(embedder_id)  # its model and probe vectors
        current = self.indexes.get(tenant)

        def refused(exc: SnapshotError) -> None:
            log.warning(
                "snapshot_refused",
                tenant=tenant,
                path=exc.path,
                reason=exc.reason,
                hint="loading the tenant from Redis instead",
            )

        found = open_newest(
            root,
            wanted,
            self._probes[embedder_id],
            refused,
            newer_than=current.version if current is not None else -1,
        )
        if found is None:
            return None
        snapshot, header, path = found
        behind = header.version < wanted.stored_version  # changes made since it was written
        apart = self._changed_apart(snapshot, wanted.stored_version, space) if behind else None
        try:
            index, changes_id, applied = (
                (*apart, apart[0].version - header.version)
                if apart is not None
                else since(
                    self.redis, snapshot, header, wanted, path, lambda p: self.policy(tenant, p)
                )
            )
        except SnapshotError as exc:
            refused(exc)
            return None
        self.spaces[tenant] = space
        self.policies[tenant] = wanted.policy
        self.loaded_from[tenant] = "snapshot"
        self.stale.discard(tenant)  # before the swap: a stale tenant's index is not written
        self._swap_in(index, changes_id)
        log.info(
            "index_loaded_from_snapshot",
            tenant=tenant,
            index_version=index.version,
            snapshot_version=header.version,
            changes_applied=applied,
            capabilities=len(index),
            vector_space=space,
            search=index.search_mode,
            path=str(path),
            took_s=round(time.monotonic() - started, 3),
        )
        return index

    def _load_built_apart(self, tenant: str) -> IndexSnapshot | None:
        """``tenant`` built from Redis by a child process into a snapshot on disk, then mapped
        (:mod:`capdisc_workers.buildapart`); None when it is smaller than
        ``map_above``, no snapshot directory is set, or the child failed (said why:
        the worker then builds it itself)."""
        root, limit = self.settings.snapshot_dir, self.settings.map_above
        if root is None or self.store is not None or not limit:
            return None
        if int(self.redis.hlen(keys.caps(tenant))) < limit:
            return None
        active = self.redis.get(keys.space(tenant))
        space = as_str(active) if active else self.space
        embedder_id = embedder_id_of(space)
        self.queries_for(embedder_id)  # its probe vectors
        outcome = build_apart(self.settings, tenant, space, self.space, self._probes[embedder_id])
        if not outcome.ok:
            log.warning(
                "build_apart_failed",
                tenant=tenant,
                reason=outcome.reason,
                hint="building the tenant in this worker instead",
            )
            return None
        loaded = self._load_from_disk(tenant)
        if loaded is not None:
            self.loaded_from[tenant] = "redis"
            self._written_apart(tenant, outcome)
            log.info(
                "index_built_apart",
                tenant=tenant,
                index_version=loaded.version,
                capabilities=len(loaded),
                took_s=round(outcome.took_s, 3),
                child_peak_rss_mb=round(outcome.child_peak_rss_mb, 1),
                withheld=outcome.counts.get("withheld", 0),
                marked=outcome.counts.get("marked", 0),
            )
            _warn_without_vectors(tenant, space, outcome.counts.get("without_vectors", 0))
            _warn_unreadable(tenant, outcome.counts.get("unreadable", 0))
        return loaded

    def _load(self, tenant: str) -> IndexSnapshot:
        snap = read_snapshot(self.redis, tenant, self.space)
        embedder_id = embedder_id_of(snap.space)
        queries = self.queries_for(embedder_id)
        policy = self.policy(tenant, snap.policy)
        served = serving(snap.flags, policy)
        missing = sum(cid not in snap.vectors for cid in snap.records)
        entries = _entries(snap, served.withheld)
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
        self.policies[tenant] = policy
        self.loaded_from[tenant] = "redis"
        self.stale.discard(tenant)  # before the swap: a stale tenant's index is not written
        self._swap_in(index, snap.changes_id)
        log.info(
            "index_loaded",
            tenant=tenant,
            index_version=index.version,
            capabilities=len(index),
            vector_space=snap.space,
            withheld=len(served.withheld),
            marked=len(served.marks),
        )
        _warn_without_vectors(tenant, snap.space, missing)
        _warn_unreadable(tenant, len(snap.unreadable), snap.unreadable)
        return index

    def _swap_in(self, index: IndexSnapshot, changes_id: str) -> None:
        """Serve ``index`` from now on, and say so on the served stream (what ``capdisc
        status`` and the change-to-served benchmark read: when each worker serves what).
        ``changes_id``: the changes stream entry it is current to (for its snapshot file)."""
        replaced = self.indexes.get(index.tenant)
        self.indexes.put(index)
        if replaced is not None:
            self.warmer.submit(index, replaced)
        tenant = index.tenant
        if self.writer is not None and self.epoch is not None and tenant not in self.stale:
            self.writer.offer(
                index,
                space=self.spaces.get(tenant, self.space),
                epoch=self.epoch,
                changes_id=changes_id,
                policy=self.policies.get(tenant, self.settings.poisoning_policy),
            )
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

    # -- following the changes stream --------------------------------------------------------

    def follow_changes(self, stop: threading.Event, health: RedisHealth) -> None:
        """Apply the changes stream (on a connection of its own) until ``stop`` is set; Redis
        going away only pauses it (retried with backoff, said once through ``health``)."""
        client = redis.Redis.from_url(self.settings.redis_url)
        backoff = Backoff()
        while not stop.is_set():
            try:
                self._check_epoch(client)
                batch: Any = client.xread(
                    {keys.CHANGES: self.changes_id}, count=1000, block=BLOCK_MS
                )
                self._follow(client, change_records(batch))
                health.ok("changes")
                backoff.reset()
            except RETRYABLE as exc:
                health.failed("changes", exc)
                stop.wait(backoff.next())
            except Exception:  # the follower must outlive any one bad change
                log.exception("changes_apply_failed")
                stop.wait(0.5)

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

    def _follow(self, client: redis.Redis, entries: list[Change]) -> None:
        if entries:
            self.apply_changes(entries + self._more_changes(client, entries[-1][0]))
        else:
            self._catch_up(client)

    def _more_changes(self, client: redis.Redis, after: str) -> list[Change]:
        """During a burst, the change records that arrive within :func:`coalesce_window_s`
        of the last rebuild's cost: many events, one rebuild (at most about half the time
        spent rebuilding however fast events come)."""
        idle_s = time.monotonic() - self.last_build_end
        deadline = time.monotonic() + coalesce_window_s(self.last_build_s, idle_s)
        more: list[Change] = []
        while (remaining := deadline - time.monotonic()) > 0.001 and len(more) < 50_000:
            batch: Any = client.xread(
                {keys.CHANGES: after}, count=1000, block=max(1, int(remaining * 1000))
            )
            items = change_records(batch)
            if not items:
                break
            more += items
            after = items[-1][0]
        return more

    def apply_changes(self, entries: list[Change]) -> None:
        """Apply change records as deltas, one new snapshot per tenant per batch (an unreadable
        record is skipped: the catch-up reloads a tenant whose version it missed)."""
        by_tenant: dict[str, list[dict[str, str]]] = defaultdict(list)
        for entry_id, fields in entries:
            if fields is not None:
                by_tenant[fields["tenant"]].append(fields)
            self.changes_id = entry_id
        for tenant, changes in by_tenant.items():
            self._apply_tenant(tenant, changes)
        if by_tenant:
            release_freed_memory()  # the replaced snapshots

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
        version = int(fresh[-1]["version"])
        started = time.monotonic()
        space = self.spaces.get(tenant, self.space)
        apart = self._changed_apart(current, version, space)
        index, changes_id = apart or self._changed_here(current, ids, version, space)
        self._swap_in(index, changes_id)
        self.last_build_s = time.monotonic() - started
        self.last_build_end = time.monotonic()
        log.info(
            "index_updated",
            tenant=tenant,
            index_version=index.version,
            capabilities_changed=len(ids),
            applied="apart" if apart is not None else "in_process",
            took_s=round(self.last_build_s, 3),
        )

    def _changed_here(
        self, current: IndexSnapshot, ids: list[str], version: int, space: str
    ) -> tuple[IndexSnapshot, str]:
        """``current`` with the changed ``ids`` read (from ``space``) and applied in this
        process (a delta in the heap), at ``version``, and the changes stream entry it is
        current to."""
        tenant = current.tenant
        delta = read_delta(self.redis, tenant, ids, space)
        upserts, deletes, marks = changes_of(ids, delta, self.policy(tenant, delta.policy))
        return current.with_changes(version, upserts, deletes, marks), self.changes_id

    def _changed_apart(
        self, current: IndexSnapshot, version: int, space: str
    ) -> tuple[IndexSnapshot, str] | None:
        """``current``'s tenant (served from ``space``) brought to ``version`` (or later) by a
        child process from its snapshot on disk, and mapped (:mod:`capdisc_workers.buildapart`),
        with the changes stream entry it is current to; None when it holds fewer than
        ``map_above`` capabilities, no snapshot directory is set, or the child failed (said
        why: the changes are then applied here)."""
        root, limit = self.settings.snapshot_dir, self.settings.map_above
        if root is None or self.store is not None or not limit or len(current) < limit:
            return None
        tenant = current.tenant
        self.queries_for(current.embedder_id)  # its probe vectors
        probes = self._probes[current.embedder_id]
        outcome = build_apart(self.settings, tenant, space, self.space, probes, changes=True)
        try:
            if not outcome.ok:
                raise SnapshotError(outcome.reason, root)
            path = Path(outcome.path)
            header = read_header(path)
            if header.version < version:
                raise SnapshotError(f"written at version {header.version}, not {version}", path)
            index = load_snapshot(path, header, probes, verify=False)  # its child's, just made
        except SnapshotError as exc:
            log.warning(
                "change_apart_failed",
                tenant=tenant,
                index_version=version,
                reason=str(exc),
                hint="applying the changes in this worker instead",
            )
            return None
        self._written_apart(tenant, outcome)
        log.info(
            "index_changed_apart",
            tenant=tenant,
            index_version=index.version,
            took_s=round(outcome.took_s, 3),
            child_peak_rss_mb=round(outcome.child_peak_rss_mb, 1),
            path=str(path),
        )
        return index, header.changes_id

    def _written_apart(self, tenant: str, outcome: Outcome) -> None:
        """Tell the writer of the snapshot a child wrote (what ``capdisc status`` shows)."""
        if self.writer is not None and outcome.path:
            self.writer.written_apart(tenant, Path(outcome.path), outcome.took_s)

    def policy(self, tenant: str, stored: str | None) -> Policy:
        """``tenant``'s poisoning policy: its own (``stored``), else this worker's setting. A
        stored value that is not a policy (written by hand) quarantines, and says so."""

        def unreadable(exc: CapdiscError) -> None:
            log.warning(
                "poisoning_policy_unreadable",
                tenant=tenant,
                error=str(exc),
                hint="serving as quarantine; set it with `capdisc policy set`",
            )

        return policy_of(stored, self.settings.poisoning_policy, unreadable)

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
                served.get(tenant),
                stored_version(raw),
                stale=stale,
                failed_at=self.failed.get(tenant),
            ):
                if stale:
                    log.info(
                        "index_reload_after_data_loss",
                        tenant=tenant,
                        index_version=stored_version(raw),
                    )
                self.reload(tenant)


def _entries(snap: Snapshot, withheld: Collection[str]) -> Iterator[tuple[Capability, bytes]]:
    """The served capabilities of ``snap`` with their vectors, each record and vector dropped
    from ``snap`` as it is handed over, so a large load never holds every record twice."""
    for cap_id in list(snap.records):
        record = snap.records.pop(cap_id)
        vector = snap.vectors.pop(cap_id, None)
        if vector is not None and cap_id not in withheld:
            yield Capability.from_dict(record.capability), vector


def _warn_unreadable(tenant: str, count: int, ids: Sequence[str] = ()) -> None:
    if count:
        log.error(
            "records_unreadable",
            tenant=tenant,
            count=count,
            ids=list(ids[:20]),
            hint="these stored values are no capability record (written by hand or damaged) "
            "and are not served; capdisc status lists them, capdisc delete ID removes one, "
            "publishing its source again replaces it",
        )


def _warn_without_vectors(tenant: str, space: str, missing: int) -> None:
    if missing:
        log.warning(
            "capabilities_without_vectors",
            tenant=tenant,
            vector_space=space,
            missing=missing,
            hint="they were indexed by another embedder or an earlier version; "
            f"run `capdisc reindex --all --tenant {tenant}` to embed them all "
            "beside the live index and swap",
        )


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


def _contiguous(changes: list[dict[str, str]]) -> bool:
    versions = [int(c["version"]) for c in changes]
    return versions == list(range(versions[0], versions[0] + len(versions)))
