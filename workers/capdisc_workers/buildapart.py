"""A large tenant's index built in a short-lived child process and handed over as a snapshot on
disk, so the discovery worker that serves it never holds the load's garbage.

Building a tenant from Redis parses every record into Python objects, which are freed once the
index holds its compact form; but the strings and tables that live on were made among them,
so the allocator cannot give most of that memory back. Measured with
``benchmarks/discovery_memory.py`` at 100,000 capabilities: a worker that built the index
itself stayed at about 1,000 MB, one that mapped the same index from a snapshot at about
530 MB.

So a discovery worker with a ``snapshot_dir`` that loads a tenant of at least
``map_above`` capabilities from Redis runs this module as a child (:func:`build_apart`):
the child reads the tenant, builds its index exactly as the worker would (the HNSW graph of a
large catalog included), writes it as a snapshot and exits, handing all of its memory back.
The worker then maps the snapshot like any other
(:meth:`capdisc_workers.follower.SnapshotFollower.reload`); changes made meanwhile arrive as
one delta. When the child fails or times out, the worker says why and builds in-process.

Changes to such a tenant are applied apart too (``--changes``): a delta built in the worker
would hold the mapped index and the new one, in the heap, side by side, with the delta's
temporaries (at 100,000 capabilities the worker went from 334 MB to a 967 MB peak and stayed at
579 MB). The child maps the newest snapshot on disk, applies the changes made since it was
written (read from the changes stream, as a worker starting from it would), waits for a new
HNSW graph if the changes called for one, writes the result as the next snapshot and exits;
the worker maps it in place of the one it served.

    python -m capdisc_workers.buildapart TENANT --space S --default-space D --probes P.npy
        [--changes]

(``P.npy``: the embedder's probe vectors, which also give its width.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import redis

from capdisc import keys
from capdisc.discovery.snapshot import IndexSnapshot, graph_builder, hybrid_retriever
from capdisc.discovery.snapshotfile import open_newest, write_snapshot
from capdisc.embedders.port import Matrix
from capdisc.errors import CapdiscError, SnapshotError
from capdisc.models import Capability
from capdisc.redistext import as_str
from capdisc.registry.flags import Policy, parse_policy, serving
from capdisc.registry.store import Snapshot, read_snapshot
from capdisc.retrieval.neighbors import BackgroundBuilder
from capdisc.retrieval.text import embedder_id_of
from capdisc.settings import Settings
from capdisc_workers.catchup import since, wanted_now

#: Exit status of a child that found the tenant in another vector space than it was told.
MOVED = 3
#: Exit status of a ``--changes`` child that found no snapshot on disk to bring up to date, or
#: one whose changes since could not all be read or applied (its stderr says which).
NO_SNAPSHOT = 4
#: The counts the child reports on its last line of output (JSON), with its peak RSS.
COUNTS = ("without_vectors", "withheld", "marked", "unreadable")


@dataclass(frozen=True)
class Outcome:
    """How a child build ended: ``ok``, and else why not (for the worker's warning)."""

    ok: bool
    reason: str = ""
    took_s: float = 0.0
    #: The child's peak resident size (the host holds it beside the worker while it runs);
    #: 0 when it did not say.
    child_peak_rss_mb: float = 0.0
    #: What the child counted: capabilities without a vector in the space, withheld by the
    #: poisoning policy, and served with a caution mark.
    counts: dict[str, int] = field(default_factory=dict)
    #: The snapshot a ``--changes`` child left on disk (empty otherwise).
    path: str = ""


def build_apart(
    settings: Settings,
    tenant: str,
    space: str,
    default_space: str,
    probes: Matrix,
    *,
    changes: bool = False,
) -> Outcome:
    """Run the child that writes ``tenant``'s snapshot (served from ``space``) into
    ``settings.snapshot_dir``: built from Redis, or with ``changes`` the newest one there
    brought up to date; it reads the worker's settings from the same environment."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="capdisc-build-") as folder:
        command = [
            sys.executable,
            "-m",
            "capdisc_workers.buildapart",
            tenant,
            "--space",
            space,
            "--default-space",
            default_space,
        ]
        np.save(Path(folder) / "probes.npy", probes, allow_pickle=False)
        command += ["--probes", str(Path(folder) / "probes.npy")]
        command += ["--changes"] if changes else []
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                timeout=settings.build_apart_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Outcome(False, f"{type(exc).__name__}: {exc}")
    took = time.monotonic() - started
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        return Outcome(False, f"exit status {done.returncode}: {' | '.join(tail)}", took)
    report = _report(done.stdout)
    return Outcome(
        True,
        took_s=took,
        child_peak_rss_mb=float(report.get("peak_rss_mb", 0.0)),
        counts={name: int(report.get(name, 0)) for name in COUNTS},
        path=str(report.get("path", "")),
    )


def _report(stdout: bytes) -> dict[str, Any]:
    """The JSON object the child printed last (empty when it printed none)."""
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def peak_rss_mb() -> float:
    """This process's peak resident size (``VmHWM``; ``ru_maxrss`` would carry the worker's
    over from before ``exec``); 0 where ``/proc`` does not say."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0.0
    found = next((line for line in status.splitlines() if line.startswith("VmHWM:")), "")
    return int(found.split()[1]) / 1024 if found else 0.0


