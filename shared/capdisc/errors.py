"""The one error tree of capdisc.

Every error capdisc raises on purpose derives from :class:`CapdiscError`. Each message says what
went wrong and what to do about it. Vendor errors (redis, onnxruntime, yaml) are translated at the
adapter boundary with ``raise ... from exc`` so callers only ever catch these classes.
"""

from __future__ import annotations


class CapdiscError(Exception):
    """Root of every error capdisc raises on purpose. ``code`` is the error's name in a
    discovery worker's error reply (:data:`ERROR_CODES` lists them all)."""

    code = "internal"

    @classmethod
    def from_reply(cls, message: str) -> CapdiscError:
        """The error as the client raises it from a reply's message."""
        return cls(message)


class ConfigError(CapdiscError):
    """A setting from the environment or the settings file is missing or malformed."""

    code = "invalid_option"


class ManifestError(CapdiscError):
    """A capability definition (CAPABILITY.yaml, SKILL.md, schema.json, a record) is invalid.

    ``source`` names the file or record, ``field`` the offending field (``None`` when the problem
    is the document as a whole). Nothing already stored is touched when this is raised.
    """

    code = "invalid_argument"

    def __init__(self, source: str, field: str | None, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: field '{field}'" if field else source
        super().__init__(f"{where}: {problem}")

    @classmethod
    def from_reply(cls, message: str) -> CapdiscError:
        return cls("the request", None, message)


class EventDecodeError(CapdiscError):
    """A registry event or discovery message could not be decoded (malformed, oversized, unknown
    version). The message names the part that is wrong; the event is dead-lettered, never
    applied."""

    code = "bad_message"


class BadRequestError(EventDecodeError):
    """A discovery request stream entry is malformed: bytes that are not UTF-8, a missing or
    wrong-typed field, a value out of range, an unknown op. The message names the field.
    ``request_id`` is the id read from the entry when it has a usable one: the sender then gets
    an error reply; without one, the entry is dead-lettered."""

    code = "bad_request"

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class RequestEncodeError(CapdiscError):
    """A request could not be sent: an argument carries text that cannot be encoded as UTF-8
    (a lone surrogate such as ``"\\udc80"``, or bytes that were not UTF-8 decoded with
    ``surrogateescape``), a value JSON cannot carry, a request larger than a worker reads
    (64 KiB), or a request id a worker would refuse (so could not answer). The message names
    the argument; pass valid Unicode text, or shorten it."""

    code = "unencodable"


class EmbeddingError(CapdiscError):
    """The embedding model could not be loaded or returned an unusable answer."""

    code = "embedding_failed"


class UnknownTenantError(CapdiscError):
    """A request named a tenant the registry has never seen. Publish to that tenant first, or
    check the tenant name (``capdisc status`` lists the known ones)."""

    code = "unknown_tenant"


class UnknownProfileError(CapdiscError):
    """A request named an agent profile the discovery workers' settings do not configure
    (``sessions.profiles``). Nothing was answered: a misspelt profile would otherwise apply none
    of the profile's restrictions. Check the name, or leave the profile out."""

    code = "unknown_profile"


class TenantNameError(CapdiscError):
    """A tenant name breaks the one rule of :mod:`capdisc.tenants` (1 to 64 ASCII letters,
    digits, ``_`` or ``-``, starting with a letter or digit). The message names where the name
    came from and quotes it, shortened; nothing was written. Use a valid name."""

    code = "bad_tenant_name"


class QuarantinedError(CapdiscError):
    """A discovery request was delivered to workers several times and never answered (it
    crashed or hung whoever took it); it was set aside in the dead-letter stream
    (``capdisc dlq list``) and will not be served. Report it with its request id."""

    code = "quarantined"


class DiscoveryTimeout(CapdiscError):
    """No discovery worker answered in time. Check that one runs (``capdisc status`` lists the
    workers seen) and that it points at the same Redis."""

    code = "timeout"


class IndexingBacklogError(CapdiscError):
    """A producer waited too long to send: the indexing tasks already sent and not yet applied
    stay at ``publish_max_pending_tasks``. Check that an indexing worker runs (``capdisc
    status``), or raise the bound."""

    code = "backlog"


class StackNotFoundError(CapdiscError):
    """No running capdisc stack was found. Start one with ``make up`` (or ``capdisc up``), or point
    ``CAPDISC_REDIS_URL`` at the Redis of a running one."""

    code = "no_stack"


class StackRunningError(CapdiscError):
    """``capdisc up`` was asked to start where a stack already runs (the same project
    directory): a second Redis and watcher on the same files would corrupt them. Use the
    running stack, or stop it first (Ctrl-C in its terminal)."""

    code = "stack_running"


class RedisUnavailableError(CapdiscError):
    """Redis could not be reached or started."""

    code = "redis_unavailable"


class RedisCredentialsError(RedisUnavailableError):
    """Redis answered but refused the password (or the ACL user) capdisc presented: no wait
    makes that work, so it is said at once instead of waiting for Redis to come back."""

    code = "redis_credentials"

    @classmethod
    def refused(cls, detail: object) -> RedisCredentialsError:
        return cls(
            f"Redis refused capdisc's credentials ({detail}): the password is wrong or "
            "missing. Give the stack's password: CAPDISC_REDIS_PASSWORD_FILE naming its file "
            "(.capdisc/secrets/redis.password where `capdisc up` runs), or in the Redis URL"
        )


class MCPImportError(CapdiscError):
    """An MCP server could not be reached or did not list its tools; check the URL or command
    (``capdisc import mcp --url URL | --command CMD``)."""

    code = "mcp_import_failed"


class UpstreamError(CapdiscError):
    """``capdisc mcp`` could not forward a tool call to the MCP server the tool was imported
    from: the server could not be started or reached, or it broke the protocol. The message
    names the server; check that it runs (``capdisc import mcp`` with the same ``--url`` or
    ``--command`` lists it), then call the tool again."""

    code = "upstream_failed"


class UpstreamTimeout(UpstreamError):
    """The MCP server a tool was imported from did not answer a forwarded call within
    ``mcp_upstream_timeout_s``; the call was cancelled there. Retry, try another tool, or raise
    the setting (``CAPDISC_MCP_UPSTREAM_TIMEOUT_S``) for a slow server."""

    code = "upstream_timeout"


class SessionNotFoundError(CapdiscError):
    """No such session (never created, or expired). A session starts with a discovery in it or
    an import; check the session id and the tenant."""

    code = "session_not_found"


class VectorStoreError(CapdiscError):
    """The vector store (Weaviate, or the in-process store) refused or failed an operation.

    The message names the store, the operation and what to do: check ``CAPDISC_WEAVIATE_URL`` and
    ``CAPDISC_WEAVIATE_GRPC_HOST``/``_PORT`` when the server cannot be reached, raise
    ``CAPDISC_WEAVIATE_TIMEOUT_*_S`` when a call timed out, recreate the collection when its
    definition does not match. Writes that fail this way are safe to retry: ids are deterministic.
    """

    code = "vector_store_failed"


class AuthError(CapdiscError):
    """Who asks could not be proven: the identity token is missing, malformed, forged (a bad
    signature or a key id the keyring does not have), expired, not yet valid or revoked.
    ``reason`` says which (``missing``, ``malformed``, ``forged``, ``expired``,
    ``not_yet_valid``, ``revoked``, ``wrong_audience``, ``claims``); ``code`` is the error code
    of a refused request's reply. Issue a token with ``capdisc token issue --tenant T`` and
    pass it with ``--token`` or ``CAPDISC_TOKEN`` (``Client(..., token=...)``)."""

    code = "unauthorized"

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason

    @classmethod
    def from_reply(cls, message: str) -> CapdiscError:
        return cls(message, cls.code)


class ForbiddenError(AuthError):
    """A proven identity asked for what its token does not allow: another tenant (``wrong
    tenant``), a grant it lacks (``write`` for a publish, ``session`` for a session), roles or a
    user it does not carry, or a session another caller's roles or user hold. ``reason`` says
    which (``wrong_tenant``, ``grant``, ``roles``, ``user``, ``session``). Ask the operator for a
    token that allows it, or use a session of your own."""

    code = "forbidden"

    def __init__(self, message: str, reason: str = "forbidden") -> None:
        super().__init__(message, reason)


class FlagError(CapdiscError):
    """A tool-poisoning flag or policy could not be changed as asked
    (:mod:`capdisc.registry.flags`): the capability is not flagged (nothing to approve), its
    text changed since it was reviewed, or a policy is not one of ``flag``, ``warn``,
    ``quarantine``. Nothing was changed; the message says what to check (``capdisc flags
    list``)."""

    code = "flag_refused"


class SnapshotError(CapdiscError):
    """A snapshot on disk (``snapshot_dir``) cannot be served: unreadable, corrupt (a checksum
    differs), written by other code or for another Redis data generation, vector space, embedder
    or poisoning policy, or newer than what Redis holds. The discovery worker says which file
    and why, then loads the tenant from Redis as without a snapshot; nothing to do unless it
    keeps happening (then check the disk, or delete the directory named)."""

    code = "snapshot_unusable"

    def __init__(self, reason: str, path: object | None = None) -> None:
        self.path = str(path) if path is not None else None
        self.reason = reason
        super().__init__(f"snapshot {self.path}: {reason}" if path is not None else reason)


def _codes() -> dict[str, type[CapdiscError]]:
    found: dict[str, type[CapdiscError]] = {}
    pending: list[type[CapdiscError]] = [CapdiscError]
    while pending:
        cls = pending.pop()
        found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


#: Every error code a reply may carry, and the error class it stands for.
ERROR_CODES: dict[str, type[CapdiscError]] = _codes()


def error_for(code: str, message: str) -> CapdiscError:
    """The error a reply's ``code`` and ``message`` stand for, to raise on the client side (an
    unknown code: the root error, with the code in its message)."""
    cls = ERROR_CODES.get(code)
    if cls is None:
        return CapdiscError(f"{message} (error code {code!r})")
    return cls.from_reply(message)
