"""What an agent runtime gets from a discovery result: tool definitions to bind, the meta-tool's
result, and the prompt text.

* :func:`tool_bundle` - tool definitions of some capabilities plus ``discover_capabilities``, in
  one of the four formats, with the map from tool names back to capability ids (and where the
  tools imported from MCP servers are called): for a turn's matches
  (:func:`list_discovered_tools`) or a session's working set (:func:`bound_tools`).
* :func:`metatool_result` - what ``discover_capabilities`` returns to the model.
* :func:`render_for_prompt` - Tier 0, then Tiers 1 and 2.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from capdisc.access import Caller, visible
from capdisc.agents import formats
from capdisc.agents.answers import metatool_result
from capdisc.discovery.engine import DiscoveryResult, render_for_prompt
from capdisc.discovery.replies import ToolBundle
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.models import Capability
from capdisc.registry.flags import Mark

#: The ``source_ref.type`` of capabilities imported from an MCP server (``capdisc import mcp``).
MCP_SOURCE_TYPE = "mcp"

__all__ = [
    "MCP_SOURCE_TYPE",
    "bound_tools",
    "list_discovered_tools",
    "metatool_result",
    "render_for_prompt",
    "tool_bundle",
]


def tool_bundle(
    caps: Sequence[Capability], fmt: formats.ToolFormat, marks: Mapping[str, Mark] | None = None
) -> ToolBundle:
    """Tool definitions of ``caps`` (flagged ones marked) plus the meta-tool, in ``fmt``, the
    map from each tool name back to its capability id, and the sources of the tools imported
    from an MCP server (where a gateway forwards their calls)."""
    callable_caps = formats.callable_capabilities(caps)
    names = formats.NameMap.for_format(fmt, callable_caps)
    return ToolBundle(
        tuple(formats.list_discovered_tools(caps, fmt, marks)),
        {name: cap_id for cap_id, name in names.items()},
        {
            names.to_name(cap.id): replace(cap.source_ref, description="")  # where, not what
            for cap in callable_caps
            if cap.source_ref.type == MCP_SOURCE_TYPE
        },
    )


def list_discovered_tools(result: DiscoveryResult, fmt: formats.ToolFormat) -> dict[str, Any]:
    """``{"tools": [...], "tool_names": {name: capability id}}`` for the matches of ``result``
    (flagged ones marked); the meta-tool is always included."""
    marks = {m.capability.id: m.mark for m in result.matches if m.mark is not None}
    return tool_bundle([m.capability for m in result.matches], fmt, marks).to_dict()


def bound_tools(
    snapshot: IndexSnapshot, bound: Sequence[str], fmt: formats.ToolFormat, caller: Caller
) -> ToolBundle:
    """Tool definitions of a whole working set (what the agent should have bound now) that
    ``caller`` may see and the tenant's policy serves, in ``fmt``, plus the meta-tool."""
    caps = [
        snapshot.capabilities[i]
        for i in bound
        if i in snapshot.capabilities and visible(snapshot.capabilities[i].visibility, caller)
    ]
    return tool_bundle(caps, fmt, snapshot.marks)