def policy_of(
    stored: str | None,
    default: Policy,
    unreadable: Callable[[CapdiscError], None] = lambda _exc: None,
) -> Policy:
    """A tenant's poisoning policy: its stored one, else ``default``; a stored value that is not
    a policy (written by hand) quarantines, and is told to ``unreadable``."""
    if stored is None:
        return default
    try:
        return parse_policy(stored)
    except CapdiscError as exc:
        unreadable(exc)
        return "quarantine"


def built(snap: Snapshot, policy: Policy, probes: Matrix) -> tuple[IndexSnapshot, dict[str, int]]:
    """The index a worker would build of ``snap``, its HNSW graph (large catalogs) included,
    and its :data:`COUNTS`."""
    served = serving(snap.flags, policy)
    counts = {
        "without_vectors": sum(cid not in snap.vectors for cid in snap.records),
        "withheld": len(served.withheld),
        "marked": len(served.marks),
        "unreadable": len(snap.unreadable),
    }
    entries = (
        (Capability.from_dict(record.capability), snap.vectors[cid])
        for cid, record in snap.records.items()
        if cid in snap.vectors and cid not in served.withheld
    )
    builder = BackgroundBuilder()
    index = IndexSnapshot.build(
        snap.tenant,
        snap.version,
        int(probes.shape[1]),  # the embedder's width
        entries,
        embedder_id_of(snap.space),
        partial(hybrid_retriever, builder=builder),
        probes=probes,
        marks=served.marks,
    )
    builder.idle(timeout_s=3600.0)
    return index, counts


def brought_up_to_date(
    client: redis.Redis, settings: Settings, root: Path, tenant: str, space: str, probes: Matrix
) -> dict[str, Any]:
    """The newest snapshot of ``tenant`` under ``root`` that fits what Redis holds, with the
    changes made since it was written applied and written as the next one (after the HNSW graph
    they called for, if any, is built); what to report: its ``path``, ``version`` and the
    number of changes ``applied``. Exits with :data:`NO_SNAPSHOT` (saying why on stderr) when
    there is none, or its changes cannot all be read or applied."""
    default = settings.poisoning_policy
    wanted = wanted_now(client, tenant, space, lambda raw: policy_of(raw, default))
    if wanted is None:
        raise SystemExit("Redis holds no data generation marker yet: nothing to bring up to date")
    try:
        if wanted.space != space:  # reindexed onto another model: the worker reloads it whole
            raise SnapshotError(f"the tenant is served from {wanted.space} now", root / tenant)
        found = open_newest(root, wanted, probes, _refused)
        if found is None:
            raise SnapshotError("none fits what Redis holds", root / tenant)
        snapshot, header, path = found
        changed, changes_id, applied = since(
            client, snapshot, header, wanted, path, lambda raw: policy_of(raw, default)
        )
    except SnapshotError as exc:
        _refused(exc)
        raise SystemExit(NO_SNAPSHOT) from exc
    if applied:
        graph_builder().idle(timeout_s=settings.build_apart_timeout_s)
        path = written(
            root,
            changed,
            space=space,
            epoch=wanted.epoch,
            changes_id=changes_id,
            policy=wanted.policy,
            keep=settings.snapshot_keep,
        )
    return {"path": str(path), "version": changed.version, "applied": applied}


def written(root: Path, snapshot: IndexSnapshot, **header: Any) -> Path:
    """:func:`write_snapshot` of ``snapshot`` under ``root``; a write that fails (a full disk, no
    permission, a file in the way) exits saying so, for the worker's ``build_apart_failed``,
    rather than with a traceback."""
    try:
        return write_snapshot(root, snapshot, **header)
    except (OSError, SnapshotError) as exc:
        raise SystemExit(
            f"cannot write the snapshot of {snapshot.tenant} under {root}: {exc} (check its "
            "free space and permissions)"
        ) from exc


def _refused(exc: SnapshotError) -> None:
    print(f"snapshot {exc.path}: {exc.reason}", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("tenant")
    parser.add_argument("--space", required=True)
    parser.add_argument("--default-space", required=True)
    parser.add_argument("--probes", required=True)
    parser.add_argument("--changes", action="store_true")
    args = parser.parse_args()
    settings = Settings.load()
    if settings.snapshot_dir is None:
        raise SystemExit("no snapshot_dir set: nothing to write the snapshot to")
    client = redis.Redis.from_url(settings.redis_url)
    if args.changes:
        probes = np.load(args.probes, allow_pickle=False)
        found = brought_up_to_date(
            client, settings, settings.snapshot_dir, args.tenant, args.space, probes
        )
        print(json.dumps({**found, "peak_rss_mb": round(peak_rss_mb(), 1)}))
        return
    snap = read_snapshot(client, args.tenant, args.default_space)
    if snap.space != args.space:
        print(f"the tenant is served from {snap.space} now, not {args.space}", file=sys.stderr)
        raise SystemExit(MOVED)
    probes = np.load(args.probes, allow_pickle=False)
    policy = policy_of(snap.policy, settings.poisoning_policy)
    epoch = client.get(keys.EPOCH)
    if epoch is None:
        raise SystemExit("Redis holds no data generation marker yet: nothing to write")
    index, counts = built(snap, policy, probes)
    path = written(
        settings.snapshot_dir,
        index,
        space=snap.space,
        epoch=as_str(epoch),
        changes_id=snap.changes_id,
        policy=policy,
        keep=settings.snapshot_keep,
    )
    print(json.dumps({**counts, "path": str(path), "peak_rss_mb": round(peak_rss_mb(), 1)}))


if __name__ == "__main__":
    main()
