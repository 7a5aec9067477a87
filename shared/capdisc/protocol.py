"""Discovery messages: the request a client puts on the requests stream and the reply it gets.

Requests ride a Redis stream read by the discovery workers' consumer group; each reply is pushed
on a per-request list the client blocks on (``capdisc:reply:{request_id}``).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from capdisc.errors import EventDecodeError
from capdisc.formats import TOOL_FORMATS
from capdisc.models import KINDS

MAX_QUERY_CHARS = 4096
MAX_REQUEST_BYTES = 64 * 1024


@dataclass(frozen=True)
class DiscoverRequest:
    """One per-turn discovery request."""

    query: str
    tenant: str = "default"
    limit: int | None = None
    kind: str | None = None
    category: str | None = None
    tags: list[str] = field(default_factory=list)
    only_available: bool = False
    min_version: int = 0
    tool_format: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def decode(cls, data: str | bytes) -> DiscoverRequest:
        if len(data) > MAX_REQUEST_BYTES:
            raise EventDecodeError(f"discovery request is {len(data)} bytes, the limit is "
                                   f"{MAX_REQUEST_BYTES}")
        try:
            raw = json.loads(data)
            request = cls(**raw)
        except (ValueError, TypeError) as exc:
            raise EventDecodeError(f"discovery request is malformed: {exc}") from exc
        _check(request)
        return request


def _check(request: DiscoverRequest) -> None:
    if not isinstance(request.query, str) or not request.query.strip():
        raise EventDecodeError("discovery request field 'query' must be a non-empty string")
    if len(request.query) > MAX_QUERY_CHARS:
        raise EventDecodeError(f"discovery request field 'query' is longer than "
                               f"{MAX_QUERY_CHARS} characters")
    if request.limit is not None and (not isinstance(request.limit, int) or request.limit < 1):
        raise EventDecodeError("discovery request field 'limit' must be a positive integer")
    if request.kind is not None and request.kind not in KINDS:
        raise EventDecodeError(f"discovery request field 'kind' must be one of "
                               f"{', '.join(KINDS)}, got {request.kind!r}")
    if not isinstance(request.tags, list) or not all(isinstance(t, str) for t in request.tags):
        raise EventDecodeError("discovery request field 'tags' must be a list of strings")
    if request.tool_format is not None and request.tool_format not in TOOL_FORMATS:
        raise EventDecodeError(f"discovery request field 'tool_format' must be one of "
                               f"{', '.join(TOOL_FORMATS)}, got {request.tool_format!r}")
    if not isinstance(request.options, dict):
        raise EventDecodeError("discovery request field 'options' must be an object")


def error_reply(request_id: str, error: str, message: str) -> dict[str, Any]:
    """The reply for a request that could not be answered."""
    return {"request_id": request_id, "error": error, "message": message}
