"""Drift between a tenant's records and its live vectors, repaired in Redis: orphan vectors
(no record) are dropped here; records without a vector are left for the caller to reindex. What
counts as drift is :func:`capdisc.registry.policy.plan_repair`."""

from __future__ import annotations

import redis

from capdisc import keys
from capdisc.redistext import as_str
from capdisc.registry.policy import RepairPlan, plan_repair

Redis = redis.Redis


def repair_plan(client: Redis, tenant: str, default_space: str) -> RepairPlan | None:
    """Compare ``tenant``'s records with its live vectors and drop the orphan vectors, in one
    optimistic transaction (a write meanwhile leaves it to the next run: None). The plan's
    ``missing_vectors`` are for the caller to reindex."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(keys.caps(tenant), keys.space(tenant))  # type: ignore[no-untyped-call]
            active = pipe.get(keys.space(tenant))
            space = as_str(active) if active else default_space
            plan = plan_repair(
                {as_str(k) for k in pipe.hkeys(keys.caps(tenant))},
                {as_str(k) for k in pipe.hkeys(keys.vectors(tenant, space))},
            )
            pipe.multi()
            if plan.orphan_vectors:
                pipe.hdel(keys.vectors(tenant, space), *plan.orphan_vectors)
            pipe.execute()
        except redis.WatchError:
            return None
    return plan
