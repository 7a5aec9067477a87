"""The provider-neutral half of the example agents: everything that talks to capdisc.

``agent_openai.py`` and ``agent_anthropic.py`` speak their provider's wire format and hand every
tool call here. A :class:`Toolbox` holds one run's capdisc session and what it has bound:

* :meth:`Toolbox.discover` runs a ``discover_capabilities`` call in the session (what
  :meth:`capdisc.client.Client.handle_metatool_call` does, plus the session) and rebinds the
  session's working set, with the tool names the model will use and capdisc's map back to
  capability ids (``answer.tool_names``);
* :meth:`Toolbox.call` runs a discovered tool with the executor, records the call with
  :meth:`~capdisc.client.Client.record_tool_call`, and, when the loop guard evicts the tool,
  appends its guidance to the result and unbinds the tool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from capdisc.agents.answers import metatool_result
from capdisc.agents.metatool import METATOOL_NAME, parse_metatool_arguments
from capdisc.client import Answer, Client
from capdisc.errors import ManifestError

SYSTEM_PROMPT = (
    "You are an agent that acts through tools. You start with one tool, discover_capabilities: "
    "call it to find the tools a task needs, then call those tools. Answer in plain text when "
    "the task is done."
)

#: ``(tool name, capability id, arguments) -> result``
Executor = Callable[[str, str, dict[str, Any]], dict[str, Any]]
Log = Callable[[str], None]


def stub_executor(name: str, capability_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Runs nothing: prints the call and returns a canned result. Replace it with your own."""
    print(f"  [stub] {name} ({capability_id}) {json.dumps(arguments)}")
    return {
        "ok": True,
        "capability": capability_id,
        "note": "stub executor: the call was printed, nothing was executed",
    }


@dataclass
class ToolCall:
    """One executed call of a discovered tool and the loop guard's verdict on it."""

    name: str
    capability_id: str
    arguments: dict[str, Any]
    result: dict[str, Any]
    loop_detected: bool = False
    evicted: bool = False
    guidance: str | None = None


@dataclass
class AgentRun:
    """What a run did: its final answer, its capdisc session, what it searched, bound, called."""

    session: str
    final_text: str = ""
    model_turns: int = 0
    searches: list[str] = field(default_factory=list)
    #: The tool names bound after each discovery.
    bound: list[list[str]] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    #: Calls of tools that were not bound (never found, or evicted), refused unexecuted.
    refused: list[str] = field(default_factory=list)

    @property
    def ever_bound(self) -> set[str]:
        return {name for names in self.bound for name in names}


@dataclass
class Outcome:
    """What to send back to the model for one tool call."""

    text: str
    is_error: bool = False
    #: The tool was evicted by this call: stop offering it.
    dropped: bool = False


class Toolbox:
    """One run's capdisc session: discovery, the bound tools, executed and recorded calls."""

    def __init__(
        self,
        capdisc: Client,
        *,
        tool_format: str,
        session: str | None = None,
        executor: Executor = stub_executor,
        min_version: int = 0,
        profile: str | None = None,
        log: Log = print,
    ) -> None:
        self.capdisc = capdisc
        self.tool_format = tool_format
        self.executor = executor
        self.min_version = min_version
        self.profile = profile
        self.log = log
        self.run = AgentRun(session=session or f"agent-{uuid.uuid4().hex[:12]}")
        #: tool name -> capability id: what the model may call now
        self.bound: dict[str, str] = {}
        #: tool name -> the loop guard's guidance, for tools it evicted
        self.evicted: dict[str, str] = {}

    @property
    def session(self) -> str:
        return self.run.session

    def discover(self, arguments: str | Mapping[str, Any]) -> tuple[dict[str, Any], Answer | None]:
        """Run a ``discover_capabilities`` call: the result for the model, and capdisc's answer,
        whose ``tools`` (the session's working set, meta-tool first) are now bound. ``None``
        when the arguments were refused; the result then says why, for the model to retry."""
        try:
            call = parse_metatool_arguments(arguments)
        except ManifestError as exc:
            self.log(f"  {METATOOL_NAME} refused: {exc}")
            return {"error": str(exc)}, None
        answer = self.capdisc.discover(
            call.query,
            kind=call.kind,
            limit=call.limit,
            only_available=bool(call.only_available),
            tool_format=self.tool_format,
            session=self.session,
            profile=self.profile,
            min_version=self.min_version,
        )
        result = metatool_result(answer.raw)
        if answer.session and answer.session.get("note"):
            result["note"] = answer.session["note"]  # this search repeats a recent one
        self.bound = dict(answer.tool_names)
        for name in self.bound:
            self.evicted.pop(name, None)  # discovering an evicted tool again restores it
        self.run.searches.append(call.query)
        self.run.bound.append(list(self.bound))
        self.log(
            f"  {METATOOL_NAME}({call.query!r}): index version {answer.index_version}, "
            f"found {', '.join(answer.ids) or 'nothing'}; "
            f"bound {', '.join(self.bound) or 'nothing'}"
        )
        return result, answer

    def found_names(self, answer: Answer) -> list[str]:
        """The tool names of this search's own matches (the working set may hold more)."""
        matched = set(answer.ids)
        return [name for name, cap_id in answer.tool_names.items() if cap_id in matched]

    def call(self, name: str, arguments: str | Mapping[str, Any]) -> Outcome:
        """Run one call of a discovered tool (arguments as a JSON string or an object)."""
        capability_id = self.bound.get(name)
        if capability_id is None:
            self.run.refused.append(name)
            self.log(f"  {name}: not bound, refused")
            return Outcome(_not_bound(name, self.evicted.get(name)), is_error=True)
        decoded = _decoded(arguments)
        if isinstance(decoded, str):
            return Outcome(json.dumps({"error": decoded}), is_error=True)
        result = self.executor(name, capability_id, decoded)
        verdict = self.capdisc.record_tool_call(self.session, capability_id, decoded)
        call = ToolCall(
            name,
            capability_id,
            decoded,
            result,
            loop_detected=bool(verdict["loop_detected"]),
            evicted=bool(verdict["evicted"]),
            guidance=verdict.get("guidance"),
        )
        self.run.calls.append(call)
        text = json.dumps(result)
        if call.loop_detected and call.guidance:
            text = f"{text}\n\n{call.guidance}"
        if call.evicted:
            self.log(f"  loop guard: {name} evicted")
            del self.bound[name]
            self.evicted[name] = call.guidance or ""
        return Outcome(text, dropped=call.evicted)


def _not_bound(name: str, guidance: str | None) -> str:
    message = {
        "error": f"{name} is not one of your tools now; call {METATOOL_NAME} to find "
        "one for this step."
    }
    if guidance:
        message["guidance"] = guidance
    return json.dumps(message)


def _decoded(arguments: str | Mapping[str, Any]) -> dict[str, Any] | str:
    """A call's arguments as an object, or the error to send back instead."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        decoded = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"arguments are not valid JSON ({exc.msg})"
    return decoded if isinstance(decoded, dict) else "arguments must be a JSON object"
