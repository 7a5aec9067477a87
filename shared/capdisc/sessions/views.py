"""What a discovery turn did to its session (:class:`SessionView`), as a reply carries it.

Kept apart from :mod:`capdisc.sessions.policy` and light to import (no pydantic): the client
reads it from every reply (:mod:`capdisc.discovery.replies`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class SessionView:
    """What a discovery in a session did to it: the working set after the turn, what joined
    and what left it, whether the search repeated an earlier one (and the note saying so),
    the best capabilities not installed yet when few available ones fit, and whether the
    session had ended and this turn started it again (the note says so too)."""

    id: str
    bound: tuple[str, ...]
    added: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    redundant_search: bool = False
    note: str | None = None
    installable: tuple[JSON, ...] = ()
    #: Why the session had ended, when this turn started it again ("expired", "evicted").
    restarted: str | None = None

    def to_dict(self) -> JSON:
        view: JSON = {
            "id": self.id,
            "bound": list(self.bound),
            "added": list(self.added),
            "evicted": list(self.evicted),
            "redundant_search": self.redundant_search,
            "note": self.note,
        }
        if self.installable:
            view["installable"] = [dict(i) for i in self.installable]
        if self.restarted:
            view["restarted"] = self.restarted
        return view

    @classmethod
    def from_outcome(cls, outcome: Mapping[str, Any]) -> SessionView:
        return cls(
            id=outcome["id"],
            bound=tuple(outcome["bound"]),
            added=tuple(outcome["added"]),
            evicted=tuple(outcome["evicted"]),
            redundant_search=bool(outcome["redundant_search"]),
            note=outcome["note"],
        )
