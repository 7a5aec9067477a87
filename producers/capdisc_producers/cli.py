"""The ``capdisc`` command: run the embedded stack, publish and watch registries, discover.

Commands run from the project directory find a running stack through ``.capdisc/stack.json``;
``--redis-url`` or ``CAPDISC_REDIS_URL`` point them anywhere else. Every command's help ends
with what its exit codes mean (:mod:`capdisc_producers.exits`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from capdisc import keys
from capdisc.agents.formatnames import TOOL_FORMATS
from capdisc.errors import (
    AuthError,
    CapdiscError,
    ConfigError,
    EmbeddingError,
    FlagError,
    RedisCredentialsError,
    SessionNotFoundError,
    UnknownTenantError,
)
from capdisc.tenants import TENANT_RULE, check_tenant, shown, tenant_problem
from capdisc_producers.access import TOKEN_ENV, Access, command_settings, resolve_access
from capdisc_producers.exits import COULD_NOT_RUN, FAILED, TROUBLE, exit_status

# Start-up stays short (``benchmarks/cli_startup.py``): this module imports click and the
# small modules above only. Everything else (redis, the client, the settings, the registry,
# logging, the producers) is imported inside the command that uses it, and ``bench`` and
# ``token`` are loaded when named (:class:`CheckedGroup`). ``tests/unit/test_cli_startup.py``
# checks it.
if TYPE_CHECKING:
    import redis

    from capdisc.client import Answer, Client
    from capdisc.rawsettings import ClientSettings
    from capdisc.registry.flags import Flag
    from capdisc.registry.policy import SyncPlan
    from capdisc.settings import Settings
    from capdisc_producers.publisher import Publisher
    from capdisc_producers.sync import SyncReport

#: ``capdisc.registry.flags.FLAG_STATES`` and ``POLICIES``, spelt out so that defining the
#: options does not import the flags (a unit test checks that they match).
FLAG_STATES = ("flagged", "pending", "approved")
POLICIES = ("flag", "warn", "quarantine")


def _remember_stack(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    """Keep ``--stack`` for :func:`_environ`; the command's own wins over the global one."""
    if value is not None:
        ctx.meta["capdisc.stack"] = value


stack_option = click.option(
    "--stack",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    expose_value=False,
    callback=_remember_stack,
    metavar="DIR",
    help="The project directory of the running stack (where `capdisc up` runs), so that it is "
    "found from any working directory; the same as CAPDISC_STACK=DIR (default: CAPDISC_STACK, "
    "else the working directory and its parents)",
)


def redis_option(command: Any) -> Any:
    """``--redis-url``, ``--stack`` and ``--token``: where the stack is and who asks (the token
    is kept in ``ctx.meta``, never printed)."""
    command = stack_option(command)
    command = click.option(
        "--token",
        envvar=TOKEN_ENV,
        default=None,
        expose_value=False,
        callback=_remember,
        show_envvar=True,
        help="Identity token (`capdisc token issue`; default: the running "
        "stack's admin token). Prefer the variable: a command line "
        "is visible to other users",
    )(command)
    return click.option(
        "--redis-url",
        envvar=None,
        default=None,
        help="Redis of the stack (default: CAPDISC_REDIS_URL, then .capdisc/stack.json)",
    )(command)


