"""An upstream MCP server's tools changed: publish what changed, as ``capdisc import mcp`` does.

``capdisc mcp`` keeps one connection to each server it forwards calls to. When that server says
its tool list changed, the pool lists it again over the same connection (a stdio server is one
process: a new connection would start another, which need not have changed) and
:class:`Reimporter` syncs the listing into each tenant whose calls went there: the same
:func:`capdisc_producers.mcp_import.capabilities_of`, plan and publish as the import command,
under the same source, with the capability names the first import chose (``--name`` included:
they are read back from the stored records). Unchanged tools send nothing, changed ones are
re-indexed, tools the server dropped are deleted; ids another source owns stay refused.

Who publishes: the import token (``--import-token``, ``mcp_import_token``; default the process's
token). With auth on and the keyring at hand, it is checked for each tenant before anything is
sent (:func:`write_refusal`): a token the indexing workers would refuse (no ``write`` grant for
the tenant, another tenant, expired, forged) publishes nothing, and each change is logged as
``mcp_upstream_reimport_skipped`` with the reason, instead of filling the dead letters with
refused events. Without the keyring this process cannot tell, so it publishes and the workers
verify each event: a refused one is dead-lettered, and logged here as
``mcp_upstream_reimport_refused`` with the workers' reason.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import anyio.to_thread
import redis
import structlog

from capdisc.errors import AuthError
from capdisc.identity.gate import Gate, require
from capdisc.registry.events import DEFAULT_MAX_BYTES
from capdisc.registry.policy import StoredRecord, plan_sync
from capdisc.registry.store import stored_by_source
from capdisc_producers.mcp_import import ServerTools, capabilities_of
from capdisc_producers.mcp_upstream import Upstream
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, held_elsewhere, publish_plan

log = structlog.get_logger("capdisc.mcp")

#: Outcome decisions of events the indexing workers refused: invalid, or another source's.
REFUSED = ("rejected", "refused_owned")

#: What to do when the import token may not write: logged at start and with each skipped change.
IMPORT_TOKEN_HINT = (
    "re-imports need a token with the write grant: start capdisc mcp with --import-token TOKEN "
    "or CAPDISC_MCP_IMPORT_TOKEN (capdisc token issue --tenant T --grants write); until then, "
    "run capdisc import mcp again when an upstream's tools change"
)

#: How many of a re-import's rejected tools its warning names.
MAX_REJECTED_LOGGED = 20
#: What to do about tools a re-import refused.
REJECTED_HINT = (
    "the server's other tools were re-imported and the refused ones keep what was stored; fix "
    "them on the server (capdisc import mcp with its --url or --command lists every refusal)"
)


class Reimporter:
    """Publishes an upstream's new tool listing to the registry at ``redis_url``, stamping
    ``token`` on the events, and waits up to ``wait_s`` for the indexing workers to apply them.
    With auth on, ``gate`` holds the keyring: a tenant ``token`` may not write is skipped
    (logged with the reason); without it (``Gate(None)``) every tenant is published to."""

    def __init__(
        self,
        redis_url: str,
        token: str | None,
        wait_s: float,
        gate: Gate | None = None,
        max_event_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.redis_url = redis_url
        self.token = token
        self.wait_s = wait_s
        self.gate = gate or Gate(None)
        self.max_event_bytes = max_event_bytes

    async def __call__(
        self, upstream: Upstream, listing: ServerTools, tenants: frozenset[str]
    ) -> None:
        for tenant in sorted(tenants):
            refusal = self.refusal(tenant)
            if refusal is None:
                await self.reimport(upstream, listing, tenant)
            else:
                log.warning(
                    "mcp_upstream_reimport_skipped",
                    upstream=upstream.label,
                    tenant=tenant,
                    tools=len(listing.tools),
                    reason=refusal,
                    hint=IMPORT_TOKEN_HINT,
                )

    def refusal(self, tenant: str | None) -> str | None:
        """Why the indexing workers would refuse this re-importer's events in ``tenant``; None
        when they would apply them, or when it cannot be told here (see :func:`write_refusal`)."""
        return write_refusal(self.gate, self.token, tenant)

    async def reimport(self, upstream: Upstream, listing: ServerTools, tenant: str) -> None:
        report = await anyio.to_thread.run_sync(
            functools.partial(self.publish, upstream.source, listing, tenant),
            abandon_on_cancel=True,
        )
        log.info(
            "mcp_upstream_reimported",
            upstream=upstream.label,
            tenant=tenant,
            tools=len(listing.tools),
            summary=report.summary(),
            index_version=report.index_version,
            applied=report.complete,
        )
        rejected = [str(error) for error in report.plan.errors.values()]
        if rejected:  # the summary counts them; the operator needs which and why
            log.warning(
                "mcp_upstream_reimport_rejected",
                upstream=upstream.label,
                tenant=tenant,
                count=len(rejected),
                rejected=rejected[:MAX_REJECTED_LOGGED],
                hint=REJECTED_HINT,
            )
        refused = refused_reasons(report)
        if refused:  # the plan's summary counts what was sent, not what the workers applied
            log.warning(
                "mcp_upstream_reimport_refused", upstream=upstream.label, tenant=tenant, **refused
            )

    def publish(self, source: str, listing: ServerTools, tenant: str) -> SyncReport:
        """Sync ``listing`` as ``source``'s tools in ``tenant`` (blocking)."""
        connection = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2.0)
        publisher = Publisher(
            self.redis_url, token=self.token, max_event_bytes=self.max_event_bytes
        )
        try:
            return publish_listing(connection, publisher, listing, source, tenant, self.wait_s)
        finally:
            publisher.close()
            connection.close()


def write_refusal(gate: Gate, token: str | None, tenant: str | None) -> str | None:
    """Why the indexing workers would refuse events stamped with ``token`` in ``tenant`` (in the
    token's own tenant when None), as they check it (:meth:`Gate.writer
    <capdisc.identity.gate.Gate.writer>`); None when they would apply them. With auth off, or
    without the keyring at hand (``gate`` disabled), None: the workers verify each event."""
    if not gate.enabled:
        return None
    try:
        identity = gate.identity(token)
        require(identity, tenant or identity.tenant, "write")
    except AuthError as exc:
        return str(exc)
    return None


def refused_reasons(report: SyncReport) -> dict[str, object]:
    """How many of the report's events the indexing workers refused, and why (each distinct
    reason once); empty when none was."""
    refused = [o for o in report.outcomes if o.get("decision") in REFUSED]
    if not refused:
        return {}
    return {"refused": len(refused), "reasons": sorted({str(o.get("reason")) for o in refused})}


def publish_listing(
    connection: redis.Redis,
    publisher: Publisher,
    listing: ServerTools,
    source: str,
    tenant: str,
    wait_s: float,
) -> SyncReport:
    """What ``capdisc import mcp`` does once it has listed the server: plan against what the
    registry holds for ``source`` and publish the changes."""
    stored = stored_by_source(connection, tenant, source)
    found, errors = capabilities_of(listing, source, server_name_of(stored))
    plan = plan_sync(
        found, errors, stored, held_elsewhere(connection, tenant, source, found, stored)
    )
    return publish_plan(
        connection, publisher, plan, root=source, tenant=tenant, source=source, wait_s=wait_s
    )


def server_name_of(stored: Mapping[str, StoredRecord]) -> str | None:
    """The prefix the first import gave the source's capability names (their category), so a
    re-import keeps their ids; None when nothing is stored (the server's own name then)."""
    for record in stored.values():
        category = record.capability.get("category")
        if isinstance(category, str) and category:
            return category
    return None
