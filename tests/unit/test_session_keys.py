"""A session's keys (its state, its event stream, each request's remembered outcome) are its
own: no session or request id, however it uses ':', names a key of another session."""

from __future__ import annotations

import fnmatch
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capdisc import keys
from capdisc.discovery.protocol import REQUEST_ID_RE, SESSION_RE
from capdisc.tenants import TENANT_RE

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
    assert mine.startswith("capdisc:s:acme:s1~events~") and len(mine.rsplit("~")[-1]) == 32


ACL_FILE = Path(__file__).resolve().parents[2] / "infra" / "redis-users.acl"


def _key_patterns(user: str) -> list[str]:
    """The key patterns (``~``, ``%R~``, ``%W~``, in selectors too) of one user of the ACL file."""
    (line,) = [ln for ln in ACL_FILE.read_text().splitlines() if ln.startswith(f"user {user} ")]
    words = line.replace("(", " ").replace(")", " ").split()
    return [w.partition("~")[2] for w in words if w.startswith(("~", "%R~", "%W~", "%RW~"))]


@pytest.mark.parametrize(
    ("user", "kinds"),
    [
        ("capdisc-indexing", ("state", "events", "request")),
        ("capdisc-monitor", ("state", "events", "request")),
        ("capdisc-producer", ("state", "events", "request")),
        ("capdisc-client", ("state", "request")),
    ],
)
@given(session=IDS, request=REQUEST_IDS)
def test_no_key_pattern_of_another_role_reaches_a_session_whatever_its_id(
    user: str, kinds: tuple[str, ...], session: str, request: str
) -> None:
    patterns = _key_patterns(user)
    owned = _keys(session, request)

    reached = [
        (kind, pattern)
        for kind in kinds
        for pattern in patterns
        if fnmatch.fnmatchcase(owned[kind], pattern)
    ]

    assert reached == []


@pytest.mark.parametrize("session", ["s1", "s1:caps", "x.reply.celery.pidbox", "a:vectors:b"])
def test_a_session_named_like_a_registry_key_is_still_out_of_other_roles_reach(
    session: str,
) -> None:
    owned = _keys(session, "r1:version")

    for user in ("capdisc-indexing", "capdisc-monitor", "capdisc-producer"):
        for pattern in _key_patterns(user):
            assert not any(fnmatch.fnmatchcase(key, pattern) for key in owned.values()), (
                user,
                pattern,
            )


@pytest.mark.parametrize(
    ("legacy", "moved"),
    [
        ("capdisc:t:acme:session:s1", "capdisc:s:acme:s1"),
        ("capdisc:t:acme:session:s1~events~abc", "capdisc:s:acme:s1~events~abc"),
        ("capdisc:t:acme:session:a:session:b~req:r:1", "capdisc:s:acme:a:session:b~req:r:1"),
        ("capdisc:t:acme:sessions", "capdisc:s:acme~live"),
        ("capdisc:t:acme:session:x:sessions", "capdisc:s:acme:x:sessions"),
        ("capdisc:t:session:session:s1", "capdisc:s:session:s1"),  # a tenant named session
        ("capdisc:t:session:sessions", "capdisc:s:session~live"),
        ("capdisc:t:acme:sessions:x", None),
        ("capdisc:t:acme:caps", None),
        ("capdisc:t:acme:session:", None),
        ("capdisc:tenants", None),
    ],
)
def test_a_key_from_before_sessions_had_their_own_prefix_maps_to_its_new_name(
    legacy: str, moved: str | None
) -> None:
    assert keys.from_legacy_session_key(legacy) == moved


@pytest.mark.parametrize("user", ["capdisc-indexing", "capdisc-producer", "capdisc-client"])
def test_a_tenants_index_of_live_sessions_is_out_of_other_roles_reach(user: str) -> None:
    index = keys.sessions("acme")

    assert not any(fnmatch.fnmatchcase(index, p) for p in _key_patterns(user))


@given(tenant=st.from_regex(TENANT_RE, fullmatch=True), session=IDS, request=REQUEST_IDS)
def test_no_session_key_is_a_tenants_index_of_sessions(
    tenant: str, session: str, request: str
) -> None:
    owned = _keys(session, request)

    assert keys.sessions(tenant) not in owned.values()
    assert not any(fnmatch.fnmatchcase(key, "capdisc:s:*~live") for key in owned.values())
