"""Capabilities as tool definitions in the four formats agents consume.

Pure functions: capabilities in, plain JSON-ready dicts out, one shape per provider. Each shape was
checked against the provider's own SDK types or docs (noted at each builder below):

* OpenAI Chat Completions: ``{"type": "function", "function": {name, description, parameters}}``;
* OpenAI Responses: flat ``{"type": "function", name, description, parameters, strict}``, with
  ``defer_loading`` for tool search and a ``tool_search_output`` item for client-executed search;
* Anthropic Messages: ``{name, description, input_schema}``, ``defer_loading: true`` and
  ``tool_reference`` blocks for a ``tool_result``;
* MCP: ``Tool`` as ``tools/list`` sends it: ``name``, ``title``, ``description``, ``inputSchema``,
  ``annotations``; the meta-tool also declares its result's ``outputSchema``.

**Flagged tools** (:mod:`capdisc.registry.flags`): a served capability the tool-poisoning scan
flagged
carries its mark. Under ``warn`` its description starts with ``[flagged: rule, ...]`` in every
format (the only place a model reads that all four accept); in MCP its ``_meta`` also holds
``capdisc/flags``, the rule codes and field paths (never the scanned excerpts), under ``flag``
and ``warn`` alike. Builders take the marks by capability id (``marks=``).

**Only callable capabilities become tool definitions**: kind ``tool`` and ``available``. Skills,
extensions and channels have no input schema and nothing to call: a skill is instructions, an
extension is a package whose own tools are capabilities of their own, a channel is reached
through the tools that post to it. Offering one as a function with an empty schema would invite
the model to call something that does nothing; they reach the model instead as text (the tiers'
summaries and full content) and through ``discover_capabilities``, whose answer carries a skill's
instructions. An unavailable tool (not installed, secrets missing) would fail when called, so it
is not offered either. Every builder applies the same rule (:func:`callable_capabilities`).

**Names.** Provider name rules are stricter than capability ids (``tool:github-create-pr``,
``mcp:github/create_issue``). :func:`tool_name` maps an id to a legal name, and :class:`NameMap`
maps names back to ids. The name depends on the id alone, so the same capability has the same name
in every request, in a tool list built from a whole catalog and in a ``tool_reference`` built from
its top five (Anthropic requires the reference to match a defined tool exactly):

* ``tool:NAME`` becomes ``NAME`` when ``NAME`` is already legal: the common case reads as itself;
* any other id (another prefix, illegal characters, too long, or a ``NAME`` that could be
  mistaken for a hashed name or the meta-tool's) becomes its legal characters, runs of illegal
  ones replaced by ``__``, cut to fit, plus ``_`` and 8 hex digits of the id's sha256. Two ids
  that sanitize alike therefore still differ, and a clean name can never equal a hashed one.

Only if two hashed names still clash (a 32-bit hash collision) does :class:`NameMap` lengthen the
hashes of the clashing ids, so only then does a name depend on its neighbours.

**Schemas** pass through unchanged (deep-copied) except for what a format requires: a missing
top-level ``"type": "object"`` is added everywhere, and OpenAI formats get ``"properties": {}``
when it is missing (the API rejects an object schema without it). Strict mode is never turned on:
Chat Completions leaves ``strict`` out (default off) and Responses sends ``"strict": false``,
because there ``strict`` is on by default for compatible schemas and a capability's schema was
never written for strict mode's rules.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from capdisc.agents.formatnames import TOOL_FORMATS as TOOL_FORMATS
from capdisc.agents.formatnames import ToolFormat as ToolFormat
from capdisc.agents.metatool import METATOOL_NAME, metatool_definition, metatool_output_schema
from capdisc.errors import ManifestError
from capdisc.models import Capability, JSONDict, display_name_from
from capdisc.registry.flags import Mark

OPENAI_DESCRIPTION_MAX = 1024
"""OpenAI rejects a function description longer than this (API error ``string_above_max_length``,
"Expected a string with maximum length 1024"); longer ones are cut with an ellipsis."""

HASH_CHARS = 8
_LONGER_HASHES = (16, 32)
_TOOL_PREFIX = "tool:"
_LOOKS_HASHED = re.compile(r"_[0-9a-f]{8,}$")


# -- names ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NameRule:
    """A provider's rule for tool names: which characters, how many."""

    label: str
    pattern: re.Pattern[str]
    illegal: re.Pattern[str]
    max_len: int


