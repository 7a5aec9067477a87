"""Who asks, as a worker decides it before serving or applying anything.

With auth on (``auth: on`` and ``auth_keys_file``), a request's identity is the one its token
proves (:func:`capdisc.identity.auth.verify`): the token's tenant must cover the tenant the request
names
("wrong tenant" otherwise), its grants must allow what the request does, and the roles and user
the request is served as are the token's. A request may claim fewer roles than its token
carries (to see less), never other ones; an ``admin`` token may claim any roles and user (the
operator acting as someone). With auth off, the identity a request claims is used, as in
development; workers say so in their log at start.

What each request needs:

=============================================  ==================================
request                                        grant (``admin`` implies all)
=============================================  ==================================
discover                                       ``discover``
discover in a session, session call, show,     ``session`` (``write`` implies it)
export and import
registry event (publish, delete, import, ...)  ``write``
=============================================  ==================================
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from capdisc.discovery.protocol import DiscoverRequest, SessionRequest
from capdisc.errors import ConfigError, ForbiddenError
from capdisc.identity import auth
from capdisc.registry.events import RegistryEvent
from capdisc.settings import Settings

R = TypeVar("R", bound=DiscoverRequest | SessionRequest)


def grant_for(request: DiscoverRequest | SessionRequest) -> str:
    """The grant a discovery worker request needs."""
    if isinstance(request, SessionRequest) or request.session:
        return "session"
    return "discover"


@dataclass
class Gate:
    """Admits requests and registry events; ``keys`` None means auth is off."""

    keys: auth.KeyringFile | None
    clock: Callable[[], float] = time.time

    @classmethod
    def from_settings(
        cls, settings: Settings, log: Any = None, clock: Callable[[], float] = time.time
    ) -> Gate:
        """The gate ``settings`` ask for; with auth on, the keyring is read once here so a
        missing or broken one stops the process at start, naming the file. A keyring file
        broken later keeps the keyring read before, and the process's structlog ``log`` says
        why (``keyring_unusable``, once per change of the file). ``clock`` (seconds since the
        epoch) is what a token's times are checked against: a worker passes Redis's, so that
        its own host's clock being off does not refuse tokens issued on time."""
        if not settings.auth:
            return cls(None, clock)
        if settings.auth_keys_file is None:
            raise ConfigError(
                "auth is on but no keyring is set: point CAPDISC_AUTH_KEYS_FILE "
                "at one (`capdisc token keygen --keys PATH` makes it), or set "
                "CAPDISC_AUTH=off for development"
            )
        keys = auth.KeyringFile(settings.auth_keys_file, _warner(log))
        keys.current()
        return cls(keys, clock)

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def identity(self, token: str | None) -> auth.Identity:
        """The identity ``token`` proves (:class:`AuthError` otherwise)."""
        if self.keys is None:
            raise ConfigError("auth is off: there is no keyring to verify tokens with")
        return auth.verify(token, self.keys.current(), self.clock())

    def admit(self, request: R) -> R:
        """``request`` as it is served: with auth on, as the verified token's holder (its
        tenant checked, its grant required, its roles and user); the token dropped either
        way. :class:`AuthError` (``unauthorized``) or :class:`ForbiddenError` otherwise."""
        if self.keys is None:
            return replace(request, token=None)
        identity = self.identity(request.token)
        require(identity, request.tenant, grant_for(request))
        roles, user = served_as(identity, request.roles, request.user)
        return replace(request, roles=list(roles), user=user, token=None)

    def admit_event(self, event: RegistryEvent) -> None:
        """An indexing worker's check before it applies ``event``: with auth on, its token must
        prove the ``write`` grant for its tenant (:class:`AuthError` or
        :class:`ForbiddenError`: the worker refuses the event with that reason). A reindex
        without a token passes: it changes no content (the stored definition is embedded
        again), and the reconciler sends such events itself."""
        if self.keys is not None and not (event.type == "reindex" and event.token is None):
            self.writer(event.tenant, event.token)

    def writer(self, tenant: str, token: str | None) -> auth.Identity | None:
        """The identity allowed to write ``tenant`` (None with auth off); :class:`AuthError`
        or :class:`ForbiddenError` when ``token`` does not allow it."""
        if self.keys is None:
            return None
        identity = self.identity(token)
        require(identity, tenant, "write")
        return identity


def require(identity: auth.Identity, tenant: str, grant: str) -> None:
    """:class:`ForbiddenError` unless ``identity`` covers ``tenant`` and has ``grant``."""
    if not identity.covers(tenant):
        raise ForbiddenError(
            f"wrong tenant: the token is for tenant {identity.tenant!r}, this "
            f"asks about {tenant!r}; use a token issued for {tenant!r} "
            f"(capdisc token issue --tenant {tenant})",
            "wrong_tenant",
        )
    if not identity.allows(grant):
        raise ForbiddenError(
            f"the token (subject {identity.subject!r}) lacks the {grant!r} "
            f"grant this needs; ask for a token with --grants {grant}",
            "grant",
        )


def served_as(
    identity: auth.Identity, roles: Sequence[str], user: str | None
) -> tuple[tuple[str, ...], str | None]:
    """The roles and user a request is served as: the token's; fewer roles if it claims fewer;
    anything an ``admin`` token claims. :class:`ForbiddenError` for a claim beyond the token."""
    if identity.allows("admin"):
        return (tuple(roles), user) if roles or user else (identity.roles, identity.user)
    extra = sorted(set(roles) - set(identity.roles))
    if extra:
        raise ForbiddenError(
            f"the token does not carry role(s) {', '.join(extra)}; its roles "
            f"are {', '.join(identity.roles) or 'none'}: ask with those or fewer (or none: "
            f"the token's), or with a token issued with --roles {','.join(extra)}",
            "roles",
        )
    if user is not None and user != identity.user:
        holder = "names no user" if identity.user is None else f"is for user {identity.user!r}"
        raise ForbiddenError(
            f"the token {holder}, so it may not ask as {user!r}: leave the user out (the "
            f"token's is used), or use a token issued with --user {user}",
            "user",
        )
    return (tuple(roles) or identity.roles), identity.user


def _warner(log: Any) -> Callable[[str], None] | None:
    """What tells ``log`` that the keyring file changed into one that cannot be used."""
    if log is None:
        return None
    return lambda reason: log.warning("keyring_unusable", reason=reason)
