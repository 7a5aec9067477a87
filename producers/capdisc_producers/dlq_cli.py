"""``capdisc dlq``: the dead letters (events the indexing workers refused or could not
apply), listed, replayed and dropped."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from capdisc import keys
from capdisc_producers.cli_base import (
    access_of,
    check_write,
    connect,
    group,
    json_option,
    publisher_for,
    redis_option,
    say,
)
from capdisc_producers.exits import FAILED, exit_status

# Small modules only at the top, as in capdisc_producers.cli.
if TYPE_CHECKING:
    pass


@group()
def dlq() -> None:
    """Events the indexing workers could not apply, and discovery requests the discovery workers
    refused or quarantined: list them, replay the events, drop what is no longer needed."""


@dlq.command("list", epilog=exit_status(None))
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@redis_option
@json_option
@click.pass_context
def dlq_list(ctx: click.Context, limit: int, redis_url: str | None, as_json: bool) -> None:
    """The oldest dead-lettered events, with the reason each was refused."""
    from capdisc.registry.deadletters import budget, list_dead_letters

    connection = connect(ctx, redis_url)[1]
    letters = [letter.to_dict() for letter in list_dead_letters(connection, limit)]
    held = budget(connection)
    if as_json:
        click.echo(
            json.dumps(
                {"dead_letters": letters, "bytes": held.held_bytes, "dropped": held.dropped},
                indent=2,
            )
        )
        return
    if held.dropped:
        click.echo(
            f"{held.dropped} older dead letters were dropped to keep the stream within "
            f"deadletters_max_bytes and {keys.DEADLETTERS_MAXLEN:,} entries"
        )
    if not letters:
        click.echo("no dead letters")
    for letter in letters:
        cut = letter["truncated_from_bytes"]
        kept = f"  (payload cut short: {cut} bytes, only its start kept)" if cut else ""
        click.echo(
            f"{letter['id']}  {_letter_subject(letter)}  attempts "
            f"{letter['attempts']}{kept}\n    {letter['reason']}"
        )


def _letter_subject(letter: dict[str, Any]) -> str:
    if letter["source"] == keys.DISCOVERY_REQUESTS:
        return f"discovery request {letter['request_id'] or '(no readable request id)'}"
    return f"{letter['capability_id'] or '(undecodable event)'}  tenant {letter['tenant']}"


@dlq.command(
    "replay",
    epilog=exit_status(
        "a named id is no dead letter, is a discovery request (never replayed), or its "
        "payload was cut short (deadletter_payload_max_bytes); the other ids are replayed"
    ),
)
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Replay every dead letter")
@redis_option
@click.pass_context
def dlq_replay(
    ctx: click.Context, entry_ids: tuple[str, ...], replay_all: bool, redis_url: str | None
) -> None:
    """Send dead-lettered events (ENTRY_IDS from `capdisc dlq list`, or --all) to the indexing
    queue again; each leaves the stream once sent. One that fails again comes back with a new
    id and reason. Dead-lettered discovery requests are never replayed (not registry events;
    their clients stopped waiting): naming one is refused, --all leaves them. Prints one line
    per id: replayed, not found, or refused: a discovery request."""
    from capdisc.registry.deadletters import REPLAYED, replay_each, with_token

    if bool(entry_ids) == replay_all:
        raise click.UsageError("give the entry ids to replay, or --all")
    settings, connection = connect(ctx, redis_url)
    token = access_of(ctx).token
    publisher = publisher_for(settings.redis_url, None)
    try:
        outcomes = replay_each(
            connection,
            lambda payload: publisher.send_raw(with_token(payload, token)),
            None if replay_all else entry_ids,
        )
    finally:
        publisher.close()
    if replay_all:
        _report_replay_all(outcomes)
    else:
        _report_named(outcomes, REPLAYED)


#: Why a dead letter whose payload was cut short is not replayed, and what to do instead.
TRUNCATED_HINT = (
    "its payload was longer than deadletter_payload_max_bytes and only its start was kept, "
    "so replaying it would send another event: publish its source again (capdisc dlq drop "
    "removes it)"
)


def _report_replay_all(outcomes: dict[str, str]) -> None:
    from capdisc.registry.deadletters import (
        REFUSED_REQUEST,
        REFUSED_TASK,
        REFUSED_TRUNCATED,
        REPLAYED,
    )

    replayed = [i for i, outcome in outcomes.items() if outcome == REPLAYED]
    left = sum(outcome == REFUSED_REQUEST for outcome in outcomes.values())
    tasks = sum(outcome == REFUSED_TASK for outcome in outcomes.values())
    cut = sum(outcome == REFUSED_TRUNCATED for outcome in outcomes.values())
    for entry_id in replayed:
        click.echo(f"{entry_id}: {REPLAYED}")
    if not replayed:
        click.echo("no registry events to replay")
    if left:
        click.echo(
            f"left {left} discovery request(s): they cannot be replayed (capdisc dlq drop "
            "removes them)"
        )
    if tasks:
        click.echo(
            f"left {tasks} indexing task(s) no worker took: upgrade the indexing workers and "
            "publish again (capdisc dlq drop removes them)"
        )
    if cut:
        click.echo(f"left {cut} event(s) not replayed: {TRUNCATED_HINT}")


def _report_named(outcomes: dict[str, str], done: str) -> None:
    """One line per named dead letter; exit 1, saying why, unless every one was ``done``."""
    from capdisc.registry.deadletters import REFUSED_REQUEST, REFUSED_TASK, REFUSED_TRUNCATED

    for entry_id, outcome in outcomes.items():
        click.echo(f"{entry_id}: {outcome}")
    refused = (done, REFUSED_REQUEST, REFUSED_TASK, REFUSED_TRUNCATED)
    missing = [i for i, outcome in outcomes.items() if outcome not in refused]
    requests = [i for i, outcome in outcomes.items() if outcome == REFUSED_REQUEST]
    tasks = [i for i, outcome in outcomes.items() if outcome == REFUSED_TASK]
    cut = [i for i, outcome in outcomes.items() if outcome == REFUSED_TRUNCATED]
    if missing:
        say(f"error: no dead letter with id {', '.join(missing)} (see capdisc dlq list)")
    if requests:
        say(
            f"error: dead letter {', '.join(requests)} is a discovery request (from "
            f"{keys.DISCOVERY_REQUESTS}), not a registry event: it cannot be replayed to the "
            "indexing queue, and its client stopped waiting long ago; it stays listed for "
            "inspection (capdisc dlq drop removes it)"
        )
    if tasks:
        say(
            f"error: dead letter {', '.join(tasks)} is an indexing task no worker took (a task "
            "name the workers do not know), not a registry event: upgrade the indexing "
            "workers and publish again; it stays listed (capdisc dlq drop removes it)"
        )
    if cut:
        say(f"error: dead letter {', '.join(cut)} was not replayed: {TRUNCATED_HINT}")
    if missing or requests or tasks or cut:
        sys.exit(FAILED)


@dlq.command(
    "drop",
    epilog=exit_status("a named id is no dead letter; the other ids are dropped"),
)
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "drop_everything", is_flag=True, help="Drop every dead letter")
@redis_option
@click.pass_context
def dlq_drop(
    ctx: click.Context, entry_ids: tuple[str, ...], drop_everything: bool, redis_url: str | None
) -> None:
    """Remove dead letters without replaying them (ENTRY_IDS from `capdisc dlq list`, or
    --all): registry events and discovery requests alike, once nothing more is to be learnt
    from them. Prints one line per id: dropped, or not found."""
    from capdisc.registry.deadletters import DROPPED, drop, drop_all

    if bool(entry_ids) == drop_everything:
        raise click.UsageError("give the entry ids to drop, or --all")
    connection = connect(ctx, redis_url)[1]
    check_write(access_of(ctx), None)
    if not drop_everything:
        _report_named(drop(connection, entry_ids), DROPPED)
        return
    dropped = drop_all(connection)
    for entry_id, outcome in dropped.items():
        click.echo(f"{entry_id}: {outcome}")
    if not dropped:
        click.echo("no dead letters")
