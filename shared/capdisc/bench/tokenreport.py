"""The token report: a static dump of every tool against a tiered answer.

The static dump is what an agent pays when every capability's tool definition sits in every
prompt (OpenAI Chat Completions ``tools``, as JSON). A tiered answer is what capdisc renders per
turn (Tiers 0, 1 and 2, under their budgets); ``with tools`` adds the definitions of the tools it
found and of the ``discover_capabilities`` meta-tool, for a runtime that binds them natively
besides the context. Both sides are counted with the same counter.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from capdisc.agents.formats import to_openai_chat
from capdisc.discovery.config import DiscoveryConfig
from capdisc.discovery.protocol import DiscoverRequest
from capdisc.discovery.service import Context, answer
from capdisc.discovery.snapshot import IndexSnapshot
from capdisc.embedders.port import CachedQueryEmbedder
from capdisc.sessions.policy import SessionPolicy
from capdisc.tokens import TokenCounter, make_counter


@dataclass(frozen=True)
class TurnTokens:
    """What one turn costs: the rendered context and the bound tool definitions."""

    context: int
    tools: int
    within_budget: bool = True

    @property
    def total(self) -> int:
        return self.context + self.tools


def static_dump_tokens(snapshot: IndexSnapshot, counter: TokenCounter) -> int:
    """Every capability's tool definition, as one ``tools`` array in the prompt."""
    caps = [snapshot.capabilities[i] for i in snapshot.ids]
    return counter(json.dumps(to_openai_chat(caps, include_metatool=False)))


def turn_tokens(
    snapshot: IndexSnapshot,
    query: str,
    queries: CachedQueryEmbedder,
    config: DiscoveryConfig,
    counter: TokenCounter,
) -> TurnTokens:
    """One turn through the discovery service, as a worker answers it: its context and its
    tool definitions (with the meta-tool)."""
    reply = answer(
        DiscoverRequest(query, tenant=snapshot.tenant, tool_format="openai-chat"),
        Context(snapshot, queries, config, SessionPolicy()),
    )
    tools = list(reply.tools.tools) if reply.tools else []
    used = reply.tokens
    within = (
        used["tier0"] <= config.tier0_budget_tokens
        and used["tier1"] <= config.tier1_budget_tokens
        and used["tier2"] <= config.tier2_budget_tokens
    )
    return TurnTokens(counter(reply.context), counter(json.dumps(tools)), within)


def token_report(
    snapshot: IndexSnapshot,
    queries: Sequence[str],
    embedder: CachedQueryEmbedder,
    config: DiscoveryConfig,
) -> dict[str, Any]:
    """Static dump against the per-turn median and maximum, and the saving of the median."""
    counter = make_counter(config.token_counter)
    static = static_dump_tokens(snapshot, counter)
    turns = [turn_tokens(snapshot, q, embedder, config, counter) for q in queries]
    contexts = [t.context for t in turns] or [0]
    totals = [t.total for t in turns] or [0]
    return {
        "capabilities": len(snapshot),
        "queries": len(turns),
        "counter": config.token_counter,
        "static_dump_tokens": static,
        "turn_tokens": {
            "median": statistics.median(contexts),
            "max": max(contexts),
            "with_tools_median": statistics.median(totals),
            "with_tools_max": max(totals),
        },
        "budget_tokens": (
            config.tier0_budget_tokens + config.tier1_budget_tokens + config.tier2_budget_tokens
        ),
        "saving": _saving(statistics.median(contexts), static),
        "saving_with_tools": _saving(statistics.median(totals), static),
        "over_budget_turns": sum(not t.within_budget for t in turns),
    }


def _saving(tokens: float, static: int) -> float:
    return round(1.0 - tokens / static, 4) if static else 0.0
