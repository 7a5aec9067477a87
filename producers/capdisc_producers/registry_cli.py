"""The commands that change the registry: ``publish`` and ``watch`` a directory of
manifests, ``import`` a JSONL catalog or an MCP server's tools, ``delete``, ``reindex``, and
``reconcile``."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from capdisc import keys
from capdisc.errors import CapdiscError, EmbeddingError
from capdisc_producers.cli_base import (
    REFUSED,
    access_of,
    caller_of,
    caller_options,
    check_write,
    chosen_tenant,
    command,
    connect,
    fail,
    group,
    interrupt,
    json_option,
    known_tenant,
    publisher_for,
    redis_option,
    report_sync,
    say,
    take_over_option,
    tenant_option,
    timeout_option,
    wait_option,
)
from capdisc_producers.exits import COULD_NOT_RUN, FAILED, exit_status

# Small modules only at the top, as in capdisc_producers.cli.
if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

    from capdisc.registry.policy import SyncPlan
    from capdisc.settings import Settings
    from capdisc_producers.publisher import Publisher
    from capdisc_producers.sync import SyncReport


@command(
    epilog=exit_status(
        "a manifest was rejected, or the indexing workers refused a capability (the rest is "
        "published)"
    )
)
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@redis_option
@tenant_option
@caller_options
@take_over_option
@wait_option
@timeout_option(120.0)
@click.pass_context
def publish(
    ctx: click.Context,
    path: Path,
    redis_url: str | None,
    tenant: str | None,
    take_over: bool,
    wait: bool,
    timeout_s: float,
) -> None:
    """Publish the CAPABILITY.yaml manifests under PATH (upserts, deletes, rejections).
    With --roles/--user, capabilities whose manifest declares no visibility are shared with
    those roles and that user only (else with the whole tenant). An id another source
    published first is rejected, naming that source, unless --take-over."""
    from capdisc.errors import ManifestError
    from capdisc.registry.normalize import visibility_of
    from capdisc_producers.sync import sync_directory

    caller = caller_of(ctx)
    visibility = None
    if caller["roles"] or caller["user"]:
        try:  # else every manifest's event would be refused by the workers and dead-lettered
            visibility = visibility_of(
                caller["roles"], [caller["user"]] if caller["user"] else [], "publish"
            )
        except ManifestError as exc:
            option = "--roles" if str(exc.field).startswith("visibility.roles") else "--user"
            raise click.BadParameter(exc.problem, param_hint=f"'{option}'") from exc

    def run(to: SyncTarget) -> SyncReport:
        return sync_directory(
            to.connection,
            to.publisher,
            path,
            tenant=to.tenant,
            max_bytes=to.settings.manifest_max_bytes,
            wait_s=timeout_s if wait else 0.0,
            visibility=visibility,
            take_over=take_over,
            lock_owner=to.owner,
        )

    report_sync(_sync(ctx, redis_url, tenant, timeout_s, run), wait, timeout_s)


@dataclass(frozen=True)
class SyncTarget:
    """Where a command's sync goes: the stack's settings and Redis, a publisher for the
    tenant, and the owner of the source's lock (one for every attempt of the command)."""

    settings: Settings
    connection: redis.Redis
    publisher: Publisher
    tenant: str
    owner: str


def _sync(
    ctx: click.Context,
    redis_url: str | None,
    tenant: str | None,
    timeout_s: float,
    run: Callable[[SyncTarget], SyncReport],
) -> SyncReport:
    """``run``'s report, run again from the start after each Redis outage
    (:func:`~capdisc_producers.outages.through_outages`), as the same lock owner so that an
    attempt cut short does not lock out the next; the publisher is closed after it."""
    from capdisc_producers.outages import through_outages

    settings, connection = connect(ctx, redis_url)
    chosen = chosen_tenant(ctx, tenant)
    publisher = publisher_for(settings.redis_url, chosen, timeout_s)
    target = SyncTarget(settings, connection, publisher, chosen, f"cli-{uuid.uuid4().hex}")
    try:
        return through_outages(lambda: run(target), connection, say)
    finally:
        publisher.close()