def _tenant_name(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--tenant`` that is not a tenant name is a usage error (exit 2), before anything runs."""
    problem = tenant_problem(value) if value is not None else None
    if problem:
        raise click.BadParameter(f"{shown(value)} {problem}", param=param)
    return value


tenant_option = click.option(
    "--tenant",
    default=None,
    callback=_tenant_name,
    help=f"Tenant: {TENANT_RULE} (default: settings tenant)",
)
take_over_option = click.option(
    "--take-over",
    is_flag=True,
    help="Move capabilities whose id another source owns to this one (else they are rejected, "
    "naming their owner)",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object")


class CheckedCommand(click.Command):
    """A command whose text arguments must be valid UTF-8: bytes that were not (Python keeps
    them as lone surrogates) are a usage error naming the argument (exit 2), not a traceback
    later. File paths may be any bytes and are not checked."""

    def invoke(self, ctx: click.Context) -> Any:
        for param in self.get_params(ctx):
            _check_text(ctx, param)
        return super().invoke(ctx)


class CheckedGroup(click.Group):
    """A group whose commands, and subgroups, are checked like :class:`CheckedCommand`.

    ``lazy_commands`` names commands defined in other modules (name -> module, attribute,
    help): a module is imported when its command is run or asked for its help, not for the
    group's own help, which shows the short help given here."""

    command_class = CheckedCommand
    group_class = type

    def __init__(
        self, *args: Any, lazy_commands: dict[str, tuple[str, str, str]] | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, attribute, _help = self.lazy_commands[cmd_name]
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's command list, without importing the commands not loaded yet."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names), default=0)
        rows = []
        for name in names:
            if name not in self.commands and name in self.lazy_commands:
                command: click.Command | None = click.Command(
                    name, help=self.lazy_commands[name][2]
                )
            else:
                command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


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


def _check_text(ctx: click.Context, param: click.Parameter) -> None:
    if isinstance(param.type, click.Path) or not param.name:
        return
    value = (
        ctx.params.get(param.name) if param.expose_value else ctx.meta.get(f"capdisc.{param.name}")
    )
    for item in value if isinstance(value, tuple | list) else (value,):
        try:
            if isinstance(item, str):
                item.encode("utf-8")
        except UnicodeEncodeError:
            from capdisc.discovery.protocol import unencodable

            raise click.BadParameter(
                f"must be UTF-8 text; found {unencodable(item)}", ctx=ctx, param=param
            ) from None


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    ctx.meta[f"capdisc.{param.name}"] = value
    return value


def caller_options(command: Any) -> Any:
    """``--roles`` and ``--user``: who asks, within the tenant (kept in ``ctx.meta``)."""
    command = click.option(
        "--roles",
        default="",
        expose_value=False,
        callback=_remember,
        help="Comma-separated roles of the caller (only capabilities visible to them are shown)",
    )(command)
    return click.option(
        "--user", default=None, expose_value=False, callback=_remember, help="The caller's user id"
    )(command)


def _caller(ctx: click.Context) -> dict[str, Any]:
    roles = str(ctx.meta.get("capdisc.roles") or "")
    return {
        "roles": [r.strip() for r in roles.split(",") if r.strip()],
        "user": ctx.meta.get("capdisc.user") or None,
    }


def _settings(ctx: click.Context) -> Settings:
    """The settings (built now if the command started with its client settings only)."""
    if ctx.obj["settings"] is None:
        from capdisc.settings import Settings

        ctx.obj["settings"] = Settings.load(path=ctx.obj["settings_file"])
    settings: Settings = ctx.obj["settings"]
    return settings


def _client_settings(ctx: click.Context) -> ClientSettings:
    """The settings that say how to reach the stack and ask it."""
    settings: ClientSettings = ctx.obj["client_settings"]
    return settings


def _connect(ctx: click.Context, redis_url: str | None) -> tuple[Settings, redis.Redis]:
    connection = _redis(ctx, redis_url)
    return _settings(ctx).with_changes(redis_url=_access(ctx).redis_url), connection


def _redis(ctx: click.Context, redis_url: str | None) -> redis.Redis:
    """A connection to the stack's Redis (``--redis-url``, else found); what it took to reach
    it is kept for :func:`_access`."""
    import redis

    access = resolve_access(
        redis_url,
        ctx.meta.get("capdisc.token"),
        _environ(ctx),
        Path.cwd(),
        _client_settings(ctx),
    )
    ctx.meta["capdisc.access"] = access
    from capdisc.rawsettings import redis_url_problem

    problem = redis_url_problem(access.redis_url)
    if problem:
        raise ConfigError(
            f"the Redis URL {problem}; give redis://HOST:PORT/DB with --redis-url or "
            "CAPDISC_REDIS_URL"
        )
    try:
        return redis.Redis.from_url(access.redis_url, socket_connect_timeout=2.0)
    except ValueError as exc:  # not a Redis URL at all
        from capdisc.settings import mask_url

        raise ConfigError(
            f"the Redis URL {mask_url(access.redis_url)!r} cannot be used ({exc}); give "
            "redis://HOST:PORT/DB with --redis-url or CAPDISC_REDIS_URL"
        ) from exc


def _environ(ctx: click.Context) -> Mapping[str, str]:
    """The environment, with ``CAPDISC_STACK`` set to ``--stack`` when it was given."""
    stack: Path | None = ctx.meta.get("capdisc.stack")
    if stack is None:
        return os.environ
    from capdisc.stackfile import STACK_ENV

    return {**os.environ, STACK_ENV: str(stack)}


def _access(ctx: click.Context) -> Access:
    access: Access = ctx.meta["capdisc.access"]
    return access


def _tenant(ctx: click.Context, tenant: str | None) -> str:
    """``--tenant``, else the token's tenant, else the settings' (after :func:`_redis`)."""
    from capdisc.client import tenant_of

    return check_tenant(tenant or tenant_of(_access(ctx).token) or _client_settings(ctx).tenant)


def _client(ctx: click.Context, connection: redis.Redis, tenant: str | None) -> Client:
    """A client as the command's caller: its token, and its --roles and --user."""
    from capdisc.client import Client

    return Client(
        connection,
        tenant=_tenant(ctx, tenant),
        token=_access(ctx).token,
        timeout_s=_client_settings(ctx).discover_timeout_s,
        **_caller(ctx),
    )


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: ``capdisc VERSION``, the version of the installed package."""
    if not value or ctx.resilient_parsing:
        return
    from importlib import metadata

    try:
        version = metadata.version("capdisc")
    except metadata.PackageNotFoundError:
        _fail(
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
        "session, a source, a tenant, a key; the other names are still acted on). Each "
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

    run_up(Path.cwd(), registry, _settings(ctx), os.environ, click.echo)
    click.echo("capdisc stopped.")


@cli.command(
    "discover",
    epilog=exit_status(
        "the tenant is unknown: nothing was ever published to it",
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
    connection = _redis(ctx, redis_url)
    with _client(ctx, connection, tenant) as client:
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
        except ValueError:
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


@cli.group()
def session() -> None:
    """An agent session's working set: show, record calls, export and import."""


@cli.command("mcp", epilog=exit_status(None, ok="the server stopped when asked"))
@click.option(
    "--http",
    "http_port",
    type=int,
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
    from capdisc_producers.mcp_server import ServerAuth, serve
    from capdisc_producers.mcp_server import log as mcp_log

    settings, _connection = _connect(ctx, redis_url)
    if import_token:
        settings = settings.with_changes(mcp_import_token=import_token)
    access = _access(ctx)
    required = access.auth if access.auth is not None else access.keys_file is not None
    gate = (
        Gate.from_settings(
            settings.with_changes(auth=True, auth_keys_file=access.keys_file), mcp_log
        )
        if access.keys_file is not None and required
        else Gate(None)
    )
    serve(
        settings,
        tenant=_tenant(ctx, tenant),
        profile=profile,
        host=host,
        port=http_port,
        access=ServerAuth(access.token, gate, required),
        tenant_given=tenant is not None,
        **_caller(ctx),
    )


#: The exit status of a session command that names an existing session.
SESSION_EXITS = exit_status("no such session: never created, or expired")


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
    epilog=exit_status(None, COULD_NOT_RUN + ", or --args is not JSON"),
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
        _fail(f"--args is not valid JSON: {exc}")
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
        "the tenant is unknown",
        COULD_NOT_RUN + " (a token whose roles do not see every capability may not watch)",
    ),
)
@click.argument("session_id")
@click.option(
    "--after",
    default="0-0",
    show_default=True,
    help="Print the events after this event id (0-0: from the oldest one kept)",
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
    restored, loop_detected, redundant_search, imported), one line each (--json: one JSON
    object a line), until interrupted. The session need not have started yet."""

    def follow(client: Client) -> None:
        for printed, event in enumerate(client.watch_session(session_id, after=after), 1):
            click.echo(json.dumps(event) if as_json else _event_line(event))
            if count is not None and printed >= count:
                return

    with contextlib.suppress(KeyboardInterrupt):
        _session_client(ctx, redis_url, tenant, follow)


def _event_line(event: dict[str, str]) -> str:
    at = time.strftime("%H:%M:%S", time.localtime(int(event.get("at_ms") or 0) / 1000))
    what = "  ".join(part for part in (event.get("tool"), event.get("reason")) if part)
    return f"{event['id']}  {at}  {event['type']:<16} {what}".rstrip()


@session.command(
    "import",
    epilog=exit_status(None, COULD_NOT_RUN + ", or PATH is no exported session"),
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
        _fail(f"{path} is not an exported session: {exc}")
    working = _session_client(ctx, redis_url, tenant, lambda c: c.import_session(session_id, data))
    click.echo(f"session {session_id}: {len(working['bound'])} capabilities bound")


def _publisher(url: str, tenant: str | None, backlog_wait_s: float | None = 600.0) -> Publisher:
    """A publisher that stamps the command's token on every event, once the token is seen to
    allow writing ``tenant`` (any tenant when None; the indexing workers verify, this only
    refuses early, before anything is sent). While ``publish_max_pending_tasks`` sent tasks
    wait for the workers it waits to send, at most ``backlog_wait_s`` (None: as long as it
    takes)."""
    from capdisc_producers.publisher import Publisher

    ctx = click.get_current_context()
    access = _access(ctx)
    _check_write(access, tenant)
    settings = _settings(ctx)
    return Publisher(
        url,
        token=access.token,
        max_event_bytes=settings.event_max_bytes,
        max_pending_tasks=settings.publish_max_pending_tasks,
        backlog_wait_s=backlog_wait_s,
    )


def _check_write(access: Access, tenant: str | None) -> None:
    """Fail unless the token may write ``tenant`` (checked with the keyring when at hand, else
    from its claims); without a token, fail when the stack is known to require one."""
    from capdisc.identity import auth
    from capdisc.identity.gate import require

    if access.token is None:
        if access.auth:
            _fail(
                "this command writes the registry, and this capdisc requires a token with the "
                "write grant: pass --token or set CAPDISC_TOKEN (capdisc token issue --tenant "
                "T --grants write)"
            )
        return
    try:
        identity = (
            auth.verify(access.token, auth.load_keyring(access.keys_file), time.time())
            if access.keys_file is not None and access.keys_file.is_file()
            else auth.unverified(access.token, time.time())
        )
        require(identity, tenant or identity.tenant, "write")
    except AuthError as exc:
        _fail(str(exc))


def _session_client(
    ctx: click.Context, redis_url: str | None, tenant: str | None, action: Any
) -> Any:
    connection = _connect(ctx, redis_url)[1]
    with _client(ctx, connection, tenant) as client:
        try:
            return action(client)
        except CapdiscError as exc:
            _fail(str(exc), _exit_code(exc))


@cli.command(
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
    settings, connection = _connect(ctx, redis_url)
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
        settings = _connect(ctx, redis_url)[0]
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
        lines.append(
            f"last reconcile {age_s} s ago: {last['missing_vectors']} reindexed, "
            f"{last['orphan_vectors']} orphan vectors dropped"
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


@cli.command(
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
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the indexing workers have applied every event",
)
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True)
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
    from capdisc.models import Visibility
    from capdisc_producers.outages import through_outages
    from capdisc_producers.sync import sync_directory

    settings, connection = _connect(ctx, redis_url)
    publisher = _publisher(settings.redis_url, _tenant(ctx, tenant), timeout_s)
    caller = _caller(ctx)
    visibility = (
        Visibility(tuple(caller["roles"]), (caller["user"],) if caller["user"] else ())
        if caller["roles"] or caller["user"]
        else None
    )
    owner = f"cli-{uuid.uuid4().hex}"  # the same for a sync run again after an outage
    report = through_outages(
        lambda: sync_directory(
            connection,
            publisher,
            path,
            tenant=_tenant(ctx, tenant),
            max_bytes=settings.manifest_max_bytes,
            wait_s=timeout_s if wait else 0.0,
            visibility=visibility,
            take_over=take_over,
            lock_owner=owner,
        ),
        connection,
        _say,
    )
    _report_sync(report, wait, timeout_s)


@cli.command(epilog=exit_status(None, ok="stopped when asked (Ctrl-C, SIGTERM)"))
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

    settings, connection = _connect(ctx, redis_url)
    configure_logging(settings.log_level, settings.log_format)
    signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        watch_directory(
            connection,
            _publisher(settings.redis_url, _tenant(ctx, tenant), backlog_wait_s=None),
            path,
            tenant=_tenant(ctx, tenant),
            max_bytes=settings.manifest_max_bytes,
            debounce_ms=settings.watch_debounce_ms,
            take_over=take_over,
        )


@cli.command(
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
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True)
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
        _fail("--all deletes the whole tenant; give no ids and no --source with it")
    settings, connection = _connect(ctx, redis_url)
    tenant = _tenant(ctx, tenant)
    if everything:
        _delete_everything(settings, connection, tenant, timeout_s)
        return
    _check_write(_access(ctx), tenant)  # before anything is forgotten, not only before sending
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

    _known_tenant(connection, tenant)
    _check_write(_access(click.get_current_context()), tenant)
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
        _say(f"error: not deleted: {', '.join(cap_id for cap_id, _d, _r in failed)}")
        sys.exit(FAILED)


@cli.command(
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
@click.option("--timeout", "timeout_s", type=float, default=3600.0, show_default=True)
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
        _fail("give capability ids, --source, or --all (the whole tenant)")
    settings, connection = _connect(ctx, redis_url)
    tenant = _tenant(ctx, tenant)
    if everything:
        if capability_ids or source:
            _fail("--all reindexes the whole tenant; give no ids and no --source with it")
        _known_tenant(connection, tenant)
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
        _say(f"error: tenant {tenant!r} holds no {', '.join(missing)} (check the ids and --tenant)")
    if failed:
        _say(f"error: not {verbs.done_verb}: {', '.join(failed)}")
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


@cli.command(epilog=exit_status(None))
@redis_option
@json_option
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True)
@click.pass_context
def reconcile(ctx: click.Context, redis_url: str | None, as_json: bool, timeout_s: float) -> None:
    """Compare the registry with the index now and repair drift (indexing workers also do this
    every reconcile_interval_s): records without a vector are reindexed, orphan vectors go, and
    the shared embedding cache is pruned once it outgrows the registry."""
    from capdisc.client import wait_for_reply

    settings, connection = _connect(ctx, redis_url)
    reply_id = f"reconcile-{uuid.uuid4().hex}"
    publisher = _publisher(settings.redis_url, None)
    try:
        publisher.reconcile(keys.reply(reply_id))
    finally:
        publisher.close()
    popped = wait_for_reply(connection, reply_id, timeout_s)
    if popped is None:
        _fail(
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
    """The ids named, or those ``source`` holds (fail, exit 1, when it holds none)."""
    from capdisc.registry.store import stored_by_source

    if capability_ids and source:
        _fail("give capability ids or --source, not both")
    if not (capability_ids or source):
        _fail("give capability ids, --source, or --all (the whole tenant)")
    if not source:
        return list(capability_ids)
    ids = sorted(stored_by_source(connection, tenant, source))
    if not ids:
        _fail(
            f"tenant {tenant!r} has no capabilities from source {source!r} (capdisc status "
            "--json lists each tenant's sources)",
            FAILED,
        )
    return ids


def _known_tenant(connection: redis.Redis, tenant: str) -> None:
    """Fail (exit 1) unless something was ever published to ``tenant``."""
    from capdisc.registry.store import tenants as known_tenants

    if tenant not in known_tenants(connection):
        _fail(
            f"tenant {tenant!r} is unknown: nothing was ever published to it (capdisc status "
            "lists the tenants; check --tenant)",
            FAILED,
        )


def _publish_ids(
    settings: Settings,
    connection: redis.Redis,
    plan: SyncPlan,
    tenant: str,
    timeout_s: float,
    source: str = "cli",
) -> SyncReport:
    from capdisc_producers.sync import publish_plan

    publisher = _publisher(settings.redis_url, tenant, timeout_s)
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
        _fail(
            f"only {len(report.outcomes)} of {report.sent} events were applied within "
            f"{timeout_s:.0f} s; is an indexing worker running? (capdisc status)"
        )
    return report


def _reindex_all(
    settings: Settings, connection: redis.Redis, tenant: str, fresh: bool, timeout_s: float
) -> None:
    from capdisc_producers.reindex import start_full_reindex, wait_for_swap

    publisher = _publisher(settings.redis_url, tenant)
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
            _fail(str(exc), FAILED)
    if version is None:
        _fail(
            f"reindex {job} did not swap in within {timeout_s:.0f} s; it goes on building "
            "(capdisc status shows it); is an indexing worker running?"
        )
    click.echo(f"reindex {job} swapped in at index version {version}")


@cli.group("import")
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
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the indexing workers have applied every event",
)
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True)
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
    schema nested deeper than 32 levels cut to its top 32.
    """
    from capdisc_producers.importer import import_jsonl
    from capdisc_producers.outages import through_outages

    settings, connection = _connect(ctx, redis_url)
    publisher = _publisher(settings.redis_url, _tenant(ctx, tenant), timeout_s)
    with click.progressbar(length=0, label="events", file=sys.stderr) as bar:

        def progress(stage: str, count: int) -> None:
            if stage == "sent":
                bar.length = (bar.length or 0) + count
            bar.label = "applied" if stage == "applied" else "sent"
            if stage == ("applied" if wait else "sent"):
                bar.update(count)

        owner = f"cli-{uuid.uuid4().hex}"  # the same for an import run again after an outage
        try:
            report = through_outages(
                lambda: import_jsonl(
                    connection,
                    publisher,
                    path,
                    tenant=_tenant(ctx, tenant),
                    source=source,
                    wait_s=timeout_s if wait else 0.0,
                    progress=progress,
                    take_over=take_over,
                    lock_owner=owner,
                ),
                connection,
                _say,
            )
        finally:
            publisher.close()
    _report_sync(report, wait, timeout_s, partial_ok=True)


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
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the indexing workers have applied every event",
)
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True)
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
    from capdisc_producers.outages import through_outages

    settings, connection = _connect(ctx, redis_url)
    publisher = _publisher(settings.redis_url, _tenant(ctx, tenant), timeout_s)
    changed: list[Changed] = []
    owner = f"cli-{uuid.uuid4().hex}"  # the same for an import run again after an outage

    def attempt() -> SyncReport:  # run again (listing the server again) after a Redis outage
        report, changed[:] = import_mcp(
            connection,
            publisher,
            url=url,
            command=command,
            tenant=_tenant(ctx, tenant),
            server_name=server_name,
            wait_s=timeout_s if wait else 0.0,
            timeout_s=timeout_s,
            take_over=take_over,
            max_message_bytes=settings.mcp_max_result_bytes,
            lock_owner=owner,
        )
        return report

    try:
        report = through_outages(attempt, connection, _say)
    except CapdiscError as exc:
        _fail(str(exc))
    finally:
        publisher.close()
    for change in changed:
        click.echo(
            f"changed: {change.capability_id} (content hash {change.old_hash[:12]} -> "
            f"{change.new_hash[:12]})"
        )
    _report_sync(report, wait, timeout_s)


