"""Discovery messages: the request a client puts on the requests stream and the reply it gets.

Requests ride a Redis stream read by the discovery workers' consumer group; each reply is pushed
on a per-request list the client blocks on (``capdisc:reply:{request_id}``).

A stream entry has the fields ``payload`` (the request as JSON), ``op`` (``discover``, the
default, or ``session``) and ``deadline_ms``. Everything a worker reads is decoded and checked
here, at the edge (:func:`decode_entry`): the entry's bytes must be UTF-8 and its fields known;
the payload must be one JSON object whose every field has its type and bounds, nested no deeper
than :data:`MAX_DEPTH`, with no lone surrogates; a session import's document is checked field
by field. A problem is a :class:`~capdisc.errors.BadRequestError` whose message names the field,
carrying the request id when one can be read (the sender then gets an error reply). The client
side (:meth:`DiscoverRequest.encode`) refuses text that cannot be sent, naming the field.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any, Literal

from capdisc.agents.formatnames import TOOL_FORMATS
from capdisc.errors import BadRequestError, EventDecodeError, RequestEncodeError
from capdisc.models import KINDS
from capdisc.tenants import TENANT_RE, TENANT_RULE

MAX_QUERY_CHARS = 4096
MAX_REQUEST_BYTES = 64 * 1024
#: Deepest nesting of any value in a request (options, a call's arguments, a session document).
MAX_DEPTH = 32
#: Longest identity token a request may carry.
MAX_TOKEN_CHARS = 8192
#: Largest integer a request may carry (the largest JSON numbers represent exactly).
MAX_INT = 2**53 - 1
MAX_LIMIT = 10_000
#: Longest name (category, profile, tool id, tag, role, user) and longest list of them.
MAX_NAME_CHARS = 256
MAX_ITEMS = 1000
SESSION_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
#: The fields a request stream entry may have, and its ops.
ENTRY_FIELDS = ("op", "payload", "deadline_ms")
ENTRY_OPS = ("discover", "session")
#: Largest entry read (all field names and values): the payload and a little more.
MAX_ENTRY_BYTES = MAX_REQUEST_BYTES + 1024
_DEADLINE_RE = re.compile(r"^[0-9]{1,16}$")


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
    #: The signed identity token (:mod:`capdisc.identity.auth`); with auth on, who asks is the one
    #: it
    #: proves. Never logged, never kept.
    token: str | None = field(default=None, repr=False)

    def encode(self) -> str:
        """The request as JSON; :class:`RequestEncodeError` naming the field when a value
        cannot be sent (text that is not valid Unicode, a value JSON cannot carry)."""
        return _encode(_without_no_token(_shallow(self)), "discovery request")

    @classmethod
    def decode(cls, data: str | bytes) -> DiscoverRequest:
        what = "discovery request"
        raw = _checked_fields(_parse_object(data, what), DISCOVER_FIELDS, DISCOVER_REQUIRED, what)
        return cls(**raw)


SessionOp = Literal["call", "show", "export", "import", "watch"]
SESSION_OPS: tuple[SessionOp, ...] = ("call", "show", "export", "import", "watch")


@dataclass(frozen=True)
class SessionRequest:
    """A request about a session's working set: record an executed tool call, show, export
    or import it, or learn the name of its event stream to watch it. Served by the discovery
    workers, which own the session policy."""

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
    token: str | None = field(default=None, repr=False)

    def encode(self) -> str:
        """The request as JSON (see :meth:`DiscoverRequest.encode`)."""
        return _encode(_without_no_token(_shallow(self)), "session request")

    @classmethod
    def decode(cls, data: str | bytes) -> SessionRequest:
        what = "session request"
        raw = _checked_fields(_parse_object(data, what), SESSION_FIELDS, SESSION_REQUIRED, what)
        if raw["op"] == "call" and raw.get("tool_id") is None:
            raise EventDecodeError("session request field 'tool_id' is required for a call")
        if raw["op"] == "import":
            if raw.get("data") is None:
                raise EventDecodeError(
                    "session request field 'data' is required for an import: the exported session"
                )
            raw["data"] = check_session_document(raw["data"])
        return cls(**raw)


@dataclass(frozen=True)
class Entry:
    """One request read from the stream, decoded and checked."""

    request: DiscoverRequest | SessionRequest
    #: Milliseconds since the epoch, on Redis's clock (:mod:`capdisc.redisclock`), after which
    #: nobody waits for the reply (None: no deadline).
    deadline_ms: int | None = None

    def expired(self, now_ms: float) -> bool:
        return self.deadline_ms is not None and now_ms > self.deadline_ms


def decode_entry(fields: Mapping[Any, Any]) -> Entry:
    """Decode and check a request stream entry (its field names and values, bytes as Redis
    returns them); :class:`BadRequestError` naming the field otherwise, with the request id
    when the payload has a usable one."""
    try:
        return _decode_entry(fields)
    except EventDecodeError as exc:
        raise BadRequestError(str(exc), peek_request_id(fields)) from exc


def peek_request_id(fields: Mapping[Any, Any]) -> str | None:
    """The request id of an entry, if its payload is a JSON object with a well-formed one."""
    raw = fields.get(b"payload", fields.get("payload"))
    if not isinstance(raw, bytes | str) or len(raw) > MAX_REQUEST_BYTES:
        return None
    try:
        decoded = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (ValueError, RecursionError):
        return None
    value = decoded.get("request_id") if isinstance(decoded, dict) else None
    return value if isinstance(value, str) and REQUEST_ID_RE.fullmatch(value) else None


def unencodable(text: str) -> str | None:
    """Why ``text`` cannot be sent as UTF-8 (its first lone surrogate, and where), or None.
    Bytes that were not UTF-8, decoded with ``surrogateescape`` (command-line arguments), are
    named as the bytes they were."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{_char_problem(text[exc.start])} at position {exc.start}"
    return None


