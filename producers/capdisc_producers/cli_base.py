"""What every ``capdisc`` command shares: its options (``--redis-url``, ``--tenant``,
``--token``, ``--json``, ...), the checked command and group classes, the stack, settings,
connection, client and publisher a command works with, how it reports a sync, and how it
fails (``error: ...`` on stderr and the exit code of :mod:`capdisc_producers.exits`).

Like every module of the command, it imports click and small modules only; the rest is
imported inside the function that uses it (``tests/unit/test_cli_startup.py``).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from capdisc.errors import (
    AuthError,
    CapdiscError,
    ConfigError,
    SessionNotFoundError,
    UnknownProfileError,
    UnknownTenantError,
)
from capdisc.tenants import TENANT_RULE, check_tenant, shown, tenant_problem
from capdisc_producers.access import TOKEN_ENV, Access, resolve_access
from capdisc_producers.exits import FAILED, TROUBLE

# Small modules only at the top, as in capdisc_producers.cli.
if TYPE_CHECKING:
    import redis

    from capdisc.client import Client
    from capdisc.rawsettings import ClientSettings
    from capdisc.settings import Settings
    from capdisc_producers.publisher import Publisher
    from capdisc_producers.sync import SyncReport


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
    help=f"Tenant: {TENANT_RULE} (default: the token's tenant, else the settings tenant)",
)
take_over_option = click.option(
    "--take-over",
    is_flag=True,
    help="Move capabilities whose id another source owns to this one (else they are rejected, "
    "naming their owner)",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object")


def _wait(_ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A ``--timeout`` of no wait (0 or less, not a number) is a usage error (exit 2) before
    anything is sent: the command would send, then say the workers did not answer in time."""
    if not value > 0:
        raise click.BadParameter(f"must be a number of seconds above 0, got {value}", param=param)
    return value


def timeout_option(default_s: float) -> Any:
    """``--timeout``: how long a command waits for the workers, in seconds."""
    return click.option(
        "--timeout", "timeout_s", type=float, default=default_s, show_default=True, callback=_wait
    )


#: Whether a command that sends events waits until the indexing workers applied them.
wait_option = click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the indexing workers have applied every event",
)


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


def caller_of(ctx: click.Context) -> dict[str, Any]:
    roles = str(ctx.meta.get("capdisc.roles") or "")
    return {
        "roles": [r.strip() for r in roles.split(",") if r.strip()],
        "user": ctx.meta.get("capdisc.user") or None,
    }


def settings_of(ctx: click.Context) -> Settings:
    """The settings (built now if the command started with its client settings only)."""
    if ctx.obj["settings"] is None:
        from capdisc.settings import Settings

        ctx.obj["settings"] = Settings.load(path=ctx.obj["settings_file"])
    settings: Settings = ctx.obj["settings"]
    return settings


def client_settings_of(ctx: click.Context) -> ClientSettings:
    """The settings that say how to reach the stack and ask it."""
    settings: ClientSettings = ctx.obj["client_settings"]
    return settings


def connect(ctx: click.Context, redis_url: str | None) -> tuple[Settings, redis.Redis]:
    connection = redis_of(ctx, redis_url)
    return settings_of(ctx).with_changes(redis_url=access_of(ctx).redis_url), connection


def redis_of(ctx: click.Context, redis_url: str | None) -> redis.Redis:
    """A connection to the stack's Redis (``--redis-url``, else found); what it took to reach
    it is kept for :func:`access_of`."""
    import redis

    access = resolve_access(
        redis_url,
        ctx.meta.get("capdisc.token"),
        _environ(ctx),
        Path.cwd(),
        client_settings_of(ctx),
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


def access_of(ctx: click.Context) -> Access:
    access: Access = ctx.meta["capdisc.access"]
    return access


def chosen_tenant(ctx: click.Context, tenant: str | None) -> str:
    """``--tenant``, else the token's tenant, else the settings' (after :func:`redis_of`)."""
    from capdisc.client import tenant_of

    return check_tenant(tenant or tenant_of(access_of(ctx).token) or client_settings_of(ctx).tenant)


def client_of(ctx: click.Context, connection: redis.Redis, tenant: str | None) -> Client:
    """A client as the command's caller: its token, and its --roles and --user."""
    from capdisc.client import Client

    return Client(
        connection,
        tenant=chosen_tenant(ctx, tenant),
        token=access_of(ctx).token,
        timeout_s=client_settings_of(ctx).discover_timeout_s,
        **caller_of(ctx),
    )


def publisher_for(url: str, tenant: str | None, backlog_wait_s: float | None = 600.0) -> Publisher:
    """A publisher that stamps the command's token on every event, once the token is seen to
    allow writing ``tenant`` (any tenant when None; the indexing workers verify, this only
    refuses early, before anything is sent). While ``publish_max_pending_tasks`` sent tasks
    wait for the workers it waits to send, at most ``backlog_wait_s`` (None: as long as it
    takes)."""
    from capdisc_producers.publisher import Publisher

    ctx = click.get_current_context()
    access = access_of(ctx)
    check_write(access, tenant)
    settings = settings_of(ctx)
    return Publisher(
        url,
        token=access.token,
        max_event_bytes=settings.event_max_bytes,
        max_pending_tasks=settings.publish_max_pending_tasks,
        backlog_wait_s=backlog_wait_s,
    )


def check_write(access: Access, tenant: str | None) -> None:
    """Fail unless the token may write ``tenant`` (checked with the keyring when at hand, else
    from its claims); without a token, fail when the stack is known to require one."""
    from capdisc.identity import auth
    from capdisc.identity.gate import require

    if access.token is None:
        if access.auth:
            fail(
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
        fail(str(exc))


def known_tenant(connection: redis.Redis, tenant: str) -> None:
    """Fail (exit 1) unless something was ever published to ``tenant``."""
    from capdisc.registry.store import tenants as known_tenants

    if tenant not in known_tenants(connection):
        fail(
            f"tenant {tenant!r} is unknown: nothing was ever published to it (capdisc status "
            "lists the tenants; check --tenant)",
            FAILED,
        )


#: Outcome decisions of events the indexing workers refused: invalid, or another source's.
REFUSED = ("rejected", "refused_owned")


def report_sync(
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
        fail(
            f"only {len(report.outcomes)} of {report.sent} events were applied within "
            f"{timeout_s:.0f} s; is an indexing worker running? (capdisc status)"
        )
    if wait and report.earlier_unapplied:
        fail(
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


def say(message: str) -> None:
    click.echo(message, err=True)


def interrupt(*_: object) -> NoReturn:
    raise KeyboardInterrupt


def fail(message: str, code: int = TROUBLE) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``: 2 (the command could not run,
    or was used wrongly) unless told 1 (the operation failed, or named something unknown)."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


#: Errors that say a command named something capdisc does not hold: exit 1, not 2.
UNKNOWN_ERRORS = (UnknownTenantError, SessionNotFoundError, UnknownProfileError)


def exit_code(exc: CapdiscError) -> int:
    return FAILED if isinstance(exc, UNKNOWN_ERRORS) else TROUBLE


def command(*args: Any, **kwargs: Any) -> Any:
    """``click.command`` making a :class:`CheckedCommand` (added to the ``capdisc`` group by
    :mod:`capdisc_producers.cli`)."""
    return click.command(*args, cls=CheckedCommand, **kwargs)


def group(*args: Any, **kwargs: Any) -> Any:
    """``click.group`` making a :class:`CheckedGroup`, whose commands are checked too."""
    return click.group(*args, cls=CheckedGroup, **kwargs)