@command(epilog=exit_status(None, ok="stopped when asked (Ctrl-C, SIGTERM)"))
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@redis_option
@tenant_option
@take_over_option
@click.pass_context
def watch(
    ctx: click.Context, path: Path, redis_url: str | None, tenant: str | None, take_over: bool
) -> None:
    """Publish PATH, then re-publish what changes on every edit (debounced)."""
    from capdisc.logs import configure_logging
    from capdisc_producers.watcher import watch_directory

    settings, connection = connect(ctx, redis_url)
    configure_logging(settings.log_level, settings.log_format)
    signal.signal(signal.SIGTERM, interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        watch_directory(
            connection,
            publisher_for(settings.redis_url, chosen_tenant(ctx, tenant), backlog_wait_s=None),
            path,
            tenant=chosen_tenant(ctx, tenant),
            max_bytes=settings.manifest_max_bytes,
            debounce_ms=settings.watch_debounce_ms,
            take_over=take_over,
        )


@command(
    epilog=exit_status(
        "an id the tenant does not hold, a --source that owns nothing there, (--all) a tenant "
        "nothing was ever published to, or a capability the indexing workers refused; the "
        "other ids are deleted"
    )
)
@click.argument("capability_ids", nargs=-1)
@click.option(
    "--source",
    default=None,
    help="Delete every capability of this source (a registry directory's absolute "
    "path, jsonl:PATH, mcp:NAME; `capdisc status --json` lists them)",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Delete every capability the tenant holds, whichever source published it, and "
    "forget its rejected manifests: the tenant's registry emptied (its sessions and "
    "poisoning policy stay). A watcher still syncing a directory publishes it again "
    "at its next change: stop it first",
)
@redis_option
@tenant_option
@timeout_option(60.0)
@click.pass_context
def delete(
    ctx: click.Context,
    capability_ids: tuple[str, ...],
    source: str | None,
    everything: bool,
    redis_url: str | None,
    tenant: str | None,
    timeout_s: float,
) -> None:
    """Delete capabilities by id (tool:web-search ...), a whole --source, or --all of a tenant,
    and wait until the workers applied it. Ids named here are deleted whichever source owns them
    (the output names it); --source deletes only what that source still owns, and forgets a
    registry directory's rejected manifests. A later manifest or import of the same id
    publishes it again; an older event never does."""
    from capdisc.registry.policy import SyncPlan
    from capdisc_producers.sync import forget_manifest_errors

    if everything and (capability_ids or source):
        fail("--all deletes the whole tenant; give no ids and no --source with it")
    settings, connection = connect(ctx, redis_url)
    tenant = chosen_tenant(ctx, tenant)
    if everything:
        _delete_everything(settings, connection, tenant, timeout_s)
        return
    check_write(access_of(ctx), tenant)  # before anything is forgotten, not only before sending
    if source and not capability_ids and Path(source).is_absolute():  # a registry directory
        forgotten = forget_manifest_errors(connection, tenant, Path(source))
        if forgotten:
            click.echo(f"{source}: {forgotten} rejected manifest(s) forgotten")
    ids = _chosen_ids(connection, tenant, capability_ids, source)
    plan = SyncPlan(deletes=ids, taken_over=[] if source else ids)
    report = _publish_ids(settings, connection, plan, tenant, timeout_s, source or "cli")
    _print_outcomes(report, tenant, Verbs("delete", "deleted", "absent", "nothing to delete"))


def _delete_everything(
    settings: Settings, connection: redis.Redis, tenant: str, timeout_s: float
) -> None:
    """``capdisc delete --all``: every stored id of ``tenant`` deleted (one line for the count,
    one for each id not deleted), its rejected manifests forgotten. A tenant that holds nothing
    is already empty: exit 0."""
    from capdisc.registry.policy import SyncPlan
    from capdisc.registry.store import stored_ids
    from capdisc_producers.sync import forget_all_manifest_errors

    known_tenant(connection, tenant)
    check_write(access_of(click.get_current_context()), tenant)
    forgotten = forget_all_manifest_errors(connection, tenant)
    if forgotten:
        click.echo(f"{forgotten} rejected manifest(s) forgotten")
    ids = stored_ids(connection, tenant)
    if not ids:
        click.echo(f"tenant {tenant!r} holds no capabilities: nothing to delete")
        return
    plan = SyncPlan(deletes=ids, taken_over=ids)
    report = _publish_ids(settings, connection, plan, tenant, timeout_s, "cli")
    _print_tally(report, tenant)


def _print_tally(report: SyncReport, tenant: str) -> None:
    """How many of ``--all``'s deletes were applied, each one that was not on a line of its own
    (exit 1 naming them); an id some other writer deleted meanwhile counts as deleted."""
    gone = {"delete", "absent"}
    failed = sorted(
        (str(o.get("capability_id")), str(o.get("decision")), o.get("reason"))
        for o in report.outcomes
        if o.get("decision") not in gone
    )
    for cap_id, decision, reason in failed:
        click.echo(f"{cap_id}: not deleted ({decision})" + (f" ({reason})" if reason else ""))
    click.echo(f"{len(report.outcomes) - len(failed)} capabilities deleted from tenant {tenant!r}")
    click.echo(f"index version {report.index_version}")
    if failed:
        say(f"error: not deleted: {', '.join(cap_id for cap_id, _d, _r in failed)}")
        sys.exit(FAILED)


@command(
    epilog=exit_status(
        "an id the tenant does not hold, a --source that owns nothing there, or (--all) a "
        "tenant nothing was ever published to; the other ids are reindexed"
    )
)
@click.argument("capability_ids", nargs=-1)
@click.option("--source", default=None, help="Reindex every capability of this source")
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="Rebuild the tenant's whole index beside the live one and swap it in "
    "(blue/green: discovery keeps answering from the old index meanwhile); "
    "also how a tenant moves to a new embedding model",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Embed every text again instead of reusing the shared embedding cache",
)
@redis_option
@tenant_option
@timeout_option(3600.0)
@click.pass_context
def reindex(
    ctx: click.Context,
    capability_ids: tuple[str, ...],
    source: str | None,
    everything: bool,
    fresh: bool,
    redis_url: str | None,
    tenant: str | None,
    timeout_s: float,
) -> None:
    """Embed capabilities again: by id, a whole --source, or --all of a tenant (blue/green)."""
    from capdisc.registry.policy import SyncPlan

    if not (capability_ids or source or everything):
        fail("give capability ids, --source, or --all (the whole tenant)")
    settings, connection = connect(ctx, redis_url)
    tenant = chosen_tenant(ctx, tenant)
    if everything:
        if capability_ids or source:
            fail("--all reindexes the whole tenant; give no ids and no --source with it")
        known_tenant(connection, tenant)
        _reindex_all(settings, connection, tenant, fresh, timeout_s)
        return
    ids = _chosen_ids(connection, tenant, capability_ids, source)
    report = _publish_ids(settings, connection, SyncPlan(reindexes=ids), tenant, timeout_s)
    _print_outcomes(
        report, tenant, Verbs("reindex", "reindexed", "not_found", "nothing to reindex")
    )


