"""The running stack's ``.capdisc/stack.json``: finding it from a directory, and the settings of
a worker that joins it.

``capdisc up`` writes the file while it runs: the Redis URL without its password, the pid of
``up``, whether auth is on, and the paths of the password file, the keyring and the admin
token (never a secret itself). The ``capdisc`` command and a worker started by hand from the
project directory (or below it), or anywhere with ``CAPDISC_STACK`` naming the project
directory, find the stack through it; ``CAPDISC_REDIS_URL`` always wins.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capdisc.errors import ConfigError, StackNotFoundError
from capdisc.rawsettings import DEFAULT_REDIS_URL, with_password

if TYPE_CHECKING:
    from capdisc.settings import Settings

STATE_DIR = ".capdisc"
STACK_FILE = "stack.json"
#: Held by the running ``capdisc up`` (one stack a project directory).
LOCK_FILE = "up.lock"
REDIS_ENV = "CAPDISC_REDIS_URL"
#: The project directory of the stack to use, for processes started elsewhere (an MCP host).
STACK_ENV = "CAPDISC_STACK"


def find_stack(start: Path) -> dict[str, Any] | None:
    """The stack file of a running stack in ``start`` or a parent directory. A file left by an
    ``up`` that was killed (its pid is gone), or a damaged one, is not a running stack."""
    path = _stack_file(start)
    stack = _read_stack(path) if path is not None else None
    return stack if isinstance(stack, dict) else None


def _stack_file(start: Path) -> Path | None:
    """The first stack file in ``start`` or a parent directory."""
    for directory in (start, *start.parents):
        path = directory / STATE_DIR / STACK_FILE
        if path.is_file():
            return path
    return None


def _read_stack(path: Path) -> dict[str, Any] | str:
    """The stack file at ``path`` of a running stack, or why it is none (what to do included)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return f"{path} cannot be read ({exc.strerror})"
    except ValueError:  # not JSON, or not UTF-8
        return f"{path} is damaged (not JSON); remove it"
    pid = data.get("pid") if isinstance(data, dict) else None
    if not isinstance(data, dict) or isinstance(pid, bool) or not isinstance(pid, int | None):
        return f"{path} is damaged (not a JSON object with a numeric pid); remove it"
    if not _alive(pid):
        return f"{path} was left by capdisc up pid {pid}, which no longer runs"
    if not (isinstance(data.get("redis_url"), str) and data["redis_url"]):
        return f"{path} names no redis_url; remove it"
    return data


def running_stack_from(
    environ: Mapping[str, str], cwd: Path, by_url: str = f"set {REDIS_ENV}"
) -> dict[str, Any]:
    """The stack file of the running stack found from :func:`stack_start`;
    :class:`~capdisc.errors.StackNotFoundError`, saying why there is none (no stack file, a
    damaged one, one left by an ``up`` that is gone) and how to name one (or, ``by_url``, how
    to reach a Redis by URL instead)."""
    start = stack_start(environ, cwd)
    path = _stack_file(start)
    stack = _read_stack(path) if path is not None else f"no {STATE_DIR}/{STACK_FILE}"
    if not isinstance(stack, dict):
        raise StackNotFoundError(
            f"no running capdisc stack found from {start} ({stack}); "
            f"start one with `make up`, set {STACK_ENV} to the directory it runs in, or "
            f"{by_url}"
        )
    return stack


def stack_url(stack: Mapping[str, Any]) -> str:
    """The Redis URL of a stack, with the password from its password file when it has one."""
    url = str(stack["redis_url"])
    password = read_secret(named_file(stack, "redis_password_file"))
    return with_password(url, password) if password else url


def stack_token(stack: Mapping[str, Any]) -> str | None:
    """The admin token ``capdisc up`` wrote for commands run in its project, if readable."""
    return read_secret(named_file(stack, "token_file"))


def read_secret(path: Path | None) -> str | None:
    """The stripped text of a secret file; None when there is none."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(
            f"{path} cannot be read ({exc.strerror}); it belongs to whoever ran capdisc up"
        ) from exc
    return text or None


def stack_start(environ: Mapping[str, str], cwd: Path) -> Path:
    """Where to look for the running stack: ``CAPDISC_STACK`` (its project directory) when
    set, else ``cwd`` (and its parents)."""
    named = environ.get(STACK_ENV)
    return Path(named).expanduser() if named else cwd


def _alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs on this machine (True when the file names none)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def named_file(stack: Mapping[str, Any], name: str) -> Path | None:
    """The path the stack file gives under ``name``, if it gives one."""
    value = stack.get(name)
    return Path(value) if isinstance(value, str) and value else None


def joining_stack(settings: Settings, environ: Mapping[str, str], cwd: Path) -> Settings:
    """``settings`` for a worker started in ``cwd``. When neither ``CAPDISC_REDIS_URL`` nor the
    settings name a Redis and a running stack is found from ``cwd``: that stack's Redis (with
    the password from its password file) and, where the settings leave them unset, its auth
    and keyring. No stack file found: ``settings`` unchanged. A stack file of no running stack
    (left by an ``up`` that is gone, or damaged): :class:`~capdisc.errors.StackNotFoundError`
    naming it, as the ``capdisc`` command says, rather than the default Redis, which is not
    the stack's."""
    if environ.get(REDIS_ENV) or settings.redis_url != DEFAULT_REDIS_URL:
        return settings
    path = _stack_file(stack_start(environ, cwd))
    if path is None:
        return settings
    stack = _read_stack(path)
    if not isinstance(stack, dict):
        raise StackNotFoundError(
            f"no running capdisc stack: {stack}; start it again (capdisc up in "
            f"{path.parent.parent}), or set {REDIS_ENV} to the Redis to use"
        )
    auth = settings.auth if settings.auth is not None else stack.get("auth")
    return settings.with_changes(
        redis_url=stack["redis_url"],
        redis_password_file=named_file(stack, "redis_password_file"),
        auth=auth if isinstance(auth, bool) else None,
        auth_keys_file=settings.auth_keys_file or named_file(stack, "auth_keys_file"),
    ).with_password_file()