def _name_rule(label: str, chars: str, max_len: int) -> NameRule:
    return NameRule(
        label=label,
        pattern=re.compile(rf"[{chars}]{{1,{max_len}}}"),
        illegal=re.compile(rf"[^{chars}]+"),
        max_len=max_len,
    )


# openai-python ``shared_params/function_definition.py`` (FunctionDefinition.name): "Must be a-z,
# A-Z, 0-9, or contain underscores and dashes, with a maximum length of 64." Responses names use
# the same rule here, so a capability has one name across both OpenAI APIs.
OPENAI_NAMES = _name_rule("OpenAI", "A-Za-z0-9_-", 64)

# platform.claude.com/docs/agents-and-tools/tool-use/define-tools: name "Must match the regex
# ^[a-zA-Z0-9_-]{1,128}$" (128 in current docs; earlier docs and platforms said 64). We keep 64:
# valid under both, and the same names as OpenAI for the same catalog.
ANTHROPIC_NAMES = _name_rule("Anthropic", "A-Za-z0-9_-", 64)

# MCP SEP-986, as ``mcp/shared/tool_name_validation.py`` (mcp 2.3.0) enforces it:
# TOOL_NAME_REGEX = ^[A-Za-z0-9._-]{1,128}$.
MCP_NAMES = _name_rule("MCP", "A-Za-z0-9._-", 128)

NAME_RULES: dict[ToolFormat, NameRule] = {
    "openai-chat": OPENAI_NAMES,
    "openai-responses": OPENAI_NAMES,
    "anthropic": ANTHROPIC_NAMES,
    "mcp": MCP_NAMES,
}

_RESERVED: frozenset[str] = frozenset({METATOOL_NAME})


def tool_name(cap_id: str, rule: NameRule, *, reserved: frozenset[str] = _RESERVED) -> str:
    """The legal, deterministic tool name of ``cap_id`` under ``rule`` (see the module doc)."""
    if cap_id.startswith(_TOOL_PREFIX):
        plain = cap_id[len(_TOOL_PREFIX) :]
        if (
            rule.pattern.fullmatch(plain)
            and plain not in reserved
            and not _LOOKS_HASHED.search(plain)
        ):
            return plain
    return _hashed_name(cap_id, rule, HASH_CHARS)


