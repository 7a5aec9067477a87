"""A session's keys (its state, its event stream, each request's remembered outcome) are its
own: no session or request id, however it uses ':', names a key of another session."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capdisc import keys
from capdisc.discovery.protocol import REQUEST_ID_RE, SESSION_RE

SECRET = "0" * 64
IDS = st.from_regex(SESSION_RE, fullmatch=True)
REQUEST_IDS = st.from_regex(REQUEST_ID_RE, fullmatch=True)


def _keys(session: str, request: str) -> dict[str, str]:
    return {
        "state": keys.session("acme", session),
        "events": keys.session_events("acme", session, SECRET),
        "request": keys.session_request("acme", session, request),
    }


def test_a_session_named_after_another_ones_stream_or_request_has_keys_of_its_own() -> None:
    named = ["s1", "s1:events", "s1:req:r1", "s1:req"]
    owned = [
        (session, kind, key)
        for session in named
        for kind, key in _keys(session, "r1" if session != "s1" else "req:r1").items()
    ]

    for (one, one_kind, one_key), (other, other_kind, other_key) in itertools.combinations(
        owned, 2
    ):
        assert one_key != other_key, (one, one_kind, other, other_kind)


@given(IDS, REQUEST_IDS, IDS, REQUEST_IDS)
def test_keys_of_different_sessions_or_requests_never_coincide(
    session: str, request: str, other: str, other_request: str
) -> None:
    mine, theirs = _keys(session, request), _keys(other, other_request)
    for (kind, key), (other_kind, other_key) in itertools.product(mine.items(), theirs.items()):
        same = (session, kind) == (other, other_kind) and (
            kind != "request" or request == other_request
        )
        assert (key == other_key) is same


@pytest.mark.parametrize(
    ("tenant", "session", "secret"),
    [("acme", "s1", "1" * 64), ("acme", "s2", SECRET), ("other", "s1", SECRET)],
)
def test_a_session_stream_is_named_by_its_secret_tenant_and_id_together(
    tenant: str, session: str, secret: str
) -> None:
    mine = keys.session_events("acme", "s1", SECRET)

    assert keys.session_events(tenant, session, secret) != mine
    assert mine.startswith("capdisc:t:acme:session:s1~events~") and len(mine.rsplit("~")[-1]) == 32
