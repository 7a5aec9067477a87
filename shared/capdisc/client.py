"""The Python client: ask the discovery workers for a turn's capabilities over Redis.

A request goes on the requests stream; the client blocks on its own reply list, in slices (the
redis-py socket timeout is 5 s), until the deadline. No worker answering is a clear
:class:`DiscoveryTimeout`, not a hang. Redis restarting or away is ridden out until the same
deadline (the request sent again under its id), then a :class:`RedisUnavailableError`.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from capdisc import keys, tenants
from capdisc.discovery.protocol import DiscoverRequest, SessionRequest
from capdisc.discovery.replies import DiscoverReply, ErrorReply, SessionReply, decode_reply
from capdisc.errors import (
    ConfigError,
    DiscoveryTimeout,
    RedisCredentialsError,
    RedisUnavailableError,
)
from capdisc.redisclock import RedisClock
from capdisc.redisrefusal import advice, refuses_writes

# What a discover call does not need is imported where it is used: a process that asks once
# (the ``capdisc`` command) starts without the sessions store, the status report, the
# meta-tool and the token library.
if TYPE_CHECKING:
    from capdisc.models import SourceRef

#: Longest single blocking read; keeps every wait under redis-py's socket timeout.
BLOCK_SLICE_S = 1.0
#: Pause between attempts while Redis cannot be reached (redis-py's own retries come first).
REDIS_RETRY_S = 0.1
#: Longest wait a client accepts for one request (a year).
MAX_TIMEOUT_S = 365 * 86400.0
#: The identity token :meth:`Client.from_stack` presents when none is given.
TOKEN_ENV = "CAPDISC_TOKEN"
#: The tenant claim of a token for every tenant (``capdisc.identity.auth.ALL_TENANTS``).
ALL_TENANTS = "*"


@dataclass(frozen=True)
class Answer:
    """A discovery answer: ranked capabilities, rendered context and the index version used."""

    query: str
    tenant: str
    index_version: int
    capabilities: list[dict[str, Any]]
    context: str
    abstained: bool = False
    tokens: dict[str, int] = field(default_factory=dict)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_names: dict[str, str] = field(default_factory=dict)
    #: Tool name -> where a tool imported from an MCP server is called (its ``source_ref``).
    tool_sources: dict[str, SourceRef] = field(default_factory=dict)
    worker: str = ""
    took_ms: float = 0.0
    #: Of ``took_ms``, the time the worker spent in the query model (0: the vectors were cached).
    model_ms: float = 0.0
    #: Category -> workflow guidance for the categories found (docs/design.md, "Workflow hints").
    workflow_hints: dict[str, str] = field(default_factory=dict)
    #: In a session: ``id``, ``bound`` (the working set), ``added``, ``evicted``,
    #: ``redundant_search`` and its ``note``, and ``installable`` capabilities when few fit.
    session: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ids(self) -> list[str]:
        return [c["id"] for c in self.capabilities]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.raw)


class Client:
    """Connects by URL (or takes a Redis connection) and talks to the discovery workers, as a
    caller with ``roles`` and ``user`` in its tenant (anonymous: what the tenant shares).

    Where the workers require identity tokens (``auth: on``), pass ``token`` (``capdisc token
    issue`` makes one): the workers serve each request as the token's holder, and a missing,
    forged, expired or wrong-tenant token raises :class:`~capdisc.errors.AuthError` (or its
    :class:`~capdisc.errors.ForbiddenError`). ``tenant`` defaults to the token's tenant."""

    def __init__(
        self,
        connection: redis.Redis,
        *,
        tenant: str | None = None,
        timeout_s: float = 5.0,
        resend_after_s: float = 3.0,
        roles: list[str] | None = None,
        user: str | None = None,
        token: str | None = None,
        backlog_max: int = keys.DISCOVERY_REQUESTS_MAXLEN,
    ) -> None:
        self.redis = connection
        self.token = token or None
        self.tenant = tenants.check_tenant(
            tenant or tenant_of(self.token) or "default", "Client tenant"
        )
        #: Who asks, within the tenant: only capabilities visible to them come back.
        self.roles = _names(roles)
        self.user = user
        self.timeout_s = seconds(timeout_s, "Client timeout_s")
        #: Unanswered this long, a request is sent again under the same id (a worker died
        #: holding it); it is answered once and changes a session once.
        self.resend_after_s = seconds(resend_after_s, "Client resend_after_s")
        #: About how many unanswered requests the requests stream keeps (older ones trimmed).
        self.backlog_max = backlog_max
        #: Deadlines are set on Redis's clock, which discovery workers read too.
        self.clock = RedisClock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        return cls(redis.Redis.from_url(url, socket_connect_timeout=2.0), **kwargs)

    @classmethod
    def from_stack(cls, directory: str | os.PathLike[str] | None = None, **kwargs: Any) -> Client:
        """A client of the running stack that ``capdisc up`` started in ``directory`` (its
        project directory, or a directory below it), else in ``CAPDISC_STACK``, else in the
        working directory or one of its parents, found through its ``.capdisc/stack.json``:
        its Redis, with the password from its password file, and unless ``token`` is given,
        ``CAPDISC_TOKEN`` or else the admin token the stack wrote (readable by whoever ran
        ``capdisc up``). Other keyword arguments are :class:`Client`'s. Raises
        :class:`~capdisc.errors.StackNotFoundError` when no running stack is found there
        (``CAPDISC_REDIS_URL`` is not consulted: use :meth:`from_url` for a Redis by URL)."""
        from capdisc.stackfile import STACK_ENV, running_stack_from, stack_token, stack_url

        environ = dict(os.environ)
        if directory is not None:
            environ[STACK_ENV] = os.fspath(directory)
        stack = running_stack_from(
            environ, Path.cwd(), "use Client.from_url(URL) for a Redis by URL"
        )
        if kwargs.get("token") is None:
            kwargs["token"] = environ.get(TOKEN_ENV) or stack_token(stack)
        return cls.from_url(stack_url(stack), **kwargs)

    def as_holder(self, token: str, tenant: str | None = None) -> Client:
        """A client on this one's connection asking as the holder of ``token`` (in ``tenant``,
        else the token's): one caller of a server that serves many (``capdisc mcp --http``).
        Closing it closes the shared connection: close this one instead."""
        return Client(
            self.redis,
            tenant=tenant,
            token=token,
            timeout_s=self.timeout_s,
            resend_after_s=self.resend_after_s,
        )

    def discover(
        self,
        query: str,
        *,
        limit: int | None = None,
        kind: str | None = None,
        category: str | None = None,
        tags: list[str] | None = None,
        only_available: bool = False,
        min_version: int = 0,
        options: dict[str, Any] | None = None,
        tool_format: str | None = None,
        tenant: str | None = None,
        timeout_s: float | None = None,
        session: str | None = None,
        profile: str | None = None,
        request_id: str | None = None,
    ) -> Answer:
        """The capabilities this turn needs, filtered by ``kind``, ``category``, ``tags`` and
        availability. ``options`` overrides discovery settings for this call (for example
        ``{"tier1_top_k": 8}``); ``min_version`` waits (up to the worker's
        ``discover_timeout_s``, and never past this call's timeout) until that index version is
        served, ``answer.index_version`` says which one answered; ``tool_format``
        (``openai-chat``, ``openai-responses``, ``anthropic``, ``mcp``) adds tool definitions,
        plus the meta-tool, to the answer: this turn's matches, or in a ``session`` its whole
        working set. In a session the matches join the working set (``answer.session``);
        ``profile`` names an agent profile."""
        request = DiscoverRequest(
            query=query,
            tenant=self._tenant(tenant),
            limit=limit,
            kind=kind,
            category=category,
            tags=_names(tags),
            only_available=only_available,
            min_version=min_version,
            tool_format=tool_format,
            options=options or {},
            session=session,
            profile=profile,
            roles=self.roles,
            user=self.user,
            token=self.token,
        )
        if request_id:
            request = replace(request, request_id=request_id)
        return _answer(self._request({"payload": request.encode()}, request.request_id, timeout_s))

    def record_tool_call(
        self,
        session: str,
        tool_id: str,
        arguments: Any = None,
        *,
        tenant: str | None = None,
        request_id: str | None = None,
    ) -> dict[str, Any]:
        """Record that the agent executed ``tool_id``: ``loop_detected``, ``evicted`` and
        ``guidance`` say whether the loop guard took the tool away (the call did run)."""
        return self._session_op(
            "call", session, tenant, request_id, tool_id=tool_id, arguments=arguments
        )

    def working_set(self, session: str, *, tenant: str | None = None) -> dict[str, Any]:
        """The session's working set: ``bound`` ids with first-seen, last-used and use count,
        ``always_include``, ``loop_evicted``."""
        working: dict[str, Any] = self._session_op("show", session, tenant)["working_set"]
        return working

    def export_session(self, session: str, *, tenant: str | None = None) -> dict[str, Any]:
        """The working set, to hand to a subagent or carry across a context compaction."""
        exported: dict[str, Any] = self._session_op("export", session, tenant)["session"]
        return exported

    def import_session(
        self, session: str, data: dict[str, Any], *, tenant: str | None = None
    ) -> dict[str, Any]:
        """Start (or replace) ``session`` with an exported working set; its working set."""
        working: dict[str, Any] = self._session_op("import", session, tenant, data=data)[
            "working_set"
        ]
        return working

    def watch_session(
        self,
        session: str,
        *,
        tenant: str | None = None,
        after: str = "0-0",
        stop: Callable[[], bool] = lambda: False,
        patience_s: float | None = None,
    ) -> Iterator[dict[str, str]]:
        """Every change to the session's working set, in order, as it happens (``bound``,
        ``refreshed``, ``evicted``, ``restored``, ``loop_detected``, ``redundant_search``,
        ``imported``; ``ended`` when it is dropped among too many live sessions, ``restarted``
        ahead of the first change after it ended, its ``reason`` ``evicted`` or ``expired``: the
        working set was emptied; a ``refreshed`` event's ``tool`` lists the tools a discovery
        found again, comma-separated), from stream id ``after``; ends when ``stop()`` is true. Redis
        restarting is ridden out; away longer than ``patience_s`` (default: ``timeout_s``), a
        :class:`~capdisc.errors.RedisUnavailableError`. A discovery worker names the stream
        first, once it checked that this client may watch the session (with auth on: a token
        of its tenant with the ``session`` grant whose roles see every capability, since the
        events name each tool bound); the stream is then read from Redis directly. ``after``
        that is no event id is a :class:`~capdisc.errors.ConfigError`, before anything is
        sent."""
        patience = self.timeout_s if patience_s is None else seconds(patience_s, "patience_s")
        return self._followed(self._tenant(tenant), session, event_id(after), stop, patience)

    def _followed(
        self, tenant: str, session: str, after: str, stop: Callable[[], bool], patience_s: float
    ) -> Iterator[dict[str, str]]:
        from capdisc.sessions import store as sessions

        def named() -> str:
            return str(self._session_op("watch", session, tenant)["stream"])

        try:
            yield from sessions.follow(self.redis, named(), after, stop, patience_s, rename=named)
        except redis.AuthenticationError as exc:
            raise RedisCredentialsError.refused(exc) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise _unreachable(exc, patience_s) from exc

    def _tenant(self, tenant: str | None) -> str:
        """The tenant a call names (checked: a bad name is refused before anything is sent),
        else this client's."""
        return tenants.check_tenant(tenant, "tenant") if tenant else self.tenant

    def _session_op(
        self,
        op: str,
        session: str,
        tenant: str | None,
        request_id: str | None = None,
        **fields: Any,
    ) -> dict[str, Any]:
        if request_id:
            fields["request_id"] = request_id
        request = SessionRequest(
            op=op,  # type: ignore[arg-type]
            session=session,
            tenant=self._tenant(tenant),
            roles=self.roles,
            user=self.user,
            token=self.token,
            **fields,
        )
        raw = self._request(
            {"op": "session", "payload": request.encode()}, request.request_id, None
        )
        reply = decode_reply(raw, SessionReply.from_dict)
        if isinstance(reply, ErrorReply):
            raise reply.error()
        return reply.to_dict()

    def _request(
        self, fields: dict[str, str], request_id: str, timeout_s: float | None
    ) -> dict[str, Any]:
        """Send a request and wait for its reply, sending it again (same id) whenever
        ``resend_after_s`` passes unanswered, or Redis could not be reached, until the
        timeout."""
        timeout = seconds(timeout_s, "timeout_s") if timeout_s is not None else self.timeout_s
        deadline = time.monotonic() + timeout
        outage: redis.RedisError | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            # the same deadline each time, on Redis's clock (read here: it may wait for Redis)
            entry: dict[Any, Any] = {
                **fields,
                "deadline_ms": int(self.clock.now_ms(self.redis) + remaining * 1000),
            }
            try:
                self.redis.xadd(
                    keys.DISCOVERY_REQUESTS, entry, maxlen=self.backlog_max, approximate=True
                )
                reply = wait_for_reply(self.redis, request_id, min(remaining, self.resend_after_s))
            except redis.AuthenticationError as exc:  # no wait makes a wrong password right
                raise RedisCredentialsError.refused(exc) from exc
            except redis.RedisError as exc:
                away = isinstance(exc, redis.ConnectionError | redis.TimeoutError)
                if not away and not refuses_writes(exc):
                    raise
                # Redis restarting, away or full: asked again, same id, until the deadline
                outage = exc
                time.sleep(max(0.0, min(REDIS_RETRY_S, deadline - time.monotonic())))
                continue
            outage = None
            if reply is not None:
                return reply
        if outage is not None:
            raise _unreachable(outage, timeout) from outage
        raise DiscoveryTimeout(no_answer_message(timeout, self._discovery_workers_seen()))

    def _discovery_workers_seen(self) -> str:
        """How many discovery workers' heartbeats are fresh (``?`` when this client cannot read
        them: a Redis ACL user for clients need not see the heartbeats, or Redis went away)."""
        from capdisc.status import live_workers

        try:
            return str(sum(w["kind"] == "discovery" for w in live_workers(self.redis)))
        except redis.RedisError:  # not allowed to read them, or Redis gone meanwhile
            return "?"

    def handle_metatool_call(
        self,
        arguments: str | dict[str, Any],
        *,
        tool_format: str | None = None,
        tenant: str | None = None,
        min_version: int = 0,
        session: str | None = None,
        profile: str | None = None,
    ) -> tuple[dict[str, Any], Answer]:
        """Run a model's ``discover_capabilities`` call: the result to hand back to the model,
        and the full answer (whose ``tools`` to bind when ``tool_format`` is given: in a
        ``session``, its whole working set). Bad arguments raise
        :class:`~capdisc.errors.ManifestError` naming the argument; send its message back to the
        model as the tool's error. ``min_version`` waits until that index version is served
        (read your own writes). In a session the result carries the redundant-search note."""
        from capdisc.agents.answers import metatool_result
        from capdisc.agents.metatool import parse_metatool_arguments

        call = parse_metatool_arguments(arguments)
        answer = self.discover(
            call.query,
            kind=call.kind,
            limit=call.limit,
            only_available=bool(call.only_available),
            tool_format=tool_format,
            tenant=tenant,
            min_version=min_version,
            session=session,
            profile=profile,
        )
        result = metatool_result(answer.raw)
        if answer.session and answer.session.get("note"):
            result["note"] = answer.session["note"]
        if answer.session and answer.session.get("installable"):
            result["installable"] = answer.session["installable"]
        return result, answer

    def status(self) -> dict[str, Any]:
        """Index versions, capability counts, workers seen and queue depths."""
        from capdisc.status import collect_status

        return collect_status(self.redis)

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def seconds(value: Any, name: str) -> float:
    """``value`` as a wait in seconds: a number above 0, at most :data:`MAX_TIMEOUT_S`;
    :class:`ConfigError` naming ``name`` otherwise (no wait is endless: a request carries the
    time its answer is no longer awaited)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number of seconds, got {type(value).__name__}")
    if not (0 < value <= MAX_TIMEOUT_S) or math.isnan(value):
        raise ConfigError(
            f"{name} must be above 0 and at most {MAX_TIMEOUT_S:.0f} seconds (a year), got "
            f"{value!r}; to wait longer, ask again when it times out"
        )
    return float(value)


#: A stream entry id as Redis takes it: milliseconds, optionally ``-sequence`` (each at most
#: 2**64 - 1), or ``$`` (only what comes next).
_EVENT_ID = re.compile(r"^(?:[0-9]{1,20}(?:-[0-9]{1,20})?|\$)$")


def event_id(after: Any) -> str:
    """``after`` if it is an event id a session's stream can be read after; :class:`ConfigError`
    naming it otherwise."""
    if not (
        isinstance(after, str)
        and _EVENT_ID.fullmatch(after)
        and all(int(part) < 2**64 for part in after.split("-") if part != "$")
    ):
        raise ConfigError(
            f"watch_session after must be an event id, MILLISECONDS-SEQUENCE as an event's "
            f"'id' (0-0: from the oldest one kept; $: only new ones), got {after!r:.40}"
        )
    return after


def _unreachable(outage: redis.RedisError, timeout_s: float) -> RedisUnavailableError:
    if refuses_writes(outage):
        return RedisUnavailableError(
            f"capdisc's Redis refused the request for {timeout_s:.1f} s ({outage}): "
            f"{advice(outage)}"
        )
    return RedisUnavailableError(
        f"capdisc cannot reach its Redis ({outage}) within {timeout_s:.1f} s; is the stack "
        "running? (capdisc status; make up starts one)"
    )


def no_answer_message(timeout_s: float, seen: str) -> str:
    """Why a request went unanswered, by how many discovery workers are seen alive (``seen``:
    a count, or ``?`` when the heartbeats cannot be read)."""
    said = f"no discovery worker answered within {timeout_s:.1f} s"
    if seen == "0":
        return (
            f"{said} (0 discovery workers seen alive); start one with `make up` or "
            "`python -m capdisc_workers.discovery`"
        )
    if seen == "?":
        return f"{said}; check that a discovery worker runs (capdisc status)"
    return (
        f"{said}, though {seen} discovery worker(s) are alive: busy or blocked (a slow query "
        "embedder or vector store, a long reload); see their logs (capdisc status names them), "
        "or give the call a longer timeout"
    )


def wait_for_reply(
    connection: redis.Redis, request_id: str, timeout_s: float
) -> dict[str, Any] | None:
    """The reply pushed on ``capdisc:reply:{request_id}`` (a discovery request, a reconcile
    run), waiting in slices under redis-py's socket timeout; None if none came in time."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        popped = connection.blpop(
            [keys.reply(request_id)], timeout=max(0.01, min(BLOCK_SLICE_S, remaining))
        )
        if popped:
            reply: dict[str, Any] = json.loads(popped[1])
            return reply
    return None


