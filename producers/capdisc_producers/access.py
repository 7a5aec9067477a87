"""How a command reaches the stack: the Redis URL and the token it presents.

Kept apart from :mod:`capdisc_producers.stack` (which starts the stack) and light to import: the
``capdisc`` command imports this at start-up, and the settings, the stack file and the secrets
only when a command resolves where the stack is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from capdisc.rawsettings import ClientSettings

TOKEN_ENV = "CAPDISC_TOKEN"


@dataclass(frozen=True)
class Access:
    """How a command reaches the stack, and the token it presents."""

    redis_url: str
    token: str | None
    #: The keyring to verify tokens with, when this process has one (``capdisc mcp``).
    keys_file: Path | None = None
    #: Whether the stack requires tokens, as far as this process knows (None: not known).
    auth: bool | None = None


def resolve_access(
    explicit_url: str | None,
    explicit_token: str | None,
    environ: Mapping[str, str],
    cwd: Path,
    settings: ClientSettings | None = None,
) -> Access:
    """The Redis URL (``--redis-url``, ``CAPDISC_REDIS_URL``, else the running stack's, found
    from ``CAPDISC_STACK`` or ``cwd``) and the token (``--token``, ``CAPDISC_TOKEN``, else the
    stack's admin token, only when the stack's Redis is the one used: a token never goes to a
    Redis it was not made for)."""
    from capdisc.rawsettings import ClientSettings, with_password
    from capdisc.stackfile import (
        REDIS_ENV,
        named_file,
        read_secret,
        running_stack_from,
        stack_token,
        stack_url,
    )

    settings = settings or ClientSettings()
    token = explicit_token or environ.get(TOKEN_ENV) or None
    url = explicit_url or environ.get(REDIS_ENV)
    if url:
        password = read_secret(settings.redis_password_file)
        if password and not urlsplit(url).password:
            url = with_password(url, password)
        return Access(url, token, settings.auth_keys_file, settings.auth)
    stack = running_stack_from(environ, cwd)
    keys_file = settings.auth_keys_file or named_file(stack, "auth_keys_file")
    auth_on = settings.auth if settings.auth is not None else stack.get("auth")
    return Access(
        stack_url(stack),
        token or stack_token(stack),
        keys_file,
        auth_on if isinstance(auth_on, bool) else None,
    )


def command_settings(
    path: Path | None = None, environ: Mapping[str, str] | None = None
) -> ClientSettings:
    """The settings a command needs to reach the stack (``path``: ``--settings``), read without
    building :class:`~capdisc.settings.Settings` when their values are in the plain forms
    :meth:`ClientSettings.load <capdisc.rawsettings.ClientSettings.load>` checks, else taken
    from :class:`~capdisc.settings.Settings` (which reads them as always, or says what is
    wrong with them)."""
    from capdisc.rawsettings import ClientSettings

    settings = ClientSettings.load(environ, path)
    if settings is None:
        from capdisc.settings import Settings

        settings = Settings.load(environ, path).client_settings()
    return settings