@cli.group()
def dlq() -> None:
    """Events the indexing workers could not apply, and discovery requests the discovery workers
    refused or quarantined: list them, replay the events, drop what is no longer needed."""


@dlq.command("list", epilog=exit_status(None))
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@redis_option
@json_option
@click.pass_context
def dlq_list(ctx: click.Context, limit: int, redis_url: str | None, as_json: bool) -> None:
    """The oldest dead-lettered events, with the reason each was refused."""
    from capdisc.registry.deadletters import budget, list_dead_letters

    connection = _connect(ctx, redis_url)[1]
    letters = [letter.to_dict() for letter in list_dead_letters(connection, limit)]
    held = budget(connection)
    if as_json:
        click.echo(
            json.dumps(
                {"dead_letters": letters, "bytes": held.held_bytes, "dropped": held.dropped},
                indent=2,
            )
        )
        return
    if held.dropped:
        click.echo(
            f"{held.dropped} older dead letters were dropped to keep the stream within "
            f"deadletters_max_bytes and {keys.DEADLETTERS_MAXLEN:,} entries"
        )
    if not letters:
        click.echo("no dead letters")
    for letter in letters:
        cut = letter["truncated_from_bytes"]
        kept = f"  (payload cut short: {cut} bytes, only its start kept)" if cut else ""
        click.echo(
            f"{letter['id']}  {_letter_subject(letter)}  attempts "
            f"{letter['attempts']}{kept}\n    {letter['reason']}"
        )


