"""Signed identity tokens: who asks is proven, not claimed.

A token is a JWT (RFC 7519) signed with a key of the operator's keyring: HS256 with a secret by
default, or EdDSA / RS256 with a key pair (a verifier then holds only the public key). Its claims
say who holds it:

==========  ===================================================================================
claim       meaning
==========  ===================================================================================
``tenant``  the one tenant it may ask about (``*``: every tenant; admin tokens only)
``roles``   the holder's roles within the tenant (what visibility rules match)
``user``    the holder's user id, or null
``grants``  what it may do: ``discover``, ``session``, ``write``, ``admin`` (``admin`` implies
            every grant, ``write`` implies ``session``)
``sub``     who it was issued to (the user, else ``anonymous@TENANT``): what logs name
``iss``     ``capdisc``; ``aud`` ``capdisc``
``iat``     issued at, ``exp`` expires at, ``nbf`` (optional) not before: seconds since the epoch
``jti``     a random id
==========  ===================================================================================

The keyring maps key ids (the token header's ``kid``) to keys. Rotation: add a key (``capdisc
token keygen``); the newest key signs, every key verifies; retire an old key once the tokens it
signed have expired (``capdisc token retire KID``). A keyring file is a JSON object, in order
oldest to newest: ``{"KID": "SECRET"}`` for an HS256 key, or ``{"KID": {"alg": "EdDSA",
"public_key": PEM, "private_key": PEM}}`` for a key pair (``private_key`` only where tokens are
issued). Files holding keys or tokens are written 0600 (:func:`write_private`).

One token is revoked by its ``jti`` (``capdisc token revoke TOKEN``) without retiring the key
that signed it: the keyring's ``"revoked"`` entry (a reserved name, never a key id) maps each
revoked ``jti`` to its token's ``exp``, and is pruned of tokens that expired anyway. The file
travels to every verifier with the keys, and verifiers read it again when it changes.

Pure apart from reading and writing those files: nothing here logs, and no :class:`AuthError`
message quotes a token.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from jwt.api_jws import get_algorithm_by_name

from capdisc.errors import AuthError, ConfigError
from capdisc.registry.events import TENANT_RE

ISSUER = "capdisc"
AUDIENCE = "capdisc"
#: The tenant claim of a token good for every tenant (admin tokens only).
ALL_TENANTS = "*"
GRANTS = ("discover", "session", "write", "admin")
DEFAULT_GRANTS = ("discover", "session")
_IMPLIED: dict[str, frozenset[str]] = {
    "admin": frozenset(GRANTS),
    "write": frozenset({"write", "session"}),
    "session": frozenset({"session"}),
    "discover": frozenset({"discover"}),
}
ALGORITHMS = ("HS256", "EdDSA", "RS256")
REQUIRED_CLAIMS = ("iss", "aud", "sub", "iat", "exp", "tenant", "grants")
#: Longest token accepted (a token is a few hundred characters).
MAX_TOKEN_CHARS = 8192
#: Shortest HS256 secret (RFC 7518 section 3.2: at least the hash's 256 bits).
MIN_SECRET_BYTES = 32
#: Clock difference tolerated between an issuer and a verifier.
DEFAULT_LEEWAY_S = 30
MAX_NAME_CHARS = 256
_TOKEN_SHAPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")
_DURATION = re.compile(r"^\s*([0-9]+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_ISSUE_HINT = "issue a new one with `capdisc token issue --tenant TENANT`"


@dataclass(frozen=True)
class Identity:
    """Who a verified token says asks."""

    tenant: str
    roles: tuple[str, ...]
    user: str | None
    #: The grants the token names, with the grants they imply.
    grants: frozenset[str]
    subject: str
    kid: str
    issued_at: int
    expires_at: int

    def allows(self, grant: str) -> bool:
        return grant in self.grants

    def covers(self, tenant: str) -> bool:
        """Whether the token may ask about ``tenant``."""
        return self.tenant in (ALL_TENANTS, tenant)


def expand(grants: Iterable[str]) -> frozenset[str]:
    """``grants`` with every grant they imply."""
    return frozenset(g for grant in grants for g in _IMPLIED.get(grant, {grant}))


# -- keys ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One key of a keyring: what verifies (a secret or a public key) and, where tokens are
    issued, what signs."""

    kid: str
    algorithm: str
    verifying: Any
    signing: Any | None
    #: The key as the keyring file holds it.
    entry: str | dict[str, str]

    @classmethod
    def parse(cls, kid: str, entry: Any, where: str) -> Key:
        if isinstance(entry, str):
            if len(entry.encode("utf-8")) < MIN_SECRET_BYTES:
                raise ConfigError(
                    f"{where}: key {kid!r} is shorter than {MIN_SECRET_BYTES} "
                    "bytes; generate one with `capdisc token keygen`"
                )
            return cls(kid, "HS256", entry, entry, entry)
        if not isinstance(entry, dict) or entry.get("alg") not in ("EdDSA", "RS256"):
            raise ConfigError(
                f"{where}: key {kid!r} must be a secret (text) or an object with "
                "'alg' (EdDSA or RS256), 'public_key' and optionally "
                "'private_key' (PEM)"
            )
        algorithm = get_algorithm_by_name(entry["alg"])
        try:
            public = algorithm.prepare_key(entry["public_key"])
            private = (
                algorithm.prepare_key(entry["private_key"]) if entry.get("private_key") else None
            )
        except (KeyError, ValueError, TypeError, jwt.PyJWTError) as exc:
            raise ConfigError(f"{where}: key {kid!r} has no usable PEM key ({exc})") from exc
        return cls(kid, entry["alg"], public, private, dict(entry))


