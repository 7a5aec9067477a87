"""Per-turn discovery settings: budgets, retrieval knobs and abstention, settable per call."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from capdisc.errors import ConfigError


class DiscoveryConfig(BaseModel):
    """Per-turn discovery knobs (budgets, retrieval, abstention), each settable per call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tier0_budget_tokens: int = Field(200, ge=0)
    tier1_budget_tokens: int = Field(800, ge=0)
    tier2_budget_tokens: int = Field(2000, ge=0)
    tier1_top_k: int = Field(5, ge=0, le=100)
    tier2_top_k: int = Field(2, ge=0, le=20)
    #: On the calibrated relevance scale (0..1); 0.2 trims padding without costing recall
    #: on the benchmark data (docs/benchmarks.md).
    tier1_min_relevance: float = Field(0.2, ge=-1.0, le=1.0)
    #: Off by default: measured on MetaTool, Seal-Tools and the example registry it gains no
    #: recall and costs NDCG (docs/benchmarks.md). On for registries rich in relationships.
    use_graph_reranking: bool = False
    graph_boost_factor: float = Field(0.15, ge=0.0, le=1.0)
    collection_name: str = "capability_index"
    token_counter: Literal["auto", "heuristic", "cl100k"] = "heuristic"
    #: Retrieval: dense and BM25 z-scores mixed with ``dense_weight`` on the dense side (or
    #: RRF, or one side alone), the exact-name path, query decomposition, and the kind of each
    #: file name, path, URL or email address written beside it (:mod:`capdisc.retrieval.entities`).
    fusion: Literal["zscore", "minmax", "rrf", "dense", "lexical"] = "zscore"
    dense_weight: float = Field(0.7, ge=0.0, le=1.0)
    exact_name_match: bool = True
    decompose_queries: bool = True
    entity_types: bool = True
    #: A request of more parts than this has its parts' vectors pooled from its own model pass
    #: (late chunking: one pass, each part's tokens in the context of the whole); a shorter one
    #: has each part embedded on its own, which measured better for tasks of two or three
    #: steps and for abstention, at more model time (docs/benchmarks.md, "Sub-query vectors").
    #: 0 pools every request's parts.
    pooled_parts_above: int = Field(3, ge=0)
    #: Abstain ("nothing fits") when no match reaches this calibrated relevance; None: the
    #: value calibrated for the embedder (0 never abstains).
    abstain_threshold: float | None = Field(None, ge=0.0, le=1.0)
    #: category -> guidance carried with results of that category (docs/design.md, "Workflow hints")
    workflow_hints: dict[str, str] = Field(default_factory=dict)

    def merged(self, overrides: Mapping[str, Any] | None) -> DiscoveryConfig:
        """A copy with per-call ``overrides`` applied and validated."""
        if not overrides:
            return self
        try:
            return DiscoveryConfig.model_validate({**self.model_dump(), **overrides})
        except ValidationError as exc:
            raise ConfigError(describe_invalid(exc, "discovery option")) from exc


#: The name a wrong field is shown by and where it was set, from its location in the validated
#: data: ``("tier1_top_k", "env CAPDISC_TIER1_TOP_K")`` for ``("discovery", "tier1_top_k")``;
#: None: its dotted location, with nothing to add (a per-call option).
Source = Callable[[tuple[str | int, ...]], tuple[str, str] | None]


def describe_invalid(
    exc: ValidationError,
    what: str,
    model: type[BaseModel] | None = None,
    source: Source = lambda _loc: None,
) -> str:
    """Each problem of ``exc`` (validating ``model``, DiscoveryConfig by default), naming the
    field and where it was set (``source``); an unknown name says which known one it may have
    meant."""
    problems = []
    for error in exc.errors():
        name, where = source(error["loc"]) or (".".join(map(str, error["loc"])), "")
        shown = f"{what} '{name}' ({where})" if where else f"{what} '{name}'"
        problems.append(f"{shown}: {_problem(error, what, model or DiscoveryConfig)}")
    return "; ".join(problems)


def _problem(error: ErrorDetails, what: str, model: type[BaseModel]) -> str:
    """What is wrong with a value, and for an unknown name what to do."""
    if error["type"] != "extra_forbidden":
        return error["msg"]
    known = _known_names(model, error["loc"][:-1])
    guess = difflib.get_close_matches(str(error["loc"][-1]), known, n=1)
    hint = f"did you mean '{guess[0]}'? " if guess else ""
    return f"not a known {what}; {hint}correct or remove it"


def _known_names(model: type[BaseModel], parent: tuple[str | int, ...]) -> list[str]:
    """The field names of the model at ``parent`` within ``model`` (through its fields and
    the values of its mappings); none when what is there is not a model."""
    node: Any = model
    for part in parent:
        if _is_model(node):
            field = node.model_fields.get(str(part))
            node = field.annotation if field is not None else None
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        else:
            return []
    return list(node.model_fields) if _is_model(node) else []


def _is_model(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)