def _letter_subject(letter: dict[str, Any]) -> str:
    if letter["source"] == keys.DISCOVERY_REQUESTS:
        return f"discovery request {letter['request_id'] or '(no readable request id)'}"
    return f"{letter['capability_id'] or '(undecodable event)'}  tenant {letter['tenant']}"


@dlq.command(
    "replay",
    epilog=exit_status(
        "a named id is no dead letter, is a discovery request (never replayed), or its "
        "payload was cut short (deadletter_payload_max_bytes); the other ids are replayed"
    ),
)
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Replay every dead letter")
@redis_option
@click.pass_context
def dlq_replay(
    ctx: click.Context, entry_ids: tuple[str, ...], replay_all: bool, redis_url: str | None
) -> None:
    """Send dead-lettered events (ENTRY_IDS from `capdisc dlq list`, or --all) to the indexing
    queue again; each leaves the stream once sent. One that fails again comes back with a new
    id and reason. Dead-lettered discovery requests are never replayed (not registry events;
    their clients stopped waiting): naming one is refused, --all leaves them. Prints one line
    per id: replayed, not found, or refused: a discovery request."""
    from capdisc.registry.deadletters import REPLAYED, replay_each, with_token

    if bool(entry_ids) == replay_all:
        raise click.UsageError("give the entry ids to replay, or --all")
    settings, connection = _connect(ctx, redis_url)
    token = _access(ctx).token
    publisher = _publisher(settings.redis_url, None)
    try:
        outcomes = replay_each(
            connection,
            lambda payload: publisher.send_raw(with_token(payload, token)),
            None if replay_all else entry_ids,
        )
    finally:
        publisher.close()
    if replay_all:
        _report_replay_all(outcomes)
    else:
        _report_named(outcomes, REPLAYED)


