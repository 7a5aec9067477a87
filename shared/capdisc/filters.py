"""Search filters: which capabilities a search may return at all.

:class:`SearchFilters` is the one form every search takes: the retrieval index
(:meth:`capdisc.retrieval.index.RetrievalIndex.search`), the discovery engine's retrievers and
the vector-store port (:meth:`capdisc.vectorstores.port.VectorStore.search`). It holds the
capability filters (kind, category, tags, availability, ids to leave out, an allowlist) and the
caller, so visibility (:func:`capdisc.access.visible`) is part of every filter.
:meth:`SearchFilters.admits` is the rule on one candidate; the retrieval index's row masks and
the Weaviate query filter are faster renderings of it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Protocol

from capdisc.access import Caller, visible
from capdisc.models import Visibility


class Candidate(Protocol):
    """What :meth:`SearchFilters.admits` reads of a capability: a
    :class:`capdisc.models.Capability` or a vector store's stored object."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def category(self) -> str: ...

    @property
    def tags(self) -> Collection[str]: ...

    @property
    def available(self) -> bool: ...

    @property
    def visibility(self) -> Visibility: ...


@dataclass(frozen=True)
class SearchFilters:
    """Pre-filters: only capabilities that pass are ranked at all (before top-k)."""

    kind: str | None = None
    category: str | None = None
    #: Every one of these is required.
    tags: tuple[str, ...] = ()
    only_available: bool = False
    #: Capabilities never to return (already bound, or removed for a "nothing fits" test).
    exclude_ids: frozenset[str] = frozenset()
    #: Only these may be returned (an agent profile's allowlist); None: any; empty: none.
    include_ids: frozenset[str] | None = None
    #: Only capabilities not available yet (offered as installable).
    only_installable: bool = False
    #: Who asks: only capabilities visible to them are ranked (:mod:`capdisc.access`).
    caller: Caller = field(default_factory=Caller)

    @property
    def admits_nothing(self) -> bool:
        """Whether no capability can pass (an empty allowlist): searches answer at once."""
        return self.include_ids is not None and not (self.include_ids - self.exclude_ids)

    def admits(self, candidate: Candidate) -> bool:
        """Whether ``candidate`` passes every filter and is visible to the caller."""
        return (
            visible(candidate.visibility, self.caller)
            and (self.kind is None or candidate.kind == self.kind)
            and (self.category is None or candidate.category == self.category)
            and all(tag in candidate.tags for tag in self.tags)
            and (candidate.available or not self.only_available)
            and not (candidate.available and self.only_installable)
            and candidate.id not in self.exclude_ids
            and (self.include_ids is None or candidate.id in self.include_ids)
        )


#: No filters: every capability open to the whole tenant (the caller is anonymous).
NO_FILTERS = SearchFilters()
