"""``capdisc token``: the keyring identity tokens are signed with, and the tokens themselves.

The keyring is ``--keys PATH``, else ``CAPDISC_AUTH_KEYS_FILE``, else the stack's
``.capdisc/secrets/auth_keys.json`` (found from the current directory up, running or not).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import NoReturn

import click

from capdisc.errors import AuthError, ConfigError
from capdisc.identity import auth
from capdisc.settings import Settings
from capdisc_producers.credentials import StackSecrets, find_keys_file, read_secret
from capdisc_producers.exits import FAILED, USAGE_ONLY, exit_status

keys_option = click.option(
    "--keys",
    "keys_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Keyring file (default: CAPDISC_AUTH_KEYS_FILE, then .capdisc/secrets/auth_keys.json)",
)


@click.group()
def token() -> None:
    """Identity tokens: keys to sign them, and tokens for callers (workers with auth on serve
    each request as the holder of its token)."""


@token.command("issue", epilog=exit_status(None, USAGE_ONLY + " (no keyring found)"))
@click.option(
    "--tenant",
    required=True,
    help="The tenant it may ask about ('*': every tenant, with --grants admin)",
)
@click.option("--roles", default="", help="Comma-separated roles of the holder")
@click.option("--user", default=None, help="The holder's user id")
@click.option(
    "--grants",
    default=",".join(auth.DEFAULT_GRANTS),
    show_default=True,
    help=f"Comma-separated, some of {', '.join(auth.GRANTS)} (discover: ask; "
    "session: sessions; write: publish, delete, import, reindex, dlq; admin: "
    "everything, any roles)",
)
@click.option("--ttl", default="24h", show_default=True, help="Lifetime: 90s, 15m, 24h, 30d")
@keys_option
@click.pass_context
def token_issue(
    ctx: click.Context,
    tenant: str,
    roles: str,
    user: str | None,
    grants: str,
    ttl: str,
    keys_file: Path | None,
) -> None:
    """Print a token signed with the keyring's newest key (keep it like a password)."""
    keyring = auth.load_keyring(_keys_path(ctx, keys_file, create=False))
    click.echo(
        auth.issue(
            keyring,
            tenant=tenant,
            roles=auth.roles_from(roles),
            user=user,
            grants=auth.grants_from(grants),
            ttl_s=auth.parse_duration(ttl),
            now=time.time(),
        )
    )


@token.command("keygen", epilog=exit_status(None, USAGE_ONLY))
@keys_option
@click.pass_context
def token_keygen(ctx: click.Context, keys_file: Path | None) -> None:
    """Add a new key (a new key id) to the keyring, creating it (0600) if needed: it signs the
    tokens issued from now on, and every older key still verifies. Running workers read the
    file again when it changes."""
    path = _keys_path(ctx, keys_file, create=True)
    keyring = auth.load_keyring(path) if path.exists() else auth.Keyring([])
    key = auth.new_key(time.time())
    auth.save_keyring(path, keyring.with_key(key))
    click.echo(f"added key {key.kid} to {path}; tokens issued from now on are signed with it")


@token.command(
    "retire",
    epilog=exit_status(
        "the keyring has no key KID (nothing changed)", USAGE_ONLY + ", or KID is its last key"
    ),
)
@click.argument("kid")
@keys_option
@click.pass_context
def token_retire(ctx: click.Context, kid: str, keys_file: Path | None) -> None:
    """Remove key KID: every token it signed stops verifying (retire a key once its tokens have
    expired, or at once if it leaked)."""
    path = _keys_path(ctx, keys_file, create=False)
    keyring = auth.load_keyring(path)
    if kid not in keyring.kids:
        click.echo(
            f"error: {path} has no key {kid!r}; its keys are {', '.join(keyring.kids) or 'none'}",
            err=True,
        )
        sys.exit(FAILED)
    keyring = keyring.without(kid)
    if not keyring.kids:
        raise ConfigError(
            f"{kid} is the last key of {path}; add another first (capdisc token keygen)"
        )
    auth.save_keyring(path, keyring)
    click.echo(f"retired key {kid}; {path} keeps {', '.join(keyring.kids)}")
    _renew_admin_token(path, kid, keyring)


@token.command(
    "revoke",
    epilog=exit_status(
        "TOKEN was not signed by this keyring, or carries no token id (nothing changed)",
        USAGE_ONLY + " (no keyring found)",
    ),
)
@click.argument("presented", metavar="TOKEN")
@keys_option
@click.pass_context
def token_revoke(ctx: click.Context, presented: str, keys_file: Path | None) -> None:
    """Revoke one token (TOKEN, or - to read it from stdin: a command line is visible to other
    users): it stops verifying from the workers' next request, and every other token of its key
    keeps working. The keyring remembers the token's id until it would have expired anyway."""
    path = _keys_path(ctx, keys_file, create=False)
    keyring = auth.load_keyring(path)
    text = (sys.stdin.readline() if presented == "-" else presented).strip()
    now = time.time()
    try:
        identity = auth.verify(text, keyring, now, leeway_s=float("inf"))
    except AuthError as exc:
        if exc.reason != "revoked":
            _refuse(f"{path} cannot revoke this token: {exc}")
        click.echo(f"the token is already revoked in {path}")
        return
    if identity.expires_at <= now - auth.DEFAULT_LEEWAY_S:
        click.echo("the token has expired: it verifies nowhere already, nothing to revoke")
        return
    jti = auth.peek(text).get("jti")
    if not isinstance(jti, str) or not jti:
        _refuse(
            "the token carries no token id ('jti'); retire its key instead (capdisc token retire)"
        )
    auth.save_keyring(path, keyring.revoking(jti, identity.expires_at, now))
    click.echo(
        f"revoked token {jti} of {identity.subject} (tenant {identity.tenant}, key {identity.kid}) "
        f"in {path}; workers reading this keyring refuse it from their next request"
    )


def _refuse(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(FAILED)


def _renew_admin_token(keys_file: Path, kid: str, keyring: auth.Keyring) -> None:
    """Issue the stack's admin token again when ``kid`` signed it: the CLI run in the project
    presents that token without being told, and would be refused until the next ``up``."""
    stack = StackSecrets(keys_file.parent)
    if keys_file != stack.keys_file or not stack.token_file.is_file():
        return
    if auth.label(read_secret(stack.token_file)).get("kid") not in (kid, None):
        return
    try:
        stack.write_admin_token(keyring, time.time())
    except ConfigError as exc:
        click.echo(f"warning: the admin token in {stack.token_file} no longer verifies: {exc}")
        return
    click.echo(
        f"issued the stack's admin token ({stack.token_file}) again, signed with key "
        f"{keyring.signing_key().kid}"
    )


def _keys_path(ctx: click.Context, explicit: Path | None, *, create: bool) -> Path:
    settings: Settings = ctx.obj["settings"]
    found = explicit or settings.auth_keys_file or find_keys_file(Path.cwd())
    if found is not None:
        return found
    if create:
        return StackSecrets.under(Path.cwd() / ".capdisc").keys_file
    raise ConfigError(
        "no keyring found: give --keys PATH, set CAPDISC_AUTH_KEYS_FILE, or run "
        "this in a project where `capdisc up` ran (or `capdisc token keygen` "
        "makes one)"
    )
