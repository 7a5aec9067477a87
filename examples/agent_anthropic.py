"""An agent loop on the Anthropic Messages API that finds its tools through capdisc, with
deferred tools and ``tool_reference`` results (Claude's custom tool search pattern).

The model starts with one tool, ``discover_capabilities`` (never deferred). When it calls it,
the loop asks capdisc in a session (one session id per run) and:

* adds every tool of the session's working set to the request's ``tools`` with
  ``defer_loading: true``: defined, but not placed in the model's context;
* answers the ``tool_use`` with a ``tool_result`` whose content is one ``tool_reference`` block
  per tool this search found, which loads exactly those definitions into the conversation
  (a search that found no callable tool is answered with capdisc's text result instead).

When the model calls a discovered tool, a stub executor runs it (prints the call, returns
canned JSON) and the loop records the call with capdisc, whose loop guard evicts a tool the
model keeps calling with the same arguments. A referenced tool must stay defined for the rest
of the conversation (the API checks every ``tool_reference`` against ``tools``), so an evicted
tool stays visible to the model; the loop appends the guard's guidance to that call's result
and refuses to run the tool again until a discovery brings it back.

The wire format is plain JSON over ``urllib`` (no SDK needed): ``POST {base}/v1/messages``
with ``x-api-key`` and ``anthropic-version``. Run it against a running stack (``make up``),
from the repository directory::

    export ANTHROPIC_API_KEY=...         # and ANTHROPIC_BASE_URL for a gateway or proxy
    .venv/bin/python examples/agent_anthropic.py --model MODEL \\
        "Tell the team in #releases that the deploy is done"

``main()`` only parses arguments; :func:`run_agent` is the loop, importable and tested against a
scripted model server (``tests/integration/test_examples.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from capdisc.agents import formats
from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Client
from capdisc.errors import CapdiscError

if str(Path(__file__).resolve().parent) not in sys.path:  # imported from elsewhere
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from capdisc_loop import (  # the sibling module, shared with agent_openai.py
    SYSTEM_PROMPT,
    AgentRun,
    Executor,
    Log,
    Toolbox,
    stub_executor,
)

__all__ = ["AgentRun", "AnthropicError", "MessagesAPI", "main", "run_agent"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"


class AnthropicError(Exception):
    """The Messages API refused a request: the HTTP status and the API's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"Anthropic API error {status}: {message}")
        self.status = status


