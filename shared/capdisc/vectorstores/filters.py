"""The one filter type: which capabilities a search may return at all."""

from __future__ import annotations

from dataclasses import dataclass, field

from capdisc.access import Caller, visible
from capdisc.models import Capability


@dataclass(frozen=True)
class SearchFilters:
    """Pre-filters: only capabilities that pass are ranked at all."""

    kind: str | None = None
    category: str | None = None
    tags: tuple[str, ...] = ()
    only_available: bool = False
    #: Capabilities never to return (already bound, or removed for a "nothing fits" test).
    exclude_ids: frozenset[str] = frozenset()
    #: Only these may be returned (an agent profile's allowlist); None: any.
    include_ids: frozenset[str] | None = None
    #: Only capabilities not available yet (offered as installable).
    only_installable: bool = False
    #: Who asks: only capabilities visible to them are ranked (:mod:`capdisc.access`).
    caller: Caller = field(default_factory=Caller)

    def admits(self, cap: Capability) -> bool:
        return (visible(cap.visibility, self.caller)
                and (self.kind is None or cap.kind == self.kind)
                and (self.category is None or cap.category == self.category)
                and all(tag in cap.tags for tag in self.tags)
                and (cap.available or not self.only_available)
                and not (cap.available and self.only_installable)
                and cap.id not in self.exclude_ids
                and (self.include_ids is None or cap.id in self.include_ids))
