"""The example agents (``examples/agent_openai.py``, ``examples/agent_anthropic.py``) against a
scripted model server on loopback and the real stack: a real Redis and real workers answer the
discoveries and keep the session.

The scripted model (``tests/fixtures/scripted_model.py``) calls ``discover_capabilities``, then
the tool whose name maps to ``tool:slack-post-message`` if, and only if, the request made it
callable, then answers in text. So a run that ends with the final text proves the loop bound
the discovered tool in the provider's own format.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from capdisc.client import Client
from capdisc.sessions.policy import GENERIC_LOOP_GUIDANCE

from .conftest import Stack, publish

SLACK = "tool:slack-post-message"
SLACK_NAME = "slack-post-message"
VARIANTS = ["openai-chat", "openai-responses", "anthropic"]


import agent_anthropic  # noqa: E402  (examples/ and tests/fixtures/ are on the path)
import agent_openai  # noqa: E402
import scripted_model as scripted  # noqa: E402


@pytest.fixture
def published(stack: Stack, registry: Path, tenant: str) -> int:
    """The example registry published to this test's tenant; the index version to wait for."""
    return publish(stack.url, registry, tenant).index_version


@pytest.fixture
def capdisc(stack: Stack, tenant: str) -> Iterator[Client]:
    with Client(stack.connection(), tenant=tenant, timeout_s=20) as client:
        yield client


def _serve(script: Any) -> Any:
    return scripted.ScriptedModel(script)


def run_scripted(
    variant: str, script: Any, capdisc: Client, min_version: int
) -> tuple[Any, Any, list[str]]:
    """:func:`run_example` against a scripted model server that serves ``script``: the run,
    the (closed) server with the requests it saw, and the example's log lines."""
    server, lines = _serve(script), []
    try:
        return run_example(variant, server, capdisc, min_version, lines), server, lines
    finally:
        server.close()


def run_example(
    variant: str, server: Any, capdisc: Client, min_version: int, lines: list[str]
) -> Any:
    """Run one example's ``run_agent`` against the scripted server, in a fresh session."""
    session = f"s-{uuid.uuid4().hex[:10]}"
    task = "Tell the team in #releases that the deploy is done."
    if variant == "anthropic":
        api = agent_anthropic.MessagesAPI("sk-ant-test", server.anthropic_url, timeout_s=20)
        return agent_anthropic.run_agent(
            task,
            capdisc=capdisc,
            api=api,
            model="scripted",
            session=session,
            min_version=min_version,
            log=lines.append,
        )
    model_client = OpenAI(base_url=server.openai_url, api_key="sk-test", max_retries=0, timeout=20)
    return agent_openai.run_agent(
        task,
        capdisc=capdisc,
        model_client=model_client,
        model="scripted",
        api=variant.removeprefix("openai-"),
        session=session,
        min_version=min_version,
        log=lines.append,
    )


