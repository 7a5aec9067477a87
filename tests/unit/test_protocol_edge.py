"""The edge of the discovery workers: every request stream entry is decoded and checked by
:func:`capdisc.discovery.protocol.decode_entry` before anything acts on it, and the client refuses
to send
text that cannot be encoded. Each bad entry is refused with a message naming the field, and
with the request id when one can be read (that decides between an error reply and a dead
letter)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capdisc.discovery.protocol import (
    MAX_REQUEST_BYTES,
    DiscoverRequest,
    SessionRequest,
    decode_entry,
    peek_request_id,
    unencodable,
)
from capdisc.errors import BadRequestError, CapdiscError, RequestEncodeError

DROP = object()


def _json(base: dict[str, Any], changes: dict[str, Any]) -> bytes:
    fields = {**base, **changes}
    return json.dumps({k: v for k, v in fields.items() if v is not DROP}).encode()


def discover(**changes: Any) -> dict[bytes, bytes]:
    """A discover entry whose payload has ``changes`` (DROP removes a field)."""
    return {b"payload": _json({"query": "post to slack", "request_id": "r-1"}, changes)}


def session(**changes: Any) -> dict[bytes, bytes]:
    base = {"op": "show", "session": "s-1", "request_id": "r-2"}
    return {b"op": b"session", b"payload": _json(base, changes)}


def document(**changes: Any) -> dict[str, Any]:
    """An exported session with ``changes``."""
    base = {
        "session_id": "s-0",
        "profile": None,
        "created_ms": 1,
        "bound": {"tool:a": [1, 2, 0]},
        "loop_evicted": [],
    }
    return {k: v for k, v in {**base, **changes}.items() if v is not DROP}


def session_import(data: Any) -> dict[bytes, bytes]:
    return session(op="import", data=data)


def raw(payload: bytes, **entry: bytes) -> dict[bytes, bytes]:
    return {b"payload": payload, **{k.encode(): v for k, v in entry.items()}}


BAD_ENTRIES: list[tuple[str, dict[Any, Any], str | None, str]] = [
    # bytes that are not UTF-8
    (
        "payload-garbage",
        raw(b"\xff\xfe garbage"),
        None,
        "request entry field 'payload' is not UTF-8 text (byte 0xff at offset 0)",
    ),
    (
        "payload-utf16",
        raw('{"query": "x", "request_id": "r-1"}'.encode("utf-16")),
        None,
        "field 'payload' is not UTF-8 text",
    ),
    ("field-name-garbage", {b"\xff": b"x"}, None, "field name b'\\xff' is not UTF-8 text"),
    (
        "op-garbage",
        {**discover(), b"op": b"\xc3\x28"},
        "r-1",
        "request entry field 'op' is not UTF-8 text",
    ),
    (
        "deadline-garbage",
        {**discover(), b"deadline_ms": b"\xfe"},
        "r-1",
        "field 'deadline_ms' is not UTF-8 text",
    ),
    (
        "query-lone-surrogate",
        raw(b'{"query": "a\\udc80", "request_id": "r-1"}'),
        "r-1",
        "discovery request field 'query' carries text that is not valid Unicode",
    ),
    (
        "tag-lone-surrogate",
        raw(b'{"query": "a", "tags": ["\\ud800"], "request_id": "r-1"}'),
        "r-1",
        "field 'tags' carries text that is not valid Unicode (lone surrogate '\\ud800' at",
    ),
    (
        "key-lone-surrogate",
        raw(b'{"query": "a", "\\udfff": 1, "request_id": "r-1"}'),
        "r-1",
        "has a field name that is not valid Unicode",
    ),
    # missing fields
    ("no-payload", {b"op": b"discover"}, None, "request entry field 'payload' is missing"),
    ("empty-entry", {}, None, "request entry field 'payload' is missing"),
    ("no-query", discover(query=DROP), "r-1", "discovery request field 'query' is required"),
    (
        "no-request-id",
        discover(request_id=DROP),
        None,
        "discovery request field 'request_id' is required",
    ),
    (
        "session-no-session",
        session(session=DROP),
        "r-2",
        "session request field 'session' is required",
    ),
    ("session-no-op", session(op=DROP), "r-2", "session request field 'op' is required"),
    (
        "call-no-tool",
        session(op="call"),
        "r-2",
        "session request field 'tool_id' is required for a call",
    ),
    (
        "import-no-data",
        session(op="import"),
        "r-2",
        "session request field 'data' is required for an import",
    ),
    # wrong types
    (
        "query-int",
        discover(query=5),
        "r-1",
        "discovery request field 'query' must be a string, got an integer",
    ),
    ("query-blank", discover(query="   "), "r-1", "field 'query' must be a non-empty string"),
    ("query-null", discover(query=None), "r-1", "field 'query' must be a string, got null"),
    ("limit-string", discover(limit="3"), "r-1", "field 'limit' must be an integer, got a string"),
    ("limit-bool", discover(limit=True), "r-1", "field 'limit' must be an integer, got a boolean"),
    ("limit-float", discover(limit=2.5), "r-1", "field 'limit' must be an integer, got a number"),
    ("limit-zero", discover(limit=0), "r-1", "field 'limit' must be from 1 to 10000, got 0"),
    ("tags-string", discover(tags="slack"), "r-1", "field 'tags' must be a list of strings"),
    ("tags-ints", discover(tags=[1]), "r-1", "field 'tags' has an item that must be a string"),
    (
        "only-available-string",
        discover(only_available="yes"),
        "r-1",
        "field 'only_available' must be true or false, got a string",
    ),
    ("options-list", discover(options=[]), "r-1", "field 'options' must be an object, got a list"),
    (
        "min-version-negative",
        discover(min_version=-1),
        "r-1",
        "field 'min_version' must be from 0 to",
    ),
    (
        "min-version-string",
        discover(min_version="1"),
        "r-1",
        "field 'min_version' must be an integer",
    ),
    (
        "tenant-object",
        discover(tenant={"a": 1}),
        "r-1",
        "field 'tenant' must be a string, got an object",
    ),
    ("tenant-bad-name", discover(tenant="a b"), "r-1", "field 'tenant' must be a tenant name"),
    (
        "kind-unknown",
        discover(kind="gadget"),
        "r-1",
        "field 'kind' must be one of tool, skill, extension, channel, got 'gadget'",
    ),
    (
        "tool-format-unknown",
        discover(tool_format="xml"),
        "r-1",
        "field 'tool_format' must be one of",
    ),
    (
        "session-bad-id",
        discover(session="no spaces!"),
        "r-1",
        "field 'session' must be 1-128 letters",
    ),
    (
        "roles-empty-name",
        discover(roles=[""]),
        "r-1",
        "field 'roles' has an item that must be a non-empty string",
    ),
    ("user-empty", discover(user=""), "r-1", "field 'user' must be a non-empty string"),
    (
        "request-id-int",
        discover(request_id=7),
        None,
        "field 'request_id' must be a string, got an integer",
    ),
    ("request-id-spaces", discover(request_id="a b"), None, "field 'request_id' must be 1-128"),
    (
        "request-id-too-long",
        discover(request_id="r" * 129),
        None,
        "field 'request_id' must be 1-128",
    ),
    (
        "session-tool-id-list",
        session(op="call", tool_id=["x"]),
        "r-2",
        "session request field 'tool_id' must be a string, got a list",
    ),
    (
        "session-data-list",
        session(op="import", data=[]),
        "r-2",
        "session request field 'data' must be an object, got a list",
    ),
    # huge values
    (
        "query-huge",
        discover(query="x" * 5000),
        "r-1",
        "field 'query' is 5000 characters, the limit is 4096",
    ),
    (
        "limit-huge",
        discover(limit=10**30),
        "r-1",
        "field 'limit' must be from 1 to 10000, got 1000000000000000000000000000000",
    ),
    ("min-version-huge", discover(min_version=2**60), "r-1", "field 'min_version' must be from 0"),
    ("limit-huge-digits", discover(limit=10**200), "r-1", "got an integer of about 201 digits"),
    (
        "integer-literal-too-long",
        raw(b'{"query": "a", "request_id": "r-1", "limit": ' + b"9" * 5000 + b"}"),
        None,
        "is not valid JSON",
    ),
    ("entry-oversized", discover(query="x" * (MAX_REQUEST_BYTES + 2048)), None, "request entry is"),
    (
        "payload-oversized",
        discover(query="x" * MAX_REQUEST_BYTES),
        None,
        "discovery request is 65570 bytes, the limit is 65536",
    ),
    (
        "payload-just-over",
        raw(b" " * (MAX_REQUEST_BYTES + 1)),
        None,
        f"discovery request is {MAX_REQUEST_BYTES + 1} bytes, the limit is {MAX_REQUEST_BYTES}",
    ),
    (
        "options-nested",
        discover(options={"a": json.loads("[" * 40 + "]" * 40)}),
        "r-1",
        "field 'options' is nested deeper than 32 levels",
    ),
    (
        "arguments-nested",
        session(op="call", tool_id="t", arguments=json.loads("[" * 40 + "]" * 40)),
        "r-2",
        "session request field 'arguments' is nested deeper than 32 levels",
    ),
    ("json-nested-to-recursion", raw(b"[" * 20000 + b"]" * 20000), None, "nested too deeply"),
    ("tags-too-many", discover(tags=["t"] * 1001), "r-1", "field 'tags' has 1001 items"),
    (
        "deadline-too-long",
        {**discover(), b"deadline_ms": b"9" * 20},
        "r-1",
        "field 'deadline_ms' must be a whole number of milliseconds",
    ),
    (
        "deadline-negative",
        {**discover(), b"deadline_ms": b"-5"},
        "r-1",
        "field 'deadline_ms' must be a whole number",
    ),
    # unknown ops and fields
    (
        "op-unknown",
        {**discover(), b"op": b"frobnicate"},
        "r-1",
        "request entry field 'op' must be one of discover, session, got 'frobnicate'",
    ),
    (
        "session-op-unknown",
        session(op="delete"),
        "r-2",
        "session request field 'op' must be one of call, show, export, import, watch, got 'delete'",
    ),
    (
        "entry-field-unknown",
        {**discover(), b"colour": b"red"},
        "r-1",
        "request entry has unknown field 'colour'",
    ),
    (
        "payload-field-unknown",
        discover(colour="red"),
        "r-1",
        "discovery request field 'colour' is unknown",
    ),
    # not a request at all
    ("payload-not-json", raw(b"not json"), None, "discovery request is not valid JSON"),
    ("payload-list", raw(b"[1, 2]"), None, "discovery request must be a JSON object, got a list"),
    ("payload-string", raw(b'"hello"'), None, "must be a JSON object, got a string"),
    (
        "payload-nan",
        raw(b'{"query": "a", "request_id": "r-1", "limit": NaN}'),
        "r-1",
        "NaN is not a number JSON allows",
    ),
    (
        "session-payload-not-json",
        {b"op": b"session", b"payload": b"{"},
        None,
        "session request is not valid JSON",
    ),
    # broken session documents (session import)
    (
        "import-bound-list",
        session_import({"bound": []}),
        "r-2",
        "session import field 'created_ms' is required",
    ),
    (
        "import-bound-list-with-created",
        session_import(document(bound=[])),
        "r-2",
        "session import field 'bound' must be an object of capability id -> [first_seen_ms, "
        "last_used_ms, use_count], got a list",
    ),
    (
        "import-created-string",
        session_import(document(created_ms="x")),
        "r-2",
        "session import field 'created_ms' must be an integer, got a string",
    ),
    (
        "import-created-float",
        session_import(document(created_ms=1.5)),
        "r-2",
        "session import field 'created_ms' must be an integer, got a number",
    ),
    (
        "import-created-negative",
        session_import(document(created_ms=-1)),
        "r-2",
        "session import field 'created_ms' must be from 0 to",
    ),
    (
        "import-created-huge",
        session_import(document(created_ms=10**20)),
        "r-2",
        "session import field 'created_ms' must be from 0 to",
    ),
    (
        "import-bound-short-entry",
        session_import(document(bound={"tool:a": [1, 2]})),
        "r-2",
        "session import field 'bound' entry 'tool:a' must be [first_seen_ms, last_used_ms, "
        "use_count], three integers",
    ),
    (
        "import-bound-string-count",
        session_import(document(bound={"tool:a": [1, 2, "3"]})),
        "r-2",
        "field 'bound' entry 'tool:a' must be",
    ),
    (
        "import-bound-empty-id",
        session_import(document(bound={"": [1, 2, 3]})),
        "r-2",
        "field 'bound' has a capability id that is empty",
    ),
    (
        "import-bound-too-many",
        session_import(document(bound={f"t{i}": [1, 1, 1] for i in range(1001)})),
        "r-2",
        "field 'bound' has 1001 entries",
    ),
    (
        "import-loop-evicted-string",
        session_import(document(loop_evicted="tool:a")),
        "r-2",
        "session import field 'loop_evicted' must be a list of strings",
    ),
    (
        "import-profile-int",
        session_import(document(profile=5)),
        "r-2",
        "session import field 'profile' must be a string, got an integer",
    ),
    (
        "import-unknown-field",
        session_import(document(calls=[])),
        "r-2",
        "session import field 'calls' is unknown",
    ),
    (
        "import-document-missing-created",
        session_import(document(created_ms=DROP)),
        "r-2",
        "session import field 'created_ms' is required",
    ),
]


@pytest.mark.parametrize(
    ("fields", "request_id", "message"),
    [case[1:] for case in BAD_ENTRIES],
    ids=[c[0] for c in BAD_ENTRIES],
)
def test_a_bad_entry_is_refused_naming_the_field_with_its_request_id_if_readable(
    fields: dict[Any, Any], request_id: str | None, message: str
) -> None:
    with pytest.raises(BadRequestError) as refused:
        decode_entry(fields)

    assert message in str(refused.value)
    assert refused.value.request_id == request_id
    assert len(str(refused.value)) < 400  # bounded, whatever the entry carried


GOOD_ENTRIES: list[tuple[str, dict[Any, Any], Any]] = [
    ("discover-minimal", discover(), DiscoverRequest(query="post to slack", request_id="r-1")),
    (
        "discover-full",
        discover(
            tenant="acme",
            limit=3,
            kind="tool",
            category="communication",
            tags=["chat"],
            only_available=True,
            min_version=4,
            tool_format="mcp",
            options={"tier1_top_k": 8},
            session="s:1",
            profile="billing",
            roles=["finance"],
            user="a@example.com",
        ),
        DiscoverRequest(
            query="post to slack",
            request_id="r-1",
            tenant="acme",
            limit=3,
            kind="tool",
            category="communication",
            tags=["chat"],
            only_available=True,
            min_version=4,
            tool_format="mcp",
            options={"tier1_top_k": 8},
            session="s:1",
            profile="billing",
            roles=["finance"],
            user="a@example.com",
        ),
    ),
    (
        "discover-op-named",
        {**discover(), b"op": b"discover"},
        DiscoverRequest(query="post to slack", request_id="r-1"),
    ),
    ("session-show", session(), SessionRequest(op="show", session="s-1", request_id="r-2")),
    (
        "session-call",
        session(op="call", tool_id="tool:a", arguments={"x": [1, {"y": None}]}),
        SessionRequest(
            op="call",
            session="s-1",
            request_id="r-2",
            tool_id="tool:a",
            arguments={"x": [1, {"y": None}]},
        ),
    ),
    (
        "session-import",
        session_import(document()),
        SessionRequest(op="import", session="s-1", request_id="r-2", data=document()),
    ),
    (
        "text-fields",
        {"payload": json.dumps({"query": "é", "request_id": "r-3"})},
        DiscoverRequest(query="é", request_id="r-3"),
    ),
]


@pytest.mark.parametrize(
    ("fields", "expected"), [c[1:] for c in GOOD_ENTRIES], ids=[c[0] for c in GOOD_ENTRIES]
)
def test_a_good_entry_decodes_to_its_request(fields: dict[Any, Any], expected: Any) -> None:
    assert decode_entry(fields).request == expected


def test_the_deadline_is_read_and_zero_means_none() -> None:
    assert (
        decode_entry({**discover(), b"deadline_ms": b"1700000000000"}).deadline_ms == 1700000000000
    )
    assert decode_entry({**discover(), b"deadline_ms": b"0"}).deadline_ms is None
    entry = decode_entry({**discover(), b"deadline_ms": b"1000"})
    assert entry.expired(1001.0) and not entry.expired(999.0)


def test_what_a_client_encodes_a_worker_decodes() -> None:
    request = DiscoverRequest(
        query="open a pull request", tags=["git"], limit=2, options={"tier2_top_k": 1}
    )
    call = SessionRequest(op="import", session="s-9", data=document())

    assert decode_entry({b"payload": request.encode().encode()}).request == request
    assert decode_entry({b"op": b"session", b"payload": call.encode().encode()}).request == call


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (discover(), "r-1"),
        (discover(query=5), "r-1"),
        ({b"payload": b"\xff"}, None),
        ({b"payload": b"[]"}, None),
        (discover(request_id="x y"), None),
        ({b"op": b"session"}, None),
        ({b"payload": b"[" * 20000}, None),
    ],
)
def test_peek_request_id_reads_only_a_well_formed_id(
    fields: dict[Any, Any], expected: str | None
) -> None:
    assert peek_request_id(fields) == expected


@pytest.mark.parametrize(
    ("message", "field", "problem"),
    [
        (
            DiscoverRequest(query="\udc80"),
            "query",
            "byte 0x80 that is not UTF-8 (lone surrogate '\\udc80')",
        ),
        (DiscoverRequest(query="ok", tags=["a", "\ud800"]), "tags", "lone surrogate '\\ud800'"),
        (DiscoverRequest(query="ok", tenant="t\udcff"), "tenant", "byte 0xff"),
        (DiscoverRequest(query="ok", options={"k\udc80": 1}), "options", "lone surrogate"),
        (DiscoverRequest(query="ok", roles=["r\udc81"]), "roles", "byte 0x81"),
        (DiscoverRequest(query="ok", options={"x": {1, 2}}), "options", "cannot be sent as JSON"),
        (
            DiscoverRequest(query="ok", options={"x": float("nan")}),
            "options",
            "cannot be sent as JSON",
        ),
        (
            SessionRequest(op="call", session="s", tool_id="t", arguments={"a": "\udc80"}),
            "arguments",
            "not valid Unicode",
        ),
        (
            SessionRequest(op="import", session="s", data={"bound": {"\ud83d": [1, 1, 1]}}),
            "data",
            "lone surrogate",
        ),
    ],
)
def test_the_client_refuses_text_it_cannot_encode_naming_the_field(
    message: DiscoverRequest | SessionRequest, field: str, problem: str
) -> None:
    with pytest.raises(RequestEncodeError) as refused:
        message.encode()

    assert isinstance(refused.value, CapdiscError)
    assert f"field '{field}'" in str(refused.value) and problem in str(refused.value)


@pytest.mark.parametrize(
    ("message", "field", "limit"),
    [
        (DiscoverRequest(query="x" * (MAX_REQUEST_BYTES + 1)), "query", "4096 characters"),
        (
            SessionRequest(op="call", session="s", tool_id="t", arguments={"a": "é" * 40_000}),
            "arguments",
            "shorten it",
        ),
    ],
)
def test_the_client_refuses_a_request_larger_than_a_worker_reads_naming_its_largest_field(
    message: DiscoverRequest | SessionRequest, field: str, limit: str
) -> None:
    with pytest.raises(RequestEncodeError) as refused:
        message.encode()

    text = str(refused.value)
    assert f"the limit is {MAX_REQUEST_BYTES}: its field '{field}'" in text and limit in text


def test_a_request_of_exactly_the_limit_is_sent_and_read() -> None:
    base = SessionRequest(op="call", session="s", tool_id="t", arguments="", request_id="r-1")
    room = MAX_REQUEST_BYTES - len(base.encode().encode("utf-8"))
    request = SessionRequest(
        op="call", session="s", tool_id="t", arguments="a" * room, request_id="r-1"
    )

    payload = request.encode()

    assert len(payload.encode("utf-8")) == MAX_REQUEST_BYTES
    assert SessionRequest.decode(payload) == request


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("fine ✓", None),
        ("ab\udcff", "byte 0xff that is not UTF-8 (lone surrogate '\\udcff') at position 2"),
        ("\ud800x", "lone surrogate '\\ud800' at position 0"),
    ],
)
def test_unencodable_names_the_first_bad_character(text: str, problem: str | None) -> None:
    assert unencodable(text) == problem