@dataclass(frozen=True)
class Verbs:
    """How :func:`_print_outcomes` words the outcomes of one command's events."""

    #: The decision of an event that did what was asked, and how its line says so.
    done: str
    done_verb: str
    #: The decision of an event whose capability the tenant does not hold, and what follows.
    missing: str
    missing_note: str


def _print_outcomes(report: SyncReport, tenant: str, verbs: Verbs) -> None:
    """One line per capability (with what the workers said of its owner), then the version;
    exit 1, naming them, when the tenant did not hold some or the workers refused or skipped
    some (the others are done)."""
    missing, failed = [], []
    for outcome in sorted(report.outcomes, key=lambda o: str(o.get("capability_id"))):
        cap_id, decision, reason = (
            str(outcome.get("capability_id")),
            outcome.get("decision"),
            outcome.get("reason"),
        )
        verb = _outcome_verb(str(decision), verbs)
        click.echo(f"{cap_id}: {verb}" + (f" ({reason})" if reason else ""))
        if decision == verbs.missing:
            missing.append(cap_id)
        elif decision != verbs.done:
            failed.append(cap_id)
    click.echo(f"index version {report.index_version}")
    if missing:
        say(f"error: tenant {tenant!r} holds no {', '.join(missing)} (check the ids and --tenant)")
    if failed:
        say(f"error: not {verbs.done_verb}: {', '.join(failed)}")
    if missing or failed:
        sys.exit(FAILED)


def _outcome_verb(decision: str, verbs: Verbs) -> str:
    if decision == verbs.done:
        return verbs.done_verb
    if decision == verbs.missing:
        return f"not found, {verbs.missing_note}"
    if decision in REFUSED:
        return "refused"
    return f"not {verbs.done_verb} ({decision})"


