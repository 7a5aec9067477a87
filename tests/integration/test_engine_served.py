"""The full engine as the discovery worker serves it: exact names, chained requests, abstention,
per-call options, and the three tiers in ``capdisc discover``."""

from __future__ import annotations

from pathlib import Path

from capdisc.client import Client

from .conftest import Stack, publish
from .test_cli import run_cli


def test_a_query_naming_a_capability_gets_it_first(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    answer = client.discover("use stripe-refund for this", min_version=report.index_version)

    assert answer.ids[0] == "tool:stripe-refund"


def test_a_chained_request_gets_a_capability_for_each_part(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    answer = client.discover(
        "Open a pull request on GitHub for the fix. Then post a message "
        "to the team's Slack channel with the link.",
        min_version=report.index_version,
    )

    assert {"tool:github-create-pull-request", "tool:slack-post-message"} <= set(answer.ids)


def test_nothing_fits_is_said_instead_of_padding_the_list(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    answer = client.discover(
        "zebra xylophone quartz",
        min_version=report.index_version,
        options={"abstain_threshold": 0.95},
    )

    assert answer.abstained and answer.ids == []
    assert "No registered capability fits" in answer.context


def test_per_call_options_change_the_answer_size(
    stack: Stack, client: Client, registry: Path, tenant: str
) -> None:
    report = publish(stack.url, registry, tenant)

    answer = client.discover(
        "send a message",
        min_version=report.index_version,
        options={"tier1_top_k": 2, "tier1_min_relevance": 0.0},
    )

    assert len(answer.ids) == 2


def test_cli_discover_shows_the_three_tiers(stack: Stack, registry: Path, tenant: str) -> None:
    report = publish(stack.url, registry, tenant)

    result = run_cli(
        "discover",
        "open a pull request",
        "--tenant",
        tenant,
        "--min-version",
        str(report.index_version),
        env=stack.env,
    )

    assert result.returncode == 0, result.stderr
    for tier in ("── tier 0", "── tier 1", "── tier 2"):
        assert tier in result.stdout
    assert "github-create-pull-request" in result.stdout