#: Why a dead letter whose payload was cut short is not replayed, and what to do instead.
TRUNCATED_HINT = (
    "its payload was longer than deadletter_payload_max_bytes and only its start was kept, "
    "so replaying it would send another event: publish its source again (capdisc dlq drop "
    "removes it)"
)


def _report_replay_all(outcomes: dict[str, str]) -> None:
    from capdisc.registry.deadletters import (
        REFUSED_REQUEST,
        REFUSED_TASK,
        REFUSED_TRUNCATED,
        REPLAYED,
    )

    replayed = [i for i, outcome in outcomes.items() if outcome == REPLAYED]
    left = sum(outcome == REFUSED_REQUEST for outcome in outcomes.values())
    tasks = sum(outcome == REFUSED_TASK for outcome in outcomes.values())
    cut = sum(outcome == REFUSED_TRUNCATED for outcome in outcomes.values())
    for entry_id in replayed:
        click.echo(f"{entry_id}: {REPLAYED}")
    if not replayed:
        click.echo("no registry events to replay")
    if left:
        click.echo(
            f"left {left} discovery request(s): they cannot be replayed (capdisc dlq drop "
            "removes them)"
        )
    if tasks:
        click.echo(
            f"left {tasks} indexing task(s) no worker took: upgrade the indexing workers and "
            "publish again (capdisc dlq drop removes them)"
        )
    if cut:
        click.echo(f"left {cut} event(s) not replayed: {TRUNCATED_HINT}")


