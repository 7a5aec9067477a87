"""Tiered context assembly under hard token budgets (docs/design.md explains the three tiers).

* Tier 0: category summaries of the whole registry. A function of the capability set only, so it
  is byte-identical for the same index version and tenant and can sit in a cached prompt prefix.
* Tier 1: one-line summaries of the turn's top matches above the minimum relevance, followed by
  the workflow hints of their categories when they fit.
* Tier 2: the full schema (tools) or content (skills) of the best ``tier2_top_k`` Tier 1 matches.

Every tier is cut to its budget with the configured counter; no rendered tier ever exceeds it.
A capability given a caution (a flagged one under the ``warn`` policy,
:mod:`capdisc.registry.flags`)
has it ahead of its own text in Tiers 1 and 2, and is left out rather than shown without it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from capdisc.models import Capability
from capdisc.tokens import TokenCounter, truncate_to_budget

TIER0_HEADER = "Available capability categories:"
TIER0_FOOTER = "Use the discover_capabilities tool to get details on any capability."
TIER1_HEADER = "Relevant capabilities:"
NOTHING_FITS = (
    "No registered capability fits this request. Answer directly, or call "
    "discover_capabilities with a more specific query."
)
NAMES_PER_CATEGORY = 4


class Listed(Protocol):
    """What Tier 0 reads of a capability (a :class:`~capdisc.models.Capability`, or the
    category and name columns of a table)."""

    @property
    def category(self) -> str: ...

    @property
    def name(self) -> str: ...


@dataclass(frozen=True)
class TieredContext:
    """The rendered tiers of one answer and what each costs."""

    tier0: str
    tier1: str
    tier2: str
    tier1_ids: tuple[str, ...]
    tier2_ids: tuple[str, ...]
    tokens: Mapping[str, int]

    def render(self) -> str:
        return "\n\n".join(t for t in (self.tier0, self.tier1, self.tier2) if t)


def tier0_text(capabilities: Iterable[Listed], budget: int, counter: TokenCounter) -> str:
    """Category summaries, biggest category first, as many as fit the budget."""
    groups: dict[str, list[str]] = defaultdict(list)
    for cap in capabilities:
        groups[cap.category].append(cap.name)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    lines = [TIER0_HEADER]
    for index, (category, names) in enumerate(ordered):
        shown = sorted(names)[:NAMES_PER_CATEGORY]
        more = f" (+{len(names) - len(shown)} more)" if len(names) > len(shown) else ""
        line = f"- {category}: {', '.join(shown)}{more} ({len(names)})"
        rest = len(ordered) - index - 1
        tail = [f"(+{rest} more categories)"] if rest else []
        if counter("\n".join([*lines, line, *tail, TIER0_FOOTER])) > budget:
            lines.append(f"(+{rest + 1} more categories)")
            break
        lines.append(line)
    if not groups:
        lines = ["No capabilities are registered yet."]
    return _fit([*lines, TIER0_FOOTER] if groups else lines, budget, counter)


def tier1_text(
    matches: Sequence[Capability],
    hints: Mapping[str, str],
    budget: int,
    counter: TokenCounter,
    cautions: Mapping[str, str] | None = None,
) -> tuple[str, tuple[str, ...]]:
    """Summary lines for ``matches`` (best first) and the hints of their categories;
    ``cautions`` by capability id go ahead of their descriptions."""
    if not matches:
        return truncate_to_budget(NOTHING_FITS, budget, counter), ()
    lines = [TIER1_HEADER]
    shown: list[str] = []
    for rank, cap in enumerate(matches, start=1):
        caution = (cautions or {}).get(cap.id, "")
        line = summary_line(rank, cap, caution)
        if counter("\n".join([*lines, line])) > budget:
            line = truncate_to_budget(line, budget - counter("\n".join(lines)) - 1, counter)
            # a cut line still names its capability, and keeps its whole caution
            if line.startswith(f"{rank}. {cap.name} ") and caution in line:
                lines.append(line)
                shown.append(cap.id)
            break
        lines.append(line)
        shown.append(cap.id)
    for hint in _category_hints(matches, hints):
        if counter("\n".join([*lines, hint])) <= budget:
            lines.append(hint)
    return _fit(lines, budget, counter), tuple(shown)


def summary_line(rank: int, cap: Capability, caution: str = "") -> str:
    """``1. web-search (tool). Search the web. Params: query``: one Tier 1 entry (a caution
    goes after the kind, ahead of the description)."""
    text = f"{rank}. {cap.name} ({cap.kind}). {caution + ' ' if caution else ''}"
    text += first_sentence(cap.description)
    if not cap.available:
        text += " [installable, not installed]"
    if cap.parameter_names:
        text += f" Params: {', '.join(cap.parameter_names)}"
    if cap.required_tools:
        text += f" Requires: {', '.join(cap.required_tools)}"
    return text


def tier2_text(
    matches: Sequence[Capability],
    budget: int,
    counter: TokenCounter,
    cautions: Mapping[str, str] | None = None,
) -> tuple[str, tuple[str, ...]]:
    """Full details of ``matches``, sharing the budget; a block that does not fit is cut (one
    whose caution would be cut is left out)."""
    blocks: list[str] = []
    shown: list[str] = []
    for cap in matches:
        caution = (cautions or {}).get(cap.id, "")
        used = counter("\n\n".join(blocks)) + (1 if blocks else 0)
        block = truncate_to_budget(detail_block(cap, caution), budget - used, counter)
        if not block or caution not in block:
            break
        blocks.append(block)
        shown.append(cap.id)
    return _fit(blocks, budget, counter, sep="\n\n"), tuple(shown)


def detail_block(cap: Capability, caution: str = "") -> str:
    """The Tier 2 text of one capability: schema for tools, content for skills; a caution goes
    ahead of its description."""
    lines = [
        f"# {cap.display_name or cap.name}",
        f"Id: {cap.id} | Kind: {cap.kind} | Category: {cap.category}",
        *([caution] if caution else []),
        "",
        cap.description,
    ]
    if cap.full_schema and cap.full_schema.get("properties"):
        lines += ["", "## Input Schema", *schema_lines(cap.full_schema)]
    if cap.full_content:
        lines += ["", cap.full_content.strip()]
    if cap.required_tools:
        lines.append(f"Requires: {', '.join(cap.required_tools)}")
    if cap.required_secrets:
        lines.append(f"Required secrets: {', '.join(cap.required_secrets)}")
    if cap.has_side_effects:
        lines.append("Has side effects: confirm before calling when the user did not ask for it.")
    return "\n".join(lines)


def schema_lines(schema: Mapping[str, Any]) -> list[str]:
    """``  name (type, required): description [a|b] (default: x)`` per top-level parameter."""
    required = set(schema.get("required") or ())
    lines = []
    for name, spec in (schema.get("properties") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type", "any")
        kind = "|".join(kind) if isinstance(kind, list) else str(kind)
        flags = f"{kind}, required" if name in required else kind
        line = f"  {name} ({flags})"
        if spec.get("description"):
            line += f": {spec['description']}"
        if spec.get("enum"):
            line += f" [{'|'.join(str(v) for v in spec['enum'])}]"
        if "default" in spec:
            line += f" (default: {json.dumps(spec['default'])})"
        lines.append(line)
    return lines


def first_sentence(text: str, max_chars: int = 160) -> str:
    """The first sentence of ``text`` (at most ``max_chars``)."""
    flat = " ".join(text.split())
    stops = [i for i in (flat.find(stop, 1) for stop in (". ", "! ", "? ")) if 0 < i < max_chars]
    if stops:
        return flat[: min(stops) + 1]
    return flat if len(flat) <= max_chars else flat[: max_chars - 1].rstrip() + "…"


def _category_hints(matches: Sequence[Capability], hints: Mapping[str, str]) -> list[str]:
    counts = Counter(cap.category for cap in matches)
    return [
        f"Workflow ({category}): {hints[category].strip()}"
        for category, _n in counts.most_common()
        if hints.get(category, "").strip()
    ]


def _fit(parts: Sequence[str], budget: int, counter: TokenCounter, sep: str = "\n") -> str:
    return truncate_to_budget(sep.join(parts), budget, counter)
