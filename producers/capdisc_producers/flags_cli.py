"""The commands of the poisoning guard: ``approve`` a flagged capability, list ``flags``,
and set or show a tenant's ``policy``."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import click

from capdisc.errors import AuthError, FlagError
from capdisc_producers.access import Access
from capdisc_producers.cli_base import (
    access_of,
    chosen_tenant,
    command,
    connect,
    fail,
    group,
    json_option,
    known_tenant,
    redis_option,
    say,
    tenant_option,
)
from capdisc_producers.exits import FAILED, exit_status

# Small modules only at the top, as in capdisc_producers.cli.
if TYPE_CHECKING:
    from capdisc.registry.flags import Flag


#: ``capdisc.registry.flags.FLAG_STATES`` and ``POLICIES``, spelt out so that defining the
#: options does not import the flags (a unit test checks that they match).
FLAG_STATES = ("flagged", "pending", "approved")
POLICIES = ("flag", "warn", "quarantine")


def _operator(access: Access, tenant: str) -> str | None:
    """Fail unless the token holds the admin grant for ``tenant``: approving flagged text and
    choosing the policy are for operators, not for whoever may publish. Returns the token's
    subject (None without a token where the stack requires none)."""
    from capdisc.identity import auth
    from capdisc.identity.gate import require

    if access.token is None:
        if access.auth:
            fail(
                "approving flagged capabilities and setting the poisoning policy need a token "
                "with the admin grant: pass --token or set CAPDISC_TOKEN"
            )
        return None
    try:
        identity = (
            auth.verify(access.token, auth.load_keyring(access.keys_file), time.time())
            if access.keys_file is not None and access.keys_file.is_file()
            else auth.unverified(access.token, time.time())
        )
        require(identity, tenant, "admin")
    except AuthError as exc:
        fail(str(exc))
    return identity.subject


@command(
    epilog=exit_status(
        "an id that is not in the registry or not flagged, or whose text changed since the "
        "--surface reviewed; the other ids are approved"
    )
)
@click.argument("capability_ids", nargs=-1, required=True)
@click.option(
    "--surface",
    "reviewed",
    default=None,
    metavar="HASH",
    help="The surface hash you reviewed (capdisc flags list; 8+ characters): "
    "nothing is approved if the text changed since. Only with one id",
)
@redis_option
@tenant_option
@click.pass_context
def approve(
    ctx: click.Context,
    capability_ids: tuple[str, ...],
    reviewed: str | None,
    redis_url: str | None,
    tenant: str | None,
) -> None:
    """Approve flagged capabilities for their current text. Under the quarantine policy they
    are served from the index version printed; under warn and flag they lose their caution and
    mark. A later change to their text (description, schema, content) makes them pending again.
    Needs the admin grant."""
    from capdisc.registry.flags import SHORT_HASH
    from capdisc.registry.flagstore import approve as approve_flag

    if reviewed is not None and len(capability_ids) != 1:
        raise click.UsageError("--surface names the text of one capability: give one id")
    connection = connect(ctx, redis_url)[1]
    tenant = chosen_tenant(ctx, tenant)
    by = _operator(access_of(ctx), tenant)
    version, refused = None, []
    for cap_id in dict.fromkeys(capability_ids):
        try:
            done = approve_flag(connection, tenant, cap_id, reviewed=reviewed, by=by)
        except FlagError as exc:
            refused.append(cap_id)
            click.echo(f"{cap_id}: not approved")
            say(f"error: {exc}")
            continue
        version = done.version
        click.echo(
            f"{cap_id}: {'approved' if done.changed else 'already approved'} (surface "
            f"{done.flag.surface_hash[:SHORT_HASH]}; {', '.join(done.flag.rules)})"
        )
    if version is not None:
        click.echo(f"index version {version}")
    if refused:
        sys.exit(FAILED)


@group("flags")
def flags_group() -> None:
    """What the tool-poisoning scan flagged, for review (capdisc approve ID)."""


@flags_group.command(
    "list", epilog=exit_status("the tenant is unknown: nothing was ever published to it")
)
@click.option(
    "--state", type=click.Choice(FLAG_STATES), default=None, help="Only flags in this state"
)
@redis_option
@tenant_option
@json_option
@click.pass_context
def flags_list(
    ctx: click.Context, state: str | None, redis_url: str | None, tenant: str | None, as_json: bool
) -> None:
    """Each flagged capability of the tenant: its state, surface hash, and every finding with
    its rule, field, reason and excerpt (the scanned text, defanged: review it, do not follow
    it)."""
    from capdisc.registry.flagstore import read_flags, tenant_policy

    settings, connection = connect(ctx, redis_url)
    tenant = chosen_tenant(ctx, tenant)
    known_tenant(connection, tenant)
    policy = tenant_policy(connection, tenant) or settings.poisoning_policy
    found = {
        i: f
        for i, f in sorted(read_flags(connection, tenant).items())
        if state is None or f.state == state
    }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "tenant": tenant,
                    "policy": policy,
                    "flags": {i: f.to_dict() for i, f in found.items()},
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"tenant {tenant}, poisoning policy {policy}: {len(found)} flagged "
        "capabilit" + ("y" if len(found) == 1 else "ies")
    )
    for cap_id, flag in found.items():
        click.echo("\n".join(_flag_lines(cap_id, flag)))


def _flag_lines(cap_id: str, flag: Flag) -> list[str]:
    """A flag for a reviewer; in field paths and excerpts (the publisher's text) every
    character that is not printable is shown escaped, so none reaches the terminal as a
    control."""
    from capdisc.registry.flags import SHORT_HASH

    lines = [
        f"{cap_id}  {flag.state}  surface {flag.surface_hash[:SHORT_HASH]}"
        + (f"  approved by {flag.approved_by}" if flag.approved_by else "")
    ]
    for finding in flag.findings:
        lines.append(f"    {finding.rule} at {_printable(finding.where)}: {finding.reason}")
        lines.append(f"      | {_printable(finding.excerpt)}")
    return lines


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


@group("policy")
def policy_group() -> None:
    """A tenant's tool-poisoning policy: flag, warn or quarantine."""


@policy_group.command("set", epilog=exit_status(None))
@click.argument("policy", type=click.Choice([*POLICIES, "default"]))
@redis_option
@tenant_option
@click.pass_context
def policy_set(ctx: click.Context, policy: str, redis_url: str | None, tenant: str | None) -> None:
    """Set the tenant's policy for flagged capabilities: flag (served, marked), warn (served
    with a caution naming the rules), quarantine (served only once approved), or default (the
    workers' poisoning_policy setting). Discovery serves it from the index version printed.
    Needs the admin grant."""
    from capdisc.registry.flagstore import set_policy

    connection = connect(ctx, redis_url)[1]
    tenant = chosen_tenant(ctx, tenant)
    _operator(access_of(ctx), tenant)
    version = set_policy(connection, tenant, None if policy == "default" else policy)
    click.echo(
        f"tenant {tenant}: poisoning policy {policy}"
        + (f"; index version {version}" if version else "; served from its first publish")
    )


@policy_group.command("show", epilog=exit_status(None))
@redis_option
@tenant_option
@click.pass_context
def policy_show(ctx: click.Context, redis_url: str | None, tenant: str | None) -> None:
    """The tenant's policy, and whether it is its own or the workers' default."""
    from capdisc.registry.flagstore import tenant_policy

    settings, connection = connect(ctx, redis_url)
    tenant = chosen_tenant(ctx, tenant)
    own = tenant_policy(connection, tenant)
    click.echo(
        f"tenant {tenant}: poisoning policy {own or settings.poisoning_policy}"
        + ("" if own else " (default)")
    )
