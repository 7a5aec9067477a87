"""A stdio client transport for ``capdisc mcp`` whose messages from the server are bounded.

The ``mcp`` SDK's stdio transport reads a line of any length before parsing it (and joins its
chunks over and over while it does): an upstream that answers a tool call with 50 MB of text
held the gateway's memory and that upstream's connection for as long as that took, often past
the call's timeout, so the next call to it waited too. :func:`bounded_stdio` reads the
server's stdout in chunks and keeps at most ``max_message_bytes`` of a line: a longer line is
skipped to its end without being kept, and answered in its place by a JSON-RPC error (code
:data:`ANSWER_TOO_LARGE`) to the request it answered, which the gateway turns into an error
naming the upstream, the tool, the size and the limit. The connection stays usable: the next
line is read as usual. The request a long line answers is told by its ``id`` (read from the
line's start or end, where JSON-RPC writers put it) or, failing that, is the only request
waiting; with neither, the line is handed to the client as a message it could not read.

An answer carrying the id of no request ever sent to the server, while one request waits, is
replaced by a JSON-RPC error to that request saying so (code :data:`ANSWER_MISMATCHED`): the
SDK would drop it as an answer to nothing, and the call would wait its whole timeout. An
answer to a request sent before (one the client gave up on) is passed on as it is.

Starting and stopping the server follow the SDK's stdio transport: the inherited environment
of :func:`mcp.client.stdio.get_default_environment` plus the server's own, a process group of
its own, and on leaving stdin closed, then SIGTERM to the group, then SIGKILL.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
import structlog
from anyio.abc import Process
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import JSONRPCError, JSONRPCRequest, JSONRPCResponse

log = structlog.get_logger("capdisc.mcp")

#: The JSON-RPC error code of an answer refused for its size (implementation-defined range).
ANSWER_TOO_LARGE = -32001
#: The JSON-RPC error code of an answer carrying another id than its request's.
ANSWER_MISMATCHED = -32002
#: The JSON-RPC error code of a request refused with an HTTP error status (no JSON-RPC error).
HTTP_REFUSED = -32003
#: How many of the latest request ids sent are remembered, to tell an answer to one given up on
#: from an answer to none.
SENT_IDS_KEPT = 4096
#: How much of a long line's start and end is kept to find the request it answers.
EDGE_BYTES = 4096
#: Room for the JSON-RPC envelope around a result of the largest size passed on: a message
#: from the server may be this much longer than ``mcp_max_result_bytes`` (the result itself is
#: checked against the limit once read).
ENVELOPE_BYTES = 4096
_GRACE_S = 2.0
#: A JSON-RPC message's id where writers put it: at its start or its end.
_ID = r'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")'
ID_AT_START = re.compile(r'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID)
ID_AT_END = re.compile(r"[{,]\s*" + _ID + r"\s*\}\s*$")


class AnswerTooLarge(ValueError):
    """A message from the server longer than the limit, skipped (the client is told)."""


@dataclass(frozen=True)
class _LongLine:
    """A line longer than the limit: its size, and its start and end (never kept whole)."""

    size: int
    head: bytes
    tail: bytes


@asynccontextmanager
async def bounded_stdio(
    server: StdioServerParameters, max_message_bytes: int
) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``server`` and exchange newline-delimited JSON-RPC with it; a line from it longer
    than ``max_message_bytes`` is refused as described in the module."""
    env = {**get_default_environment(), **(server.env or {})}
    process = await anyio.open_process(
        [server.command, *server.args],
        env=env,
        cwd=server.cwd,
        stderr=None,  # the server's own log goes where capdisc's goes
        start_new_session=True,
    )
    to_client, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    to_server, from_client = anyio.create_memory_object_stream[SessionMessage](0)
    waiting: set[types.RequestId] = set()
    sent: dict[types.RequestId, None] = {}  # the latest ids sent, oldest first

    async def read() -> None:
        assert process.stdout is not None
        async with to_client:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for line in _lines(process.stdout, max_message_bytes):
                    if isinstance(line, _LongLine):
                        log.warning(
                            "mcp_upstream_answer_too_large",
                            upstream=shlex.join([server.command, *server.args]),
                            bytes=line.size,
                            limit_bytes=max_message_bytes,
                        )
                    await to_client.send(_message(line, max_message_bytes, waiting, sent))

    async def write() -> None:
        assert process.stdin is not None
        async with from_client:
            with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                async for item in from_client:
                    if isinstance(item.message, JSONRPCRequest):
                        waiting.add(item.message.id)
                        _remember(sent, item.message.id)
                    data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode(server.encoding))
        await to_client.aclose()  # the server cannot be written to: the connection is over

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield from_server, to_server
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tasks.cancel_scope.cancel()


