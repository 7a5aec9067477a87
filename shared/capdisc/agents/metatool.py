"""The ``discover_capabilities`` meta-tool (docs/design.md, "The meta-tool and tool definitions").

The one tool an agent always has: when the passive tiers miss something, the model searches the
registry itself. Its definition sits in every request, so it is kept within
:data:`METATOOL_TOKEN_BUDGET` (checked by tests/unit/test_metatool.py): a short description with
two example calls, and a few words on each argument. :func:`metatool_tokens` measures it with
any token counter.

:func:`metatool_definition` is the format-neutral definition (name, description, JSON Schema);
:mod:`capdisc.agents.formats` turns it into each provider's tool shape.
:func:`metatool_output_schema` is the JSON Schema of its result
(:func:`capdisc.discovery.toolsets.metatool_result`, plus what ``capdisc mcp`` adds), declared
as the MCP tool's ``outputSchema``. :func:`parse_metatool_arguments` checks the arguments a model
sent, strictly: a model's arguments are untrusted input.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from capdisc.errors import ManifestError
from capdisc.models import KINDS, JSONDict, Kind
from capdisc.tokens import TokenCounter, heuristic_tokens

METATOOL_NAME = "discover_capabilities"

METATOOL_DESCRIPTION = (
    "Find tools, skills, extensions or channels when none listed fits; found tools join your "
    "tools. E.g. query 'post to our Slack channel'; query 'refund a payment', kind 'tool'."
)

METATOOL_TOKEN_BUDGET = 180
"""Most tokens the definition may cost (``json.dumps`` of :func:`metatool_definition`, by the
4-characters heuristic and by cl100k). The examples and the argument descriptions are what a
model needs to call it well; everything else is left out."""

MAX_LIMIT = 20
"""Largest ``limit`` a model may ask for (the schema's ``maximum``)."""

MAX_QUERY_CHARS = 1000
"""Longest query accepted; a longer one is a model running away, not a search."""

# Kept terse on purpose: every key here is paid for in every request. ``kind`` keeps its
# ``"type": "string"`` because some providers' schema subsets want a type beside an ``enum``.
METATOOL_PARAMETERS: JSONDict = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "The task, in plain words"},
        "kind": {"type": "string", "enum": list(KINDS), "description": "Only this kind"},
        "limit": {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_LIMIT,
            "description": "Max results",
        },
        "only_available": {"type": "boolean", "description": "Skip ones not installed"},
    },
    "required": ["query"],
    "additionalProperties": False,
}

_OBJECTS: JSONDict = {"type": "array", "items": {"type": "object"}}
_FOUND: JSONDict = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "kind": {"type": "string", "enum": list(KINDS)},
        "name": {"type": "string"},
        "relevance": {"type": "number", "minimum": 0, "maximum": 1},
        "available": {"type": "boolean"},
        "flags": _OBJECTS,
    },
    "required": ["id", "kind", "name", "relevance", "available"],
}