def _report_named(outcomes: dict[str, str], done: str) -> None:
    """One line per named dead letter; exit 1, saying why, unless every one was ``done``."""
    from capdisc.registry.deadletters import REFUSED_REQUEST, REFUSED_TASK, REFUSED_TRUNCATED

    for entry_id, outcome in outcomes.items():
        click.echo(f"{entry_id}: {outcome}")
    refused = (done, REFUSED_REQUEST, REFUSED_TASK, REFUSED_TRUNCATED)
    missing = [i for i, outcome in outcomes.items() if outcome not in refused]
    requests = [i for i, outcome in outcomes.items() if outcome == REFUSED_REQUEST]
    tasks = [i for i, outcome in outcomes.items() if outcome == REFUSED_TASK]
    cut = [i for i, outcome in outcomes.items() if outcome == REFUSED_TRUNCATED]
    if missing:
        _say(f"error: no dead letter with id {', '.join(missing)} (see capdisc dlq list)")
    if requests:
        _say(
            f"error: dead letter {', '.join(requests)} is a discovery request (from "
            f"{keys.DISCOVERY_REQUESTS}), not a registry event: it cannot be replayed to the "
            "indexing queue, and its client stopped waiting long ago; it stays listed for "
            "inspection (capdisc dlq drop removes it)"
        )
    if tasks:
        _say(
            f"error: dead letter {', '.join(tasks)} is an indexing task no worker took (a task "
            "name the workers do not know), not a registry event: upgrade the indexing "
            "workers and publish again; it stays listed (capdisc dlq drop removes it)"
        )
    if cut:
        _say(f"error: dead letter {', '.join(cut)} was not replayed: {TRUNCATED_HINT}")
    if missing or requests or tasks or cut:
        sys.exit(FAILED)


@dlq.command(
    "drop",
    epilog=exit_status("a named id is no dead letter; the other ids are dropped"),
)
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "drop_everything", is_flag=True, help="Drop every dead letter")
@redis_option
@click.pass_context
def dlq_drop(
    ctx: click.Context, entry_ids: tuple[str, ...], drop_everything: bool, redis_url: str | None
) -> None:
    """Remove dead letters without replaying them (ENTRY_IDS from `capdisc dlq list`, or
    --all): registry events and discovery requests alike, once nothing more is to be learnt
    from them. Prints one line per id: dropped, or not found."""
    from capdisc.registry.deadletters import DROPPED, drop, drop_all

    if bool(entry_ids) == drop_everything:
        raise click.UsageError("give the entry ids to drop, or --all")
    connection = _connect(ctx, redis_url)[1]
    _check_write(_access(ctx), None)
    if not drop_everything:
        _report_named(drop(connection, entry_ids), DROPPED)
        return
    dropped = drop_all(connection)
    for entry_id, outcome in dropped.items():
        click.echo(f"{entry_id}: {outcome}")
    if not dropped:
        click.echo("no dead letters")


# -- tool poisoning: flags, approvals, policy ------------------------------------------------


def _flagged(cap: dict[str, Any]) -> str:
    """``  [flagged: rule, ...]`` after a discovered capability the scan flagged."""
    rules = list(dict.fromkeys(str(f.get("rule")) for f in cap.get("flags") or ()))
    return f"  [flagged: {', '.join(rules)}]" if rules else ""


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


def _operator(access: Access, tenant: str) -> str | None:
    """Fail unless the token holds the admin grant for ``tenant``: approving flagged text and
    choosing the policy are for operators, not for whoever may publish. Returns the token's
    subject (None without a token where the stack requires none)."""
    from capdisc.identity import auth
    from capdisc.identity.gate import require

    if access.token is None:
        if access.auth:
            _fail(
                "approving flagged capabilities and setting the poisoning policy need a token "
                "with the admin grant: pass --token or set CAPDISC_TOKEN"
            )
        return None
    try:
        identity = (
            auth.verify(access.token, auth.load_keyring(access.keys_file), time.time())
            if access.keys_file is not None and access.keys_file.is_file()
            else auth.unverified(access.token, time.time())
        )
        require(identity, tenant, "admin")
    except AuthError as exc:
        _fail(str(exc))
    return identity.subject


