"""``capdisc session``: an agent session's working set, shown, called, exported, imported
and watched."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from capdisc.errors import CapdiscError, ConfigError
from capdisc_producers.cli_base import (
    caller_options,
    client_of,
    connect,
    exit_code,
    fail,
    group,
    json_option,
    redis_option,
    tenant_option,
)
from capdisc_producers.exits import COULD_NOT_RUN, exit_status

# Small modules only at the top, as in capdisc_producers.cli.
if TYPE_CHECKING:
    from capdisc.client import Client


@group()
def session() -> None:
    """An agent session's working set: show, record calls, export and import."""


#: The exit status of a session command that names an existing session.
#: Every session command exits 1 for a tenant nothing was published to (the workers refuse it).
UNKNOWN_TENANT = "the tenant is unknown"
SESSION_EXITS = exit_status(f"no such session (never created, or expired), or {UNKNOWN_TENANT}")


@session.command("show", epilog=SESSION_EXITS)
@click.argument("session_id")
@caller_options
@redis_option
@tenant_option
@json_option
@click.pass_context
def session_show(
    ctx: click.Context, session_id: str, redis_url: str | None, tenant: str | None, as_json: bool
) -> None:
    """The working set: bound capabilities with their last use, and the always-include ones."""
    working = _session_client(ctx, redis_url, tenant, lambda c: c.working_set(session_id))
    if as_json:
        click.echo(json.dumps(working, indent=2))
        return
    click.echo(f"session {working['session']} (profile {working['profile'] or 'none'})")
    click.echo(f"always include: {', '.join(working['always_include']) or 'nothing'}")
    for entry in working["bound"]:
        age_s = max(0, int(time.time() - entry["last_used_ms"] / 1000))
        click.echo(f"  {entry['id']:<40} last used {age_s} s ago, used {entry['use_count']}x")


@session.command(
    "call",
    epilog=exit_status(UNKNOWN_TENANT, COULD_NOT_RUN + ", or --args is not JSON"),
)
@click.argument("session_id")
@click.argument("tool_id")
@click.option("--args", "arguments", default=None, help="The call's arguments as JSON")
@caller_options
@redis_option
@tenant_option
@json_option
@click.pass_context
def session_call(
    ctx: click.Context,
    session_id: str,
    tool_id: str,
    arguments: str | None,
    redis_url: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Record that the agent executed TOOL_ID (the loop guard may take it away)."""
    try:
        parsed = json.loads(arguments) if arguments else None
    except ValueError as exc:
        fail(f"--args is not valid JSON: {exc}")
    except RecursionError:
        fail("--args is not valid JSON: nested too deeply")
    outcome = _session_client(
        ctx, redis_url, tenant, lambda c: c.record_tool_call(session_id, tool_id, parsed)
    )
    if as_json:
        click.echo(json.dumps(outcome, indent=2))
        return
    if outcome["loop_detected"]:
        click.echo(
            f"loop detected; {tool_id} {'evicted' if outcome['evicted'] else 'kept'}: "
            f"{outcome['guidance']}"
        )
    else:
        click.echo(f"recorded {tool_id}")


@session.command("export", epilog=SESSION_EXITS)
@click.argument("session_id")
@caller_options
@redis_option
@tenant_option
@click.pass_context
def session_export(
    ctx: click.Context, session_id: str, redis_url: str | None, tenant: str | None
) -> None:
    """Print the working set as JSON (for `capdisc session import`)."""
    exported = _session_client(ctx, redis_url, tenant, lambda c: c.export_session(session_id))
    click.echo(json.dumps(exported, indent=2))


@session.command(
    "watch",
    epilog=exit_status(
        UNKNOWN_TENANT,
        COULD_NOT_RUN + " (a token whose roles do not see every capability may not watch)",
    ),
)
@click.argument("session_id")
@click.option(
    "--after",
    default="0-0",
    show_default=True,
    callback=lambda _ctx, param, value: _event_id(param, value),
    help="Print the events after this event id (0-0: from the oldest one kept; $: only new ones)",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many events (default: follow until interrupted)",
)
@caller_options
@redis_option
@tenant_option
@json_option
@click.pass_context
def session_watch(
    ctx: click.Context,
    session_id: str,
    after: str,
    count: int | None,
    redis_url: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Follow the session's working-set changes as they happen (bound, refreshed, evicted,
    restored, loop_detected, redundant_search, imported; ended when it is dropped among too
    many live sessions, restarted when it starts again after it ended or expired: its working
    set was emptied), one line each (--json: one JSON object a line), until interrupted. The
    session need not have started yet. Redis going away while it follows is waited out (up to
    5 minutes)."""
    from capdisc_producers.outages import WAIT_LIMIT_S

    def follow(client: Client) -> None:
        events = client.watch_session(session_id, after=after, patience_s=WAIT_LIMIT_S)
        for printed, event in enumerate(events, 1):
            click.echo(json.dumps(event) if as_json else _event_line(event))
            if count is not None and printed >= count:
                return

    with contextlib.suppress(KeyboardInterrupt):
        _session_client(ctx, redis_url, tenant, follow)


def _event_id(param: click.Parameter, value: str) -> str:
    """``--after`` checked as the client checks it: a usage error (exit 2) naming it."""
    from capdisc.client import event_id

    try:
        return event_id(value)
    except ConfigError as exc:
        problem = str(exc).replace("watch_session after ", "")
        raise click.BadParameter(problem, param=param) from exc


def _event_line(event: dict[str, str]) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(int(event.get("at_ms") or 0) / 1000))
    what = "  ".join(part for part in (event.get("tool"), event.get("reason")) if part)
    return f"{event['id']}  {at}  {event['type']:<16} {what}".rstrip()


@session.command(
    "import",
    epilog=exit_status(UNKNOWN_TENANT, COULD_NOT_RUN + ", or PATH is no exported session"),
)
@click.argument("session_id")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@caller_options
@redis_option
@tenant_option
@click.pass_context
def session_import(
    ctx: click.Context, session_id: str, path: Path, redis_url: str | None, tenant: str | None
) -> None:
    """Start SESSION_ID with the working set exported to PATH (a subagent, a compaction)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        fail(f"{path} is not an exported session: {exc}")
    except RecursionError:
        fail(f"{path} is not an exported session: nested too deeply")
    working = _session_client(ctx, redis_url, tenant, lambda c: c.import_session(session_id, data))
    click.echo(f"session {session_id}: {len(working['bound'])} capabilities bound")


def _session_client(
    ctx: click.Context, redis_url: str | None, tenant: str | None, action: Any
) -> Any:
    connection = connect(ctx, redis_url)[1]
    with client_of(ctx, connection, tenant) as client:
        try:
            return action(client)
        except CapdiscError as exc:
            fail(str(exc), exit_code(exc))