#: The keyring file's entry of revoked tokens (``jti`` -> ``exp``): not a key id.
REVOKED = "revoked"


class Keyring:
    """Keys by key id, oldest first: the newest key that can sign signs, every key verifies;
    and the ids (``jti``) of revoked tokens, with when each would have expired."""

    def __init__(self, keys: Sequence[Key], revoked: Mapping[str, int] | None = None) -> None:
        self._keys = {key.kid: key for key in keys}
        self.revoked: Mapping[str, int] = dict(revoked or {})

    @classmethod
    def from_mapping(cls, data: Any, where: str = "keyring") -> Keyring:
        if not isinstance(data, dict):
            raise ConfigError(f"{where} must be a JSON object of key id -> key")
        keys = [Key.parse(str(kid), entry, where) for kid, entry in data.items() if kid != REVOKED]
        return cls(keys, _revoked_entry(data.get(REVOKED, {}), where))

    def to_mapping(self) -> dict[str, Any]:
        mapping: dict[str, Any] = {kid: key.entry for kid, key in self._keys.items()}
        if self.revoked:
            mapping[REVOKED] = dict(sorted(self.revoked.items(), key=lambda item: item[1]))
        return mapping

    @property
    def kids(self) -> list[str]:
        return list(self._keys)

    def get(self, kid: str) -> Key | None:
        return self._keys.get(kid)

    def signing_key(self) -> Key:
        """The newest key that can sign."""
        for key in reversed(self._keys.values()):
            if key.signing is not None:
                return key
        raise ConfigError(
            "the keyring has no key that can sign (only public keys, or none); "
            "add one with `capdisc token keygen`"
        )

    def with_key(self, key: Key) -> Keyring:
        if key.kid == REVOKED:
            raise ConfigError(f"{REVOKED!r} is the keyring's list of revoked tokens, not a key id")
        return Keyring([*(k for k in self._keys.values() if k.kid != key.kid), key], self.revoked)

    def without(self, kid: str) -> Keyring:
        if kid not in self._keys:
            raise ConfigError(
                f"the keyring has no key {kid!r}; its keys are {', '.join(self._keys) or 'none'}"
            )
        return Keyring([k for k in self._keys.values() if k.kid != kid], self.revoked)

    def revoking(self, jti: str, expires_at: int, now: float) -> Keyring:
        """This keyring with token ``jti`` revoked until ``expires_at``, and the revocations of
        tokens that expired (past the leeway) dropped: they no longer verify anyway."""
        kept = {j: e for j, e in self.revoked.items() if e > now - DEFAULT_LEEWAY_S}
        return Keyring(list(self._keys.values()), {**kept, jti: expires_at})


def _revoked_entry(value: Any, where: str) -> dict[str, int]:
    """The keyring file's ``"revoked"`` entry, checked."""
    if not isinstance(value, dict) or not all(
        isinstance(jti, str) and jti and _whole(exp) for jti, exp in value.items()
    ):
        raise ConfigError(
            f"{where}: {REVOKED!r} must be an object of token id (jti) -> its expiry in whole "
            "seconds since the epoch, as `capdisc token revoke` writes it"
        )
    return dict(value)