@command(epilog=exit_status(None))
@redis_option
@json_option
@timeout_option(120.0)
@click.pass_context
def reconcile(ctx: click.Context, redis_url: str | None, as_json: bool, timeout_s: float) -> None:
    """Compare the registry with the index now and repair drift (indexing workers also do this
    every reconcile_interval_s): records without a vector are reindexed, orphan vectors go, and
    the shared embedding cache is pruned once it outgrows the registry."""
    from capdisc.client import wait_for_reply

    settings, connection = connect(ctx, redis_url)
    reply_id = f"reconcile-{uuid.uuid4().hex}"
    publisher = publisher_for(settings.redis_url, None)
    try:
        publisher.reconcile(keys.reply(reply_id))
    finally:
        publisher.close()
    popped = wait_for_reply(connection, reply_id, timeout_s)
    if popped is None:
        fail(
            f"no indexing worker reconciled within {timeout_s:.0f} s; is one running? "
            "(capdisc status)"
        )
    if as_json:
        click.echo(json.dumps(popped, indent=2))
        return
    click.echo(
        f"reindexing {popped['missing_vectors']} capabilities without a vector, dropped "
        f"{popped['orphan_vectors']} orphan vectors"
    )
    if popped.get("reindex_deferred"):
        click.echo(
            f"{popped['reindex_deferred']} of them wait: a window of repairs waits at a time "
            "(publish_max_pending_tasks), and the indexing workers send the rest as it is "
            "embedded"
        )
    if popped.get("reindex_batches_resumed"):
        click.echo(
            f"resumed {popped['reindex_batches_resumed']} batches of a full reindex that an "
            "older indexing worker left unsent"
        )
    if popped.get("embedding_cache_pruned"):
        click.echo(
            f"pruned {popped['embedding_cache_pruned']} embedding-cache entries no capability "
            "uses any more"
        )
    for tenant, reason in popped["skipped"].items():
        click.echo(f"skipped {tenant}: {reason}")


def _chosen_ids(
    connection: redis.Redis, tenant: str, capability_ids: tuple[str, ...], source: str | None
) -> list[str]:
    """The ids named, or those ``source`` holds (fail, exit 1, when it holds none, or when ids
    are named in a tenant nothing was published to: applied, their events would create it)."""
    from capdisc.registry.store import stored_by_source

    if capability_ids and source:
        fail("give capability ids or --source, not both")
    if not (capability_ids or source):
        fail("give capability ids, --source, or --all (the whole tenant)")
    if not source:
        known_tenant(connection, tenant)
        return list(capability_ids)
    ids = sorted(stored_by_source(connection, tenant, source))
    if not ids:
        fail(
            f"tenant {tenant!r} has no capabilities from source {source!r} (capdisc status "
            "--json lists each tenant's sources)",
            FAILED,
        )
    return ids


def _publish_ids(
    settings: Settings,
    connection: redis.Redis,
    plan: SyncPlan,
    tenant: str,
    timeout_s: float,
    source: str = "cli",
) -> SyncReport:
    from capdisc_producers.sync import publish_plan

    publisher = publisher_for(settings.redis_url, tenant, timeout_s)
    try:
        report = publish_plan(
            connection,
            publisher,
            plan,
            root=Path("cli"),
            tenant=tenant,
            source=source,
            wait_s=timeout_s,
        )
    finally:
        publisher.close()
    if not report.complete:
        fail(
            f"only {len(report.outcomes)} of {report.sent} events were applied within "
            f"{timeout_s:.0f} s; is an indexing worker running? (capdisc status)"
        )
    return report


def _reindex_all(
    settings: Settings, connection: redis.Redis, tenant: str, fresh: bool, timeout_s: float
) -> None:
    from capdisc_producers.reindex import start_full_reindex, wait_for_swap

    publisher = publisher_for(settings.redis_url, tenant)
    try:
        job, after = start_full_reindex(connection, publisher, tenant, fresh)
    finally:
        publisher.close()
    click.echo(
        f"reindex {job} of tenant {tenant!r} started; discovery keeps serving the live "
        "index until it swaps"
    )
    with click.progressbar(length=1, label="batches", file=sys.stderr) as bar:

        def progress(done: int, total: int) -> None:
            bar.length = max(1, total)
            bar.update(done - bar.pos)

        try:
            version = wait_for_swap(connection, tenant, job, after, timeout_s, progress)
        except EmbeddingError as exc:
            fail(str(exc), FAILED)
    if version is None:
        fail(
            f"reindex {job} did not swap in within {timeout_s:.0f} s; it goes on building "
            "(capdisc status shows it); is an indexing worker running?"
        )
    click.echo(f"reindex {job} swapped in at index version {version}")