def _names(names: list[str] | None) -> list[str]:
    """A copy of a list of names; one string is passed on as it is, for the worker to refuse
    naming the field (``list("ops")`` would ask for the names ``o``, ``p`` and ``s``)."""
    if isinstance(names, str):
        return names
    return list(names or [])


def _answer(raw: dict[str, Any]) -> Answer:
    """The answer a discover reply carries; the error it stands for, raised, if it is one."""
    reply = decode_reply(raw, DiscoverReply.from_dict)
    if isinstance(reply, ErrorReply):
        raise reply.error()
    return Answer(
        query=reply.query,
        tenant=reply.tenant,
        index_version=reply.index_version,
        capabilities=[c.to_dict() for c in reply.capabilities],
        context=reply.context,
        abstained=reply.abstained,
        tokens=dict(reply.tokens),
        tools=list(reply.tools.tools) if reply.tools else [],
        tool_names=dict(reply.tools.tool_names) if reply.tools else {},
        tool_sources=dict(reply.tools.sources) if reply.tools else {},
        worker=reply.worker,
        took_ms=reply.took_ms,
        model_ms=reply.model_ms,
        workflow_hints=dict(reply.workflow_hints),
        session=reply.session.to_dict() if reply.session else None,
        raw=raw,
    )


def tenant_of(token: str | None) -> str | None:
    """The tenant a token names (unverified: a default only; the workers verify), None for a
    token for every tenant or one that cannot be read. The token's claims are read as
    ``capdisc.identity.auth.peek`` reads them, without loading the token library."""
    claims = _unverified_claims(token) if token else None
    tenant = claims.get("tenant") if claims else None
    return tenant if isinstance(tenant, str) and tenant != ALL_TENANTS else None


def _unverified_claims(token: str) -> dict[str, Any] | None:
    """The claims of a JWT (its middle segment, base64url JSON), NOT verified; None when it
    has none that can be read."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (ValueError, RecursionError):  # not base64, not UTF-8, not JSON; nested too deeply
        return None
    return claims if isinstance(claims, dict) else None
