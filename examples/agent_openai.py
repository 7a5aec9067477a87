"""An agent loop with the OpenAI SDK that finds its tools through capdisc.

The model starts with one tool, ``discover_capabilities``. When it calls it, the loop asks
capdisc in a session (one session id per run), hands the answer back to the model and binds the
tools capdisc returned: the session's working set, named as the model will call them. When the
model calls one of them, a stub executor runs it (prints the call, returns canned JSON) and the
loop records the call with capdisc, whose loop guard evicts a tool the model keeps calling with
the same arguments: the model then gets the guard's guidance with the result, and loses the
tool. The capdisc side of all this is in ``capdisc_loop.py``, shared with ``agent_anthropic.py``.

Two OpenAI APIs, against api.openai.com or any OpenAI-compatible server:

* ``--api chat`` (default): Chat Completions. The meta-tool is a function tool; the next
  request's ``tools`` are the working set capdisc rendered in ``openai-chat`` format.
* ``--api responses``: the Responses API with client-executed tool search. The meta-tool is the
  ``tool_search`` tool with ``execution: "client"``; the model's ``tool_search_call`` is answered
  with a ``tool_search_output`` item carrying this search's tools (``openai-responses`` format),
  which are callable from then on. Tools loaded into a conversation cannot be unloaded, so an
  evicted tool stays visible to the model; the loop refuses to run it, with the guidance.

Run it against a running stack (``make up``), from the repository directory::

    export OPENAI_API_KEY=...            # and OPENAI_BASE_URL for another compatible server
    .venv/bin/python examples/agent_openai.py --model MODEL \\
        "Tell the team in #releases that the deploy is done"

``main()`` only parses arguments; :func:`run_agent` is the loop, importable and tested against a
scripted model server (``tests/integration/test_examples.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Literal

import redis
from openai import OpenAI, OpenAIError

from capdisc.agents import formats
from capdisc.agents.metatool import METATOOL_NAME
from capdisc.client import Client
from capdisc.errors import CapdiscError

if str(Path(__file__).resolve().parent) not in sys.path:  # imported from elsewhere
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from capdisc_loop import (  # the sibling module, shared with agent_anthropic.py
    SYSTEM_PROMPT,
    AgentRun,
    Executor,
    Log,
    Toolbox,
    stub_executor,
)

__all__ = ["AgentRun", "main", "run_agent"]


def run_agent(
    task: str,
    *,
    capdisc: Client,
    model_client: OpenAI,
    model: str,
    api: Literal["chat", "responses"] = "chat",
    session: str | None = None,
    executor: Executor = stub_executor,
    max_turns: int = 12,
    min_version: int = 0,
    profile: str | None = None,
    log: Log = print,
) -> AgentRun:
    """Run ``task`` to a final answer with the model ``model`` behind ``model_client``.

    ``session`` is the capdisc session (default: a fresh id); ``min_version`` makes discovery
    wait until that index version is served (read your own writes); ``profile`` names a capdisc
    agent profile. Raises ``RuntimeError`` when there is no final answer after ``max_turns``
    model requests."""
    toolbox = Toolbox(
        capdisc,
        tool_format="openai-chat" if api == "chat" else "openai-responses",
        session=session,
        executor=executor,
        min_version=min_version,
        profile=profile,
        log=log,
    )
    loop = _chat_loop if api == "chat" else _responses_loop
    loop(task, toolbox, model_client, model, max_turns)
    return toolbox.run


def _chat_loop(
    task: str, toolbox: Toolbox, model_client: OpenAI, model: str, max_turns: int
) -> None:
    """Chat Completions: one request a turn, until the model answers in text."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task},
    ]
    tools = formats.to_openai_chat([])  # the meta-tool alone, until a discovery
    for _ in range(max_turns):
        toolbox.run.model_turns += 1
        completion = model_client.chat.completions.create(
            model=model, messages=messages, tools=tools
        )
        message = completion.choices[0].message
        calls = [c for c in message.tool_calls or [] if c.type == "function"]
        assistant: dict[str, Any] = {"role": "assistant", "content": message.content}
        if calls:
            assistant["tool_calls"] = [c.model_dump(exclude_none=True) for c in calls]
        messages.append(assistant)
        if not calls:
            toolbox.run.final_text = message.content or ""
            return
        for call in calls:
            name, arguments = call.function.name, call.function.arguments
            if name == METATOOL_NAME:
                result, answer = toolbox.discover(arguments)
                if answer is not None:
                    tools = answer.tools  # the working set, meta-tool first
                content = json.dumps(result)
            else:
                outcome = toolbox.call(name, arguments)
                if outcome.dropped:
                    tools = [t for t in tools if t["function"]["name"] != name]
                content = outcome.text
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    raise RuntimeError(f"no final answer after {max_turns} model turns")


