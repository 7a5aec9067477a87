"""The ``capdisc`` command: run the embedded stack, publish and watch registries, discover.

This module holds the group and the commands an agent's side uses (``up``, ``discover``,
``mcp``); the others live in a module each, by what they act on (:mod:`.registry_cli`,
:mod:`.status_cli`, :mod:`.session_cli`, :mod:`.dlq_cli`, :mod:`.flags_cli`, and
:mod:`.bench_cli` and :mod:`.token_cli`, loaded when named), over what they share
(:mod:`.cli_base`).

Commands run from the project directory find a running stack through ``.capdisc/stack.json``;
``--redis-url`` or ``CAPDISC_REDIS_URL`` point them anywhere else. Every command's help ends
with what its exit codes mean (:mod:`capdisc_producers.exits`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from capdisc.agents.formatnames import TOOL_FORMATS
from capdisc.errors import CapdiscError, RedisCredentialsError
from capdisc_producers.access import command_settings
from capdisc_producers.cli_base import (
    CheckedGroup,
    access_of,
    caller_of,
    caller_options,
    chosen_tenant,
    client_of,
    connect,
    exit_code,
    fail,
    json_option,
    redis_of,
    redis_option,
    settings_of,
    stack_option,
    tenant_option,
)
from capdisc_producers.dlq_cli import dlq
from capdisc_producers.exits import COULD_NOT_RUN, exit_status
from capdisc_producers.flags_cli import approve, flags_group, policy_group
from capdisc_producers.registry_cli import delete, import_group, publish, reconcile, reindex, watch
from capdisc_producers.session_cli import session
from capdisc_producers.status_cli import status

# Start-up stays short (``benchmarks/cli_startup.py``): this module, and the modules of
# the commands it adds (``cli_base``, ``registry_cli``, ``status_cli``, ``session_cli``,
# ``dlq_cli``, ``flags_cli``), import click and small modules only at the top. Everything else
# (redis, the client, the settings, the registry, logging, the producers) is imported inside
# the command that uses it, and ``bench`` and ``token`` are loaded when named
# (:class:`~capdisc_producers.cli_base.CheckedGroup`). ``tests/unit/test_cli_startup.py``
# checks it.
if TYPE_CHECKING:
    from capdisc.client import Answer


#: The commands of :data:`cli` defined in other modules, imported when used.
LAZY_COMMANDS = {
    "bench": (
        "capdisc_producers.bench_cli",
        "bench",
        "Benchmarks of the discovery engine.",
    ),
    "token": (
        "capdisc_producers.token_cli",
        "token",
        "Identity tokens: keys to sign them, and tokens for callers (workers with auth on serve "
        "each request as the holder of its token).",
    ),
}


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: ``capdisc VERSION``, the version of the installed package."""
    if not value or ctx.resilient_parsing:
        return
    from importlib import metadata

    try:
        version = metadata.version("capdisc")
    except metadata.PackageNotFoundError:
        fail(
            "capdisc is not installed as a package, so it has no version: install it "
            "(pip install -e . in the project, or make install)"
        )
    click.echo(f"capdisc {version}")
    ctx.exit(0)