def _hashed_name(cap_id: str, rule: NameRule, hash_chars: int) -> str:
    stem = cap_id[len(_TOOL_PREFIX) :] if cap_id.startswith(_TOOL_PREFIX) else cap_id
    stem = rule.illegal.sub("__", stem)[: rule.max_len - 1 - hash_chars] or "cap"
    digest = hashlib.sha256(cap_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{stem}_{digest[:hash_chars]}"


class NameMap:
    """Capability ids to tool names under one format's rule, and back.

    Built from the ids of one request's tools; :meth:`to_id` turns the name in a model's tool call
    back into the capability id. The meta-tool's name is reserved: no capability gets it, and
    :meth:`to_id` does not know it (check ``name == METATOOL_NAME`` first).
    """

    def __init__(self, ids: Iterable[str], rule: NameRule) -> None:
        self.rule = rule
        names = {cap_id: tool_name(cap_id, rule) for cap_id in dict.fromkeys(ids)}
        for hash_chars in _LONGER_HASHES:
            clashing = _clashing(names)
            if not clashing:
                break
            for cap_id in clashing:
                names[cap_id] = _hashed_name(cap_id, rule, hash_chars)
        if _clashing(names):  # pragma: no cover - needs a 128-bit sha256 prefix collision
            raise ValueError(f"ids {sorted(_clashing(names))} cannot be given distinct names")
        self._names = names
        self._ids = {name: cap_id for cap_id, name in names.items()}

    @classmethod
    def for_format(cls, fmt: ToolFormat, items: Iterable[Capability | str]) -> NameMap:
        """The map for ``fmt`` over capabilities or ids."""
        return cls(
            (item.id if isinstance(item, Capability) else item for item in items), NAME_RULES[fmt]
        )

    def to_name(self, cap_id: str) -> str:
        """The tool name of ``cap_id``; ``KeyError`` when the id is not in this map."""
        return self._names[cap_id]

    def to_id(self, name: str) -> str:
        """The capability id behind a tool name; ``KeyError`` for a name this map never gave."""
        return self._ids[name]

    def get_id(self, name: str) -> str | None:
        """Like :meth:`to_id`, ``None`` for an unknown name (a model may invent one)."""
        return self._ids.get(name)

    def items(self) -> list[tuple[str, str]]:
        """``(capability id, tool name)`` pairs in insertion order."""
        return list(self._names.items())

    def __contains__(self, cap_id: object) -> bool:
        return cap_id in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _clashing(names: Mapping[str, str]) -> list[str]:
    owners: dict[str, list[str]] = {}
    for cap_id, name in names.items():
        owners.setdefault(name, []).append(cap_id)
    return [cap_id for ids in owners.values() if len(ids) > 1 for cap_id in ids]


# -- shared pieces -------------------------------------------------------------------------------


def callable_capabilities(capabilities: Iterable[Capability]) -> list[Capability]:
    """The capabilities that become tool definitions: kind ``tool``, available, first of each id."""
    seen: set[str] = set()
    chosen: list[Capability] = []
    for cap in capabilities:
        if cap.kind == "tool" and cap.available and cap.id not in seen:
            seen.add(cap.id)
            chosen.append(cap)
    return chosen


def input_schema(capability: Capability, *, openai: bool = False) -> JSONDict:
    """The capability's JSON Schema as a tool's input schema: a deep copy, ``"type": "object"``
    added when missing, and for OpenAI ``"properties": {}`` when missing. A schema whose top level
    is not an object cannot be a tool's input and is refused."""
    schema = copy.deepcopy(capability.full_schema) if capability.full_schema is not None else {}
    if "type" not in schema:
        schema = {"type": "object", **schema}
    elif schema["type"] != "object":
        raise ManifestError(
            capability.id,
            "full_schema",
            f"top-level type is {schema['type']!r}; a tool input must be 'object'",
        )
    if openai and "properties" not in schema:
        schema["properties"] = {}
    return schema


def _openai_description(text: str) -> str:
    text = text.strip()
    if len(text) <= OPENAI_DESCRIPTION_MAX:
        return text
    return text[: OPENAI_DESCRIPTION_MAX - 1] + "…"


def _with_description(definition: JSONDict, description: str) -> JSONDict:
    """Add ``description`` after the name when there is one (every format makes it optional)."""
    if description:
        definition["description"] = description
    return definition


def _names(fmt: ToolFormat, caps: list[Capability], names: NameMap | None) -> NameMap:
    return names if names is not None else NameMap.for_format(fmt, caps)


#: A served flagged capability's mark, by capability id.
Marks = Mapping[str, Mark]
#: The MCP ``_meta`` key of a flagged tool's rule codes and field paths.
MCP_FLAGS_META = "capdisc/flags"


def described(cap: Capability, marks: Marks | None) -> str:
    """The description a tool definition carries: under ``warn``, after its flag label."""
    mark = marks.get(cap.id) if marks else None
    if mark is not None and mark.caution:
        return f"{mark.label} {cap.description}"
    return cap.description


# -- OpenAI Chat Completions ---------------------------------------------------------------------
# Shape: openai-python ``types/chat/chat_completion_function_tool_param.py``
# (ChatCompletionFunctionToolParam: type "function", function) and
# ``types/shared_params/function_definition.py`` (FunctionDefinition: name required; description,
# parameters, strict optional; strict off unless true). Chat Completions has no ``defer_loading``.


def _openai_chat_tool(name: str, description: str, parameters: JSONDict) -> JSONDict:
    function = _with_description({"name": name}, _openai_description(description))
    function["parameters"] = parameters
    return {"type": "function", "function": function}


def to_openai_chat(
    capabilities: Iterable[Capability],
    include_metatool: bool = True,
    *,
    names: NameMap | None = None,
    marks: Marks | None = None,
) -> list[JSONDict]:
    """Chat Completions ``tools``: the meta-tool first, then each callable capability."""
    caps = callable_capabilities(capabilities)
    name_map = _names("openai-chat", caps, names)
    tools: list[JSONDict] = []
    if include_metatool:
        meta = metatool_definition()
        tools.append(_openai_chat_tool(meta["name"], meta["description"], meta["parameters"]))
    tools.extend(
        _openai_chat_tool(
            name_map.to_name(cap.id), described(cap, marks), input_schema(cap, openai=True)
        )
        for cap in caps
    )
    return tools


# -- OpenAI Responses ----------------------------------------------------------------------------
# Function tool: openai-python ``types/responses/function_tool_param.py`` (FunctionToolParam: type
# "function", name, parameters, strict required-nullable "Default `true`", description optional)
# and ``namespace_tool_param.py`` (``defer_loading``: "Whether this function should be deferred
# and discovered via tool search"; strict omitted means strict when the schema allows it).
# Tool search: developers.openai.com/api/docs/guides/tools-tool-search ("Add tool_search as a
# tool ... mark the ones you want to defer with defer_loading: true"); ``tool_search_tool_param.py``
# (ToolSearchToolParam: type "tool_search", execution "server"|"client", description, parameters
# for a client-executed search); ``response_tool_search_output_item_param.py`` (type
# "tool_search_output", tools, call_id, execution, status).


def _openai_responses_tool(
    name: str, description: str, parameters: JSONDict, defer_loading: bool
) -> JSONDict:
    tool = _with_description({"type": "function", "name": name}, _openai_description(description))
    tool["parameters"] = parameters
    tool["strict"] = False
    if defer_loading:
        tool["defer_loading"] = True
    return tool


def openai_client_tool_search() -> JSONDict:
    """The meta-tool as the Responses API's client-executed ``tool_search`` tool: the model's
    ``tool_search_call`` then carries ``discover_capabilities`` arguments (parse them with
    :func:`capdisc.agents.metatool.parse_metatool_arguments`) and is answered with
    :func:`to_openai_tool_search_output`."""
    meta = metatool_definition()
    return {
        "type": "tool_search",
        "execution": "client",
        "description": meta["description"],
        "parameters": meta["parameters"],
    }


def to_openai_responses(
    capabilities: Iterable[Capability],
    include_metatool: bool = True,
    defer_loading: bool = False,
    *,
    names: NameMap | None = None,
    marks: Marks | None = None,
) -> list[JSONDict]:
    """Responses API ``tools``: flat function tools, the meta-tool first.

    With ``defer_loading`` every capability's function is deferred (only its name and description
    reach the model until tool search loads it), and the meta-tool becomes the client-executed
    ``tool_search`` tool (:func:`openai_client_tool_search`): deferred functions need a tool search
    in the list, and this one runs through capdisc. Without the meta-tool, deferred functions need
    the caller's own ``{"type": "tool_search"}``.
    """
    caps = callable_capabilities(capabilities)
    name_map = _names("openai-responses", caps, names)
    tools: list[JSONDict] = []
    if include_metatool:
        if defer_loading:
            tools.append(openai_client_tool_search())
        else:
            meta = metatool_definition()
            tools.append(
                _openai_responses_tool(
                    meta["name"], meta["description"], meta["parameters"], defer_loading=False
                )
            )
    tools.extend(
        _openai_responses_tool(
            name_map.to_name(cap.id),
            described(cap, marks),
            input_schema(cap, openai=True),
            defer_loading,
        )
        for cap in caps
    )
    return tools


def to_openai_tool_search_output(
    call_id: str,
    capabilities: Iterable[Capability],
    *,
    names: NameMap | None = None,
    marks: Marks | None = None,
) -> JSONDict:
    """The input item answering a client-executed ``tool_search_call``: the found capabilities as
    (not deferred) function tools, which become callable from then on."""
    caps = callable_capabilities(capabilities)
    name_map = _names("openai-responses", caps, names)
    return {
        "type": "tool_search_output",
        "call_id": call_id,
        "execution": "client",
        "tools": [
            _openai_responses_tool(
                name_map.to_name(cap.id),
                described(cap, marks),
                input_schema(cap, openai=True),
                defer_loading=False,
            )
            for cap in caps
        ],
    }


# -- Anthropic Messages --------------------------------------------------------------------------
# Tool: anthropic-sdk-python ``types/tool_param.py`` (ToolParam: name, input_schema required with
# type "object"; description, cache_control, type "custom" optional) and the API reference's Tool
# (``defer_loading``: "If true, tool will not be included in initial system prompt. Only loaded
# when returned via tool_reference from tool search."). Reference block:
# ``types/tool_reference_block_param.py`` (type "tool_reference", tool_name), carried in a
# ``tool_result``'s content (platform.claude.com/docs .../tool-use/tool-search-tool).


def _anthropic_tool(name: str, description: str, schema: JSONDict, defer_loading: bool) -> JSONDict:
    tool = _with_description({"name": name}, description.strip())
    tool["input_schema"] = schema
    if defer_loading:
        tool["defer_loading"] = True
    return tool


def to_anthropic(
    capabilities: Iterable[Capability],
    include_metatool: bool = True,
    defer_loading: bool = False,
    *,
    names: NameMap | None = None,
    marks: Marks | None = None,
) -> list[JSONDict]:
    """Messages API ``tools``: the meta-tool first (never deferred: it is how deferred tools are
    found), then each callable capability, deferred when ``defer_loading``. Answer the meta-tool's
    ``tool_use`` with a ``tool_result`` whose content is :func:`to_anthropic_tool_references`."""
    caps = callable_capabilities(capabilities)
    name_map = _names("anthropic", caps, names)
    tools: list[JSONDict] = []
    if include_metatool:
        meta = metatool_definition()
        tools.append(
            _anthropic_tool(
                meta["name"], meta["description"], meta["parameters"], defer_loading=False
            )
        )
    tools.extend(
        _anthropic_tool(
            name_map.to_name(cap.id), described(cap, marks), input_schema(cap), defer_loading
        )
        for cap in caps
    )
    return tools


def to_anthropic_tool_references(
    capabilities: Iterable[Capability], *, names: NameMap | None = None
) -> list[JSONDict]:
    """``tool_reference`` blocks naming the found tools, for a ``tool_result``'s ``content``. Each
    named tool must be defined (deferred) in the request's ``tools``: :func:`to_anthropic` with
    ``defer_loading=True`` over a superset gives the same names."""
    caps = callable_capabilities(capabilities)
    name_map = _names("anthropic", caps, names)
    return [{"type": "tool_reference", "tool_name": name_map.to_name(cap.id)} for cap in caps]


# -- MCP -----------------------------------------------------------------------------------------
# Tool as ``tools/list`` sends it (wire JSON is camelCase): mcp 2.3.0 ``mcp_types/_types.py``
# (Tool(BaseMetadata): name, title, description, input_schema "type: object is required at the
# root", output_schema, icons, annotations, _meta) and ToolAnnotations (title, readOnlyHint default
# false, destructiveHint default true "meaningful only when readOnlyHint == false", idempotentHint,
# openWorldHint). ``_meta``: Tool.meta (alias ``_meta``), an open map; keys take a prefix of
# dot-separated labels and a slash.


def _mcp_annotations(has_side_effects: bool | None) -> JSONDict:
    if has_side_effects:
        # Capabilities do not tell additive from destructive effects: say destructive, which is
        # also what a client assumes when the hint is absent.
        return {"readOnlyHint": False, "destructiveHint": True}
    if has_side_effects is None:
        # Unknown effects are never advertised as read-only (destructiveHint stays at its
        # default, true).
        return {"readOnlyHint": False}
    return {"readOnlyHint": True}


def _mcp_tool(
    name: str,
    title: str,
    description: str,
    schema: JSONDict,
    annotations: JSONDict,
    mark: Mark | None = None,
) -> JSONDict:
    tool: JSONDict = {"name": name}
    if title:
        tool["title"] = title
    _with_description(tool, description.strip())
    tool["inputSchema"] = schema
    tool["annotations"] = annotations
    if mark is not None:
        tool["_meta"] = {MCP_FLAGS_META: mark.to_list()}
    return tool


def _mcp_metatool() -> JSONDict:
    """The meta-tool as an MCP ``Tool``, with the ``outputSchema`` its results match. A search
    of a closed registry: reads only, touches no outside world."""
    meta = metatool_definition()
    tool = _mcp_tool(
        meta["name"],
        display_name_from(METATOOL_NAME),
        meta["description"],
        meta["parameters"],
        {"readOnlyHint": True, "openWorldHint": False},
    )
    tool["outputSchema"] = metatool_output_schema()
    return tool


def to_mcp(
    capabilities: Iterable[Capability],
    include_metatool: bool = True,
    *,
    names: NameMap | None = None,
    marks: Marks | None = None,
) -> list[JSONDict]:
    """MCP ``Tool`` objects (camelCase wire form): the meta-tool first, then each callable
    capability with ``readOnlyHint`` true only for tools declared without side effects (false
    for those with side effects, and for those whose source did not say) and
    ``destructiveHint`` only for tools with side effects."""
    caps = callable_capabilities(capabilities)
    name_map = _names("mcp", caps, names)
    tools: list[JSONDict] = []
    if include_metatool:
        tools.append(_mcp_metatool())
    tools.extend(
        _mcp_tool(
            name_map.to_name(cap.id),
            cap.display_name,
            described(cap, marks),
            input_schema(cap),
            _mcp_annotations(cap.has_side_effects),
            marks.get(cap.id) if marks else None,
        )
        for cap in caps
    )
    return tools


# -- entry point ---------------------------------------------------------------------------------


def list_discovered_tools(
    capabilities: Iterable[Capability], fmt: ToolFormat, marks: Marks | None = None
) -> list[JSONDict]:
    """The discovered capabilities' tool definitions plus the meta-tool, in ``fmt``, flagged
    ones with their ``marks``.

    The meta-tool is always included, whatever the query and its relevance (docs/design.md,
    "The meta-tool and tool definitions"). Nothing is deferred here; use the per-format
    builders for tool search.
    """
    if fmt == "openai-chat":
        return to_openai_chat(capabilities, marks=marks)
    if fmt == "openai-responses":
        return to_openai_responses(capabilities, marks=marks)
    if fmt == "anthropic":
        return to_anthropic(capabilities, marks=marks)
    if fmt == "mcp":
        return to_mcp(capabilities, marks=marks)
    raise ValueError(f"unknown tool format {fmt!r}; use one of {', '.join(TOOL_FORMATS)}")
