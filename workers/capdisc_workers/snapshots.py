"""Writing a discovery worker's snapshots to disk (``snapshot_dir``), off the request path.

The follower offers every snapshot it swaps in (:meth:`SnapshotWriter.offer`); one daemon
thread writes the newest one of each tenant (:func:`capdisc.discovery.snapshotfile.
write_snapshot`), at most once per ``snapshot_interval_s`` a tenant, and only once its HNSW
graph is built (a snapshot is worth writing for what it saves a restart: the build and the
graph). An offer holds its snapshot weakly: one replaced before its turn is not kept alive and
not written. A write that fails is logged and left; serving never waits for one. Each tenant's
last snapshot written (:meth:`SnapshotWriter.last_written`) and its last write that failed
since (:meth:`SnapshotWriter.last_failed`) are kept for the worker's heartbeat and ``capdisc
status``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from capdisc.discovery.snapshot import HybridRetriever, IndexSnapshot, graph_builder
from capdisc.discovery.snapshotfile import (
    build_fingerprint,
    generation,
    intact,
    newest_version,
    read_header,
    snapshot_dir,
    snapshot_name,
    write_snapshot,
)
from capdisc.errors import SnapshotError
from capdisc.retrieval.config import calibrated_for
from capdisc.retrieval.neighbors import BackgroundBuilder

log = structlog.get_logger("capdisc.discovery")
#: The longest a write waits for its snapshot's graph (a newer snapshot supersedes it sooner).
GRAPH_WAIT_S = 900.0


@dataclass(frozen=True)
class Offer:
    """A snapshot to write and what its header says beside it."""

    snapshot: weakref.ref[IndexSnapshot]
    version: int
    space: str
    epoch: str
    changes_id: str
    policy: str


@dataclass(frozen=True)
class Written:
    """A tenant's last snapshot written by this process: its index version, when it was written
    (wall clock), its size on disk and how long the write took."""

    index_version: int
    written_at_unix_s: float
    megabytes: float
    took_s: float

    def as_dict(self) -> dict[str, float]:
        """The fields by name (what the heartbeat carries)."""
        return asdict(self)


@dataclass(frozen=True)
class Failed:
    """A tenant's last snapshot write that failed (and none succeeded since): the index version
    it was writing, when it failed (wall clock) and why."""

    index_version: int
    failed_at_unix_s: float
    error: str

    def as_dict(self) -> dict[str, float | str]:
        """The fields by name (what the heartbeat carries)."""
        return asdict(self)


class SnapshotWriter:
    """Writes the snapshots offered to it into ``root`` on a thread of its own."""

    def __init__(
        self,
        root: Path,
        *,
        keep: int,
        interval_s: float,
        builder: Callable[[], BackgroundBuilder] = graph_builder,
    ) -> None:
        self.root = root
        self.keep = keep
        self.interval_s = interval_s
        self._builder = builder
        self._pending: dict[str, Offer] = {}
        #: When each tenant's last snapshot was written (monotonic).
        self._last: dict[str, float] = {}
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._busy = False
        #: Each tenant's last snapshot written (read by the heartbeat thread: under ``_lock``).
        self._written: dict[str, Written] = {}
        #: Each tenant's last write that failed, until one succeeds (also under ``_lock``).
        self._failed: dict[str, Failed] = {}
        self._lock = threading.Lock()
        #: Snapshots written by this process.
        self.written = 0

    def last_written(self) -> dict[str, Written]:
        """Each tenant's last snapshot written by this process (empty before the first)."""
        with self._lock:
            return dict(self._written)

    def last_failed(self) -> dict[str, Failed]:
        """Each tenant whose last snapshot write failed (none written since), and why."""
        with self._lock:
            return dict(self._failed)

    def written_apart(self, tenant: str, path: Path, took_s: float) -> None:
        """Record the snapshot at ``path``, written for this worker by its child process
        (:mod:`capdisc_workers.buildapart`, which writes a large tenant's snapshots), as
        ``tenant``'s last one written; nothing when it cannot be read (it is then refused)."""
        try:
            header = read_header(path)
            megabytes = round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 1)
        except (SnapshotError, OSError):
            return
        record = Written(
            index_version=header.version,
            written_at_unix_s=round(header.written_at_ms / 1000, 3),
            megabytes=megabytes,
            took_s=round(took_s, 2),
        )
        with self._lock:
            self._written[tenant] = record
            self._failed.pop(tenant, None)

    def offer(
        self, snapshot: IndexSnapshot, *, space: str, epoch: str, changes_id: str, policy: str
    ) -> None:
        """Write ``snapshot`` when its tenant's turn comes (replacing an offer not written yet)."""
        if not isinstance(snapshot.retriever, HybridRetriever) or not len(snapshot):
            return  # searched in an external store, or empty: nothing to map
        with self._wake:
            self._pending[snapshot.tenant] = Offer(
                weakref.ref(snapshot), snapshot.version, space, epoch, changes_id, policy
            )
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="capdisc-snapshots", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def idle(self, timeout_s: float) -> bool:
        """Wait until nothing is being written and no offer is due; False on timeout."""
        with self._wake:
            return self._wake.wait_for(
                lambda: not self._busy and not self._due_now(), timeout=timeout_s
            )

    def _due_now(self) -> bool:
        now = time.monotonic()
        return any(self._due(t) <= now for t in self._pending)

    def _due(self, tenant: str) -> float:
        last = self._last.get(tenant)
        return last + self.interval_s if last is not None else 0.0

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: bool(self._pending))
                tenant = min(self._pending, key=self._due)
                wait_s = self._due(tenant) - time.monotonic()
                if wait_s > 0:
                    self._wake.wait(wait_s)
                    continue
                offer = self._pending.pop(tenant)
                self._busy = True
            try:
                if self._write(tenant, offer):
                    self._last[tenant] = time.monotonic()
            except Exception as exc:  # a full disk or a bug here must not end serving
                self._record_failure(tenant, offer, exc)
                log.warning(
                    "snapshot_write_failed",
                    tenant=tenant,
                    root=str(self.root),
                    error=f"{type(exc).__name__}: {exc}",
                    hint="the worker serves on; a restart loads from Redis until a snapshot "
                    "is written (check the snapshot_dir's space and permissions)",
                )
            finally:
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def _record_failure(self, tenant: str, offer: Offer, exc: Exception) -> None:
        failed = Failed(
            index_version=offer.version,
            failed_at_unix_s=round(time.time(), 3),
            error=f"{type(exc).__name__}: {exc}",
        )
        with self._lock:
            self._failed[tenant] = failed

    def _write(self, tenant: str, offer: Offer) -> bool:
        """Write one offer; False when it was superseded or is on disk already."""
        snapshot = offer.snapshot()
        if snapshot is None or not self._graph_ready(snapshot):
            return False
        key = generation(offer.epoch, build_fingerprint(snapshot.embedder_id), offer.policy)
        on_disk = newest_version(self.root, tenant, offer.space, key)
        if on_disk is not None and on_disk > snapshot.version:
            return False
        same = snapshot_dir(self.root, tenant, offer.space) / snapshot_name(on_disk or 0, key)
        if on_disk == snapshot.version and intact(same):
            return False  # a damaged one is written again: every start would refuse it
        started = time.monotonic()
        path = write_snapshot(
            self.root,
            snapshot,
            space=offer.space,
            epoch=offer.epoch,
            changes_id=offer.changes_id,
            policy=offer.policy,
            keep=self.keep,
        )
        record = Written(
            index_version=snapshot.version,
            written_at_unix_s=round(time.time(), 3),
            megabytes=round(sum(f.stat().st_size for f in path.iterdir()) / 2**20, 1),
            took_s=round(time.monotonic() - started, 2),
        )
        with self._lock:
            self._written[tenant] = record
            self._failed.pop(tenant, None)
            self.written += 1
        log.info(
            "snapshot_written",
            tenant=tenant,
            index_version=record.index_version,
            capabilities=len(snapshot),
            path=str(path),
            megabytes=record.megabytes,
            took_s=record.took_s,
        )
        return True

    def _graph_ready(self, snapshot: IndexSnapshot) -> bool:
        """Whether ``snapshot`` has the graph it will get (waiting for a build under way);
        False when its build was superseded (a newer snapshot is offered instead)."""
        retriever = snapshot.retriever
        assert isinstance(retriever, HybridRetriever)
        config = calibrated_for(snapshot.embedder_id)
        if not config.ann_above or len(snapshot) <= config.ann_above:
            return True
        slot = retriever.index.neighbors
        if slot.graph is None:
            self._builder().idle(GRAPH_WAIT_S)
        return slot.graph is not None
