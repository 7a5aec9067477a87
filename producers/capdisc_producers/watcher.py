"""Watch a registry directory and re-sync it on every change, debounced.

Any change under the directory (a manifest edited, renamed over, added, or a whole capability
directory added or removed) triggers a re-scan; only capabilities whose content changed are
sent. ``watchfiles`` groups a burst of file events (an editor's temp file and rename) into one
batch. It checks for new events every ``debounce_ms / 2`` and yields a batch at the first check
that found none, so a sync starts between half of ``debounce_ms`` and ``debounce_ms`` after the
last event of a burst (a burst that never pauses is cut after ``4 * debounce_ms``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import redis
import structlog
import watchfiles

from capdisc.manifest import ScanCache
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, sync_directory

log = structlog.get_logger("capdisc.watcher")


def watch_directory(client: redis.Redis, publisher: Publisher, root: Path, *, tenant: str,
                    max_bytes: int, debounce_ms: int, stop: threading.Event | None = None,
                    on_sync: Callable[[SyncReport], None] | None = None) -> None:
    """Sync ``root`` now and after every change until ``stop`` is set."""
    root = root.resolve()
    cache = ScanCache()
    _sync(client, publisher, root, tenant, max_bytes, cache, on_sync)
    for changes in watchfiles.watch(root, step=max(1, debounce_ms // 2),
                                    debounce=max(50, 4 * debounce_ms), stop_event=stop,
                                    raise_interrupt=False, rust_timeout=1000,
                                    yield_on_timeout=False):
        log.info("registry_changed", root=str(root), files=len(changes))
        _sync(client, publisher, root, tenant, max_bytes, cache, on_sync)


def _sync(client: redis.Redis, publisher: Publisher, root: Path, tenant: str, max_bytes: int,
          cache: ScanCache, on_sync: Callable[[SyncReport], None] | None) -> None:
    report = sync_directory(client, publisher, root, tenant=tenant, max_bytes=max_bytes,
                            cache=cache)
    for path, error in report.plan.errors.items():
        log.warning("manifest_rejected", path=str(path), error=str(error), tenant=tenant)
    log.info("registry_synced", root=str(root), tenant=tenant, sent=report.sent,
             upserts=len(report.plan.upserts), deletes=len(report.plan.deletes),
             rejected=len(report.plan.errors))
    if on_sync is not None:
        on_sync(report)