class MessagesAPI:
    """Just enough of the Messages API: ``create(**body)`` posts one request, returns the reply.

    ``beta`` goes out as the ``anthropic-beta`` header, for gateways or API versions that still
    want one for tool search (``advanced-tool-use-2025-11-20``)."""

    def __init__(
        self,
        api_key: str,
        base_url: str = DEFAULT_BASE_URL,
        *,
        beta: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/messages"
        self.headers = {
            "x-api-key": api_key,
            "anthropic-version": API_VERSION,
            "content-type": "application/json",
        }
        if beta:
            self.headers["anthropic-beta"] = beta
        self.timeout_s = timeout_s

    def create(self, **body: Any) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=self.headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                decoded: dict[str, Any] = json.loads(reply.read())
                return decoded
        except urllib.error.HTTPError as exc:
            raise AnthropicError(exc.code, _error_message(exc.read())) from exc


def _error_message(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:500]


def run_agent(
    task: str,
    *,
    capdisc: Client,
    api: MessagesAPI,
    model: str,
    session: str | None = None,
    executor: Executor = stub_executor,
    max_turns: int = 12,
    max_tokens: int = 1024,
    min_version: int = 0,
    profile: str | None = None,
    log: Log = print,
) -> AgentRun:
    """Run ``task`` to a final answer with ``model`` behind ``api``.

    ``session`` is the capdisc session (default: a fresh id); ``min_version`` makes discovery
    wait until that index version is served (read your own writes); ``profile`` names a capdisc
    agent profile. Raises ``RuntimeError`` when there is no final answer after ``max_turns``
    model requests."""
    toolbox = Toolbox(
        capdisc,
        tool_format="anthropic",
        session=session,
        executor=executor,
        min_version=min_version,
        profile=profile,
        log=log,
    )
    meta = formats.to_anthropic([])  # the meta-tool alone: never deferred
    deferred: dict[str, dict[str, Any]] = {}  # every tool found so far, by name
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        toolbox.run.model_turns += 1
        reply = api.create(
            model=model,
            max_tokens=max_tokens,
            system=SYSTEM_PROMPT,
            tools=[*meta, *deferred.values()],
            messages=messages,
        )
        content = reply["content"]
        messages.append({"role": "assistant", "content": content})
        uses = [block for block in content if block.get("type") == "tool_use"]
        if not uses:
            toolbox.run.final_text = "".join(
                b.get("text", "") for b in content if b.get("type") == "text"
            )
            return toolbox.run
        # Every tool_use is answered in the next user message, tool_result blocks only.
        messages.append(
            {"role": "user", "content": [_tool_result(toolbox, use, deferred) for use in uses]}
        )
    raise RuntimeError(f"no final answer after {max_turns} model turns")


def _tool_result(
    toolbox: Toolbox, use: dict[str, Any], deferred: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The ``tool_result`` block answering one ``tool_use``."""
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use["id"]}
    if use["name"] != METATOOL_NAME:
        outcome = toolbox.call(use["name"], use.get("input") or {})
        block["content"] = outcome.text
        if outcome.is_error:
            block["is_error"] = True
        return block
    result, answer = toolbox.discover(use.get("input") or {})
    if answer is None:
        return {**block, "content": json.dumps(result), "is_error": True}
    for tool in answer.tools:
        if tool["name"] != METATOOL_NAME:
            deferred[tool["name"]] = {**tool, "defer_loading": True}
    found = toolbox.found_names(answer)
    block["content"] = (
        [{"type": "tool_reference", "tool_name": name} for name in found]
        if found
        else json.dumps(result)
    )
    return block


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="An agent loop on the Anthropic Messages API that finds its tools through "
        "capdisc (deferred tools and tool_reference results)."
    )
    parser.add_argument("task", help="what the agent should do")
    parser.add_argument(
        "--model",
        default=os.environ.get("ANTHROPIC_MODEL"),
        help="model name (default: ANTHROPIC_MODEL)",
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("ANTHROPIC_BASE_URL", DEFAULT_BASE_URL),
        help="API base URL (default: ANTHROPIC_BASE_URL, else Anthropic's)",
    )
    parser.add_argument(
        "--beta",
        default=os.environ.get("ANTHROPIC_BETA"),
        help="an anthropic-beta header value, if your endpoint wants one",
    )
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument(
        "--redis-url",
        default=None,
        help="capdisc's Redis (default: CAPDISC_REDIS_URL, then the running "
        "stack's .capdisc/stack.json)",
    )
    parser.add_argument("--tenant", default="default")
    parser.add_argument("--session", default=None, help="capdisc session id (default: new)")
    parser.add_argument("--max-turns", type=int, default=12)
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("--model is required (or set ANTHROPIC_MODEL)")
    api_key = os.environ.get("ANTHROPIC_API_KEY")
    if not api_key:
        parser.error("set ANTHROPIC_API_KEY")
    from capdisc_producers.stack import resolve_access

    api = MessagesAPI(api_key, args.base_url, beta=args.beta)
    try:
        access = resolve_access(args.redis_url, None, os.environ, Path.cwd())  # + CAPDISC_TOKEN
        with Client.from_url(access.redis_url, tenant=args.tenant, token=access.token) as capdisc:
            run = run_agent(
                args.task,
                capdisc=capdisc,
                api=api,
                model=args.model,
                session=args.session,
                max_turns=args.max_turns,
                max_tokens=args.max_tokens,
            )
    except (CapdiscError, redis.RedisError) as exc:
        print(f"capdisc: {exc}", file=sys.stderr)
        return 1
    except (AnthropicError, urllib.error.URLError, TimeoutError) as exc:
        print(f"model API: {exc}", file=sys.stderr)
        return 1
    print(
        f"\n{run.final_text}\n\n(capdisc session {run.session}: model turns "
        f"{run.model_turns}, searches {len(run.searches)}, tool calls {len(run.calls)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
