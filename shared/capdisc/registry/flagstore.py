"""Tool-poisoning flags and policies in Redis: reading them, approving a flagged capability,
setting a tenant's policy. The policy itself is :mod:`capdisc.registry.flags`; indexing workers
write
each flag with its record (:func:`capdisc.registry.store.apply_event`).

An approval and a policy change alter what discovery serves, so each bumps the tenant's index
version and appends a change record in the same transaction, like any registry change:
discovery workers pick it up within the usual second, and a caller can wait for that version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from capdisc import keys
from capdisc.errors import FlagError
from capdisc.redistext import as_str
from capdisc.registry.flags import Flag, Policy, approved, parse_policy
from capdisc.registry.store import CHANGES_MAXLEN


@dataclass(frozen=True)
class Approval:
    """What ``capdisc approve`` did: the flag now stored, and the index version that serves
    it (unchanged when it was approved already)."""

    capability_id: str
    flag: Flag
    version: int
    changed: bool


def read_flags(client: redis.Redis, tenant: str) -> dict[str, Flag]:
    """Every flag of ``tenant`` by capability id."""
    return {as_str(k): Flag.from_json(v) for k, v in client.hgetall(keys.flags(tenant)).items()}


def tenant_policy(client: redis.Redis, tenant: str) -> Policy | None:
    """The policy set for ``tenant`` (None: the workers' ``poisoning_policy`` applies)."""
    raw = client.get(keys.poisoning_policy(tenant))
    return parse_policy(as_str(raw)) if raw is not None else None


def approve(
    client: redis.Redis,
    tenant: str,
    capability_id: str,
    *,
    reviewed: str | None = None,
    by: str | None = None,
) -> Approval:
    """Approve the flagged ``capability_id`` for its current text (``reviewed``: the surface
    hash the reviewer saw, refused if the text changed since), in one transaction with a version
    bump and a change record. :class:`FlagError` when it is not flagged."""
    watched = (keys.flags(tenant), keys.caps(tenant), keys.version(tenant))
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(*watched)  # type: ignore[no-untyped-call]
                flag = _current(pipe, tenant, capability_id)
                version = int(pipe.get(keys.version(tenant)) or 0)
                fresh = approved(flag, reviewed=reviewed, by=by, at_ms=int(time.time() * 1000))
                if not flag.unapproved:  # approved already, for this very text
                    return Approval(capability_id, flag, version, changed=False)
                pipe.multi()
                pipe.hset(keys.flags(tenant), capability_id, fresh.to_json())
                version = _bump(pipe, tenant, version, "upsert", capability_id)
                pipe.execute()
                return Approval(capability_id, fresh, version, changed=True)
            except redis.WatchError:
                continue


def _current(pipe: redis.client.Pipeline, tenant: str, capability_id: str) -> Flag:
    raw = pipe.hget(keys.flags(tenant), capability_id)
    if raw:
        return Flag.from_json(raw)
    stored = pipe.hexists(keys.caps(tenant), capability_id)
    raise FlagError(
        f"{capability_id} of tenant {tenant!r} is "
        + (
            "not flagged: nothing to approve"
            if stored
            else "not in the registry (capdisc flags list shows the flagged ones)"
        )
    )


def set_policy(client: redis.Redis, tenant: str, policy: str | None) -> int:
    """Set ``tenant``'s policy (None: back to the workers' setting); discovery workers reload
    the tenant with it. Returns the index version that serves it (0: nothing published yet)."""
    chosen = parse_policy(policy) if policy is not None else None
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(keys.version(tenant))  # type: ignore[no-untyped-call]
                version = int(pipe.get(keys.version(tenant)) or 0)
                pipe.multi()
                if chosen is None:
                    pipe.delete(keys.poisoning_policy(tenant))
                else:
                    pipe.set(keys.poisoning_policy(tenant), chosen)
                if version:
                    version = _bump(pipe, tenant, version, "reload", "")
                pipe.execute()
                return version
            except redis.WatchError:
                continue


def _bump(pipe: redis.client.Pipeline, tenant: str, version: int, op: str, cap_id: str) -> int:
    """Queue the next index version and its change record (``reload``: the whole tenant)."""
    version += 1
    pipe.set(keys.version(tenant), version)
    pipe.xadd(
        keys.CHANGES,
        {"tenant": tenant, "version": version, "op": op, "id": cap_id},
        maxlen=CHANGES_MAXLEN,
        approximate=True,
    )
    return version
