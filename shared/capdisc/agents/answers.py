"""What the ``discover_capabilities`` meta-tool returns to the model, from a discovery answer
(a worker's reply or ``DiscoveryResult.to_dict()``, which have the same shape): what was found
and how to use the best of it. Plain dictionaries in and out, so the light client uses it
without the engine."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def metatool_result(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The meta-tool's answer to the model, from a discovery answer (``DiscoveryResult.to_dict()``
    or a worker's reply, which is the same): what was found, and how to use the best of it."""
    caps = answer.get("capabilities") or []
    summary = {
        "total_indexed": answer.get("total_indexed", 0),
        "index_version": answer.get("index_version", 0),
    }
    if answer.get("abstained") or not caps:
        return {
            "capabilities": [],
            **summary,
            "note": "No registered capability fits this query; try other words, or answer "
            "without a tool.",
        }
    tiers = answer.get("tiers") or {}
    result = {
        "capabilities": [_summary(cap) for cap in caps],
        "details": "\n\n".join(t for t in (tiers.get("tier1"), tiers.get("tier2")) if t),
        **summary,
    }
    if answer.get("workflow_hints"):
        result["workflow_guidance"] = dict(answer["workflow_hints"])
    return result


def _summary(cap: Mapping[str, Any]) -> dict[str, Any]:
    """One found capability for the model: flagged ones with their ``flags`` (rule codes and
    where they fired)."""
    entry = {key: cap[key] for key in ("id", "kind", "name", "relevance", "available")}
    if cap.get("flags"):
        entry["flags"] = cap["flags"]
    return entry
