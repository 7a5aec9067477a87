"""Identity tokens (capdisc.identity.auth): what verifies, what does not and why, key rotation,
files."""

from __future__ import annotations

import base64
import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from capdisc.errors import AuthError, ConfigError, ForbiddenError
from capdisc.identity import auth
from capdisc.identity.gate import served_as

NOW = 1_750_000_000.0
SECRET = "s" * 40
OTHER = "o" * 40
KEYRING = auth.Keyring.from_mapping({"k1": SECRET})


def token(keyring: auth.Keyring = KEYRING, **overrides: Any) -> str:
    fields: dict[str, Any] = {
        "tenant": "acme",
        "roles": ["finance"],
        "user": "alice",
        "grants": ["discover"],
        "ttl_s": 3600,
        "now": NOW,
    }
    fields.update(overrides)
    return auth.issue(keyring, **fields)


def signed(
    claims: dict[str, Any], secret: str = SECRET, kid: str = "k1", algorithm: str = "HS256"
) -> str:
    """A token with exactly ``claims`` (none added), as a third party could make one."""
    return jwt.encode(claims, secret, algorithm=algorithm, headers={"kid": kid})


def good_claims(**changes: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "iss": "capdisc",
        "aud": "capdisc",
        "sub": "alice",
        "iat": int(NOW),
        "exp": int(NOW) + 60,
        "tenant": "acme",
        "roles": [],
        "user": "alice",
        "grants": ["discover"],
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not ...}


def tampered(original: str) -> str:
    """The token with its claims changed (roles: admin) and its signature kept."""
    header, payload, signature = original.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["roles"] = ["admin"]
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_a_valid_token_proves_tenant_roles_user_and_grants() -> None:
    identity = auth.verify(token(), KEYRING, NOW + 10)

    assert (identity.tenant, identity.roles, identity.user, identity.kid, identity.subject) == (
        "acme",
        ("finance",),
        "alice",
        "k1",
        "alice",
    )
    assert identity.allows("discover") and not identity.allows("write")
    assert identity.expires_at == int(NOW) + 3600


REFUSALS: list[tuple[str, Callable[[], str], str]] = [
    ("missing", lambda: "", "missing"),
    ("garbage", lambda: "not a token", "malformed"),
    ("three-parts-of-garbage", lambda: "abc.def.ghi", "malformed"),
    ("no-kid", lambda: jwt.encode(good_claims(), SECRET, algorithm="HS256"), "malformed"),
    ("forged-signature", lambda: token(auth.Keyring.from_mapping({"k1": OTHER})), "forged"),
    ("tampered-claims", lambda: tampered(token()), "forged"),
    ("unknown-kid", lambda: token(auth.Keyring.from_mapping({"k9": SECRET})), "forged"),
    (
        "alg-none",
        lambda: jwt.encode(good_claims(), None, algorithm="none", headers={"kid": "k1"}),
        "forged",
    ),
    ("expired", lambda: token(now=NOW - 7200), "expired"),
    ("not-yet-valid-nbf", lambda: token(not_before=NOW + 600), "not_yet_valid"),
    ("not-yet-valid-iat", lambda: token(now=NOW + 600), "not_yet_valid"),
    ("wrong-audience", lambda: signed(good_claims(aud="someone-else")), "wrong_audience"),
    ("wrong-issuer", lambda: signed(good_claims(iss="someone-else")), "wrong_audience"),
    ("missing-tenant", lambda: signed(good_claims(tenant=...)), "claims"),
    ("missing-grants", lambda: signed(good_claims(grants=...)), "claims"),
    ("missing-exp", lambda: signed(good_claims(exp=...)), "claims"),
    ("unknown-grant", lambda: signed(good_claims(grants=["root"])), "claims"),
    ("tenant-not-a-name", lambda: signed(good_claims(tenant="a b")), "claims"),
    ("roles-not-a-list", lambda: signed(good_claims(roles="finance")), "claims"),
    ("every-tenant-without-admin", lambda: signed(good_claims(tenant="*")), "claims"),
    ("exp-not-a-number", lambda: signed(good_claims(exp="tomorrow")), "claims"),
    ("exp-before-any-clock", lambda: signed(good_claims(exp=-(10**20))), "expired"),
    ("nbf-beyond-any-clock", lambda: signed(good_claims(nbf=10**20)), "not_yet_valid"),
    ("iat-beyond-any-clock", lambda: signed(good_claims(iat=10**30)), "not_yet_valid"),
]


