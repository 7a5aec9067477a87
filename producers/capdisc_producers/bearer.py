"""Why ``capdisc mcp --http`` refused a bearer token, said in its 401.

The ``mcp`` SDK's bearer middleware answers every refused token with the same "Authentication
required", so a host whose token expired, was signed with a retired key or names no token at all
cannot tell which, nor what to do. :class:`BearerReasons` sits in front of it: it checks the
request's token with the same keyring first and answers a refused one itself, with 401,
``WWW-Authenticate: Bearer error="invalid_token"`` and the reason as RFC 6750's
``error_description`` (also in the JSON body). A token that verifies goes on to the SDK, which
checks it again and checks its grants (403 ``insufficient_scope``). Refusals are logged by key id
and subject, never the token, at most :class:`~capdisc.logs.Throttle`'s share a minute.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from capdisc.errors import AuthError
from capdisc.identity import auth
from capdisc.identity.gate import Gate
from capdisc.logs import Throttle
from capdisc_producers.bodylimit import send_error

#: Paths the SDK serves without a token (OAuth metadata).
PUBLIC_PREFIX = "/.well-known/"
_UNSAFE = re.compile(r'[^\x20-\x7e]|["\\]')


class BearerReasons:
    """Wraps the SDK's authenticated app: a request whose bearer token ``gate`` refuses gets a
    401 saying why."""

    def __init__(self, app: ASGIApp, gate: Gate, log: Any) -> None:
        self.app = app
        self.gate = gate
        self.log = log
        self.throttle = Throttle()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path", "").startswith(PUBLIC_PREFIX):
            await self.app(scope, receive, send)
            return
        token = bearer_token(scope)
        try:
            self.gate.identity(token)
        except AuthError as exc:
            self._logged(exc, token)
            await _challenge(send, str(exc))
            return
        await self.app(scope, receive, send)

    def _logged(self, exc: AuthError, token: str | None) -> None:
        left_out = self.throttle.admit()
        if left_out is not None:
            self.log.warning(
                "mcp_token_refused", reason=exc.reason, left_out=left_out, **auth.label(token)
            )


def bearer_token(scope: Scope) -> str | None:
    """The token of the request's ``Authorization: Bearer`` header (None without one)."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return (token.strip() or None) if scheme.lower() == "bearer" else None
    return None


def header_safe(text: str) -> str:
    """``text`` as a quoted-string's content: printable ASCII, no quote or backslash."""
    return _UNSAFE.sub("?", text.replace('"', "'"))


async def _challenge(send: Send, reason: str) -> None:
    challenge = f'Bearer error="invalid_token", error_description="{header_safe(reason)}"'
    await send_error(
        send, 401, "invalid_token", reason, [(b"www-authenticate", challenge.encode())]
    )
