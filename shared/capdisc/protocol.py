"""Discovery messages: the request a client puts on the requests stream and the reply it gets.

Requests ride a Redis stream read by the discovery workers' consumer group; each reply is pushed
on a per-request list the client blocks on (``capdisc:reply:{request_id}``).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

from capdisc.errors import EventDecodeError
from capdisc.formats import TOOL_FORMATS
from capdisc.models import KINDS

MAX_QUERY_CHARS = 4096
MAX_REQUEST_BYTES = 64 * 1024
SESSION_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
R = TypeVar("R")


@dataclass(frozen=True)
class DiscoverRequest:
    """One per-turn discovery request."""

    query: str
    tenant: str = "default"
    limit: int | None = None
    kind: str | None = None
    category: str | None = None
    tags: list[str] = field(default_factory=list)
    only_available: bool = False
    min_version: int = 0
    tool_format: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The agent session this turn belongs to: found capabilities join its working set.
    session: str | None = None
    #: The agent profile (allowlist, expert tools, budgets) of the session.
    profile: str | None = None
    #: Who asks, within the tenant: only capabilities visible to them come back.
    roles: list[str] = field(default_factory=list)
    user: str | None = None

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, data: str | bytes) -> DiscoverRequest:
        request = _build(cls, data, "discovery request")
        _check(request)
        return request


def _build(cls: type[R], data: str | bytes, what: str) -> R:
    """A request from its JSON object, size-checked; :class:`EventDecodeError` otherwise."""
    if len(data) > MAX_REQUEST_BYTES:
        raise EventDecodeError(f"{what} is {len(data)} bytes, the limit is {MAX_REQUEST_BYTES}")
    try:
        raw = json.loads(data)
        return cls(**raw)
    except (ValueError, TypeError) as exc:
        raise EventDecodeError(f"{what} is malformed: {exc}") from exc


def _check(request: DiscoverRequest) -> None:
    if not isinstance(request.query, str) or not request.query.strip():
        raise EventDecodeError("discovery request field 'query' must be a non-empty string")
    if len(request.query) > MAX_QUERY_CHARS:
        raise EventDecodeError(f"discovery request field 'query' is longer than "
                               f"{MAX_QUERY_CHARS} characters")
    if request.limit is not None and (not isinstance(request.limit, int) or request.limit < 1):
        raise EventDecodeError("discovery request field 'limit' must be a positive integer")
    if request.kind is not None and request.kind not in KINDS:
        raise EventDecodeError(f"discovery request field 'kind' must be one of "
                               f"{', '.join(KINDS)}, got {request.kind!r}")
    if not isinstance(request.tags, list) or not all(isinstance(t, str) for t in request.tags):
        raise EventDecodeError("discovery request field 'tags' must be a list of strings")
    if request.tool_format is not None and request.tool_format not in TOOL_FORMATS:
        raise EventDecodeError(f"discovery request field 'tool_format' must be one of "
                               f"{', '.join(TOOL_FORMATS)}, got {request.tool_format!r}")
    if not isinstance(request.options, dict):
        raise EventDecodeError("discovery request field 'options' must be an object")
    _check_session(request.session, request.profile, "discovery request")
    _check_caller(request.roles, request.user, "discovery request")


def _check_caller(roles: Any, user: Any, what: str) -> None:
    if not isinstance(roles, list) or not all(isinstance(r, str) and r for r in roles):
        raise EventDecodeError(f"{what} field 'roles' must be a list of role names")
    if user is not None and not (isinstance(user, str) and user):
        raise EventDecodeError(f"{what} field 'user' must be a non-empty string")


def _check_session(session: Any, profile: Any, what: str) -> None:
    if session is not None and not (isinstance(session, str)
                                    and SESSION_RE.fullmatch(session)):
        raise EventDecodeError(f"{what} field 'session' must be 1-128 letters, digits or "
                               "'._:-' characters")
    if profile is not None and not isinstance(profile, str):
        raise EventDecodeError(f"{what} field 'profile' must be a string")


SessionOp = Literal["call", "show", "export", "import"]
SESSION_OPS: tuple[SessionOp, ...] = ("call", "show", "export", "import")


@dataclass(frozen=True)
class SessionRequest:
    """A request about a session's working set: record an executed tool call, show, export
    or import it. Served by the discovery workers, which own the session policy."""

    op: SessionOp
    session: str
    tenant: str = "default"
    tool_id: str | None = None
    arguments: Any = None
    data: dict[str, Any] | None = None
    profile: str | None = None
    roles: list[str] = field(default_factory=list)
    user: str | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, data: str | bytes) -> SessionRequest:
        request = _build(cls, data, "session request")
        if request.op not in SESSION_OPS:
            raise EventDecodeError(f"session request field 'op' must be one of "
                                   f"{', '.join(SESSION_OPS)}, got {request.op!r}")
        if request.session is None:
            raise EventDecodeError("session request field 'session' is required")
        _check_session(request.session, request.profile, "session request")
        _check_caller(request.roles, request.user, "session request")
        if request.op == "call" and not (isinstance(request.tool_id, str) and request.tool_id):
            raise EventDecodeError("session request field 'tool_id' is required for a call")
        if request.op == "import" and not isinstance(request.data, dict):
            raise EventDecodeError("session request field 'data' must be an exported session")
        return request


def error_reply(request_id: str, error: str, message: str) -> dict[str, Any]:
    """The reply for a request that could not be answered."""
    return {"request_id": request_id, "error": error, "message": message}