@pytest.mark.parametrize(("make", "reason"), [pytest.param(m, r, id=i) for i, m, r in REFUSALS])
def test_verify_refuses_with_a_clear_reason(make: Callable[[], str], reason: str) -> None:
    presented = make()
    with pytest.raises(AuthError) as caught:
        auth.verify(presented, KEYRING, NOW + 10)

    assert caught.value.reason == reason
    assert caught.value.code == "unauthorized"
    message = str(caught.value)
    assert "token" in message and (
        "capdisc token" in message or "clock" in message or "CAPDISC_TOKEN" in message
    )
    signature = presented.rsplit(".", 1)[-1]
    assert len(presented) < 20 or presented not in message
    assert len(signature) < 20 or signature not in message


@pytest.mark.parametrize(
    ("claims", "reason"),
    [({"exp": -(10**20)}, "expired"), ({"nbf": 10**20}, "not_yet_valid")],
)
def test_times_beyond_any_clock_are_refused_unverified_too(
    claims: dict[str, Any], reason: str
) -> None:
    """The CLI reads a token's claims without the keyring when it has none at hand."""
    with pytest.raises(AuthError) as caught:
        auth.unverified(signed(good_claims(**claims), secret="y" * 32), NOW)

    assert caught.value.reason == reason
    assert "seconds since the epoch" in str(caught.value)


def test_leeway_tolerates_a_little_clock_skew_only() -> None:
    expired_just_now = token(ttl_s=60)
    auth.verify(expired_just_now, KEYRING, NOW + 60 + 29)
    with pytest.raises(AuthError, match="expired"):
        auth.verify(expired_just_now, KEYRING, NOW + 60 + 31)


def test_rotation_the_newest_key_signs_and_every_key_verifies() -> None:
    old_token = token()
    rotated = KEYRING.with_key(auth.new_key(NOW))
    new_token = token(rotated)

    assert jwt.get_unverified_header(new_token)["kid"] == rotated.kids[-1] != "k1"
    assert auth.verify(old_token, rotated, NOW).kid == "k1"
    assert auth.verify(new_token, rotated, NOW).kid == rotated.kids[-1]
    with pytest.raises(AuthError, match="does not have") as caught:
        auth.verify(old_token, rotated.without("k1"), NOW)
    assert caught.value.reason == "forged"


def test_eddsa_public_key_verifies_what_the_private_key_signed() -> None:
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    issuer = auth.Keyring.from_mapping(
        {"ed": {"alg": "EdDSA", "public_key": public, "private_key": pem}}
    )
    verifier = auth.Keyring.from_mapping({"ed": {"alg": "EdDSA", "public_key": public}})

    assert auth.verify(token(issuer), verifier, NOW).tenant == "acme"
    with pytest.raises(ConfigError, match="can sign"):
        token(verifier)
    # an HS256 token made with the public key as secret (algorithm confusion) is refused
    confused = jwt.encode(good_claims(), "x" * 40, algorithm="HS256", headers={"kid": "ed"})
    with pytest.raises(AuthError) as caught:
        auth.verify(confused, verifier, NOW)
    assert caught.value.reason == "forged"


def test_admin_implies_every_grant_and_may_cover_every_tenant() -> None:
    identity = auth.verify(token(tenant="*", grants=["admin"]), KEYRING, NOW)

    assert all(identity.allows(g) for g in auth.GRANTS)
    assert identity.covers("acme") and identity.covers("other")
    writer = auth.verify(token(grants=["write"]), KEYRING, NOW)
    assert writer.allows("session") and not writer.allows("discover")
    assert writer.covers("acme") and not writer.covers("other")


@pytest.mark.parametrize(
    "fields",
    [
        {"tenant": "*"},
        {"tenant": "no spaces"},
        {"grants": ["root"]},
        {"grants": []},
        {"roles": [" "]},
        {"ttl_s": 0},
        {"user": ""},
    ],
)
def test_issue_refuses_tokens_that_would_not_verify(fields: dict[str, Any]) -> None:
    with pytest.raises(AuthError, match="cannot issue"):
        token(**fields)