# Not paid for per request the way the input schema is (hosts use it to check results), so the
# fields say what they hold.
METATOOL_OUTPUT_SCHEMA: JSONDict = {
    "type": "object",
    "properties": {
        "capabilities": {"type": "array", "items": _FOUND, "description": "Best first"},
        "details": {"type": "string", "description": "How to use the best matches"},
        "note": {"type": "string", "description": "Nothing fits, or a repeated search"},
        "workflow_guidance": {"type": "object", "additionalProperties": {"type": "string"}},
        "installable": {**_OBJECTS, "description": "Fitting ones not installed yet"},
        "total_indexed": {"type": "integer"},
        "index_version": {"type": "integer"},
        "session": {"type": ["object", "null"], "description": "The session's working set"},
        "tools": {**_OBJECTS, "description": "Tool definitions of the working set"},
        "tool_names": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["capabilities", "total_indexed", "index_version"],
}

ARGUMENT_NAMES: tuple[str, ...] = ("query", "kind", "limit", "only_available")

_SOURCE = METATOOL_NAME


def metatool_definition() -> JSONDict:
    """The format-neutral definition: ``name``, ``description``, ``parameters`` (JSON Schema).

    A fresh deep copy each call, so a caller that edits it (adds ``strict``, say) cannot change
    the next request's definition.
    """
    return {
        "name": METATOOL_NAME,
        "description": METATOOL_DESCRIPTION,
        "parameters": copy.deepcopy(METATOOL_PARAMETERS),
    }


def metatool_output_schema() -> JSONDict:
    """The JSON Schema of the meta-tool's result (a fresh deep copy): what was found
    (``capabilities``, ``details``, ``note``, ``workflow_guidance``, ``installable``, the index
    counts), and in ``capdisc mcp`` also ``session``, ``tools`` and ``tool_names``."""
    return copy.deepcopy(METATOOL_OUTPUT_SCHEMA)


def metatool_tokens(counter: TokenCounter = heuristic_tokens) -> int:
    """Tokens the definition costs: ``counter`` over ``json.dumps(metatool_definition())``."""
    return counter(json.dumps(metatool_definition()))


@dataclass(frozen=True)
class MetaToolCall:
    """One validated call of the meta-tool.

    ``None`` means the model did not give that argument (or sent ``null``): the engine's configured
    default applies, so a per-call value only ever overrides configuration when it was given.
    """

    query: str
    kind: Kind | None = None
    limit: int | None = None
    only_available: bool | None = None


def parse_metatool_arguments(arguments: str | Mapping[str, Any]) -> MetaToolCall:
    """Validate a model's arguments for ``discover_capabilities`` (a JSON string, as OpenAI sends
    them, or an already-decoded object, as Anthropic and MCP do).

    Strict: unknown arguments, wrong types, a ``kind`` outside the enum and a ``limit`` outside
    1-20 are refused with a :class:`~capdisc.errors.ManifestError` whose ``field`` names the
    argument, so the message can go back to the model as the tool's error result. Lenient in two
    ways only, both what JSON Schema itself allows or what models do with optional fields: an
    integral number such as ``5.0`` is an integer, and ``null`` for an optional argument means it
    was not given. The query is stripped of surrounding whitespace.
    """
    data = _decode(arguments)
    unknown = [key for key in data if key not in ARGUMENT_NAMES]
    if unknown:
        raise ManifestError(
            _SOURCE, str(unknown[0]), "unknown argument (use " + ", ".join(ARGUMENT_NAMES) + ")"
        )
    return MetaToolCall(
        query=_query(data.get("query")),
        kind=_kind(data.get("kind")),
        limit=_limit(data.get("limit")),
        only_available=_only_available(data.get("only_available")),
    )


def _decode(arguments: str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            decoded = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise ManifestError(_SOURCE, None, f"arguments are not valid JSON ({exc.msg})") from exc
        except RecursionError as exc:
            raise ManifestError(_SOURCE, None, "arguments are nested too deeply to read") from exc
        except ValueError as exc:  # an integer past the 4300 digits int() converts
            raise ManifestError(_SOURCE, None, "arguments hold a number too long to read") from exc
    else:
        decoded = arguments
    if not isinstance(decoded, Mapping):
        raise ManifestError(
            _SOURCE, None, f"arguments must be a JSON object, got {_type_name(decoded)}"
        )
    return cast(Mapping[str, Any], decoded)


def _query(value: Any) -> str:
    if value is None:
        raise ManifestError(_SOURCE, "query", "is required: say what the capability should do")
    if not isinstance(value, str):
        raise ManifestError(_SOURCE, "query", f"must be a string, got {_type_name(value)}")
    text = value.strip()
    if not text:
        raise ManifestError(_SOURCE, "query", "must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise ManifestError(
            _SOURCE, "query", f"is {len(text)} characters; keep it to {MAX_QUERY_CHARS} at most"
        )
    return text


def _kind(value: Any) -> Kind | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in KINDS:
        raise ManifestError(_SOURCE, "kind", f"{_shown(value)} is not one of " + ", ".join(KINDS))
    return value


def _limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, float):
        if not value.is_integer():
            raise ManifestError(_SOURCE, "limit", f"must be a whole number, got {value}")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ManifestError(_SOURCE, "limit", f"must be an integer, got {_type_name(value)}")
    if not 1 <= value <= MAX_LIMIT:
        raise ManifestError(_SOURCE, "limit", f"{value} is outside 1-{MAX_LIMIT}")
    return value


def _only_available(value: Any) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ManifestError(
            _SOURCE, "only_available", f"must be true or false, got {_type_name(value)}"
        )
    return value


def _shown(value: Any) -> str:
    """A refused value as the message shows it: its repr, cut short (a model may send pages)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _type_name(value: Any) -> str:
    """The JSON name of a decoded value's type, for messages a model reads."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__