@cli.command(
    epilog=exit_status(
        "an id that is not in the registry or not flagged, or whose text changed since the "
        "--surface reviewed; the other ids are approved"
    )
)
@click.argument("capability_ids", nargs=-1, required=True)
@click.option(
    "--surface",
    "reviewed",
    default=None,
    metavar="HASH",
    help="The surface hash you reviewed (capdisc flags list; 8+ characters): "
    "nothing is approved if the text changed since. Only with one id",
)
@redis_option
@tenant_option
@click.pass_context
def approve(
    ctx: click.Context,
    capability_ids: tuple[str, ...],
    reviewed: str | None,
    redis_url: str | None,
    tenant: str | None,
) -> None:
    """Approve flagged capabilities for their current text. Under the quarantine policy they
    are served from the index version printed; under warn and flag they lose their caution and
    mark. A later change to their text (description, schema, content) makes them pending again.
    Needs the admin grant."""
    from capdisc.registry.flags import SHORT_HASH
    from capdisc.registry.flagstore import approve as approve_flag

    if reviewed is not None and len(capability_ids) != 1:
        raise click.UsageError("--surface names the text of one capability: give one id")
    connection = _connect(ctx, redis_url)[1]
    tenant = _tenant(ctx, tenant)
    by = _operator(_access(ctx), tenant)
    version, refused = None, []
    for cap_id in dict.fromkeys(capability_ids):
        try:
            done = approve_flag(connection, tenant, cap_id, reviewed=reviewed, by=by)
        except FlagError as exc:
            refused.append(cap_id)
            click.echo(f"{cap_id}: not approved")
            _say(f"error: {exc}")
            continue
        version = done.version
        click.echo(
            f"{cap_id}: {'approved' if done.changed else 'already approved'} (surface "
            f"{done.flag.surface_hash[:SHORT_HASH]}; {', '.join(done.flag.rules)})"
        )
    if version is not None:
        click.echo(f"index version {version}")
    if refused:
        sys.exit(FAILED)


@cli.group("flags")
def flags_group() -> None:
    """What the tool-poisoning scan flagged, for review (capdisc approve ID)."""


@flags_group.command(
    "list", epilog=exit_status("the tenant is unknown: nothing was ever published to it")
)
@click.option(
    "--state", type=click.Choice(FLAG_STATES), default=None, help="Only flags in this state"
)
@redis_option
@tenant_option
@json_option
@click.pass_context
def flags_list(
    ctx: click.Context, state: str | None, redis_url: str | None, tenant: str | None, as_json: bool
) -> None:
    """Each flagged capability of the tenant: its state, surface hash, and every finding with
    its rule, field, reason and excerpt (the scanned text, defanged: review it, do not follow
    it)."""
    from capdisc.registry.flagstore import read_flags, tenant_policy

    settings, connection = _connect(ctx, redis_url)
    tenant = _tenant(ctx, tenant)
    _known_tenant(connection, tenant)
    policy = tenant_policy(connection, tenant) or settings.poisoning_policy
    found = {
        i: f
        for i, f in sorted(read_flags(connection, tenant).items())
        if state is None or f.state == state
    }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "tenant": tenant,
                    "policy": policy,
                    "flags": {i: f.to_dict() for i, f in found.items()},
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"tenant {tenant}, poisoning policy {policy}: {len(found)} flagged "
        "capabilit" + ("y" if len(found) == 1 else "ies")
    )
    for cap_id, flag in found.items():
        click.echo("\n".join(_flag_lines(cap_id, flag)))


def _flag_lines(cap_id: str, flag: Flag) -> list[str]:
    """A flag for a reviewer; in field paths and excerpts (the publisher's text) every
    character that is not printable is shown escaped, so none reaches the terminal as a
    control."""
    from capdisc.registry.flags import SHORT_HASH

    lines = [
        f"{cap_id}  {flag.state}  surface {flag.surface_hash[:SHORT_HASH]}"
        + (f"  approved by {flag.approved_by}" if flag.approved_by else "")
    ]
    for finding in flag.findings:
        lines.append(f"    {finding.rule} at {_printable(finding.where)}: {finding.reason}")
        lines.append(f"      | {_printable(finding.excerpt)}")
    return lines


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@cli.group("policy")
def policy_group() -> None:
    """A tenant's tool-poisoning policy: flag, warn or quarantine."""


@policy_group.command("set", epilog=exit_status(None))
@click.argument("policy", type=click.Choice([*POLICIES, "default"]))
@redis_option
@tenant_option
@click.pass_context
def policy_set(ctx: click.Context, policy: str, redis_url: str | None, tenant: str | None) -> None:
    """Set the tenant's policy for flagged capabilities: flag (served, marked), warn (served
    with a caution naming the rules), quarantine (served only once approved), or default (the
    workers' poisoning_policy setting). Discovery serves it from the index version printed.
    Needs the admin grant."""
    from capdisc.registry.flagstore import set_policy

    connection = _connect(ctx, redis_url)[1]
    tenant = _tenant(ctx, tenant)
    _operator(_access(ctx), tenant)
    version = set_policy(connection, tenant, None if policy == "default" else policy)
    click.echo(
        f"tenant {tenant}: poisoning policy {policy}"
        + (f"; index version {version}" if version else "; served from its first publish")
    )