@pytest.mark.parametrize(
    ("mapping", "problem"),
    [
        ({"k": "short"}, "shorter than 32"),
        ({"k": {"alg": "HS512", "secret": "x"}}, "EdDSA or RS256"),
        ({"k": {"alg": "EdDSA", "public_key": "not pem"}}, "no usable PEM"),
        ([], "JSON object"),
    ],
)
def test_a_bad_keyring_is_a_config_error_naming_the_key(mapping: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        auth.Keyring.from_mapping(mapping)


def test_keyring_files_are_private_and_reread_when_changed(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "keys.json"
    auth.save_keyring(path, KEYRING)
    source = auth.KeyringFile(path)
    assert source.current().kids == ["k1"]

    auth.save_keyring(path, KEYRING.with_key(auth.new_key(NOW)))

    assert len(source.current().kids) == 2
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with pytest.raises(ConfigError, match="cannot be read"):
        auth.load_keyring(tmp_path / "absent.json")


BROKEN_KEYRINGS = ['{"k1": "short"}', "{not json", "[]", "{}", '{"revoked": {}}']


@pytest.mark.parametrize("broken", BROKEN_KEYRINGS)
def test_a_keyring_file_broken_while_running_keeps_the_last_keyring_and_says_why(
    tmp_path: Path, broken: str
) -> None:
    path = tmp_path / "keys.json"
    auth.save_keyring(path, KEYRING)
    problems: list[str] = []
    source = auth.KeyringFile(path, problems.append)
    presented = token()
    assert auth.verify(presented, source.current(), NOW).subject == "alice"

    path.write_text(broken, encoding="utf-8")

    assert auth.verify(presented, source.current(), NOW).subject == "alice"
    assert source.current().kids == ["k1"]
    assert len(problems) == 1  # said once, not at every request
    assert str(path) in problems[0] and "stays in use" in problems[0]
    auth.save_keyring(path, KEYRING.with_key(auth.new_key(NOW)))
    assert len(source.current().kids) == 2


def test_a_keyring_file_without_a_key_stops_a_verifier_at_start_saying_what_to_do(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"revoked": {}}', encoding="utf-8")

    with pytest.raises(ConfigError, match=r"has no key.*capdisc token keygen"):
        auth.KeyringFile(path).current()


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("24h", 86400), ("30d", 2_592_000)]
)
def test_durations(text: str, seconds: int) -> None:
    assert auth.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5m", "1w", "soon"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(AuthError, match="not a duration"):
        auth.parse_duration(text)


def test_label_names_kid_and_subject_and_never_the_token() -> None:
    presented = token()
    labelled = auth.label(presented)

    assert labelled == {"kid": "k1", "subject": "alice", "token_id": auth.peek(presented)["jti"]}
    assert auth.label("garbage") == {"token": "malformed"}
    assert auth.label(None) == {"token": "missing"}


# -- revoking one token -------------------------------------------------------------------------


def test_a_revoked_token_is_refused_and_the_other_tokens_of_its_key_still_verify() -> None:
    revoked, kept = token(), token()
    keyring = KEYRING.revoking(auth.peek(revoked)["jti"], int(NOW) + 3600, NOW)

    with pytest.raises(AuthError, match="revoked") as refused:
        auth.verify(revoked, keyring, NOW + 10)

    assert refused.value.reason == "revoked"
    assert auth.verify(kept, keyring, NOW + 10).subject == "alice"


def test_revocations_survive_the_keyring_file_and_key_rotation_and_are_reread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "keys.json"
    auth.save_keyring(path, KEYRING)
    source = auth.KeyringFile(path)
    presented = token()
    assert auth.verify(presented, source.current(), NOW).subject == "alice"

    revoked = source.current().revoking(auth.peek(presented)["jti"], int(NOW) + 3600, NOW)
    auth.save_keyring(path, revoked.with_key(auth.new_key(NOW)))

    with pytest.raises(AuthError, match="revoked"):
        auth.verify(presented, source.current(), NOW)
    assert source.current().kids[0] == "k1" and len(source.current().kids) == 2


@pytest.mark.parametrize(
    ("expires_at", "kept"),
    [
        (NOW + 60, True),
        (NOW - auth.DEFAULT_LEEWAY_S + 1, True),
        (NOW - auth.DEFAULT_LEEWAY_S, False),
    ],
)
def test_revoking_forgets_the_revocations_of_tokens_that_expired_anyway(
    expires_at: float, kept: bool
) -> None:
    older = KEYRING.revoking("old", int(expires_at), NOW - 7200)

    keyring = older.revoking("new", int(NOW) + 60, NOW)

    assert ("old" in keyring.revoked) is kept and "new" in keyring.revoked


@pytest.mark.parametrize(
    "entry", [[], {"j": "soon"}, {"j": 1.5}, {"": 1}, {"j": True}, "j"], ids=repr
)
def test_a_keyring_whose_revoked_entry_is_not_ids_to_expiries_is_a_config_error(
    entry: Any,
) -> None:
    with pytest.raises(ConfigError, match="'revoked' must be an object of token id"):
        auth.Keyring.from_mapping({"k1": SECRET, "revoked": entry})


def test_revoked_is_never_taken_for_a_key_id() -> None:
    with pytest.raises(ConfigError, match="not a key id"):
        KEYRING.with_key(auth.Key("revoked", "HS256", SECRET, SECRET, SECRET))


def test_asking_as_another_user_than_an_anonymous_token_names_no_user_and_says_what_to_do() -> None:
    anonymous = auth.verify(token(user=None), KEYRING, NOW)

    with pytest.raises(ForbiddenError) as refused:
        served_as(anonymous, [], "bob")

    assert "None" not in str(refused.value)
    assert "names no user" in str(refused.value) and "--user bob" in str(refused.value)