def _responses_loop(
    task: str, toolbox: Toolbox, model_client: OpenAI, model: str, max_turns: int
) -> None:
    """Responses with client-executed tool search. The whole input goes out each turn (no
    ``previous_response_id``), the model's output items appended as they came."""
    tools = [formats.openai_client_tool_search()]  # the meta-tool as the client's tool search
    items: list[Any] = [{"role": "user", "content": task}]
    for _ in range(max_turns):
        toolbox.run.model_turns += 1
        response = model_client.responses.create(
            model=model, instructions=SYSTEM_PROMPT, input=items, tools=tools
        )
        outputs: list[dict[str, Any]] = []
        for item in response.output:
            items.append(item.to_dict())
            if item.type == "tool_search_call" and item.execution == "client":
                outputs.append(_search_output(toolbox, item.call_id or "", item.arguments))
            elif item.type == "function_call":
                outcome = toolbox.call(item.name, item.arguments)
                outputs.append(
                    {
                        "type": "function_call_output",
                        "call_id": item.call_id,
                        "output": outcome.text,
                    }
                )
        if not outputs:
            toolbox.run.final_text = response.output_text
            return
        items.extend(outputs)
    raise RuntimeError(f"no final answer after {max_turns} model turns")


def _search_output(toolbox: Toolbox, call_id: str, arguments: Any) -> dict[str, Any]:
    """The ``tool_search_output`` item answering a client-executed ``tool_search_call``: the
    function tools this search found, as ``formats.to_openai_tool_search_output`` renders them
    (taken from the answer's ``openai-responses`` tools; none when nothing fits or the
    arguments were refused)."""
    _result, answer = toolbox.discover(arguments if isinstance(arguments, dict) else {})
    if answer is None:
        return {
            "type": "tool_search_output",
            "call_id": call_id,
            "execution": "client",
            "tools": [],
        }
    found = set(toolbox.found_names(answer))
    return {
        "type": "tool_search_output",
        "call_id": call_id,
        "execution": "client",
        "tools": [t for t in answer.tools if t.get("name") in found],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="An agent loop with the OpenAI SDK that finds its tools through capdisc."
    )
    parser.add_argument("task", help="what the agent should do")
    parser.add_argument(
        "--model", default=os.environ.get("OPENAI_MODEL"), help="model name (default: OPENAI_MODEL)"
    )
    parser.add_argument(
        "--api",
        choices=["chat", "responses"],
        default="chat",
        help="Chat Completions (default) or Responses with client tool search",
    )
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="an OpenAI-compatible server (default: OPENAI_BASE_URL, else OpenAI's)",
    )
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
        parser.error("--model is required (or set OPENAI_MODEL)")
    from capdisc_producers.stack import resolve_access

    # A local server often needs no key, but the SDK insists on one.
    api_key = os.environ.get("OPENAI_API_KEY") or ("unused" if args.base_url else None)
    model_client = OpenAI(base_url=args.base_url, api_key=api_key)
    try:
        access = resolve_access(args.redis_url, None, os.environ, Path.cwd())  # + CAPDISC_TOKEN
        with Client.from_url(access.redis_url, tenant=args.tenant, token=access.token) as capdisc:
            run = run_agent(
                args.task,
                capdisc=capdisc,
                model_client=model_client,
                model=args.model,
                api=args.api,
                session=args.session,
                max_turns=args.max_turns,
            )
    except (CapdiscError, redis.RedisError) as exc:
        print(f"capdisc: {exc}", file=sys.stderr)
        return 1
    except OpenAIError as exc:
        print(f"model API: {exc}", file=sys.stderr)
        return 1
    print(
        f"\n{run.final_text}\n\n(capdisc session {run.session}: model turns "
        f"{run.model_turns}, searches {len(run.searches)}, tool calls {len(run.calls)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
