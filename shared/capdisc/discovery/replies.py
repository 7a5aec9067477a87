"""Discovery replies as typed values, on both sides of the wire.

A discovery worker answers each request with one of three replies, pushed as JSON on the
request's reply list; the client reads it back with :func:`decode_reply`:

* :class:`DiscoverReply` - a turn's ranked capabilities, rendered tiers and, in a session, the
  session's working set; with a tool format, the tool definitions to bind.
* :class:`SessionReply` - the outcome of a session command (a recorded call, a working set, an
  export).
* :class:`ErrorReply` - the request was not answered: a ``code`` from the one vocabulary of
  :data:`capdisc.errors.ERROR_CODES` and a message that says what to do. The client raises
  the error the code stands for.

A reply that lacks a field, or carries one of the wrong type, is refused with
:class:`~capdisc.errors.EventDecodeError` naming the field: a renamed key fails loudly instead
of reading as an empty default.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from capdisc.errors import ERROR_CODES, CapdiscError, EventDecodeError, error_for
from capdisc.models import SourceRef
from capdisc.sessions.views import SessionView

T = TypeVar("T")
JSON = dict[str, Any]


# -- reading fields ------------------------------------------------------------------------------


def _field(raw: Mapping[str, Any], name: str, kind: type[T] | tuple[type, ...], where: str) -> T:
    """``raw[name]``, which must be of ``kind``; :class:`EventDecodeError` naming it otherwise."""
    if name not in raw:
        raise EventDecodeError(f"{where} has no field '{name}'")
    value = raw[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, float)):
        raise EventDecodeError(
            f"{where} field '{name}' has the wrong type ({type(value).__name__})"
        )
    return value  # type: ignore[return-value]


def _optional(
    raw: Mapping[str, Any], name: str, kind: type[T] | tuple[type, ...], where: str, default: T
) -> T:
    return default if raw.get(name) is None else _field(raw, name, kind, where)


def _number(raw: Mapping[str, Any], name: str, where: str) -> float:
    return float(_field(raw, name, (int, float), where))


# -- the parts of a discover reply ---------------------------------------------------------------


@dataclass(frozen=True)
class CapabilityView:
    """One found capability as a reply carries it."""

    id: str
    kind: str
    name: str
    display_name: str
    description: str
    category: str
    available: bool
    score: float
    relevance: float
    tier: int
    #: Why it was included beyond its own relevance (graph re-ranking, an expert tool).
    reason: str | None = None
    #: The tool-poisoning rules that fired on it, with where (see capdisc.registry.flags).
    flags: tuple[JSON, ...] | None = None

    def to_dict(self) -> JSON:
        entry: JSON = {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "display_name": self.display_name,
            "description": self.description,
            "category": self.category,
            "available": self.available,
            "score": self.score,
            "relevance": self.relevance,
            "tier": self.tier,
        }
        if self.reason:
            entry["reason"] = self.reason
        if self.flags is not None:
            entry["flags"] = [dict(f) for f in self.flags]
        return entry

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> CapabilityView:
        flags = _optional(raw, "flags", list, where, None)
        return cls(
            id=_field(raw, "id", str, where),
            kind=_field(raw, "kind", str, where),
            name=_field(raw, "name", str, where),
            display_name=_field(raw, "display_name", str, where),
            description=_field(raw, "description", str, where),
            category=_field(raw, "category", str, where),
            available=_field(raw, "available", bool, where),
            score=_number(raw, "score", where),
            relevance=_number(raw, "relevance", where),
            tier=_field(raw, "tier", int, where),
            reason=_optional(raw, "reason", str, where, None),
            flags=tuple(flags) if flags is not None else None,
        )


@dataclass(frozen=True)
class Tiers:
    """The three rendered tiers: the category overview, the top matches, the full schemas."""

    tier0: str
    tier1: str
    tier2: str

    def render(self) -> str:
        return "\n\n".join(t for t in (self.tier0, self.tier1, self.tier2) if t)

    def to_dict(self) -> JSON:
        return {"tier0": self.tier0, "tier1": self.tier1, "tier2": self.tier2}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> Tiers:
        return cls(*(_field(raw, name, str, where) for name in ("tier0", "tier1", "tier2")))


@dataclass(frozen=True)
class ToolBundle:
    """Tool definitions in one format, the map from each tool name back to its capability id
    (the meta-tool included), and, for tools imported from an MCP server, where to call them
    (tool name -> the capability's :class:`~capdisc.models.SourceRef`: ``mcp:<url>`` or
    ``mcp:<command>`` and the tool's name there; on the wire, ``tool_sources``)."""

    tools: tuple[JSON, ...]
    tool_names: Mapping[str, str]
    sources: Mapping[str, SourceRef] = field(default_factory=dict)

    def to_dict(self) -> JSON:
        bundle: JSON = {"tools": list(self.tools), "tool_names": dict(self.tool_names)}
        if self.sources:
            bundle["tool_sources"] = {name: ref.to_dict() for name, ref in self.sources.items()}
        return bundle

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str) -> ToolBundle:
        sources = _optional(raw, "tool_sources", dict, where, {})
        return cls(
            tuple(_field(raw, "tools", list, where)),
            dict(_field(raw, "tool_names", dict, where)),
            {str(name): _source_ref(ref, f"{where} tool source") for name, ref in sources.items()},
        )