# -- the stream entry ------------------------------------------------------------------------------


def _decode_entry(fields: Mapping[Any, Any]) -> Entry:
    texts = _entry_texts(fields)
    op = texts.get("op", "discover")
    if op not in ENTRY_OPS:
        raise EventDecodeError(
            f"request entry field 'op' must be one of {', '.join(ENTRY_OPS)}, got {_short(op)}"
        )
    deadline_ms = _deadline(texts.get("deadline_ms"))
    if "payload" not in texts:
        raise EventDecodeError(
            "request entry field 'payload' is missing: a request entry "
            "carries the request as JSON there"
        )
    payload = texts["payload"]
    request: DiscoverRequest | SessionRequest = (
        SessionRequest.decode(payload) if op == "session" else DiscoverRequest.decode(payload)
    )
    return Entry(request, deadline_ms)


def _entry_texts(fields: Mapping[Any, Any]) -> dict[str, str]:
    size = sum(len(_as_bytes(k)) + len(_as_bytes(v)) for k, v in fields.items())
    if size > MAX_ENTRY_BYTES:
        raise EventDecodeError(f"request entry is {size} bytes, the limit is {MAX_ENTRY_BYTES}")
    texts = {}
    for key, value in fields.items():
        name = _utf8(key, f"request entry field name {_short(key)}")
        if name not in ENTRY_FIELDS:
            raise EventDecodeError(
                f"request entry has unknown field {_short(name)}; an entry "
                f"has {', '.join(ENTRY_FIELDS)}"
            )
        texts[name] = _utf8(value, f"request entry field '{name}'")
    return texts


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogatepass")