def new_key(now: float) -> Key:
    """A fresh HS256 key (384 random bits) whose id sorts by creation time."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    secret = secrets.token_urlsafe(48)
    return Key(f"k{stamp}-{secrets.token_hex(2)}", "HS256", secret, secret, secret)


def load_keyring(path: Path) -> Keyring:
    """The keyring in ``path`` (:class:`ConfigError` naming the file when it cannot be read)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"keyring file {path} cannot be read ({exc.strerror}); create one "
            "with `capdisc token keygen --keys PATH` or point "
            "CAPDISC_AUTH_KEYS_FILE at it"
        ) from exc
    except ValueError as exc:
        raise ConfigError(f"keyring file {path} is not JSON: {exc}") from exc
    return Keyring.from_mapping(data, f"keyring file {path}")


def save_keyring(path: Path, keyring: Keyring) -> None:
    write_private(path, json.dumps(keyring.to_mapping(), indent=2) + "\n")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600; a new directory 0700),
    atomically: a reader sees the old file or the new one. :class:`ConfigError` naming
    ``path`` when it cannot be written."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):  # a full disk, a path that is a directory, ...
            raise _unwritable(path, exc) from exc
        raise


def _unwritable(path: Path, exc: OSError) -> ConfigError:
    return ConfigError(
        f"cannot write {path} ({exc.strerror}): it must be a file in a directory this user may "
        "write in; give another path or fix that one"
    )


class KeyringFile:
    """A keyring file, read again whenever it changes: a key added or retired takes effect
    without a restart. A file that becomes unreadable, or changes into one that is not a
    keyring or has no key (a hand edit gone wrong), keeps the last keyring read:
    ``on_problem`` is told why, once per such change, so the process can say so. Only the first
    read raises."""

    def __init__(self, path: Path, on_problem: Callable[[str], None] | None = None) -> None:
        self.path = path
        self.on_problem = on_problem
        self._stamp: tuple[int, int, int] | None = None
        self._keyring: Keyring | None = None
        self._lock = threading.Lock()

    def current(self) -> Keyring:
        with self._lock:
            try:
                stat = self.path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
            except OSError:
                stamp = None
            if self._keyring is None:
                self._keyring, self._stamp = self._verifying(), stamp
            elif stamp is not None and stamp != self._stamp:
                self._stamp = stamp
                self._keyring = self._reread(self._keyring)
            return self._keyring

    def _reread(self, last: Keyring) -> Keyring:
        """The changed file's keyring, or ``last`` when it is not a keyring."""
        try:
            return self._verifying()
        except ConfigError as exc:
            if self.on_problem is not None:
                self.on_problem(f"{exc}; the keyring read before stays in use until it is fixed")
            return last

    def _verifying(self) -> Keyring:
        """The file's keyring, if it has a key to verify with (one without would refuse every
        token: an edit that left only the revocations, or an empty object)."""
        keyring = load_keyring(self.path)
        if not keyring.kids:
            raise ConfigError(
                f"keyring file {self.path} has no key, so no token would verify; add one with "
                f"`capdisc token keygen --keys {self.path}` and issue tokens with it"
            )
        return keyring


# -- tokens -------------------------------------------------------------------------------------


def issue(
    keyring: Keyring,
    *,
    tenant: str,
    roles: Sequence[str] = (),
    user: str | None = None,
    grants: Sequence[str] = DEFAULT_GRANTS,
    ttl_s: float,
    now: float,
    not_before: float | None = None,
) -> str:
    """A token for ``tenant`` (``*``: all, with ``admin``), signed by the keyring's newest key
    that can sign, valid ``ttl_s`` seconds from ``now``."""
    _check_issue(tenant, roles, user, grants, ttl_s)
    key = keyring.signing_key()
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": user or f"anonymous@{tenant}",
        "iat": int(now),
        "exp": int(now + ttl_s),
        "tenant": tenant,
        "roles": list(roles),
        "user": user,
        "grants": list(dict.fromkeys(grants)),
        "jti": secrets.token_hex(8),
    }
    if not_before is not None:
        claims["nbf"] = int(not_before)
    signer: Any = key.signing  # never None: signing_key() picks a key that signs
    return jwt.encode(claims, signer, algorithm=key.algorithm, headers={"kid": key.kid})