def bound_in_request(variant: str, request: dict[str, Any]) -> set[str]:
    """The tool names a request made callable, read the way the provider would."""
    if variant == "openai-chat":
        return {t["function"]["name"] for t in request["tools"]}
    if variant == "openai-responses":
        return {
            t["name"]
            for item in request["input"]
            if item.get("type") == "tool_search_output"
            for t in item["tools"]
        }
    deferred = {t["name"] for t in request["tools"] if t.get("defer_loading")}
    referenced = {
        block["tool_name"]
        for message in request["messages"]
        if isinstance(message["content"], list)
        for result in message["content"]
        if result.get("type") == "tool_result" and isinstance(result["content"], list)
        for block in result["content"]
        if block["type"] == "tool_reference"
    }
    assert referenced <= deferred, "a tool_reference names a tool that is not defined deferred"
    return referenced


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_example_discovers_binds_and_calls_the_tool(
    variant: str, published: int, capdisc: Client
) -> None:
    script = scripted.Script()
    run, server, _lines = run_scripted(variant, script, capdisc, published)

    assert run.final_text == script.final_text
    assert run.searches == [script.query]
    assert SLACK_NAME in run.ever_bound
    assert [(c.name, c.capability_id, c.arguments) for c in run.calls] == [
        (SLACK_NAME, SLACK, script.arguments)
    ]
    assert not run.refused
    # The model saw only the meta-tool first, then the discovered tool, in its own format.
    assert len(server.requests) == 3
    first = server.tools_sent(0)
    assert first == (
        ["tool_search"] if variant == "openai-responses" else ["discover_capabilities"]
    )
    assert SLACK_NAME in bound_in_request(variant, server.requests[1])
    working = capdisc.working_set(run.session)
    entry = next(b for b in working["bound"] if b["id"] == SLACK)
    assert entry["use_count"] == 1


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_tool_called_in_a_loop_is_evicted_with_guidance(
    variant: str, published: int, capdisc: Client
) -> None:
    script = scripted.Script(repeats=4, final_text="I stopped posting the same message.")
    run, server, lines = run_scripted(variant, script, capdisc, published)

    assert run.final_text == script.final_text
    assert [c.loop_detected for c in run.calls] == [False, False, False, True]
    last = run.calls[-1]
    assert last.evicted and last.guidance == GENERIC_LOOP_GUIDANCE
    # The guidance reached the model with the fourth call's result...
    final_request = json.dumps(server.requests[-1])
    assert GENERIC_LOOP_GUIDANCE in final_request
    assert final_request.count(GENERIC_LOOP_GUIDANCE) == 1
    # ...and the tool was taken away: from the tools sent (Chat Completions), from what the
    # loop will run (a tool loaded by tool search or a tool_reference stays loaded).
    if variant == "openai-chat":
        assert SLACK_NAME in server.tools_sent(-2)
        assert SLACK_NAME not in server.tools_sent(-1)
    assert any(line.endswith(f"{SLACK_NAME} evicted") for line in lines)
    working = capdisc.working_set(run.session)
    assert SLACK not in [b["id"] for b in working["bound"]]
    assert SLACK in working["loop_evicted"]


def test_an_evicted_tool_is_refused_until_discovered_again(published: int, capdisc: Client) -> None:
    """A model that keeps calling an evicted tool (a Responses or Anthropic conversation still
    shows it) gets the guidance back and nothing runs."""
    script = scripted.Script(repeats=5, final_text="Giving up on that tool.")
    run, server, _lines = run_scripted("anthropic", script, capdisc, published)

    assert len(run.calls) == 4  # the fifth call was refused, not executed
    assert run.refused == [SLACK_NAME]
    fifth_result = server.requests[-1]["messages"][-1]["content"][0]
    assert fifth_result["is_error"] is True
    assert GENERIC_LOOP_GUIDANCE in json.loads(fifth_result["content"])["guidance"]
    assert run.final_text == script.final_text


@pytest.mark.parametrize("variant", VARIANTS)
def test_main_runs_the_loop_from_the_command_line(
    variant: str,
    stack: Stack,
    tenant: str,
    published: int,
    capdisc: Client,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    capdisc.discover("warm up", min_version=published)  # main() has no --min-version
    script = scripted.Script()
    server = _serve(script)
    common = [
        "--redis-url",
        stack.url,
        "--tenant",
        tenant,
        "--model",
        "scripted",
        "Tell the team in #releases that the deploy is done.",
    ]
    try:
        if variant == "anthropic":
            monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
            code = agent_anthropic.main(["--base-url", server.anthropic_url, *common])
        else:
            monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
            code = agent_openai.main(
                ["--base-url", server.openai_url, "--api", variant.removeprefix("openai-"), *common]
            )
    finally:
        server.close()

    out = capsys.readouterr().out
    assert code == 0, out
    assert script.final_text in out
    assert "searches 1, tool calls 1)" in out