def _utf8(value: Any, what: str) -> str:
    """``value`` as text: bytes must be UTF-8 and text valid Unicode."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EventDecodeError(
                f"{what} is not UTF-8 text (byte 0x{value[exc.start]:02x} at offset {exc.start})"
            ) from exc
    text = str(value)
    problem = unencodable(text)
    if problem:
        raise EventDecodeError(f"{what} is not valid Unicode text ({problem})")
    return text


def _deadline(text: str | None) -> int | None:
    if text is None:
        return None
    if not _DEADLINE_RE.fullmatch(text):
        raise EventDecodeError(
            f"request entry field 'deadline_ms' must be a whole number of "
            f"milliseconds since the epoch, got {_short(text)}"
        )
    return int(text) or None


# -- the payload -----------------------------------------------------------------------------------


def _parse_object(data: str | bytes, what: str) -> dict[str, Any]:
    """The payload's JSON object: at most :data:`MAX_REQUEST_BYTES` of UTF-8, no NaN or
    infinity, every field nested no deeper than :data:`MAX_DEPTH` and valid Unicode."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > MAX_REQUEST_BYTES:
        raise EventDecodeError(f"{what} is {size} bytes, the limit is {MAX_REQUEST_BYTES}")
    text = _utf8(data, what) if isinstance(data, bytes) else data
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except RecursionError as exc:
        raise EventDecodeError(f"{what} is nested too deeply to read") from exc
    except ValueError as exc:
        raise EventDecodeError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise EventDecodeError(f"{what} must be a JSON object, got {_kind(raw)}")
    for name, value in raw.items():
        if unencodable(name):
            raise EventDecodeError(
                f"{what} has a field name that is not valid Unicode: {_short(name)}"
            )
        problem = _value_problem(value)
        if problem:
            raise EventDecodeError(f"{what} field {_short(name)} {problem}")
    return raw


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _value_problem(value: Any) -> str | None:
    """Why a decoded JSON value cannot be served: nested deeper than :data:`MAX_DEPTH`, or a
    string (or object key) with a lone surrogate. Iterative: depth is what it checks."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"is nested deeper than {MAX_DEPTH} levels"
        if isinstance(item, str):
            problem = unencodable(item)
            if problem:
                return f"carries text that is not valid Unicode ({problem})"
        elif isinstance(item, dict):
            stack += [(part, depth + 1) for pair in item.items() for part in pair]
        elif isinstance(item, list):
            stack += [(part, depth + 1) for part in item]
    return None


#: A field's check: the problem with a value (to follow "field 'x'"), or None.
Check = Callable[[Any], str | None]


def _checked_fields(
    raw: dict[str, Any], spec: Mapping[str, Check], required: tuple[str, ...], what: str
) -> dict[str, Any]:
    """``raw`` when it has only the fields of ``spec``, all of ``required``, each passing its
    check; :class:`EventDecodeError` naming the first field that does not."""
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        raise EventDecodeError(
            f"{what} field {_short(unknown[0])} is unknown; the fields are {', '.join(spec)}"
        )
    for name in required:
        if name not in raw:
            raise EventDecodeError(f"{what} field '{name}' is required")
    for name, value in raw.items():
        problem = spec[name](value)
        if problem:
            raise EventDecodeError(f"{what} field '{name}' {problem}")
    return raw


def _string(max_chars: int, *, blank: bool = True) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, got {_kind(value)}"
        if not blank and not value.strip():
            return "must be a non-empty string"
        if len(value) > max_chars:
            return f"is {len(value)} characters, the limit is {max_chars}"
        return None

    return check


def _matching(pattern: re.Pattern[str], described: str) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return f"must be a string, got {_kind(value)}"
        return None if pattern.fullmatch(value) else f"must be {described}, got {_short(value)}"

    return check


def _integer(low: int, high: int) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return f"must be an integer, got {_kind(value)}"
        if not low <= value <= high:
            return f"must be from {low} to {high}, got {_short(value)}"
        return None

    return check


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {_kind(value)}"


def _choice(choices: tuple[str, ...]) -> Check:
    def check(value: Any) -> str | None:
        if value in choices and isinstance(value, str):
            return None
        return f"must be one of {', '.join(choices)}, got {_short(value)}"

    return check


def _strings(*, blank: bool) -> Check:
    item = _string(MAX_NAME_CHARS, blank=blank)

    def check(value: Any) -> str | None:
        if not isinstance(value, list):
            return f"must be a list of strings, got {_kind(value)}"
        if len(value) > MAX_ITEMS:
            return f"has {len(value)} items, the limit is {MAX_ITEMS}"
        problems = (item(v) for v in value)
        problem = next((p for p in problems if p), None)
        return f"has an item that {problem}" if problem else None

    return check


def _token(value: Any) -> str | None:
    """A token is checked for type and size only (its value is never quoted back)."""
    if not isinstance(value, str):
        return f"must be a string (a signed token), got {_kind(value)}"
    if len(value) > MAX_TOKEN_CHARS:
        return f"is {len(value)} characters, the limit is {MAX_TOKEN_CHARS}"
    return None


def _json_object(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"must be an object, got {_kind(value)}"


def _anything(_value: Any) -> str | None:
    return None


def _optional(check: Check) -> Check:
    def optional(value: Any) -> str | None:
        return None if value is None else check(value)

    return optional


_TENANT = _matching(TENANT_RE, f"a tenant name ({TENANT_RULE})")
_SESSION = _matching(SESSION_RE, "1-128 letters, digits or '._:-' characters")
_REQUEST_ID = _matching(REQUEST_ID_RE, "1-128 letters, digits or '._:-' characters")
_NAME = _optional(_string(MAX_NAME_CHARS, blank=False))

DISCOVER_FIELDS: dict[str, Check] = {
    "query": _string(MAX_QUERY_CHARS, blank=False),
    "tenant": _TENANT,
    "limit": _optional(_integer(1, MAX_LIMIT)),
    "kind": _optional(_choice(KINDS)),
    "category": _NAME,
    "tags": _strings(blank=True),
    "only_available": _boolean,
    "min_version": _integer(0, MAX_INT),
    "tool_format": _optional(_choice(TOOL_FORMATS)),
    "options": _json_object,
    "request_id": _REQUEST_ID,
    "session": _optional(_SESSION),
    "profile": _NAME,
    "roles": _strings(blank=False),
    "user": _NAME,
    "token": _optional(_token),
}
DISCOVER_REQUIRED = ("query", "request_id")
SESSION_FIELDS: dict[str, Check] = {
    "op": _choice(SESSION_OPS),
    "session": _SESSION,
    "tenant": _TENANT,
    "tool_id": _NAME,
    "arguments": _anything,
    "data": _optional(_json_object),
    "profile": _NAME,
    "roles": _strings(blank=False),
    "user": _NAME,
    "request_id": _REQUEST_ID,
    "token": _optional(_token),
}
SESSION_REQUIRED = ("op", "session", "request_id")


# -- a session import's document ---------------------------------------------------------------


def check_session_document(data: Any) -> dict[str, Any]:
    """An exported session (what ``capdisc session export`` prints), checked field by field:
    ``created_ms`` an integer, ``bound`` an object of capability id -> ``[first_seen_ms,
    last_used_ms, use_count]``, ``loop_evicted`` a list of ids, ``profile`` a name or null.
    :class:`EventDecodeError` naming the field otherwise."""
    what = "session import"
    if not isinstance(data, dict):
        raise EventDecodeError(
            f"{what} must be an exported session (a JSON object), got {_kind(data)}"
        )
    return _checked_fields(data, DOCUMENT_FIELDS, ("created_ms",), what)


def _bound(value: Any) -> str | None:
    if not isinstance(value, dict):
        return (
            f"must be an object of capability id -> [first_seen_ms, last_used_ms, "
            f"use_count], got {_kind(value)}"
        )
    if len(value) > MAX_ITEMS:
        return f"has {len(value)} entries, the limit is {MAX_ITEMS}"
    for cap_id, entry in value.items():
        if not cap_id or len(cap_id) > MAX_NAME_CHARS:
            return f"has a capability id that is empty or longer than {MAX_NAME_CHARS}"
        if not _bound_entry(entry):
            return (
                f"entry {_short(cap_id)} must be [first_seen_ms, last_used_ms, use_count], "
                f"three integers from 0 to {MAX_INT}"
            )
    return None


def _bound_entry(entry: Any) -> bool:
    return isinstance(entry, list) and len(entry) == 3 and not any(_MS(v) for v in entry)


_MS = _integer(0, MAX_INT)


DOCUMENT_FIELDS: dict[str, Check] = {
    "session_id": _optional(_string(MAX_NAME_CHARS)),
    "profile": _NAME,
    "created_ms": _MS,
    "bound": _bound,
    "loop_evicted": _strings(blank=False),
}


# -- encoding (the client's side) ----------------------------------------------------------------


def _shallow(request: DiscoverRequest | SessionRequest) -> dict[str, Any]:
    """The request's fields by name, values as they are (JSON encoding reads them, so no deep
    copy as ``dataclasses.asdict`` makes)."""
    return {f.name: getattr(request, f.name) for f in dataclass_fields(request)}


def _without_no_token(fields: dict[str, Any]) -> dict[str, Any]:
    """Fields to send: without ``token`` when there is none (a worker that predates tokens
    still reads such a request)."""
    if fields.get("token") is None:
        fields.pop("token", None)
    return fields


def _encode(fields: dict[str, Any], what: str) -> str:
    """``fields`` as compact JSON; when they cannot be sent, the error names the first field
    that cannot (each is tried on its own only then). A request larger than a worker reads
    (:data:`MAX_REQUEST_BYTES`) is refused here: a worker could not even find its id to
    answer it. So is a request id a worker would refuse: no reply could reach the sender."""
    problem = _REQUEST_ID(fields.get("request_id"))
    if problem:
        raise RequestEncodeError(f"{what} field 'request_id' {problem}")
    try:
        text = json.dumps(fields, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        size = len(text.encode("utf-8"))
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        pass
    else:
        if size > MAX_REQUEST_BYTES:
            raise RequestEncodeError(_too_large(fields, what, size))
        return text
    for name, value in fields.items():
        problem = _unsendable(value)
        if problem:
            raise RequestEncodeError(f"{what} field '{name}' {problem}")
    raise RequestEncodeError(f"{what} cannot be sent as JSON")  # no single field is to blame


def _too_large(fields: dict[str, Any], what: str, size: int) -> str:
    """Why a request of ``size`` bytes cannot be sent, naming its largest field."""
    sizes = {
        name: len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        for name, value in fields.items()
    }
    largest = max(sizes, key=sizes.__getitem__)
    limit = f" (a query may have {MAX_QUERY_CHARS} characters)" if largest == "query" else ""
    return (
        f"{what} is {size} bytes, the limit is {MAX_REQUEST_BYTES}: its field '{largest}' "
        f"takes {sizes[largest]} of them; shorten it{limit}"
    )


def _unsendable(value: Any) -> str | None:
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"carries text that is not valid Unicode ({_char_problem(exc.object[exc.start])})"
            "; pass UTF-8 text"
        )
    except (TypeError, ValueError, RecursionError) as exc:
        return f"cannot be sent as JSON ({exc})"
    return None


# -- message helpers -------------------------------------------------------------------------------


def _char_problem(char: str) -> str:
    if "\udc80" <= char <= "\udcff":  # what surrogateescape makes of a byte that is not UTF-8
        return f"byte 0x{ord(char) - 0xDC00:02x} that is not UTF-8 (lone surrogate {char!a})"
    return f"lone surrogate {char!a}"


def _kind(value: Any) -> str:
    kinds = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
        bytes: "bytes",
    }
    return kinds.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 40) -> str:
    """A bounded, printable rendering of a value for a message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 120:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."