def _source_ref(value: Any, where: str) -> SourceRef:
    raw = _mapping(value, where)
    return SourceRef(
        type=_field(raw, "type", str, where),
        source=_field(raw, "source", str, where),
        location=_field(raw, "location", str, where),
    )


def _session_view(raw: Mapping[str, Any], where: str) -> SessionView:
    return SessionView(
        id=_field(raw, "id", str, where),
        bound=tuple(_field(raw, "bound", list, where)),
        added=tuple(_optional(raw, "added", list, where, [])),
        evicted=tuple(_optional(raw, "evicted", list, where, [])),
        redundant_search=_optional(raw, "redundant_search", bool, where, False),
        note=_optional(raw, "note", str, where, None),
        installable=tuple(_optional(raw, "installable", list, where, [])),
        restarted=_optional(raw, "restarted", str, where, None),
    )


# -- the three replies ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DiscoverReply:
    """The answer to one discovery turn."""

    request_id: str
    query: str
    tenant: str
    index_version: int
    abstained: bool
    capabilities: tuple[CapabilityView, ...]
    tiers: Tiers
    tokens: Mapping[str, int]
    total_indexed: int
    #: Category -> workflow guidance for the categories found, in the order first found.
    workflow_hints: Mapping[str, str] = field(default_factory=dict)
    session: SessionView | None = None
    #: With a tool format: the definitions to bind (in a session, its whole working set).
    tools: ToolBundle | None = None
    worker: str = ""
    took_ms: float = 0.0
    #: Of ``took_ms``, the time spent in the query model (0 when every vector was cached).
    model_ms: float = 0.0

    @property
    def ids(self) -> list[str]:
        return [c.id for c in self.capabilities]

    @property
    def context(self) -> str:
        return self.tiers.render()

    def to_dict(self) -> JSON:
        reply: JSON = {
            "request_id": self.request_id,
            "query": self.query,
            "tenant": self.tenant,
            "index_version": self.index_version,
            "abstained": self.abstained,
            "capabilities": [c.to_dict() for c in self.capabilities],
            "context": self.context,
            "tiers": self.tiers.to_dict(),
            "tokens": dict(self.tokens),
            "total_indexed": self.total_indexed,
            "workflow_hints": dict(self.workflow_hints),
            "worker": self.worker,
            "took_ms": self.took_ms,
            "model_ms": self.model_ms,
        }
        if self.session is not None:
            reply["session"] = self.session.to_dict()
            reply["redundant_search"] = self.session.redundant_search
            if self.session.note:
                reply["note"] = self.session.note
        if self.tools is not None:
            reply.update(self.tools.to_dict())
        return reply

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DiscoverReply:
        where = "discover reply"
        caps = _field(raw, "capabilities", list, where)
        session = raw.get("session")
        return cls(
            request_id=_field(raw, "request_id", str, where),
            query=_field(raw, "query", str, where),
            tenant=_field(raw, "tenant", str, where),
            index_version=_field(raw, "index_version", int, where),
            abstained=_field(raw, "abstained", bool, where),
            capabilities=tuple(
                CapabilityView.from_dict(_mapping(c, f"{where} capability"), f"{where} capability")
                for c in caps
            ),
            tiers=Tiers.from_dict(_field(raw, "tiers", dict, where), f"{where} tiers"),
            tokens=dict(_field(raw, "tokens", dict, where)),
            total_indexed=_field(raw, "total_indexed", int, where),
            workflow_hints=dict(_field(raw, "workflow_hints", dict, where)),
            session=(
                _session_view(_mapping(session, f"{where} session"), f"{where} session")
                if session is not None
                else None
            ),
            tools=ToolBundle.from_dict(raw, where) if "tools" in raw else None,
            worker=_optional(raw, "worker", str, where, ""),
            took_ms=_optional(raw, "took_ms", (int, float), where, 0.0),
            model_ms=_optional(raw, "model_ms", (int, float), where, 0.0),
        )

    def with_timing(self, worker: str, took_ms: float) -> DiscoverReply:
        return _with(self, worker=worker, took_ms=took_ms)

    def with_model_time(self, model_ms: float) -> DiscoverReply:
        return _with(self, model_ms=round(model_ms, 3))