async def _lines(stdout: Any, limit: int) -> AsyncIterator[bytes | _LongLine]:
    """Each line of ``stdout``; one longer than ``limit`` bytes as a :class:`_LongLine`."""
    kept = bytearray()
    size = 0
    tail = b""
    async for chunk in stdout:
        start = 0
        while start <= len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            size += len(piece)
            if size <= limit:
                kept += piece
            else:
                if len(kept) > EDGE_BYTES:
                    del kept[EDGE_BYTES:]
                tail = (tail + piece)[-EDGE_BYTES:]
            if end < 0:
                break
            if size > limit:
                yield _LongLine(size, bytes(kept[:EDGE_BYTES]), tail)
            elif kept.strip():
                yield bytes(kept)
            kept, size, tail = bytearray(), 0, b""
            start = end + 1


def _remember(sent: dict[types.RequestId, None], request_id: types.RequestId) -> None:
    sent[request_id] = None
    if len(sent) > SENT_IDS_KEPT:
        del sent[next(iter(sent))]


def _message(
    line: bytes | _LongLine,
    limit: int,
    waiting: set[types.RequestId],
    sent: dict[types.RequestId, None],
) -> SessionMessage | Exception:
    if isinstance(line, _LongLine):
        size = line.size
        answered = _answered(line.head, line.tail, waiting)
        text = (
            f"the answer is {size} bytes, more than the {limit} bytes capdisc reads "
            "(mcp_max_result_bytes)"
        )
        if answered is None:
            return AnswerTooLarge(text)
        waiting.discard(answered)
        error = types.ErrorData(code=ANSWER_TOO_LARGE, message=text, data={"bytes": size})
        return SessionMessage(JSONRPCError(jsonrpc="2.0", id=answered, error=error))
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        return exc
    if isinstance(message, JSONRPCResponse | JSONRPCError):
        if message.id is not None and message.id not in sent and len(waiting) == 1:
            return _mismatched(message.id, waiting.pop())
        waiting.discard(message.id)
    return SessionMessage(message)


def _mismatched(answered: types.RequestId, asked: types.RequestId) -> SessionMessage:
    """The JSON-RPC error answering request ``asked`` in place of an answer to no request."""
    log.warning("mcp_upstream_answer_mismatched", id=answered, asked=asked)
    error = types.ErrorData(
        code=ANSWER_MISMATCHED,
        message=f"with JSON-RPC id {json.dumps(answered)}, not {json.dumps(asked)}, the id of "
        "the request it answers",
    )
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=asked, error=error))


def _answered(head: bytes, tail: bytes, waiting: set[types.RequestId]) -> types.RequestId | None:
    """The waiting request a long line answers: the id at its start or end, else the only
    request waiting."""
    for pattern, text in ((ID_AT_START, head), (ID_AT_END, tail)):
        found = pattern.search(text.decode("utf-8", "replace"))
        if found:
            with suppress(ValueError):
                value = json.loads(found.group(1))
                if value in waiting:
                    return value  # type: ignore[no-any-return]
    return next(iter(waiting)) if len(waiting) == 1 else None


async def _stop(process: Process) -> None:
    """Close the server's stdin, give it the grace period to exit, then end its group."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(_GRACE_S):
        while process.returncode is None:
            await anyio.sleep(0.01)
    if process.returncode is None and os.name == "posix":
        await terminate_posix_process_tree(process, _GRACE_S)
    elif process.returncode is None:
        process.kill()
    with anyio.move_on_after(_GRACE_S):
        while process.returncode is None:
            await anyio.sleep(0.01)
    if process.stdout is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdout.aclose()