@click.group(
    cls=CheckedGroup,
    lazy_commands=LAZY_COMMANDS,
    epilog=exit_status(
        "the operation failed, or it named something capdisc does not hold (an id, a "
        "session, a source, a tenant, a profile, a key; the other names are still acted on). Each "
        "command's help says what the codes mean for it"
    ),
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print `capdisc VERSION` (the installed package's) and exit",
)
@click.option(
    "--settings",
    "settings_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="YAML settings file (default: CAPDISC_SETTINGS_FILE)",
)
@stack_option
@click.pass_context
def cli(ctx: click.Context, settings_file: Path | None) -> None:
    """capdisc: capability discovery for LLM agents."""
    ctx.obj = {"settings_file": settings_file}
    if ctx.invoked_subcommand in CLIENT_COMMANDS:
        ctx.obj |= {"settings": None, "client_settings": command_settings(settings_file)}
        return
    from capdisc.logs import configure_logging
    from capdisc.settings import Settings

    settings = Settings.load(path=settings_file)
    configure_logging(
        "WARNING" if settings.log_level == "INFO" else settings.log_level,
        "console" if sys.stderr.isatty() else settings.log_format,
    )
    ctx.obj |= {"settings": settings, "client_settings": settings.client_settings()}


# the commands defined in modules of their own
for _command in (publish, watch, import_group, delete, reindex, reconcile, status, session):
    cli.add_command(_command)
for _command in (dlq, approve, flags_group, policy_group):
    cli.add_command(_command)


#: Commands that only ask the stack: they log nothing and read only the client settings
#: (:class:`~capdisc.rawsettings.ClientSettings`), so they start without the logging library
#: and without building the settings (pydantic).
CLIENT_COMMANDS = frozenset({"discover"})


@cli.command(
    epilog=exit_status(
        None,
        "a usage error, or the stack could not start or stopped on a failure (the reason is "
        "printed)",
        ok="stopped when asked (SIGINT, SIGTERM, SIGHUP)",
    )
)
@click.option(
    "--registry",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("examples/registry"),
    show_default=True,
    help="Directory of CAPABILITY.yaml manifests to publish and watch",
)
@click.pass_context
def up(ctx: click.Context, registry: Path) -> None:
    """Run the embedded stack: Redis, workers, and a watcher on REGISTRY. Workers and Redis
    that exit are restarted. SIGINT (Ctrl-C), SIGTERM or SIGHUP stop everything (exit 0)."""
    from capdisc_producers.stack import run_up

    run_up(Path.cwd(), registry, settings_of(ctx), os.environ, click.echo)
    click.echo("capdisc stopped.")


@cli.command(
    "discover",
    epilog=exit_status(
        "the tenant is unknown: nothing was ever published to it, or the --profile named is not "
        "configured",
        COULD_NOT_RUN + ", or the discovery workers refused the request (the reason is printed)",
    ),
)
@click.argument("query")
@click.option("--limit", type=int, default=None, help="How many capabilities at most")
@click.option("--kind", type=click.Choice(["tool", "skill", "extension", "channel"]))
@click.option("--category", default=None, help="Only this category")
@click.option("--tag", "tags", multiple=True, help="Only capabilities with this tag (repeatable)")
@click.option("--only-available", is_flag=True, help="Leave out installable capabilities")
@click.option(
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a discovery setting for this call, e.g. tier1_top_k=8",
)
@click.option("--min-version", type=int, default=0, help="Wait until this index version")
@click.option("--session", default=None, help="Agent session: the matches join its working set")
@click.option("--profile", default=None, help="Agent profile (allowlist, expert tools, budgets)")
@click.option(
    "--format",
    "tool_format",
    type=click.Choice(TOOL_FORMATS),
    default=None,
    help="Print the answer's tool definitions in this format, as JSON (with --json: the whole "
    "answer, whose `tools` they are): the matches, or a session's working set, and the "
    "meta-tool",
)
@caller_options
@redis_option
@tenant_option
@json_option
@click.pass_context
def discover_cmd(
    ctx: click.Context,
    query: str,
    limit: int | None,
    kind: str | None,
    category: str | None,
    tags: tuple[str, ...],
    only_available: bool,
    options: tuple[str, ...],
    min_version: int,
    session: str | None,
    profile: str | None,
    tool_format: str | None,
    redis_url: str | None,
    tenant: str | None,
    as_json: bool,
) -> None:
    """Ask the discovery workers which capabilities QUERY needs (the three tiers)."""
    connection = redis_of(ctx, redis_url)
    with client_of(ctx, connection, tenant) as client:
        answer = client.discover(
            query,
            limit=limit,
            kind=kind,
            category=category,
            tags=list(tags),
            only_available=only_available,
            options=_parse_options(options),
            min_version=min_version,
            session=session,
            profile=profile,
            tool_format=tool_format,
        )
    behind = _behind_warning(answer.index_version, min_version)
    if behind:
        click.echo(behind, err=True)
    if as_json:
        click.echo(json.dumps(answer.to_dict(), indent=2))
    elif tool_format:
        click.echo(json.dumps(answer.tools, indent=2))
    else:
        click.echo(_render_answer(answer))


def _behind_warning(served: int, asked: int) -> str | None:
    """What to say when an answer comes from an older index version than ``--min-version``
    asked for (the worker waited as long as it may, then answered with what it serves)."""
    if served >= asked:
        return None
    return (
        f"warning: index version {asked} was not served in time; this answer is from version "
        f"{served} (capdisc status shows what the workers serve)"
    )


def _parse_options(options: tuple[str, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep:
            raise click.BadParameter(f"{option!r} is not KEY=VALUE", param_hint="--option")
        try:
            parsed[key.strip()] = json.loads(value)
        except (ValueError, RecursionError):  # text, or JSON nested too deeply to be an option
            parsed[key.strip()] = value
    return parsed


def _render_answer(answer: Answer) -> str:
    tokens = answer.tokens
    lines = [
        f"index version {answer.index_version} · {len(answer.capabilities)} capabilities"
        f" · {tokens.get('total', 0)} tokens (tier 0 {tokens.get('tier0', 0)}, tier 1 "
        f"{tokens.get('tier1', 0)}, tier 2 {tokens.get('tier2', 0)}) · "
        f"{answer.took_ms:.1f} ms in {answer.worker}"
        + (f" (the model {answer.model_ms:.1f} ms)" if answer.model_ms else ""),
        "",
    ]
    if answer.abstained:
        lines.append("nothing in the registry fits this request")
    for rank, cap in enumerate(answer.capabilities, start=1):
        lines.append(
            f"{rank:>2}. [tier {cap['tier']}] {cap['id']:<40} score {cap['score']:6.3f}"
            f"  relevance {cap.get('relevance', 0.0):.2f}" + _flagged(cap)
        )
    lines += _render_session(answer.session)
    tiers = answer.raw.get("tiers", {})
    for name in ("tier0", "tier1", "tier2"):
        if tiers.get(name):
            lines += ["", f"── {name.replace('tier', 'tier ')} " + "─" * 60, tiers[name]]
    return "\n".join(lines)


def _render_session(session: dict[str, Any] | None) -> list[str]:
    if not session:
        return []
    lines = ["", f"session {session['id']}: bound {', '.join(session['bound']) or 'nothing'}"]
    if session.get("evicted"):
        lines.append(f"  evicted {', '.join(session['evicted'])}")
    if session.get("redundant_search"):
        lines.append(f"  redundant search: {session['note']}")
    for cap in session.get("installable", []):
        lines.append(f"  installable (not available yet): {cap['id']}")
    return lines


@cli.command("mcp", epilog=exit_status(None, ok="the server stopped when asked"))
@click.option(
    "--http",
    "http_port",
    type=click.IntRange(1, 65535),
    default=None,
    metavar="PORT",
    help="Serve streamable HTTP on this port (default: stdio)",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--profile", default=None, help="Agent profile of every session served")
@click.option(
    "--import-token",
    default=None,
    metavar="TOKEN",
    help="Token with the write grant that an upstream MCP server's changed tools are "
    "re-imported with (default: CAPDISC_MCP_IMPORT_TOKEN, else --token). Prefer the "
    "variable: a command line is visible to other users",
)
@caller_options
@redis_option
@tenant_option
@click.pass_context
def mcp_cmd(
    ctx: click.Context,
    http_port: int | None,
    host: str,
    profile: str | None,
    import_token: str | None,
    redis_url: str | None,
    tenant: str | None,
) -> None:
    """Serve discover_capabilities as an MCP server (stdio, or streamable HTTP with --http);
    each MCP session is a capdisc session. With auth on, stdio asks as the holder of --token
    (verified at start), and HTTP requires `Authorization: Bearer TOKEN` on every request and
    asks as its holder. When an upstream MCP server's tools change, they are imported again
    with --import-token, which needs the write grant (said at start when it has not)."""
    from capdisc.identity.gate import Gate
    from capdisc.redisclock import RedisClock
    from capdisc_producers.mcp_server import ServerAuth, serve
    from capdisc_producers.mcp_server import log as mcp_log

    settings, connection = connect(ctx, redis_url)
    clock = RedisClock()
    if import_token:
        settings = settings.with_changes(mcp_import_token=import_token)
    access = access_of(ctx)
    required = access.auth if access.auth is not None else access.keys_file is not None
    gate = (
        Gate.from_settings(
            settings.with_changes(auth=True, auth_keys_file=access.keys_file),
            mcp_log,
            clock=lambda: clock.now_ms(connection) / 1000,  # tokens' times on Redis's clock
        )
        if access.keys_file is not None and required
        else Gate(None)
    )
    serve(
        settings,
        tenant=chosen_tenant(ctx, tenant),
        profile=profile,
        host=host,
        port=http_port,
        access=ServerAuth(access.token, gate, required),
        tenant_given=tenant is not None,
        **caller_of(ctx),
    )


# -- tool poisoning: flags, approvals, policy ------------------------------------------------


def _flagged(cap: dict[str, Any]) -> str:
    """``  [flagged: rule, ...]`` after a discovered capability the scan flagged."""
    rules = list(dict.fromkeys(str(f.get("rule")) for f in cap.get("flags") or ()))
    return f"  [flagged: {', '.join(rules)}]" if rules else ""


def main() -> None:
    try:
        cli(standalone_mode=True)
    except CapdiscError as exc:
        fail(str(exc), exit_code(exc))
    except Exception as exc:
        # redis is imported by the commands that use it: an error of it cannot come otherwise.
        redis = sys.modules.get("redis")
        cause = _sent_task_cause(exc)
        if redis is not None and isinstance(cause, redis.AuthenticationError):
            fail(str(RedisCredentialsError.refused(cause)))
        if redis is not None and isinstance(cause, redis.ConnectionError | redis.TimeoutError):
            fail(f"cannot reach Redis ({cause}); {_redis_down_hint()}{_tls_hint(cause)}")
        if redis is not None and isinstance(cause, redis.exceptions.NoPermissionError):
            fail(
                f"Redis refused this command to the ACL user of capdisc's Redis URL ({cause}); "
                "run it as a user whose ACL allows it: infra/README.md says which user each "
                "command needs (capdisc-producer sends events, capdisc-monitor reads status, "
                "dead letters and flags, capdisc-client asks the discovery workers)"
            )
        raise


def _sent_task_cause(exc: Exception) -> BaseException:
    """The Redis error under kombu's ``OperationalError``, which a command sending a task
    meets when Redis cannot be reached; ``exc`` itself otherwise."""
    kombu_errors = sys.modules.get("kombu.exceptions")
    if kombu_errors is not None and isinstance(exc, kombu_errors.OperationalError):
        cause: BaseException | None = exc.__cause__
        return cause or exc
    return exc


def _tls_hint(exc: Exception) -> str:
    """For a connection that timed out in a TLS handshake (a ``rediss://`` URL): say so."""
    cause = exc.__context__
    if "handshake" in str(cause):
        return "; a rediss:// URL needs a Redis that speaks TLS (a plain one: redis://)"
    return ""


def _redis_down_hint() -> str:
    """What to do about an unreachable Redis: start the stack, or, when a running ``capdisc up``
    is found whose Redis is down, wait for it to be restarted (and where to look if not), or,
    when that Redis is one ``up`` was given and does not run, start it again."""
    from capdisc.stackfile import find_stack, stack_start

    stack = find_stack(stack_start(os.environ, Path.cwd()))
    if stack is None:
        return "is the stack running? (make up)"
    if stack.get("redis_supervised") is False:
        return (
            f"capdisc up (pid {stack.get('pid')}) uses a Redis it does not run (it was given "
            f"{stack.get('redis_url')}): start that Redis again; up's workers wait for it"
        )
    if "redis" in stack.get("children", {}):
        return f"capdisc up (pid {stack.get('pid')}) is running: is this its Redis?"
    return (
        f"the Redis of capdisc up (pid {stack.get('pid')}) is down and being restarted: try "
        "again in a few seconds; if it stays down, up's output says why"
    )


if __name__ == "__main__":
    main()