@dataclass(frozen=True)
class SessionReply:
    """The outcome of a session command: ``body`` is a recorded call's outcome (``loop_detected``
    and what to do), ``{"working_set": ...}`` or ``{"session": ...}`` (an export)."""

    request_id: str
    body: Mapping[str, Any]
    worker: str = ""
    took_ms: float = 0.0

    def to_dict(self) -> JSON:
        return {
            **self.body,
            "request_id": self.request_id,
            "worker": self.worker,
            "took_ms": self.took_ms,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SessionReply:
        where = "session reply"
        body = {k: v for k, v in raw.items() if k not in ("request_id", "worker", "took_ms")}
        if not body:
            raise EventDecodeError(f"{where} carries no outcome")
        return cls(
            _field(raw, "request_id", str, where),
            body,
            _optional(raw, "worker", str, where, ""),
            _optional(raw, "took_ms", (int, float), where, 0.0),
        )

    def with_timing(self, worker: str, took_ms: float) -> SessionReply:
        return _with(self, worker=worker, took_ms=took_ms)


@dataclass(frozen=True)
class ErrorReply:
    """A request that was not answered: why, in the one error vocabulary."""

    request_id: str
    code: str
    message: str
    worker: str = ""
    took_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.code not in ERROR_CODES:
            raise ValueError(f"unknown error code {self.code!r}; add it to capdisc.errors")

    @classmethod
    def of(cls, request_id: str, exc: CapdiscError) -> ErrorReply:
        return cls(request_id, exc.code, str(exc))

    def error(self) -> CapdiscError:
        """The error this reply stands for, to raise where the request was made."""
        return error_for(self.code, self.message)

    def to_dict(self) -> JSON:
        reply: JSON = {"request_id": self.request_id, "error": self.code, "message": self.message}
        if self.worker:
            reply.update(worker=self.worker, took_ms=self.took_ms)
        return reply

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ErrorReply:
        where = "error reply"
        code = _field(raw, "error", str, where)
        return cls(
            _field(raw, "request_id", str, where),
            code if code in ERROR_CODES else CapdiscError.code,
            _field(raw, "message", str, where)
            + ("" if code in ERROR_CODES else f" (error code {code!r})"),
            _optional(raw, "worker", str, where, ""),
            _optional(raw, "took_ms", (int, float), where, 0.0),
        )

    def with_timing(self, worker: str, took_ms: float) -> ErrorReply:
        return _with(self, worker=worker, took_ms=took_ms)


Reply = DiscoverReply | SessionReply | ErrorReply
R = TypeVar("R", DiscoverReply, SessionReply, ErrorReply)


def decode_reply(raw: Any, expect: Callable[[Mapping[str, Any]], R]) -> R | ErrorReply:
    """A reply read from the wire: an :class:`ErrorReply` when it carries ``error``, else what
    ``expect`` (``DiscoverReply.from_dict`` or ``SessionReply.from_dict``) makes of it."""
    reply = _mapping(raw, "reply")
    if "error" in reply:
        return ErrorReply.from_dict(reply)
    return expect(reply)


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise EventDecodeError(f"{where} is not an object ({type(value).__name__})")
    return value


def _with(reply: T, **changes: Any) -> T:
    return replace(reply, **changes)  # type: ignore[type-var]
