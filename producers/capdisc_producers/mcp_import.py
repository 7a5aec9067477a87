"""``capdisc import mcp``: a live MCP server's tools as capabilities of one source.

Connects with the ``mcp`` 2.x client over streamable HTTP (``--url``) or stdio (``--command``),
lists every tool (all pages), and turns each into a ``tool`` capability named
``{server}.{tool}`` (so two servers' ``search`` tools do not collide), its input schema as the
full schema, its annotations deciding ``has_side_effects``, the server's own
``serverInfo.description`` (first paragraph) in its ``source_ref``. Each tool is repaired the
way every import is (:mod:`capdisc.registry.tolerance`: zero-width characters, schema
dialects, schemas nested deeper than the limit), each repair noted; a tool the ``mcp`` SDK
cannot read (read from the raw listing, :class:`ListingTap`) or still invalid is refused on
its own, and so is one that would be the capability an earlier tool of the listing is (the
same name twice, or names that differ only in characters a capability name cannot hold).
Then it syncs like a directory: unchanged tools send nothing, changed ones are re-indexed (and
logged with the old and new content hash), tools the server no longer has are deleted.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio
import redis
import structlog
from pydantic import ValidationError

from capdisc.errors import ManifestError, MCPImportError
from capdisc.models import Capability
from capdisc.registry.normalize import MAX_SOURCE_DESCRIPTION_CHARS
from capdisc.registry.tolerance import first_paragraph, tolerant_fields, validated
from capdisc.tenants import check_tenant
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, send_found, wait_until_applied

log = structlog.get_logger("capdisc.mcp_import")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_PAGES = 100
#: How much of the reason a message could not be read is kept (pydantic's run long).
MAX_UNREADABLE_CHARS = 300
#: How many of those reasons are kept (a server may print junk for as long as it runs).
MAX_UNREADABLE_NOTED = 100
#: The longest message read from a server by default, and the largest answer the gateway passes
#: on (both ``mcp_max_result_bytes``).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class RefusedTool:
    """A tool of the listing the ``mcp`` SDK cannot read (an input schema that is no object, no
    name, annotations of the wrong type): its name (empty when it has none), its position in
    the listing (from 1) and why."""

    name: str
    position: int
    reason: str


@dataclass(frozen=True)
class ServerTools:
    """What one MCP server offers: its name, its tools as plain dicts and what it says of itself
    (``serverInfo.description``, empty when it says nothing), and the tools it listed that the
    ``mcp`` SDK cannot read (each refused on its own; the others import)."""

    server: str
    tools: list[dict[str, Any]]
    description: str = ""
    refused: tuple[RefusedTool, ...] = ()


class ListingTap:
    """A client transport around another that keeps the raw ``result`` of each ``tools/list``
    answer, as the server sent it. The ``mcp`` client checks a listing whole: one tool it cannot
    read (an input schema that is no object, say) fails the listing, so the tools are read
    from the raw answer here, one at a time (:func:`read_listing`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.asked: set[Any] = set()
        self.listing: dict[str, Any] | None = None
        #: Set once the server's side has ended (a stdio server that exited, say).
        self.ended = anyio.Event()

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self.inner.__aenter__()
        return _TappedRead(read, self), _TappedWrite(write, self)

    async def __aexit__(self, *exc: Any) -> bool | None:
        return cast("bool | None", await self.inner.__aexit__(*exc))

    def sent(self, item: Any) -> None:
        from mcp_types.jsonrpc import JSONRPCRequest

        message = getattr(item, "message", None)
        if isinstance(message, JSONRPCRequest) and message.method == "tools/list":
            self.asked.add(message.id)

    def received(self, item: Any) -> None:
        from mcp_types.jsonrpc import JSONRPCResponse

        message = getattr(item, "message", None)
        if isinstance(message, JSONRPCResponse) and message.id in self.asked:
            self.asked.discard(message.id)
            self.listing = message.result


class _Tapped:
    """One side of a tapped transport's streams: closing it closes the inner one."""

    def __init__(self, inner: Any, tap: ListingTap) -> None:
        self.inner, self.tap = inner, tap

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.aclose()


class _TappedRead(_Tapped):
    async def receive(self) -> Any:
        try:
            item = await self.inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self.tap.ended.set()
            raise
        self.tap.received(item)
        return item

    def __aiter__(self) -> _TappedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    def __getattr__(self, name: str) -> Any:  # last_context and the like
        return getattr(self.inner, name)


class _TappedWrite(_Tapped):
    async def send(self, item: Any) -> None:
        self.tap.sent(item)
        await self.inner.send(item)


def tapped(target: Any, max_message_bytes: int) -> ListingTap:
    """The transport to ``target`` (a URL: streamable HTTP, or the ``StdioServerParameters`` of
    a command to start), reading no message from the server longer than ``max_message_bytes``
    and its JSON-RPC envelope (:mod:`capdisc_producers.mcp_http`,
    :mod:`capdisc_producers.mcp_stdio`), tapped."""
    from capdisc_producers.mcp_http import bounded_http
    from capdisc_producers.mcp_stdio import ENVELOPE_BYTES, bounded_stdio

    if isinstance(target, str):
        return ListingTap(bounded_http(target, max_message_bytes))
    return ListingTap(bounded_stdio(target, max_message_bytes + ENVELOPE_BYTES))


async def read_listing(
    client: Any, tap: ListingTap, cursor: str | None
) -> tuple[list[Any], str | None]:
    """One page of ``tools/list``: its tools as the server sent them, and the next cursor. A
    page the SDK refuses for one tool is read from the raw answer (the SDK's error is raised
    only when there is no raw answer to read)."""
    tap.listing = None
    try:
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
    except ValidationError:
        if tap.listing is None:
            raise
    else:
        if tap.listing is None:  # answered from a cache: already read
            return [tool.model_dump(by_alias=True) for tool in page.tools], page.next_cursor
    raw = tap.listing
    tools = raw.get("tools")
    next_cursor = raw.get("nextCursor")
    if not isinstance(tools, list):
        raise ValueError(f"its tools/list answer has no list of tools ({type(tools).__name__})")
    return tools, next_cursor if isinstance(next_cursor, str) and next_cursor else None


def read_tools(
    raw: Sequence[Any], first: int = 1, *, modern: bool = False
) -> tuple[list[dict[str, Any]], list[RefusedTool]]:
    """The tools of a raw listing as the SDK reads each (plain dicts, snake_case keys), and the
    ones it cannot read, each with its position (counted from ``first``) and the reason. On a
    ``modern`` connection (protocol 2026-07-28 and later) a tool whose ``x-mcp-header``
    annotations are invalid is refused too: clients must drop it, as the SDK's own
    ``list_tools`` does."""
    from mcp.shared.inbound import find_invalid_x_mcp_header
    from mcp_types import Tool

    tools: list[dict[str, Any]] = []
    refused: list[RefusedTool] = []
    for position, entry in enumerate(raw, first):
        name = entry.get("name") if isinstance(entry, dict) else None
        name = name if isinstance(name, str) else ""
        try:
            read = Tool.model_validate(entry, by_name=False).model_dump(by_alias=False)
        except ValidationError as exc:
            refused.append(RefusedTool(name, position, validation_reason(exc)))
            continue
        invalid = find_invalid_x_mcp_header(read["input_schema"]) if modern else None
        if invalid is not None:
            reason = f"inputSchema: invalid x-mcp-header, which MCP clients must drop ({invalid})"
            refused.append(RefusedTool(name, position, reason[:MAX_UNREADABLE_CHARS]))
            continue
        tools.append(read)
    return tools, refused


def validation_reason(exc: ValidationError) -> str:
    """Each field (up to three) pydantic refused and why, in one line."""
    parts = []
    for error in exc.errors()[:3]:
        field = ".".join(str(part) for part in error.get("loc", ())) or "the tool"
        parts.append(f"{field}: {error.get('msg', '')}")
    return " ".join("; ".join(parts).split())[:MAX_UNREADABLE_CHARS]


def list_server_tools(
    *,
    url: str | None = None,
    command: str | None = None,
    timeout_s: float = 30.0,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> ServerTools:
    """Connect to the server (``url`` for streamable HTTP, ``command`` for stdio) and list all
    its tools; a listing page longer than ``max_message_bytes`` is refused unread."""
    if (url is None) == (command is None):
        raise MCPImportError("give exactly one of --url and --command")
    if command is not None and not shlex.split(command):
        raise MCPImportError("--command is empty: give the command that starts the MCP server")
    unreadable: list[str] = []
    try:
        return asyncio.run(
            asyncio.wait_for(_list(url, command, unreadable, max_message_bytes), timeout_s)
        )
    except TimeoutError as exc:
        raise MCPImportError(
            f"MCP server {url or command} did not list its tools within {timeout_s:.0f} s"
            f"{unread_answer(unreadable)}"
        ) from exc
    except (OSError, RuntimeError, ValueError) as exc:
        raise MCPImportError(f"MCP server {url or command} could not be listed: {exc}") from exc
    except BaseException as exc:  # anyio task groups wrap transport errors in groups
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        if _too_large(exc):
            raise MCPImportError(
                f"MCP server {url or command} answered tools/list with more than the "
                f"{max_message_bytes} bytes capdisc reads (mcp_max_result_bytes); reading "
                "stopped there. Raise CAPDISC_MCP_MAX_RESULT_BYTES to import it, or ask the "
                "server's maintainers for smaller pages of tools"
            ) from exc
        raise MCPImportError(
            f"MCP server {url or command} could not be listed: {_first_cause(exc)}"
        ) from exc


def unread_answer(unreadable: Sequence[str]) -> str:
    """What a timeout's message adds when the server sent messages the ``mcp`` client could not
    read (dropped, so the answer may have been one of them): how many, and the first reason."""
    if not unreadable:
        return ""
    many = f"{len(unreadable)} messages" if len(unreadable) > 1 else "a message"
    return (
        f"; it sent {many} that could not be read, which may have been the answer "
        f"({unreadable[0]}): a server that answers with JSON nested hundreds of levels deep, or "
        "not as JSON-RPC, must be fixed"
    )


class UnreadableNoted:
    """An ``mcp`` client's message handler that notes why each message from the server the
    client could not read could not be (the client hands those over as exceptions, and drops
    them)."""

    def __init__(self, unreadable: list[str]) -> None:
        self.unreadable = unreadable

    async def __call__(self, message: Any) -> None:
        if isinstance(message, Exception) and len(self.unreadable) < MAX_UNREADABLE_NOTED:
            self.unreadable.append(unreadable_reason(message))


def unreadable_reason(exc: Exception) -> str:
    """Why a message could not be read, in one line: pydantic's first error, else the
    exception's text."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    reason = str(errors[0].get("msg", "")) if errors else _first_cause(exc)
    return " ".join(reason.split())[:MAX_UNREADABLE_CHARS]


def _too_large(exc: BaseException) -> bool:
    """Whether ``exc`` (or the first error of its group) is the server's answer refused for its
    size."""
    from mcp.shared.exceptions import MCPError

    from capdisc_producers.mcp_stdio import ANSWER_TOO_LARGE

    inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
    if inner:
        return _too_large(inner[0])
    return isinstance(exc, MCPError) and exc.code == ANSWER_TOO_LARGE


async def _list(
    url: str | None, command: str | None, unreadable: list[str], max_message_bytes: int
) -> ServerTools:
    from mcp import Client, StdioServerParameters

    target: Any = url
    if command is not None:
        argv = shlex.split(command)
        target = StdioServerParameters(command=argv[0], args=argv[1:])
    tap = tapped(target, max_message_bytes)
    async with Client(tap, message_handler=UnreadableNoted(unreadable)) as client:
        return await list_all_tools(client, tap)


async def list_all_tools(client: Any, tap: ListingTap) -> ServerTools:
    """Every tool the server connected through ``tap`` lists now (all pages, never from a
    cache), each tool the SDK cannot read refused on its own; with what the server says of
    itself."""
    from mcp_types.version import MODERN_PROTOCOL_VERSIONS

    modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
    tools: list[dict[str, Any]] = []
    refused: list[RefusedTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        raw, cursor = await read_listing(client, tap, cursor)
        read, unread = read_tools(raw, len(tools) + len(refused) + 1, modern=modern)
        tools += read
        refused += unread
        if cursor is None:
            break
    info = client.server_info
    return ServerTools(
        server=info.name if info else "mcp",
        tools=tools,
        description=(info.description or "") if info else "",
        refused=tuple(refused),
    )


def capabilities_of(
    listing: ServerTools,
    source: str,
    server_name: str | None = None,
    *,
    notes: list[str] | None = None,
) -> tuple[dict[Path, Capability], dict[Path, ManifestError]]:
    """The server's tools as capabilities of ``source``, keyed by ``SOURCE#TOOL``, each repaired
    the way imports are (each repair appended to ``notes``: ``... tool 'x': note``); a tool
    that is still no valid capability is an error naming the tool and the field (the others
    still import)."""
    server = _safe(server_name or listing.server, 40)
    found: dict[Path, Capability] = {}
    errors: dict[Path, ManifestError] = {}
    repairs = notes if notes is not None else []
    about = server_description(listing.description, source, repairs)
    holders: dict[str, str] = {}  # capability id -> the tool that has it
    for refused in listing.refused:
        where = Path(f"{source}#{refused.name or f'tools[{refused.position}]'}")
        errors[where] = unreadable_tool(source, refused)
    for tool in listing.tools:
        name = str(tool.get("name") or "")
        where = Path(f"{source}#{name}")
        try:
            capability = _capability(tool, server, about, source, repairs)
            holder = holders.setdefault(capability.id, name)
            if holder != name or where in found:
                raise same_capability(source, name, holder, capability.id)
            found[where] = capability
        except ManifestError as exc:
            errors[where] = exc
    return found, errors


def unreadable_tool(source: str, refused: RefusedTool) -> ManifestError:
    """The refusal of a tool of the listing that the ``mcp`` SDK cannot read: named, or (with no
    name) by its position in the listing."""
    which = repr(refused.name) if refused.name else f"number {refused.position} (it has no name)"
    return ManifestError(
        f"{source} tool {which}",
        refused.reason.split(":", 1)[0] if ":" in refused.reason else None,
        f"is no tool the MCP SDK can read ({refused.reason}); it is left out and the server's "
        "other tools are imported. Fix the tool's listing on the server, then import again",
    )


def same_capability(source: str, name: str, holder: str, capability_id: str) -> ManifestError:
    """The refusal of a tool that would be the capability an earlier tool of the listing is
    (the same name listed twice, or names that differ only in characters a capability name
    cannot hold): the first is kept, so that re-imports do not swap one for the other."""
    first = "listed twice by the server" if name == holder else f"the same as tool {holder!r}"
    return ManifestError(
        f"{source} tool {name!r}",
        "name",
        f"would be capability {capability_id}, {first}; the first is kept and this one "
        "left out. Rename one of the tools on the server to import both",
    )


def server_description(text: str, source: str, notes: list[str]) -> str:
    """The server's ``serverInfo.description`` as its tools record it: the first paragraph, cut
    to :data:`MAX_SOURCE_DESCRIPTION_CHARS` at a word, zero-width characters removed. One
    with a refused character (bidi controls, tag characters) is left out and noted; its tools
    still import."""
    first, cut = first_paragraph(text, MAX_SOURCE_DESCRIPTION_CHARS)
    if cut:
        notes.append(f"{source}: serverInfo.description cut to {len(first)} characters")
    try:
        fields, repairs = tolerant_fields({"serverInfo.description": first}, None, source)
    except ManifestError as exc:
        notes.append(f"{source}: serverInfo.description left out: {exc.problem}")
        return ""
    notes.extend(f"{source}: {repair}" for repair in repairs)
    return str(fields["serverInfo.description"])


#: The tool fields an import reads, under their names in the MCP protocol.
_FIELDS = {
    "name": "name",
    "title": "title",
    "description": "description",
    "annotations": "annotations",
    "input_schema": "inputSchema",
}


def _capability(
    tool: dict[str, Any], server: str, about: str, source: str, notes: list[str]
) -> Capability:
    """One tool of ``server`` (its short name; ``about``: its own description) as a capability."""
    where = f"{source} tool {str(tool.get('name') or '')!r}"
    picked = {wire: tool[key] for key, wire in _FIELDS.items() if tool.get(key) is not None}
    fields, repairs = tolerant_fields(picked, "inputSchema", where)
    name = str(fields.get("name") or "")
    if not name.strip():
        raise ManifestError(
            where,
            "name",
            "is empty: a tool is called by its name, so this one cannot be called "
            "and is left out; the server's other tools are imported",
        )
    annotations = fields.get("annotations") or {}
    read_only = annotations.get("read_only_hint")
    record = {
        "kind": "tool",
        "name": f"{server}.{_safe(name, 64 - len(server) - 1)}",
        "display_name": str(fields.get("title") or annotations.get("title") or name),
        "description": str(fields.get("description") or fields.get("title") or name),
        "category": server,
        "tags": ["mcp", server],
        "full_schema": fields.get("inputSchema"),
        "has_side_effects": read_only is not True,
        "source_ref": {
            "type": "mcp",
            "source": source,
            "location": name,
            "description": about,
        },
    }
    capability = validated(record, where, "inputSchema")
    notes.extend(f"{where}: {repair}" for repair in repairs)
    return capability


@dataclass(frozen=True)
class Changed:
    """A tool whose schema or description changed since the last import."""

    capability_id: str
    old_hash: str
    new_hash: str


def import_mcp(
    client: redis.Redis,
    publisher: Publisher,
    *,
    url: str | None = None,
    command: str | None = None,
    tenant: str,
    server_name: str | None = None,
    wait_s: float = 0.0,
    timeout_s: float = 30.0,
    take_over: bool = False,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    lock_owner: str | None = None,
) -> tuple[SyncReport, list[Changed]]:
    """List the server's tools and publish what changed since the last import of it; also
    return the tools that changed, with their old and new content hashes. A tool whose id
    another source owns is rejected, naming the owner, unless ``take_over``. ``lock_owner``:
    as in :func:`capdisc_producers.sync.one_sync_at_a_time`."""
    check_tenant(tenant)
    if command is not None:
        command = absolute_program(command)
    source = f"mcp:{url}" if url is not None else f"mcp:{command}"
    listing = list_server_tools(
        url=url, command=command, timeout_s=timeout_s, max_message_bytes=max_message_bytes
    )
    notes: list[str] = []
    found, errors = capabilities_of(listing, source, server_name, notes=notes)
    report, stored = send_found(
        client,
        publisher,
        found,
        errors,
        tenant=tenant,
        source=source,
        root=source,
        take_over=take_over,
        lock_owner=lock_owner,
    )
    changed = [
        Changed(c.id, stored[c.id].content_hash, c.content_hash)
        for c in report.plan.upserts
        if c.id in stored
    ]
    for change in changed:
        log.info(
            "mcp_tool_changed",
            tool=change.capability_id,
            old_hash=change.old_hash,
            new_hash=change.new_hash,
            source=source,
            tenant=tenant,
        )
    report = wait_until_applied(client, report, wait_s)
    report.notes = notes
    return report, changed


def absolute_program(command: str) -> str:
    """``command`` with its program made absolute when it is a relative path (``.venv/bin/x``,
    ``./server``): ``capdisc mcp`` starts an imported server from the directory it runs in,
    which a host chooses, so the source names the program as an absolute path (as a registry
    directory's source is). A program looked up on PATH, and the arguments, stay as given."""
    argv = shlex.split(command)
    if not argv or os.sep not in argv[0] or os.path.isabs(argv[0]):
        return command
    return shlex.join([os.path.abspath(argv[0]), *argv[1:]])


def _safe(text: str, limit: int) -> str:
    return (_UNSAFE.sub("_", text).strip("._-") or "mcp")[: max(limit, 1)]


def _first_cause(exc: BaseException) -> str:
    inner: Sequence[BaseException] = getattr(exc, "exceptions", ())
    return _first_cause(inner[0]) if inner else (str(exc) or type(exc).__name__)
