"""What each MCP session of ``capdisc mcp`` lists beyond capdisc's own tools, as pure functions.

A session's list follows its capdisc working set:

* a discovery in the session (:class:`Discovered`) lists the working set its answer bound: the
  answer's MCP tool definitions (the always-include tools among them), each with the capability
  it stands for and, for a tool imported from an MCP server, its ``source_ref`` (where a call is
  forwarded). The meta-tool the answer carries, and any tool named like one of capdisc's own,
  are left out: capdisc's own tools are listed apart and always win;
* a recorded call (:class:`Called`) takes the tool off the list when the loop guard evicted it
  (an always-include tool is never evicted, so it stays, with the guidance);
* anything else leaves the list as it was.

:func:`next_tools` applies one event; :func:`changed` says whether the client must be told
(``notifications/tools/list_changed``). :class:`SessionTable` holds the lists of the sessions
served, the least recently used dropped beyond a bound (an HTTP session that ended says nothing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from capdisc.models import JSONDict, SourceRef

#: Sessions whose lists are kept: the SDK's default cap on streamable HTTP sessions.
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class ListedTool:
    """One tool a session lists: its MCP definition, the capability it stands for and, when it
    was imported from an MCP server, where it came from (None: capdisc holds its definition
    only)."""

    definition: JSONDict
    capability_id: str
    source: SourceRef | None = None

    @property
    def name(self) -> str:
        return str(self.definition["name"])


@dataclass(frozen=True)
class SessionTools:
    """The tools one session lists beyond capdisc's own, in the answer's order."""

    tools: tuple[ListedTool, ...] = ()

    def named(self, name: str) -> ListedTool | None:
        return next((tool for tool in self.tools if tool.name == name), None)

    def definitions(self) -> list[JSONDict]:
        return [tool.definition for tool in self.tools]


@dataclass(frozen=True)
class Discovered:
    """A discovery in the session: the answer's tool definitions (its whole working set), tool
    name -> capability id, and tool name -> ``source_ref`` of the MCP-imported ones."""

    tools: Sequence[JSONDict]
    tool_names: Mapping[str, str]
    tool_sources: Mapping[str, SourceRef]


@dataclass(frozen=True)
class Called:
    """A call recorded in the session, and whether the loop guard evicted the tool."""

    capability_id: str
    evicted: bool = False


Event = Discovered | Called


def next_tools(current: SessionTools, event: Event, own: frozenset[str]) -> SessionTools:
    """The session's list after ``event``; ``own`` are the names of capdisc's own tools."""
    if isinstance(event, Discovered):
        return _bound(event, own)
    if event.evicted:
        return SessionTools(
            tuple(t for t in current.tools if t.capability_id != event.capability_id)
        )
    return current


def changed(before: SessionTools, after: SessionTools) -> bool:
    """Whether a client holding ``before`` must list the tools again."""
    return before.definitions() != after.definitions()


def _bound(event: Discovered, own: frozenset[str]) -> SessionTools:
    listed: list[ListedTool] = []
    for definition in event.tools:
        name = str(definition.get("name", ""))
        capability_id = event.tool_names.get(name)
        if capability_id is None or name in own:  # the meta-tool, or a name capdisc keeps
            continue
        listed.append(ListedTool(definition, capability_id, event.tool_sources.get(name)))
    return SessionTools(tuple(listed))


class SessionTable:
    """Each served session's list, by capdisc session id; beyond ``limit`` sessions the least
    recently used is forgotten (it lists capdisc's own tools until its next discovery)."""

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._lists: OrderedDict[str, SessionTools] = OrderedDict()

    def get(self, session: str | None) -> SessionTools:
        if session is None or session not in self._lists:
            return SessionTools()
        self._lists.move_to_end(session)
        return self._lists[session]

    def put(self, session: str, tools: SessionTools) -> None:
        self._lists[session] = tools
        self._lists.move_to_end(session)
        while len(self._lists) > self.limit:
            self._lists.popitem(last=False)