def _check_issue(
    tenant: str, roles: Sequence[str], user: str | None, grants: Sequence[str], ttl_s: float
) -> None:
    problem = None
    if tenant == ALL_TENANTS and "admin" not in grants:
        problem = "a token for every tenant ('*') needs the admin grant"
    elif tenant != ALL_TENANTS and not TENANT_RE.fullmatch(tenant):
        problem = f"tenant {_short(tenant)} is not a tenant name (letters, digits, '_', '-')"
    elif not grants or set(grants) - set(GRANTS):
        problem = f"grants must be some of {', '.join(GRANTS)}, got {_short(list(grants))}"
    elif any(not r.strip() or len(r) > MAX_NAME_CHARS for r in roles):
        problem = f"roles must be non-empty names of at most {MAX_NAME_CHARS} characters"
    elif user is not None and (not user.strip() or len(user) > MAX_NAME_CHARS):
        problem = f"user must be a non-empty name of at most {MAX_NAME_CHARS} characters"
    elif ttl_s <= 0:
        problem = "the lifetime (ttl) must be positive"
    if problem:
        raise AuthError(f"cannot issue a token: {problem}", "claims")


def verify(
    token: str | None, keyring: Keyring, now: float, leeway_s: float = DEFAULT_LEEWAY_S
) -> Identity:
    """The identity ``token`` proves, or :class:`AuthError` saying why it proves none: missing,
    malformed, forged (bad signature, unknown key id, another algorithm than its key's), wrong
    issuer or audience, claims missing or mistyped, expired, not yet valid, revoked."""
    kid = _kid(token)
    key = keyring.get(kid)
    if key is None:
        raise AuthError(
            f"the identity token is signed with key {_short(kid)}, which this "
            "keyring does not have (forged, or its key was retired); " + _ISSUE_HINT,
            "forged",
        )
    claims = _decoded(str(token), key)
    identity = _identity(claims, kid)
    _check_times(claims, now, leeway_s)
    if claims.get("jti") in keyring.revoked:
        raise AuthError(
            "the identity token was revoked (capdisc token revoke); " + _ISSUE_HINT, "revoked"
        )
    return identity


def _kid(token: str | None) -> str:
    """The key id of a well-formed token."""
    if not token:
        raise AuthError(
            "no identity token: this capdisc requires one; pass --token or set "
            "CAPDISC_TOKEN (Client(..., token=...)); " + _ISSUE_HINT,
            "missing",
        )
    if (
        not isinstance(token, str)
        or len(token) > MAX_TOKEN_CHARS
        or not _TOKEN_SHAPE.fullmatch(token)
    ):
        raise AuthError(
            "the identity token is malformed (not a signed JWT: three base64url "
            "parts); pass the token `capdisc token issue` printed",
            "malformed",
        )
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise AuthError(
            f"the identity token is malformed ({exc}); pass the token `capdisc "
            "token issue` printed",
            "malformed",
        ) from exc
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise AuthError(
            "the identity token names no signing key (no 'kid' header); " + _ISSUE_HINT, "malformed"
        )
    return kid