@group("import")
def import_group() -> None:
    """Bring whole catalogs in from elsewhere."""


@import_group.command(
    "jsonl",
    epilog=exit_status(
        "no line could be imported: every line was refused or rejected (lines refused while "
        "others were imported are listed, and the exit status is 0)",
        "a usage error, or the command could not run: no stack found, Redis unreachable, a "
        "token refused, or the workers did not apply it in time",
    ),
)
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--source",
    default=None,
    help="Name of this source (default: jsonl:PATH); a "
    "re-import of the same source deletes what the file no longer has",
)
@wait_option
@timeout_option(600.0)
@redis_option
@tenant_option
@take_over_option
@click.pass_context
def import_jsonl_cmd(
    ctx: click.Context,
    path: Path,
    source: str | None,
    wait: bool,
    timeout_s: float,
    redis_url: str | None,
    tenant: str | None,
    take_over: bool,
) -> None:
    """Import a tools.jsonl catalog (one tool a line: id, name, description, parameters,
    category) as capabilities; only what changed is sent.

    Each line is read on its own. A line that is no valid tool is refused and listed on stderr
    (FILE:LINE: the reason, naming the field); the other lines are imported. Harmless problems
    of catalogs written for other programs are repaired and each repair is printed as a
    warning with its line: zero-width characters removed, schema type names of other languages
    read as JSON Schema types (dict: object, float: number, String: string, any: no type), a
    schema nested deeper than 32 levels cut to its top 32, a description cut to 4096
    characters, a schema that is no object left out.
    """
    from capdisc_producers.importer import import_jsonl

    with click.progressbar(length=0, label="events", file=sys.stderr) as bar:

        def progress(stage: str, count: int) -> None:
            if stage == "sent":
                bar.length = (bar.length or 0) + count
            bar.label = "applied" if stage == "applied" else "sent"
            if stage == ("applied" if wait else "sent"):
                bar.update(count)

        def run(to: SyncTarget) -> SyncReport:
            return import_jsonl(
                to.connection,
                to.publisher,
                path,
                tenant=to.tenant,
                source=source,
                wait_s=timeout_s if wait else 0.0,
                progress=progress,
                take_over=take_over,
                lock_owner=to.owner,
            )

        report = _sync(ctx, redis_url, tenant, timeout_s, run)
    report_sync(report, wait, timeout_s, partial_ok=True)


@import_group.command(
    "mcp",
    epilog=exit_status(
        "the indexing workers rejected or refused a tool (the rest is imported)",
        COULD_NOT_RUN + ", or the MCP server could not be reached or listed",
    ),
)
@click.option("--url", default=None, help="Streamable HTTP endpoint, e.g. http://host:8000/mcp")
@click.option(
    "--command",
    "command",
    default=None,
    help="Command that runs the server over stdio, e.g. 'uvx mcp-server-time'",
)
@click.option(
    "--name",
    "server_name",
    default=None,
    help="Prefix of the capability names (default: the server's own name)",
)
@wait_option
@timeout_option(60.0)
@redis_option
@tenant_option
@take_over_option
@click.pass_context
def import_mcp_cmd(
    ctx: click.Context,
    url: str | None,
    command: str | None,
    server_name: str | None,
    wait: bool,
    timeout_s: float,
    redis_url: str | None,
    tenant: str | None,
    take_over: bool,
) -> None:
    """Publish a live MCP server's tools as capabilities; a re-run sends only what changed and
    deletes tools the server no longer has."""
    from capdisc_producers.mcp_import import Changed, import_mcp

    changed: list[Changed] = []

    def run(to: SyncTarget) -> SyncReport:  # again, listing the server again, after an outage
        report, changed[:] = import_mcp(
            to.connection,
            to.publisher,
            url=url,
            command=command,
            tenant=to.tenant,
            server_name=server_name,
            wait_s=timeout_s if wait else 0.0,
            timeout_s=timeout_s,
            take_over=take_over,
            max_message_bytes=to.settings.mcp_max_result_bytes,
            lock_owner=to.owner,
        )
        return report

    try:
        report = _sync(ctx, redis_url, tenant, timeout_s, run)
    except CapdiscError as exc:
        fail(str(exc))
    for change in changed:
        click.echo(
            f"changed: {change.capability_id} (content hash {change.old_hash[:12]} -> "
            f"{change.new_hash[:12]})"
        )
    report_sync(report, wait, timeout_s)
