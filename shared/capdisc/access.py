"""Access control: the one rule for who sees a capability.

Every path that shows a capability to a caller goes through :func:`visible`: search (every
:class:`capdisc.filters.SearchFilters` carries the caller, and is applied before top-k: as a row
mask in :meth:`capdisc.retrieval.index.RetrievalIndex.search`, or inside a vector store's query),
Tier 0's category list, tool definitions and schemas (only of visible matches), session
working sets and the meta-tool (the same pipeline). Tenants are separate registries, so the
tenant is checked by where a capability is stored; within a tenant a capability is visible to
everyone when it names no roles and no users, else to holders of any of its roles and to the
users it names. An agent profile's allowlist narrows this further, never widens it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from capdisc.models import Capability, Visibility


@dataclass(frozen=True)
class Caller:
    """Who asks: their roles and user id within the request's tenant (an anonymous caller,
    with neither, sees only capabilities open to the whole tenant)."""

    roles: frozenset[str] = frozenset()
    user: str | None = None

    @classmethod
    def of(cls, roles: Iterable[str] = (), user: str | None = None) -> Caller:
        return cls(frozenset(roles), user or None)


#: A caller with no roles and no user: sees what is open to the whole tenant.
ANONYMOUS = Caller()


def visible(visibility: Visibility, caller: Caller) -> bool:
    """Whether ``caller`` may see a capability with ``visibility``."""
    return (
        visibility.open
        or bool(caller.roles.intersection(visibility.roles))
        or (caller.user is not None and caller.user in visibility.users)
    )


def visible_to(capabilities: Iterable[Capability], caller: Caller) -> list[Capability]:
    return [c for c in capabilities if visible(c.visibility, caller)]