def _decoded(token: str, key: Key) -> dict[str, Any]:
    """The claims, once signature, algorithm, issuer, audience and required claims are checked
    (times are checked against the caller's clock: :func:`_check_times`)."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key.verifying,
            algorithms=[key.algorithm],
            audience=AUDIENCE,
            issuer=ISSUER,
            options={
                "verify_exp": False,
                "verify_nbf": False,
                "verify_iat": False,
                "require": list(REQUIRED_CLAIMS),
            },
        )
    except (jwt.InvalidSignatureError, jwt.InvalidAlgorithmError) as exc:
        raise AuthError(
            f"the identity token's signature does not verify with key "
            f"{_short(key.kid)} (forged or altered); " + _ISSUE_HINT,
            "forged",
        ) from exc
    except (jwt.InvalidAudienceError, jwt.InvalidIssuerError) as exc:
        raise AuthError(
            f"the identity token was not issued for capdisc ({exc}); " + _ISSUE_HINT,
            "wrong_audience",
        ) from exc
    except jwt.MissingRequiredClaimError as exc:
        raise AuthError(
            f"the identity token lacks the '{exc.claim}' claim; " + _ISSUE_HINT, "claims"
        ) from exc
    except jwt.PyJWTError as exc:
        raise AuthError(
            f"the identity token is malformed ({exc}); " + _ISSUE_HINT, "malformed"
        ) from exc
    return claims


def _identity(claims: dict[str, Any], kid: str) -> Identity:
    tenant, roles, user = claims["tenant"], claims.get("roles", []), claims.get("user")
    grants = claims["grants"]
    problem = None
    if not isinstance(tenant, str) or not (tenant == ALL_TENANTS or TENANT_RE.fullmatch(tenant)):
        problem = "'tenant' is not a tenant name"
    elif not _names(roles):
        problem = "'roles' is not a list of names"
    elif user is not None and not (isinstance(user, str) and user.strip()):
        problem = "'user' is not a name or null"
    elif not _names(grants) or not grants or set(grants) - set(GRANTS):
        problem = f"'grants' must list some of {', '.join(GRANTS)}"
    elif tenant == ALL_TENANTS and "admin" not in grants:
        problem = "'tenant' is '*' without the admin grant"
    elif not all(_whole(claims.get(c)) for c in ("iat", "exp")) or not isinstance(
        claims["sub"], str
    ):
        problem = "'iat' and 'exp' must be whole seconds and 'sub' text"
    if problem:
        raise AuthError(f"the identity token's claim {problem}; " + _ISSUE_HINT, "claims")
    return Identity(
        tenant, tuple(roles), user, expand(grants), claims["sub"], kid, claims["iat"], claims["exp"]
    )


def _check_times(claims: dict[str, Any], now: float, leeway_s: float) -> None:
    if "nbf" in claims and not _whole(claims["nbf"]):
        raise AuthError(
            "the identity token's 'nbf' claim must be whole seconds; " + _ISSUE_HINT, "claims"
        )
    if claims["exp"] <= now - leeway_s:
        raise AuthError(
            f"the identity token expired at {_when(claims['exp'])}; " + _ISSUE_HINT, "expired"
        )
    starts = max(claims["iat"], claims.get("nbf", 0))
    if starts > now + leeway_s:
        raise AuthError(
            f"the identity token is not valid before {_when(starts)} (check the "
            "clocks of the issuer and this host)",
            "not_yet_valid",
        )


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, str) and v.strip() and len(v) <= MAX_NAME_CHARS for v in value
    )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _when(seconds: int) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))
    except (OverflowError, OSError, ValueError):  # beyond what the platform's clock can show
        return f"{_short(seconds)} seconds since the epoch"


def _short(value: Any, limit: int = 40) -> str:
    text = ascii(value)
    return text if len(text) <= limit else text[:limit] + "..."


# -- reading a token without verifying it -------------------------------------------------------


def peek(token: str) -> dict[str, Any]:
    """A token's claims and key id, NOT verified: for defaults (the tenant a client asks about)
    and for log context only, never for a decision. :class:`AuthError` when unreadable."""
    kid = _kid(token)
    try:
        claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError as exc:
        raise AuthError(f"the identity token is malformed ({exc})", "malformed") from exc
    return {**claims, "kid": kid}


def unverified(token: str, now: float, leeway_s: float = DEFAULT_LEEWAY_S) -> Identity:
    """The identity a token claims, its claims and times checked but NOT its signature: for a
    client to refuse early what the workers would refuse (they verify), never to allow."""
    claims = peek(token)
    missing = [c for c in REQUIRED_CLAIMS if claims.get(c) is None]
    if missing:
        raise AuthError(
            f"the identity token lacks the '{missing[0]}' claim; " + _ISSUE_HINT, "claims"
        )
    identity = _identity(claims, str(claims["kid"]))
    _check_times(claims, now, leeway_s)
    return identity


def label(token: str | None) -> dict[str, str]:
    """What logs may say about a token: its key id, subject and token id (unverified: what
    ``capdisc token revoke`` names), never the token."""
    try:
        claims = peek(token or "")
    except AuthError as exc:
        return {"token": exc.reason}
    return {
        "kid": str(claims["kid"])[:64],
        "subject": str(claims.get("sub"))[:MAX_NAME_CHARS],
        "token_id": str(claims.get("jti"))[:64],
    }


def parse_duration(text: str) -> int:
    """Seconds in ``30s``, ``15m``, ``24h``, ``7d`` or a bare number of seconds."""
    match = _DURATION.fullmatch(text)
    if not match or int(match.group(1)) <= 0:
        raise AuthError(f"{_short(text)} is not a duration; write 90s, 15m, 24h or 30d", "claims")
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def grants_from(text: str | Iterable[str]) -> tuple[str, ...]:
    """Grants from ``a,b`` text or a list, checked against :data:`GRANTS`."""
    items = text.split(",") if isinstance(text, str) else list(text)
    grants = tuple(dict.fromkeys(g.strip() for g in items if g.strip()))
    unknown = [g for g in grants if g not in GRANTS]
    if unknown or not grants:
        raise AuthError(
            f"grants must be some of {', '.join(GRANTS)}, got {_short(unknown or list(grants))}",
            "claims",
        )
    return grants


def roles_from(text: str | None) -> tuple[str, ...]:
    """Roles from ``a,b`` text."""
    if not text:
        return ()
    return tuple(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
