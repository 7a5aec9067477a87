"""Tenant names: the one rule, and the check every entry point runs before it writes a key.

A tenant name becomes part of every Redis key of its tenant (``capdisc:t:{tenant}:...``), of a
Weaviate tenant and of a token's claims, so it is 1 to 64 ASCII letters, digits, ``_`` or
``-``, the first a letter or digit: no ``:``, ``*``, ``/``, ``.``, spaces or control characters.
Case counts (``Acme`` and ``acme`` are two tenants): names are taken as given, never folded, so a
tenant and its tokens keep their names. The rule is checked by every command's ``--tenant``, the
:class:`~capdisc.client.Client`, the producers (publish, watch, imports, deletes), the settings,
and again by the workers when they decode a request or an event.
"""

from __future__ import annotations

import re

from capdisc.errors import TenantNameError

#: A tenant name (use ``fullmatch``).
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_TENANT_CHARS = 64
#: What a tenant name may be, for messages.
TENANT_RULE = (
    "1 to 64 ASCII letters, digits, '_' or '-', starting with a letter or digit (case counts)"
)
#: How much of a bad name a message quotes.
SHOWN_CHARS = 40


def is_tenant(name: object) -> bool:
    """Whether ``name`` is a valid tenant name."""
    return isinstance(name, str) and TENANT_RE.fullmatch(name) is not None


def tenant_problem(name: object) -> str | None:
    """Why ``name`` is not a tenant name (a phrase to follow the name), or None if it is one."""
    if not isinstance(name, str):
        return f"is not a tenant name: it is {type(name).__name__}, not text"
    if is_tenant(name):
        return None
    return f"is not a valid tenant name: use {TENANT_RULE}"


def check_tenant(name: object, where: str = "tenant") -> str:
    """``name`` if it is a tenant name; else :class:`TenantNameError` saying what is allowed,
    quoting the name given (shortened) and ``where`` it came from (``--tenant``, a setting)."""
    if isinstance(name, str) and is_tenant(name):
        return name
    raise TenantNameError(f"{where} {shown(name)} {tenant_problem(name)}")


def shown(name: object) -> str:
    """A bounded, printable rendering of a (possibly huge or hostile) name."""
    text = ascii(name)
    if len(text) <= SHOWN_CHARS:
        return text
    size = f" ({len(name)} characters)" if isinstance(name, str) else ""
    return f"{text[:SHOWN_CHARS]}...{size}"


__all__ = [
    "MAX_TENANT_CHARS",
    "TENANT_RE",
    "TENANT_RULE",
    "check_tenant",
    "is_tenant",
    "shown",
    "tenant_problem",
]
