"""How fast the reconciler repairs a tenant that lost every vector, against a full reindex of
the same records in the same run.

A fresh embedded stack (its own Redis, one indexing and one discovery worker, no periodic
reconcile) imports ``--size`` synthetic capabilities (``import_backlog.py``'s catalog). Then:

1. *repair*: the tenant's vector hash and the shared embedding cache are deleted (so every
   record is embedded again, as after a real loss), one reconcile run is asked for
   (``capdisc reconcile``), and the time until every record has its vector again is taken. The
   run sends a window of ``publish_max_pending_tasks`` tasks of 64 and leaves the rest in the
   tenant's repair backlog, which the indexing workers' sweep sends as the window drains.
2. *floor*: ``capdisc reindex --all --fresh`` of the same records, start to swap (every batch
   embedded again, its batches sending each other at the workers' pace).

Printed: both times, their ratio, and the pace the reconciler had when a run sent one window and
the next run, ``reconcile_interval_s`` later, topped it up (computed from the settings: that path
is gone).

    .venv/bin/python benchmarks/repair_pace.py [--size 5000] [--embedder minilm]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).parent))

from capdisc import keys
from capdisc.client import wait_for_reply
from capdisc_producers.publisher import Publisher
from capdisc_workers.embedding import EMBED_BATCH
from import_backlog import write_catalog
from reindex_backlog import full_reindex, imported_stack


def repair(client: redis.Redis, publisher: Publisher, tenant: str, timeout_s: float) -> float:
    """Lose every vector of ``tenant`` and the embedding cache, ask for one reconcile run; the
    seconds until every record has a vector again."""
    space = client.get(keys.space(tenant))
    if space is None:
        raise SystemExit(f"tenant {tenant} has no vector space after the import")
    vectors = keys.vectors(tenant, space.decode())
    size = int(client.hlen(keys.caps(tenant)))
    for cache in client.scan_iter(match=keys.embedding_cache("*")):
        client.delete(cache)
    client.delete(vectors)
    reply_id = f"reconcile-{uuid.uuid4().hex}"
    started = time.perf_counter()
    publisher.reconcile(keys.reply(reply_id))
    report = wait_for_reply(client, reply_id, timeout_s)
    if report is None or report["missing_vectors"] != size:
        raise SystemExit(f"the reconcile run found {report and report['missing_vectors']}")
    while int(client.hlen(vectors)) < size:
        if time.perf_counter() - started > timeout_s:
            raise SystemExit(f"{client.hlen(vectors)} of {size} vectors after {timeout_s} s")
        time.sleep(0.2)
    return time.perf_counter() - started


def run(catalog: Path, size: int, embedder: str, timeout_s: float) -> dict[str, Any]:
    env = {"CAPDISC_EMBEDDER": embedder, "CAPDISC_RECONCILE_INTERVAL_S": "0"}
    with imported_stack(catalog, size, env, timeout_s) as (_url, client, publisher, settings):
        repair_s = repair(client, publisher, settings.tenant, timeout_s)
        version, reindex_s = full_reindex(client, publisher, settings.tenant, timeout_s)
    if version is None:
        raise SystemExit("the full reindex did not swap")
    return {
        "repair_s": repair_s,
        "reindex_s": reindex_s,
        "window": settings.publish_max_pending_tasks * EMBED_BATCH,
        "interval_s": 60.0,  # reconcile_interval_s's default (off in this run)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", type=int, default=5_000)
    parser.add_argument("--embedder", default="minilm")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        catalog = write_catalog(Path(directory) / "tools.jsonl", args.size)
        r = run(catalog, args.size, args.embedder, args.timeout)
    size = args.size
    print(f"every vector of {size:,} capabilities lost ({args.embedder} embedder), one stack")
    print(
        f"repair, one reconcile run, then workers: {r['repair_s']:7.1f} s  "
        f"({size / r['repair_s']:6.1f} records/s)"
    )
    print(
        f"floor, reindex --all --fresh:             {r['reindex_s']:7.1f} s  "
        f"({size / r['reindex_s']:6.1f} records/s)"
    )
    print(f"repair against the floor: {r['repair_s'] / r['reindex_s']:.2f} x")
    runs = -(-size // r["window"])
    print(
        f"before (a window of {r['window']:,} a run, one run every {r['interval_s']:.0f} s, "
        f"computed): at least {(runs - 1) * r['interval_s']:.0f} s "
        f"(about {r['window'] / r['interval_s']:.0f} records/s)"
    )


if __name__ == "__main__":
    main()
