"""Watch a registry directory and re-sync it on every change, debounced.

Any change under the directory (a manifest edited, renamed over, added, or a whole capability
directory added or removed) triggers a re-scan; only capabilities whose content changed are
sent. ``watchfiles`` groups a burst of file events (an editor's temp file and rename) into one
batch. It checks for new events every ``debounce_ms / 2`` and yields a batch at the first check
that found none, so a sync starts between half of ``debounce_ms`` and ``debounce_ms`` after the
last event of a burst (a burst that never pauses is cut after ``4 * debounce_ms``).

The directory itself going away (moved, deleted, replaced by a file) deletes nothing: the
watcher says so once and syncs again when it is back; to delete capabilities, remove their
manifests.

Redis going away (restarted, unreachable) does not end the watch: a sync that cannot reach it
is logged once and tried again with a bounded backoff (0.5 s doubling to 10 s) until it goes
through. Once a second without changes, the watcher asks Redis for its run id and whether it
still knows the tenant (every sync registers it, nothing unregisters one); when Redis was
unreachable, has restarted, or lost its data without a restart (``FLUSHALL``) since the last
sync, the directory is synced again, which sends whatever the registry lost (a sync compares
the directory with what Redis holds).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import kombu.exceptions
import redis
import structlog
import watchfiles

from capdisc import keys
from capdisc.redisrefusal import advice, refuses_writes
from capdisc.registry.manifest import ScanCache
from capdisc.tenants import check_tenant
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, sync_directory

log = structlog.get_logger("capdisc.watcher")

#: What a sync raises while Redis (the registry and the Celery broker) cannot be reached.
UNREACHABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    kombu.exceptions.OperationalError,
)
#: First retry delay of a sync that could not reach Redis, and its cap.
RETRY_FIRST_S = 0.5
RETRY_CAP_S = 10.0


def watch_directory(
    client: redis.Redis,
    publisher: Publisher,
    root: Path,
    *,
    tenant: str,
    max_bytes: int,
    debounce_ms: int,
    stop: threading.Event | None = None,
    on_sync: Callable[[SyncReport], None] | None = None,
    take_over: bool = False,
) -> None:
    """Sync ``root`` now and after every change until ``stop`` is set (``take_over``: see
    :func:`~capdisc_producers.sync.sync_directory`)."""
    check_tenant(tenant)
    stop = stop or threading.Event()
    syncer = _Syncer(client, publisher, root.resolve(), tenant, max_bytes, on_sync, stop)
    syncer.take_over = take_over
    syncer.sync_until_done()
    for changes in watchfiles.watch(
        syncer.root,
        step=max(1, debounce_ms // 2),
        debounce=max(50, 4 * debounce_ms),
        stop_event=stop,
        raise_interrupt=False,
        rust_timeout=1000,
        yield_on_timeout=True,
    ):
        if changes:
            log.info("registry_changed", root=str(syncer.root), files=len(changes))
            syncer.sync_until_done()
        elif syncer.dir_back() or syncer.redis_lost_data():
            syncer.sync_until_done()


class _Syncer:
    """Syncs one directory, through Redis outages: see the module's docstring."""

    def __init__(
        self,
        client: redis.Redis,
        publisher: Publisher,
        root: Path,
        tenant: str,
        max_bytes: int,
        on_sync: Callable[[SyncReport], None] | None,
        stop: threading.Event,
    ) -> None:
        self.client = client
        self.publisher = publisher
        self.root = root
        self.tenant = tenant
        self.max_bytes = max_bytes
        self.on_sync = on_sync
        self.stop = stop
        self.cache = ScanCache()
        self.log = log.bind(root=str(root), tenant=tenant)
        self.unreachable = False
        #: Who holds the directory's sync lock while this watcher syncs (the same across its
        #: syncs: one cut short by an outage leaves the lock, and the next takes it back).
        self.owner = f"watcher-{uuid.uuid4().hex}"
        self.run_id: str | None = None
        self.take_over = False
        #: Whether the directory was found missing (or not a directory) at the last sync.
        self.gone = False

    def sync_until_done(self) -> None:
        """Sync; while Redis cannot be reached, try again with backoff (until ``stop``)."""
        delay = RETRY_FIRST_S
        while not self.stop.is_set():
            try:
                self.run_id = self._run_id()
                self._sync()
            except UNREACHABLE as exc:
                self._lost(exc)
                self.stop.wait(delay)
                delay = min(RETRY_CAP_S, delay * 2)
                continue
            except redis.RedisError as exc:
                if not refuses_writes(exc):
                    raise
                self._refused(exc)
                self.stop.wait(delay)
                delay = min(RETRY_CAP_S, delay * 2)
                continue
            if self.unreachable:
                self.unreachable = False
                self.log.warning("redis_back", resynced=True)
            return

    def redis_lost_data(self) -> bool:
        """Whether Redis restarted, came back or was emptied since the last sync: it needs
        another."""
        try:
            run_id = self._run_id()
            known = bool(self.client.sismember(keys.TENANTS, self.tenant))
        except UNREACHABLE as exc:
            self._lost(exc)
            return False
        if not known and not self.unreachable:
            self.log.warning(
                "registry_lost", hint="Redis lost its data; syncing the directory again"
            )
        return self.unreachable or not known or (run_id is not None and run_id != self.run_id)

    def _refused(self, exc: Exception) -> None:
        """Redis answers but refuses writes (full, cannot save): say so once; retried, and
        synced again in full once it takes them (as after an outage)."""
        if not self.unreachable:
            self.unreachable = True
            self.log.warning(
                "redis_refuses_writes", error=str(exc), hint=advice(exc) + "; retrying the sync"
            )

    def _lost(self, exc: Exception) -> None:
        if not self.unreachable:
            self.unreachable = True
            self.log.warning(
                "redis_unavailable",
                error=str(exc),
                hint=f"retrying with backoff up to {RETRY_CAP_S:g} s, then "
                "syncing the directory again",
            )

    def dir_back(self) -> bool:
        """Whether the directory, missing at the last sync, is there again."""
        return self.gone and self.root.is_dir()

    def _gone(self) -> None:
        if not self.gone:
            self.gone = True
            self.log.warning(
                "registry_dir_missing",
                hint="keeping every capability published from it (removing a manifest "
                "deletes one; removing the directory does not); put the directory back and "
                "it is synced again, or stop the watch",
            )

    def _run_id(self) -> str | None:
        """Redis's run id (new at every start); ``None`` where INFO is not allowed."""
        try:
            info = self.client.info("server")
        except redis.ResponseError:
            self.client.ping()
            return None
        return str(info.get("run_id")) if info.get("run_id") else None

    def _sync(self) -> None:
        if not self.root.is_dir():  # moved, deleted or replaced: not a registry emptied
            self._gone()
            return
        if self.gone:
            self.gone = False
            self.log.warning("registry_dir_back")
        report = sync_directory(
            self.client,
            self.publisher,
            self.root,
            tenant=self.tenant,
            max_bytes=self.max_bytes,
            cache=self.cache,
            take_over=self.take_over,
            lock_owner=self.owner,
        )
        for path, error in report.plan.errors.items():
            self.log.warning("manifest_rejected", path=str(path), error=str(error))
        self.log.info(
            "registry_synced",
            sent=report.sent,
            upserts=len(report.plan.upserts),
            deletes=len(report.plan.deletes),
            rejected=len(report.plan.errors),
        )
        if self.on_sync is not None:
            self.on_sync(report)
