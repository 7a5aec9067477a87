"""An upstream MCP server's tools changed: publish what changed, as ``capdisc import mcp`` does.

``capdisc mcp`` keeps one connection to each server it forwards calls to. When that server says
its tool list changed, the pool lists it again over the same connection (a stdio server is one
process: a new connection would start another, which need not have changed) and
:class:`Reimporter` syncs the listing into each tenant whose calls went there: the same
:func:`capdisc_producers.mcp_import.capabilities_of`, plan and publish as the import command,
under the same source, with the capability names the first import chose (``--name`` included:
they are read back from the stored records). Unchanged tools send nothing, changed ones are
re-indexed, tools the server dropped are deleted; ids another source owns stay refused.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import anyio.to_thread
import redis
import structlog

from capdisc.registry.policy import StoredRecord, plan_sync
from capdisc.registry.store import stored_by_source
from capdisc_producers.mcp_import import ServerTools, capabilities_of
from capdisc_producers.mcp_upstream import Upstream
from capdisc_producers.publisher import Publisher
from capdisc_producers.sync import SyncReport, held_elsewhere, publish_plan

log = structlog.get_logger("capdisc.mcp")


class Reimporter:
    """Publishes an upstream's new tool listing to the registry at ``redis_url``, stamping
    ``token`` on the events (with auth on it must grant ``write``), and waits up to ``wait_s``
    for the indexing workers to apply them."""

    def __init__(self, redis_url: str, token: str | None, wait_s: float) -> None:
        self.redis_url = redis_url
        self.token = token
        self.wait_s = wait_s

    async def __call__(
        self, upstream: Upstream, listing: ServerTools, tenants: frozenset[str]
    ) -> None:
        for tenant in sorted(tenants):
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

    def publish(self, source: str, listing: ServerTools, tenant: str) -> SyncReport:
        """Sync ``listing`` as ``source``'s tools in ``tenant`` (blocking)."""
        connection = redis.Redis.from_url(self.redis_url, socket_connect_timeout=2.0)
        publisher = Publisher(self.redis_url, token=self.token)
        try:
            return publish_listing(connection, publisher, listing, source, tenant, self.wait_s)
        finally:
            publisher.close()
            connection.close()


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
        connection, publisher, plan, root=Path(source), tenant=tenant, source=source, wait_s=wait_s
    )


def server_name_of(stored: Mapping[str, StoredRecord]) -> str | None:
    """The prefix the first import gave the source's capability names (their category), so a
    re-import keeps their ids; None when nothing is stored (the server's own name then)."""
    for record in stored.values():
        category = record.capability.get("category")
        if isinstance(category, str) and category:
            return category
    return None
