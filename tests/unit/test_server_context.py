"""The MCP server a tool came from, carried to its capability and into its texts."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from capdisc.models import SourceRef
from capdisc.registry.catalogs import load_catalog, read_jsonl_catalog
from capdisc.retrieval.documents import lexical_text
from capdisc.retrieval.text import (
    SERVER_CONTEXT,
    ServerContext,
    embedding_texts,
    full_text,
    server_of,
    summary_text,
)
from capdisc_producers.mcp_import import ServerTools, capabilities_of

EVERYTHING = ServerContext(**{f.name: True for f in fields(ServerContext)})
NOTHING = ServerContext()

MCP_TOOL = {
    "id": "github/list_pull_requests",
    "name": "list_pull_requests",
    "description": "List pull requests in a repository.",
    "parameters": {"type": "object", "properties": {"repo": {"type": "string"}}},
    "category": "github",
    "server": "github",
    "server_description": "MCP server for the GitHub API",
}
REST_TOOL = {
    "id": "sendgrid/POST_mail-send",
    "name": "POST_mail-send",
    "description": "Send an email.",
    "category": "sendgrid",
    "server": "Email Activity (beta)",
}
PLAIN_TOOL = {"id": "timeport", "name": "timeport", "description": "A game.", "category": "x"}


def _catalog(tmp_path: Path, *records: dict[str, Any]) -> Path:
    path = tmp_path / "dev" / "tools.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_the_benchmark_reader_files_a_tool_under_its_server(tmp_path: Path) -> None:
    mcp, rest, plain = load_catalog(
        _catalog(tmp_path, MCP_TOOL, REST_TOOL, PLAIN_TOOL)
    ).capabilities
    assert mcp.source_ref == SourceRef(
        "mcp", "mcp:github", "list_pull_requests", "MCP server for the GitHub API"
    )
    assert server_of(mcp) == "github"
    assert rest.source_ref.source == "mcp:Email Activity (beta)"
    assert server_of(rest) == "sendgrid"  # the short name of the tool ids, not the title
    assert plain.source_ref == SourceRef("jsonl", "dev", "timeport")
    assert server_of(plain) == ""


def test_an_imported_jsonl_catalog_keeps_its_own_source(tmp_path: Path) -> None:
    (capability,) = read_jsonl_catalog(_catalog(tmp_path, MCP_TOOL), "jsonl:dev").found.values()
    assert capability.source_ref == SourceRef("jsonl", "jsonl:dev", "github/list_pull_requests")
    assert server_of(capability) == ""


def test_an_mcp_import_names_its_server_in_the_texts_by_default() -> None:
    listing = ServerTools("desktop-commander", [{"name": "read_file", "description": "Read."}])
    found, errors = capabilities_of(listing, "mcp:npx desktop-commander")
    assert not errors
    (capability,) = found.values()
    assert server_of(capability) == "desktop commander"
    full, summary = embedding_texts(capability)
    assert full.startswith("desktop commander: read_file: Read.")
    assert summary == "read_file: Read."
    assert lexical_text(capability).endswith("\ndesktop commander")


def test_the_default_names_the_server_in_the_bm25_and_the_full_text_only() -> None:
    assert ServerContext(lexical=True, full=True) == SERVER_CONTEXT


@pytest.mark.parametrize("record", [PLAIN_TOOL, REST_TOOL | {"server": ""}])
def test_a_tool_of_no_server_has_the_same_texts_whatever_is_set(
    tmp_path: Path, record: dict[str, Any]
) -> None:
    (capability,) = load_catalog(_catalog(tmp_path, record)).capabilities
    for text in (full_text, summary_text, lexical_text):
        assert text(capability, EVERYTHING) == text(capability, NOTHING)
    assert embedding_texts(capability) == embedding_texts(capability, NOTHING)
    assert lexical_text(capability) == lexical_text(capability, NOTHING)


def test_each_text_names_the_server_only_when_asked(tmp_path: Path) -> None:
    (capability,) = load_catalog(_catalog(tmp_path, MCP_TOOL)).capabilities
    assert full_text(capability, NOTHING).startswith("List Pull Requests: List pull")
    assert summary_text(capability, NOTHING) == (
        "List Pull Requests: List pull requests in a repository."
    )
    assert lexical_text(capability, NOTHING).split("\n")[-1] != "github"

    assert full_text(capability, ServerContext(full=True)).startswith(
        "github: List Pull Requests: List pull"
    )
    assert summary_text(capability, ServerContext(summary=True)) == (
        "github: List Pull Requests: List pull requests in a repository."
    )
    assert lexical_text(capability, ServerContext(lexical=True)).split("\n")[-1] == "github"
    assert full_text(capability, ServerContext(lexical=True, summary=True)) == full_text(
        capability, NOTHING
    )


def test_the_servers_own_description_ends_the_full_text_only_when_asked(tmp_path: Path) -> None:
    (capability,) = load_catalog(_catalog(tmp_path, MCP_TOOL)).capabilities

    described = full_text(capability, ServerContext(described=True))

    assert described.endswith("\nServer: MCP server for the GitHub API")
    assert "MCP server for" not in full_text(capability, NOTHING)
    assert summary_text(capability, EVERYTHING).count("MCP server for") == 0


def test_a_server_that_says_nothing_of_itself_adds_no_line(tmp_path: Path) -> None:
    (capability,) = load_catalog(
        _catalog(tmp_path, MCP_TOOL | {"server_description": ""})
    ).capabilities

    assert full_text(capability, ServerContext(described=True)) == full_text(capability, NOTHING)


@pytest.mark.parametrize("key", ["server", "server_name", "serverName", "mcp_server", "mcpServer"])
def test_a_server_named_under_any_common_field_files_the_tool_under_it(
    tmp_path: Path, key: str
) -> None:
    record = {"name": "create_issue", "description": "Open an issue.", key: "GitHub Tools"}
    (capability,) = load_catalog(_catalog(tmp_path, record)).capabilities
    assert capability.source_ref.source == "mcp:GitHub Tools"
    assert server_of(capability) == "github tools"  # no category: the server's name


def test_a_server_description_under_its_camel_case_field_is_recorded(tmp_path: Path) -> None:
    record = {**PLAIN_TOOL, "serverName": "tides", "serverDescription": "Tide tables."}
    (capability,) = load_catalog(_catalog(tmp_path, record)).capabilities
    assert capability.source_ref.description == "Tide tables."


def test_a_tool_in_openai_s_wrapper_is_read_with_the_server_beside_it(tmp_path: Path) -> None:
    inner = {k: MCP_TOOL[k] for k in ("name", "description", "parameters")}
    record = {"type": "function", "function": inner, "server": "github"}
    (capability,) = load_catalog(_catalog(tmp_path, record)).capabilities
    assert (capability.id, capability.description) == (
        "tool:list_pull_requests",
        "List pull requests in a repository.",
    )
    assert capability.full_schema == MCP_TOOL["parameters"]
    assert server_of(capability) == "github"


def test_an_mcp_tools_title_is_its_display_name(tmp_path: Path) -> None:
    record = {**PLAIN_TOOL, "title": "Time Portal"}
    (capability,) = load_catalog(_catalog(tmp_path, record)).capabilities
    assert capability.display_name == "Time Portal"