@policy_group.command("show", epilog=exit_status(None))
@redis_option
@tenant_option
@click.pass_context
def policy_show(ctx: click.Context, redis_url: str | None, tenant: str | None) -> None:
    """The tenant's policy, and whether it is its own or the workers' default."""
    from capdisc.registry.flagstore import tenant_policy

    settings, connection = _connect(ctx, redis_url)
    tenant = _tenant(ctx, tenant)
    own = tenant_policy(connection, tenant)
    click.echo(
        f"tenant {tenant}: poisoning policy {own or settings.poisoning_policy}"
        + ("" if own else " (default)")
    )


#: Outcome decisions of events the indexing workers refused: invalid, or another source's.
REFUSED = ("rejected", "refused_owned")


def _report_sync(
    report: SyncReport, wait: bool, timeout_s: float, *, partial_ok: bool = False
) -> None:
    """Repairs (warnings) and rejections on stderr, the summary, and whether the workers applied
    everything; exit 2 when the workers did not finish in time, 1 when something was rejected
    (with ``partial_ok``, only when nothing could be imported)."""
    for note in report.notes:
        click.echo(f"warning: {note}", err=True)
    for error in report.plan.errors.values():
        click.echo(f"rejected: {error}", err=True)
    click.echo(report.summary())
    refused = _report_applied(report, wait, timeout_s)
    if (report.plan.errors or refused) and not (partial_ok and _imported_any(report, refused)):
        sys.exit(1)


def _report_applied(report: SyncReport, wait: bool, timeout_s: float) -> list[dict[str, Any]]:
    """Whether the workers applied everything (fail when not in time), and the outcomes they
    refused, each printed."""
    if wait and report.sent and not report.complete:
        _fail(
            f"only {len(report.outcomes)} of {report.sent} events were applied within "
            f"{timeout_s:.0f} s; is an indexing worker running? (capdisc status)"
        )
    if wait and report.earlier_unapplied:
        _fail(
            f"{report.earlier_unapplied} of the events earlier syncs of this source sent were "
            f"not applied within {timeout_s:.0f} s; is an indexing worker running? (capdisc "
            "status)"
        )
    if wait and report.sent:
        click.echo(f"applied; index version {report.index_version}")
    elif wait and report.earlier_sent:
        click.echo("applied; what earlier syncs of this source sent is applied now")
    elif wait and report.outages:
        click.echo("applied; the registry already held the whole source when the sync resumed")
    refused = [o for o in report.outcomes if o.get("decision") in REFUSED]
    for outcome in refused:
        click.echo(
            f"refused by the indexing workers: {outcome.get('capability_id')}: "
            f"{outcome.get('reason')}",
            err=True,
        )
    for outcome in report.outcomes:
        if outcome.get("decision") == "stale":
            click.echo(
                f"warning: not applied, a newer change of it was applied first (another sync, "
                f"sent later): {outcome.get('capability_id')}; publish again to send yours "
                "after it",
                err=True,
            )
    return refused


def _imported_any(report: SyncReport, refused: list[dict[str, Any]]) -> bool:
    """Whether some capability the sync read is now in the registry (upserted or unchanged)."""
    read = {c.id for c in report.plan.upserts} | set(report.plan.unchanged)
    return bool(read - {str(o.get("capability_id")) for o in refused})


def _say(message: str) -> None:
    click.echo(message, err=True)


def _interrupt(*_: object) -> NoReturn:
    raise KeyboardInterrupt


def _fail(message: str, code: int = TROUBLE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``: 2 (the command could not run,
    or was used wrongly) unless told 1 (the operation failed, or named something unknown)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


#: Errors that say a command named something capdisc does not hold: exit 1, not 2.
UNKNOWN_ERRORS = (UnknownTenantError, SessionNotFoundError)


def _exit_code(exc: CapdiscError) -> int:
    return FAILED if isinstance(exc, UNKNOWN_ERRORS) else TROUBLE


def main() -> None:
    try:
        cli(standalone_mode=True)
    except CapdiscError as exc:
        _fail(str(exc), _exit_code(exc))
    except Exception as exc:
        # redis is imported by the commands that use it: an error of it cannot come otherwise.
        redis = sys.modules.get("redis")
        if redis is not None and isinstance(exc, redis.AuthenticationError):
            _fail(str(RedisCredentialsError.refused(exc)))
        if redis is not None and isinstance(exc, redis.ConnectionError | redis.TimeoutError):
            _fail(f"cannot reach Redis ({exc}); {_redis_down_hint()}{_tls_hint(exc)}")
        raise


def _tls_hint(exc: Exception) -> str:
    """For a connection that timed out in a TLS handshake (a ``rediss://`` URL): say so."""
    cause = exc.__context__
    if "handshake" in str(cause):
        return "; a rediss:// URL needs a Redis that speaks TLS (a plain one: redis://)"
    return ""


def _redis_down_hint() -> str:
    """What to do about an unreachable Redis: start the stack, or, when a running ``capdisc up``
    is found whose Redis is down, wait for it to be restarted (and where to look if not)."""
    from capdisc.stackfile import find_stack, stack_start

    stack = find_stack(stack_start(os.environ, Path.cwd()))
    if stack is None:
        return "is the stack running? (make up)"
    if "redis" in stack.get("children", {}):
        return f"capdisc up (pid {stack.get('pid')}) is running: is this its Redis?"
    return (
        f"the Redis of capdisc up (pid {stack.get('pid')}) is down and being restarted: try "
        "again in a few seconds; if it stays down, up's output says why"
    )


if __name__ == "__main__":
    main()
