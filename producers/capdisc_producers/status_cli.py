"""``capdisc status``: the workers, queues, indexes, snapshots, dead letters and flags of
the stack, rendered for a person (or as JSON), and ``--check``'s health verdict."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from capdisc.errors import CapdiscError
from capdisc_producers.access import Access
from capdisc_producers.cli_base import command, connect, json_option, redis_option
from capdisc_producers.exits import FAILED, exit_status

# Small modules only at the top, as in capdisc_producers.cli.
if TYPE_CHECKING:
    pass


@command(
    epilog=exit_status(
        "(--check) a check failed: Redis did not answer (or no stack was found), or no live "
        "discovery worker or no live indexing worker was seen",
        "a usage error, or (without --check) the stack could not be reached",
    )
)
@redis_option
@json_option
@click.option(
    "--check",
    is_flag=True,
    help="A probe: check that Redis answers and that at least one discovery worker and one "
    "indexing worker are live (a heartbeat within worker_stale_after_s); print one line per "
    "failed check. Exit 0 when all pass, 1 otherwise",
)
@click.pass_context
def status(ctx: click.Context, redis_url: str | None, as_json: bool, check: bool) -> None:
    """Index version, capabilities per kind, workers seen, queue depths; with --check, whether
    the stack can serve (for probes: see the exit codes)."""
    from capdisc.status import collect_status

    if check:
        _check_health(ctx, redis_url, as_json)
        return
    settings, connection = connect(ctx, redis_url)
    report = collect_status(connection, settings.worker_stale_after_s, settings.poisoning_policy)
    click.echo(json.dumps(report, indent=2) if as_json else _render_status(report))


#: How long ``status --check`` waits for Redis to connect and to answer.
CHECK_TIMEOUT_S = 5.0


def _check_health(ctx: click.Context, redis_url: str | None, as_json: bool) -> None:
    """``status --check``: the failed checks, one line each (or one JSON object); exit 1 when
    any failed."""
    import redis

    from capdisc.status import health_failures, live_workers

    workers: list[dict[str, Any]] = []
    try:
        settings = connect(ctx, redis_url)[0]
        with redis.Redis.from_url(
            settings.redis_url,
            socket_connect_timeout=CHECK_TIMEOUT_S,
            socket_timeout=CHECK_TIMEOUT_S,
        ) as connection:
            connection.ping()
            workers = live_workers(connection, settings.worker_stale_after_s)
        failed = health_failures(workers, settings.worker_stale_after_s)
    except (CapdiscError, redis.RedisError) as exc:
        failed = [f"redis: {_unreachable(ctx, exc)}"]
    kinds = {kind: sum(w["kind"] == kind for w in workers) for kind in ("discovery", "indexing")}
    if as_json:
        click.echo(json.dumps({"healthy": not failed, "failed": failed, "workers": kinds}))
    elif not failed:
        click.echo(
            f"healthy: Redis answers; live workers: discovery {kinds['discovery']}, "
            f"indexing {kinds['indexing']}"
        )
    for line in [] if as_json else failed:
        click.echo(f"failed: {line}")
    if failed:
        sys.exit(FAILED)


def _unreachable(ctx: click.Context, exc: Exception) -> str:
    """Why Redis did not answer, naming it (its password masked) when it was found."""
    from capdisc.rawsettings import mask_url

    access: Access | None = ctx.meta.get("capdisc.access")
    if access is None:
        return str(exc)
    return f"{mask_url(access.redis_url)} did not answer ({exc}); is the stack running? (make up)"


def _dead_letters(report: dict[str, Any]) -> str:
    """How many dead letters there are, what they hold, and how many the bounds dropped."""
    count, held = report["dead_letters"], int(report.get("dead_letter_bytes", 0))
    dropped = int(report.get("dead_letters_dropped", 0))
    about = [f"{held / 1_000_000:.1f} MB" if held >= 100_000 else f"{held} bytes"] if count else []
    if dropped:
        about.append(f"{dropped} older dropped")
    return f"{count} ({', '.join(about)})" if about else str(count)


def _render_status(report: dict[str, Any]) -> str:
    lines = []
    for tenant, info in report["tenants"].items():
        kinds = ", ".join(f"{k} {n}" for k, n in info["by_kind"].items()) or "empty"
        lines.append(
            f"tenant {tenant}: index version {info['index_version']}, "
            f"{info['capabilities']} capabilities ({kinds})"
        )
        lines += [f"  rejected manifest {p}: {e}" for p, e in info["manifest_errors"].items()]
        lines += [
            f"  unreadable record {i}: not served (capdisc delete {i} removes it)"
            for i in info.get("unreadable_records", ())
        ]
        lines += [
            f"  not in the vector store yet {cap_id} (the reconciler writes it again): {why}"
            for cap_id, why in info.get("store_unwritten", {}).items()
        ]
        lines += _poisoning_lines(tenant, info.get("poisoning"))
        if info.get("repair_backlog_tasks"):
            lines.append(
                f"  repairs waiting their turn: {info['repair_backlog_tasks']} tasks of records "
                "without a vector (sent as the ones before are embedded)"
            )
        if info.get("reindex"):
            job = info["reindex"]
            lines.append(
                f"  reindex {job['job']} building into {job['target']}: "
                f"{job['done']}/{job['batches']} batches"
            )
    if not report["tenants"]:
        lines.append("no registry yet: publish one with `capdisc publish PATH`")
    workers = [
        f"{w['id']}" + (f" (serving {_versions(w)})" if w["kind"] == "discovery" else "")
        for w in report["workers"]
    ]
    lines.append("workers: " + (", ".join(workers) or "none seen"))
    lines += [line for worker in report["workers"] for line in _snapshot_lines(worker)]
    if report.get("supervised"):
        lines.append(
            "capdisc up children: "
            + ", ".join(_child(name, child) for name, child in report["supervised"].items())
        )
        lines += _silent_children(report["supervised"], report["workers"])
    queues = ", ".join(f"{name} {depth}" for name, depth in report["queues"].items())
    lines.append(
        f"queues: {queues}; pending events {report['pending_events']}; dead letters "
        f"{_dead_letters(report)}; embedding calls {report['embedding_calls']}"
    )
    last = report.get("last_reconcile")
    if last:
        age_s = max(0, int(time.time() - last["at_ms"] / 1000))
        deferred = last.get("reindex_deferred", 0)
        lines.append(
            f"last reconcile {age_s} s ago: {last['missing_vectors']} reindexed"
            + (f" ({deferred} of them sent as the window drains)" if deferred else "")
            + f", {last['orphan_vectors']} orphan vectors dropped"
        )
    return "\n".join(lines)


def _child(name: str, child: dict[str, Any]) -> str:
    """``discovery pid 12 (1 restart, last 40 s ago; last exit: killed by SIGKILL)``."""
    state = f"pid {child['pid']}" if child.get("alive") else "down, restarting"
    restarts = int(child.get("restarts", 0))
    if not restarts and not child.get("last_exit"):
        return f"{name} {state} (no restarts)"
    counted = f"{restarts} restart{'s' if restarts != 1 else ''}"
    when = child.get("last_restart_ms")
    ago = f", last {max(0, int(time.time() - when / 1000))} s ago" if when else ""
    return f"{name} {state} ({counted}{ago}; last exit: {child.get('last_exit')})"


def _silent_children(
    children: dict[str, dict[str, Any]], workers: list[dict[str, Any]]
) -> list[str]:
    """One line per worker ``capdisc up`` runs that is alive but sends no heartbeat: one
    starting, or one stopped or hung, which serves nothing and which ``up`` does not restart."""
    from capdisc.status import NEEDED_WORKERS

    beating = {w.get("pid") for w in workers}
    return [
        f"  {name} pid {child['pid']} is running but sent no recent heartbeat: still "
        f"starting, or stopped or hung (it serves nothing meanwhile); if this lasts, "
        f"`kill -CONT {child['pid']}` if it was stopped, else `kill -9 {child['pid']}` "
        "and capdisc up starts another"
        for name, child in children.items()
        if name in NEEDED_WORKERS and child.get("alive") and child.get("pid") not in beating
    ]


def _snapshot_lines(worker: dict[str, Any]) -> list[str]:
    """``  discovery@h:12: snapshot of acme v42 written 3 min ago (12.5 MB)``: one line per tenant
    the worker last wrote a snapshot of to its ``snapshot_dir``, one per tenant whose last write
    failed (with why and what to do), one saying so when it has one and wrote nothing yet; none
    without one (or for a worker of another kind)."""
    written = worker.get("snapshots")
    if written is None:
        return []
    failed = worker.get("snapshots_failed") or {}
    now = time.time()
    lines = [
        f"  {worker['id']}: snapshot of {tenant} v{snap['index_version']} written "
        f"{_ago(now - snap['written_at_unix_s'])} ago ({snap['megabytes']:.1f} MB)"
        for tenant, snap in sorted(written.items())
    ]
    lines += [
        f"  {worker['id']}: snapshot of {tenant} v{fail['index_version']} FAILED "
        f"{_ago(now - fail['failed_at_unix_s'])} ago: {fail['error']} (the worker serves on; a "
        "restart loads from Redis until one is written: check the snapshot_dir's free space "
        "and permissions, the next change retries)"
        for tenant, fail in sorted(failed.items())
    ]
    return lines or [f"  {worker['id']}: no snapshot written yet (snapshot_dir set)"]


def _ago(seconds: float) -> str:
    """``45 s``, ``3 min``, ``2 h``, ``4 d``: a duration in its largest whole unit, spelled as the
    other ages of the status are (never negative: a worker's clock may run ahead)."""
    whole = max(0, int(seconds))
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if whole >= size:
            return f"{whole // size} {unit}"
    return f"{whole} s"


def _versions(worker: dict[str, Any]) -> str:
    """``acme@12 (graph, from a snapshot), beta@3``: each tenant's served version, which
    tenants a large catalog's HNSW graph serves (the others: the exact scan) and which were
    loaded from a snapshot on disk (the others: from Redis)."""
    searches = worker.get("searches", {})
    loaded = worker.get("loaded_from", {})
    served = []
    for tenant, version in worker.get("versions", {}).items():
        notes = ["graph"] if searches.get(tenant) == "graph" else []
        notes += ["from a snapshot"] if loaded.get(tenant) == "snapshot" else []
        served.append(f"{tenant}@{version}" + (f" ({', '.join(notes)})" if notes else ""))
    return ", ".join(served) or "nothing yet"


def _poisoning_lines(tenant: str, info: dict[str, Any] | None) -> list[str]:
    """The status line of a tenant's poisoning policy and flags (none when nothing is flagged
    and the policy is the workers' default)."""
    if not info or not (info["policy_set"] or info["capabilities"]):
        return []
    line = (
        f"  poisoning policy {info['policy']}"
        + ("" if info["policy_set"] else " (default)")
        + f": {info['flagged']} flagged, {info['pending']} pending, "
        f"{info['approved']} approved"
    )
    unapproved = info["flagged"] + info["pending"]
    if unapproved:
        withheld = " (not served until approved)" if info["policy"] == "quarantine" else ""
        line += f"{withheld}; review: capdisc flags list --tenant {tenant}"
    return [line]
