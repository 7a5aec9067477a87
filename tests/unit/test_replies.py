"""Replies on the wire: typed on both sides, one error vocabulary, and a reply that lacks a
field or carries a wrong type is refused naming it (never read as an empty default)."""

from __future__ import annotations

from typing import Any

import pytest

from capdisc import errors
from capdisc.discovery.replies import (
    DiscoverReply,
    ErrorReply,
    SessionReply,
    Tiers,
    decode_reply,
)
from capdisc.errors import ERROR_CODES, CapdiscError, EventDecodeError, error_for

GOOD: dict[str, Any] = {
    "request_id": "r1",
    "query": "refund",
    "tenant": "acme",
    "index_version": 3,
    "abstained": False,
    "capabilities": [
        {
            "id": "tool:a",
            "kind": "tool",
            "name": "a",
            "display_name": "A",
            "description": "d",
            "category": "c",
            "available": True,
            "score": 0.5,
            "relevance": 0.9,
            "tier": 1,
        }
    ],
    "context": "x",
    "tiers": {"tier0": "x", "tier1": "", "tier2": ""},
    "tokens": {"tier0": 1},
    "total_indexed": 1,
    "workflow_hints": {},
    "worker": "w",
    "took_ms": 1.0,
    "model_ms": 0.5,
}


def test_a_discover_reply_reads_back_what_was_sent() -> None:
    reply = DiscoverReply.from_dict(GOOD)

    assert reply.ids == ["tool:a"] and reply.tiers == Tiers("x", "", "")
    assert DiscoverReply.from_dict(reply.to_dict()) == reply


def test_a_discover_reply_of_a_worker_that_does_not_time_its_model_reads_as_no_model_time() -> None:
    raw = {k: v for k, v in GOOD.items() if k != "model_ms"}

    assert DiscoverReply.from_dict(raw).model_ms == 0.0


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"model_ms": "fast"}, "field 'model_ms' has the wrong type"),
        ({"index_version": None}, "field 'index_version' has the wrong type"),
        ({"abstained": 1}, "field 'abstained' has the wrong type"),
        ({"index_version": True}, "field 'index_version' has the wrong type"),
        ({"tiers": {"tier0": "x", "tier1": ""}}, "tiers has no field 'tier2'"),
        ({"capabilities": ["tool:a"]}, "capability is not an object"),
        ({"session": {"bound": []}}, "session has no field 'id'"),
    ],
)
def test_a_malformed_discover_reply_is_refused_naming_the_field(
    change: dict[str, Any], says: str
) -> None:
    with pytest.raises(EventDecodeError, match=says):
        DiscoverReply.from_dict({**GOOD, **change})


@pytest.mark.parametrize("missing", ["query", "tenant", "capabilities", "tokens", "tiers"])
def test_a_discover_reply_without_a_field_is_refused_naming_it(missing: str) -> None:
    raw = {k: v for k, v in GOOD.items() if k != missing}

    with pytest.raises(EventDecodeError, match=f"no field '{missing}'"):
        DiscoverReply.from_dict(raw)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("unknown_tenant", errors.UnknownTenantError),
        ("session_not_found", errors.SessionNotFoundError),
        ("unauthorized", errors.AuthError),
        ("forbidden", errors.ForbiddenError),
        ("invalid_option", errors.ConfigError),
        ("embedding_failed", errors.EmbeddingError),
        ("bad_request", errors.BadRequestError),
        ("quarantined", errors.QuarantinedError),
        ("internal", CapdiscError),
    ],
)
def test_an_error_reply_raises_the_error_its_code_stands_for(
    code: str, error: type[Exception]
) -> None:
    raw = {"request_id": "r1", "error": code, "message": "what to do"}

    reply = decode_reply(raw, DiscoverReply.from_dict)

    assert isinstance(reply, ErrorReply)
    raised = reply.error()
    assert type(raised) is error and "what to do" in str(raised)


def test_every_error_class_has_its_own_code() -> None:
    classes = [
        c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, CapdiscError)
    ]

    assert len({c.code for c in classes}) == len(classes)
    assert all(ERROR_CODES[c.code] is c for c in classes)


def test_an_unknown_error_code_keeps_the_code_in_the_message() -> None:
    raised = error_for("gone_fishing", "try later")

    assert type(raised) is CapdiscError and "gone_fishing" in str(raised)


def test_a_reply_cannot_carry_a_code_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="unknown error code"):
        ErrorReply("r1", "SessionNotFoundError", "no such session")


def test_a_session_reply_keeps_its_outcome_and_needs_one() -> None:
    reply = SessionReply.from_dict({"request_id": "r1", "loop_detected": False, "worker": "w"})

    assert reply.body == {"loop_detected": False}
    with pytest.raises(EventDecodeError, match="carries no outcome"):
        SessionReply.from_dict({"request_id": "r1", "worker": "w"})


def test_a_session_that_started_again_reads_back_why() -> None:
    session = {"id": "s1", "bound": ["tool:a"], "restarted": "evicted", "note": "had ended"}
    reply = DiscoverReply.from_dict({**GOOD, "session": session})

    assert reply.session is not None and reply.session.restarted == "evicted"
    assert DiscoverReply.from_dict(reply.to_dict()) == reply
