"""The operations side of the ``capdisc`` command that needs no stack: ``--version``, the exit
codes every command's help documents, the ``status --check`` verdict on heartbeats, how
``status`` shows what each discovery worker serves and the snapshots it wrote, and how delete
and reindex outcomes are worded."""

from __future__ import annotations

import json
import os
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from capdisc.client import Answer
from capdisc.errors import AuthError, ConfigError
from capdisc.identity import auth
from capdisc.status import health_failures
from capdisc_producers.cli import (
    _behind_warning,
    _parse_options,
    _redis_down_hint,
    _render_answer,
    cli,
)
from capdisc_producers.credentials import StackSecrets
from capdisc_producers.exits import exit_status
from capdisc_producers.registry_cli import Verbs, _outcome_verb
from capdisc_producers.status_cli import _ago, _render_status, _snapshot_lines, _versions


def test_version_prints_the_installed_package_version_and_exits_0() -> None:
    result = CliRunner().invoke(cli, ["--version"])

    assert result.exit_code == 0
    assert result.output == f"capdisc {metadata.version('capdisc')}\n"


def leaf_commands(group: click.Group, path: str = "capdisc") -> list[tuple[str, click.Command]]:
    found: list[tuple[str, click.Command]] = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += leaf_commands(command, f"{path} {name}")
        else:
            found.append((f"{path} {name}", command))
    return found


@pytest.mark.parametrize(("path", "command"), leaf_commands(cli), ids=lambda v: str(v))
def test_every_command_documents_its_exit_codes(path: str, command: click.Command) -> None:
    with click.Context(command, info_name=path) as ctx:
        text = command.get_help(ctx)

    section = text[text.index("Exit status:") :]
    assert "  0  " in section and "  2  a usage error" in section, path
    assert all(len(line) <= 80 for line in section.splitlines()), path


def test_the_exit_status_section_keeps_its_lines_and_leaves_out_an_unused_code() -> None:
    text = exit_status(None, "a usage error", ok="stopped when asked")

    assert text.splitlines() == [
        "\b",
        "Exit status:",
        "  0  stopped when asked",
        "  2  a usage error",
    ]


def test_a_long_meaning_wraps_under_its_code() -> None:
    lines = exit_status("word " * 40).splitlines()

    assert lines[3].startswith("  1  word")
    assert lines[4].startswith("     word")


def heartbeat(kind: str) -> dict[str, str]:
    return {"id": f"{kind}@host:1", "kind": kind}


def test_a_stack_with_a_live_worker_of_each_kind_passes_the_check() -> None:
    assert health_failures([heartbeat("discovery"), heartbeat("indexing")], 10.0) == []


def test_each_missing_kind_of_worker_is_one_failed_check_saying_how_to_start_one() -> None:
    failed = health_failures([heartbeat("indexing")], 2.5)

    assert len(failed) == 1
    assert failed[0].startswith("discovery workers: none live (no heartbeat within 2.5 s)")
    assert "python -m capdisc_workers.discovery" in failed[0]
    assert [f.split(":")[0] for f in health_failures([], 10.0)] == [
        "discovery workers",
        "indexing workers",
    ]


DELETE = Verbs("delete", "deleted", "absent", "nothing to delete")


@pytest.mark.parametrize(
    ("decision", "said"),
    [
        ("delete", "deleted"),
        ("absent", "not found, nothing to delete"),
        ("refused_owned", "refused"),
        ("stale", "not deleted (stale)"),
    ],
)
def test_each_outcome_of_a_delete_is_worded_by_its_decision(decision: str, said: str) -> None:
    assert _outcome_verb(decision, DELETE) == said


def test_retiring_a_key_the_keyring_lacks_exits_1_and_changes_nothing(tmp_path: Path) -> None:
    keys_file = tmp_path / "auth_keys.json"
    runner = CliRunner()
    assert runner.invoke(cli, ["token", "keygen", "--keys", str(keys_file)]).exit_code == 0
    before = keys_file.read_text()

    result = runner.invoke(cli, ["token", "retire", "k-nope", "--keys", str(keys_file)])

    assert result.exit_code == 1
    assert f"error: {keys_file} has no key 'k-nope'" in result.output
    assert keys_file.read_text() == before


def test_a_keyring_that_cannot_be_written_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    keys_file = tmp_path / "a-file" / "auth_keys.json"  # its directory is a file

    result = CliRunner().invoke(cli, ["token", "keygen", "--keys", str(keys_file)])

    assert isinstance(result.exception, ConfigError)  # the command's main() exits 2 with it
    assert f"cannot write {keys_file}" in str(result.exception)


def test_revoking_a_token_read_from_stdin_stops_it_verifying_and_only_it(tmp_path: Path) -> None:
    keys_file = tmp_path / "auth_keys.json"
    auth.save_keyring(keys_file, auth.Keyring([auth.new_key(time.time())]))
    keyring = auth.load_keyring(keys_file)
    revoked, kept = (
        auth.issue(keyring, tenant="acme", ttl_s=600, now=time.time()) for _ in range(2)
    )
    keys = ["--keys", str(keys_file)]

    result = CliRunner().invoke(cli, ["token", "revoke", "-", *keys], input=revoked + "\n")
    again = CliRunner().invoke(cli, ["token", "revoke", revoked, *keys])

    assert result.exit_code == 0, result.output
    assert f"revoked token {auth.peek(revoked)['jti']} of anonymous@acme" in result.output
    with pytest.raises(AuthError, match="revoked"):
        auth.verify(revoked, auth.load_keyring(keys_file), time.time())
    assert auth.verify(kept, auth.load_keyring(keys_file), time.time()).tenant == "acme"
    assert again.exit_code == 0 and "already revoked" in again.output


def test_revoking_a_token_another_keyring_signed_exits_1_and_changes_nothing(
    tmp_path: Path,
) -> None:
    keys_file = tmp_path / "auth_keys.json"
    auth.save_keyring(keys_file, auth.Keyring([auth.new_key(time.time())]))
    before = keys_file.read_text()
    stranger = auth.issue(
        auth.Keyring([auth.new_key(time.time())]), tenant="acme", ttl_s=600, now=time.time()
    )

    result = CliRunner().invoke(cli, ["token", "revoke", stranger, "--keys", str(keys_file)])

    assert result.exit_code == 1
    assert f"{keys_file} cannot revoke this token" in result.output
    assert keys_file.read_text() == before


def test_retiring_the_key_of_the_stacks_admin_token_issues_that_token_again(
    tmp_path: Path,
) -> None:
    stack = StackSecrets.under(tmp_path / ".capdisc")
    old = stack.ensure_keyring(time.time())
    stack.write_admin_token(old, time.time())
    runner = CliRunner()
    keys = ["--keys", str(stack.keys_file)]
    assert runner.invoke(cli, ["token", "keygen", *keys]).exit_code == 0

    result = runner.invoke(cli, ["token", "retire", old.kids[0], *keys])

    assert result.exit_code == 0, result.output
    keyring = auth.load_keyring(stack.keys_file)
    admin = auth.verify(stack.token_file.read_text().strip(), keyring, time.time())
    assert admin.allows("admin") and admin.kid != old.kids[0]
    assert "issued the stack's admin token" in result.output


@pytest.mark.parametrize(
    ("worker", "shown"),
    [
        ({"versions": {"acme": 12}}, "acme@12"),
        (
            {"versions": {"acme": 12, "beta": 3}, "searches": {"acme": "graph"}},
            "acme@12 (graph), beta@3",
        ),
        ({"versions": {"acme": 12}, "searches": {"acme": "exact"}}, "acme@12"),
        (
            {
                "versions": {"acme": 12, "beta": 3},
                "searches": {"acme": "graph"},
                "loaded_from": {"acme": "snapshot", "beta": "redis"},
            },
            "acme@12 (graph, from a snapshot), beta@3",
        ),
        (
            {"versions": {"acme": 12}, "loaded_from": {"acme": "snapshot"}},
            "acme@12 (from a snapshot)",
        ),
        ({}, "nothing yet"),
    ],
)
def test_status_names_each_tenants_version_where_the_graph_serves_and_snapshot_loads(
    worker: dict[str, Any], shown: str
) -> None:
    assert _versions(worker) == shown


def written(version: int, age_s: float, megabytes: float) -> dict[str, float]:
    """A heartbeat's record of a snapshot written ``age_s`` ago."""
    return {
        "index_version": version,
        "written_at_unix_s": time.time() - age_s,
        "megabytes": megabytes,
        "took_s": 0.4,
    }


@pytest.mark.parametrize(
    ("snapshots", "shown"),
    [
        (None, []),  # no snapshot_dir (or an indexing worker): nothing said
        ({}, ["  discovery@host:1: no snapshot written yet (snapshot_dir set)"]),
        (
            {"acme": (42, 185, 12.5)},
            ["  discovery@host:1: snapshot of acme v42 written 3 min ago (12.5 MB)"],
        ),
        (
            {"beta": (3, 7_300, 449), "acme": (42, 20, 0.4)},
            [
                "  discovery@host:1: snapshot of acme v42 written 20 s ago (0.4 MB)",
                "  discovery@host:1: snapshot of beta v3 written 2 h ago (449.0 MB)",
            ],
        ),
    ],
)
def test_status_shows_each_snapshot_a_worker_wrote_or_that_it_wrote_none_yet(
    snapshots: dict[str, tuple[int, float, float]] | None, shown: list[str]
) -> None:
    """``snapshots``: per tenant, the version, age in seconds and size of its snapshot."""
    worker: dict[str, Any] = {"id": "discovery@host:1", "kind": "discovery"}
    if snapshots is not None:  # made now: an age is counted from when the test runs
        worker["snapshots"] = {tenant: written(*made) for tenant, made in snapshots.items()}

    assert _snapshot_lines(worker) == shown


@pytest.mark.parametrize("wrote_before", [False, True])
def test_status_says_a_worker_s_last_snapshot_write_failed_and_why(wrote_before: bool) -> None:
    error = "OSError: [Errno 28] No space left on device"
    worker: dict[str, Any] = {
        "id": "discovery@host:1",
        "kind": "discovery",
        "snapshots": {"acme": written(41, 400, 12.5)} if wrote_before else {},
        "snapshots_failed": {
            "acme": {"index_version": 42, "failed_at_unix_s": time.time() - 185, "error": error}
        },
    }

    lines = _snapshot_lines(worker)

    assert lines[-1] == (
        f"  discovery@host:1: snapshot of acme v42 FAILED 3 min ago: {error} (the worker serves "
        "on; a restart loads from Redis until one is written: check the snapshot_dir's free "
        "space and permissions, the next change retries)"
    )
    assert len(lines) == 1 + wrote_before
    assert not any("no snapshot written yet" in line for line in lines)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-4, "0 s"),  # a worker's clock ahead of ours
        (0, "0 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (3_599, "59 min"),
        (3_600, "1 h"),
        (86_399, "23 h"),
        (2 * 86_400 + 5, "2 d"),
    ],
)
def test_an_age_is_shown_in_its_largest_whole_unit(seconds: float, shown: str) -> None:
    assert _ago(seconds) == shown


def test_the_snapshot_lines_follow_the_workers_line_of_the_status() -> None:
    report = {
        "tenants": {},
        "workers": [
            {
                "id": "discovery@host:1",
                "kind": "discovery",
                "versions": {"acme": 42},
                "snapshots": {"acme": written(42, 185, 12.5)},
            },
            {"id": "discovery@host:2", "kind": "discovery", "snapshots": {}},
            {"id": "indexing@host", "kind": "indexing"},
        ],
        "queues": {"indexing": 0},
        "pending_events": 0,
        "dead_letters": 0,
        "embedding_calls": 0,
    }

    lines = _render_status(report).splitlines()

    at = lines.index(
        "workers: discovery@host:1 (serving acme@42), discovery@host:2 (serving nothing yet), "
        "indexing@host"
    )
    assert lines[at + 1 : at + 3] == [
        "  discovery@host:1: snapshot of acme v42 written 3 min ago (12.5 MB)",
        "  discovery@host:2: no snapshot written yet (snapshot_dir set)",
    ]
    assert lines[at + 3].startswith("queues: ")


@pytest.mark.parametrize(
    ("model_ms", "says"),
    [
        (4.7, "7.0 ms in discovery@h:1 (the model 4.7 ms)"),
        (0.0, "7.0 ms in discovery@h:1\n"),
    ],
    ids=["fresh: the model's share shown", "cached: no model time"],
)
def test_a_discover_answer_says_how_much_of_its_time_was_the_model(
    model_ms: float, says: str
) -> None:
    answer = Answer("q", "acme", 3, [], "", worker="discovery@h:1", took_ms=7.0, model_ms=model_ms)

    assert says in _render_answer(answer) + "\n"


@pytest.mark.parametrize(
    ("served", "asked", "warned"),
    [(7, 0, False), (7, 7, False), (9, 7, False), (6, 7, True)],
)
def test_an_answer_older_than_the_version_asked_for_is_warned_about(
    served: int, asked: int, warned: bool
) -> None:
    warning = _behind_warning(served, asked)

    assert (warning is not None) == warned
    if warning:
        assert f"index version {asked} was not served in time" in warning
        assert f"from version {served}" in warning


def test_up_refuses_a_registry_directory_that_does_not_exist_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    result = CliRunner().invoke(cli, ["up", "--registry", "no-such-registry"])

    assert result.exit_code == 2
    assert "Directory 'no-such-registry' does not exist" in result.output
    assert not (tmp_path / ".capdisc").exists()


def test_a_redis_url_of_another_scheme_is_refused_naming_what_to_give() -> None:
    result = CliRunner().invoke(cli, ["discover", "x", "--redis-url", "notaurl"])

    assert result.exit_code != 0
    assert isinstance(result.exception, ConfigError)
    assert "give redis://HOST:PORT/DB with --redis-url" in str(result.exception)


def test_reindex_without_ids_source_or_all_names_all_three() -> None:
    result = CliRunner().invoke(cli, ["reindex"])

    assert result.exit_code == 2
    assert "give capability ids, --source, or --all" in result.output


def test_status_says_a_supervised_worker_alive_without_a_heartbeat_serves_nothing() -> None:
    report = {
        "tenants": {},
        "workers": [{"id": "indexing@host:8", "kind": "indexing", "pid": 8}],
        "supervised": {
            "discovery": {"pid": 7, "alive": True, "restarts": 0},
            "indexing": {"pid": 8, "alive": True, "restarts": 0},
            "redis": {"pid": 9, "alive": True, "restarts": 0},
        },
        "queues": {"discovery_requests": 2},
        "pending_events": 0,
        "dead_letters": 0,
        "embedding_calls": 0,
    }

    silent = [line for line in _render_status(report).splitlines() if "no recent heartbeat" in line]

    assert len(silent) == 1 and silent[0].startswith("  discovery pid 7 is running")
    assert "`kill -CONT 7`" in silent[0] and "`kill -9 7`" in silent[0]


@pytest.mark.parametrize(
    ("children", "says"),
    [
        (None, "is the stack running? (make up)"),
        ({"indexing": 2}, "is down and being restarted: try again in a few seconds"),
        ({"indexing": 2, "redis": 3}, "is running: is this its Redis?"),
    ],
    ids=["no stack", "the stack's redis down", "the stack's redis up"],
)
def test_an_unreachable_redis_is_explained_by_the_stack_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, children: dict[str, int] | None, says: str
) -> None:
    if children is not None:
        (tmp_path / ".capdisc").mkdir()
        stack = {"redis_url": "redis://127.0.0.1:1/0", "pid": os.getpid(), "children": children}
        (tmp_path / ".capdisc" / "stack.json").write_text(json.dumps(stack))
    monkeypatch.setenv("CAPDISC_STACK", str(tmp_path))

    assert says in _redis_down_hint()


@pytest.mark.parametrize(
    ("count", "held", "dropped", "shown"),
    [
        (0, 0, 0, "dead letters 0;"),
        (3, 1_500_000, 0, "dead letters 3 (1.5 MB);"),
        (2, 2_000, 40, "dead letters 2 (2000 bytes, 40 older dropped);"),
        (0, 0, 7, "dead letters 0 (7 older dropped);"),
    ],
)
def test_status_says_what_the_dead_letters_hold_and_how_many_were_dropped(
    count: int, held: int, dropped: int, shown: str
) -> None:
    report = _quiet_status(dead_letters=count, dead_letter_bytes=held, dead_letters_dropped=dropped)

    assert shown in _render_status(report)


@pytest.mark.parametrize(
    ("deferred", "shown"),
    [
        (0, "0 s ago: 5000 reindexed, 2 orphan vectors dropped"),
        (2952, "0 s ago: 5000 reindexed (2952 of them sent as the window drains), 2 orphan"),
    ],
)
def test_status_says_how_much_of_the_last_repair_waits_for_the_window(
    deferred: int, shown: str
) -> None:
    report = _quiet_status(
        last_reconcile={
            "at_ms": time.time() * 1000 + 5_000,  # never "1 s ago" on a slow run
            "missing_vectors": 5000,
            "orphan_vectors": 2,
            "reindex_deferred": deferred,
        }
    )

    assert shown in _render_status(report)


@pytest.mark.parametrize(("tasks", "said"), [(0, False), (3, True)])
def test_status_says_how_many_repairs_of_a_tenant_wait_their_turn(tasks: int, said: bool) -> None:
    tenant = {
        "index_version": 4,
        "capabilities": 1,
        "by_kind": {"tool": 1},
        "manifest_errors": {},
        "repair_backlog_tasks": tasks,
    }

    shown = _render_status(_quiet_status(tenants={"acme": tenant}))

    assert ("repairs waiting their turn: 3 tasks of records without a vector" in shown) is said


def _quiet_status(**fields: Any) -> dict[str, Any]:
    """A status report of a stack with no tenant, worker or queued work, but ``fields``."""
    return {
        "index_version": 0,
        "capabilities": 0,
        "by_kind": {},
        "tenants": {},
        "workers": [],
        "queues": {"indexing": 0},
        "pending_events": 0,
        "dead_letters": 0,
        "embedding_calls": 0,
        **fields,
    }


def test_watching_a_session_after_what_is_no_event_id_is_a_usage_error_naming_after() -> None:
    result = CliRunner().invoke(cli, ["session", "watch", "run-42", "--after", "zzz"])

    assert result.exit_code == 2
    assert "Invalid value for '--after': must be an event id" in result.output


@pytest.mark.parametrize("name", ["call", "export", "import", "show", "watch"])
def test_each_session_command_documents_exit_1_for_a_tenant_with_no_registry(name: str) -> None:
    session_group = cli.commands["session"]
    assert isinstance(session_group, click.Group)
    command = session_group.commands[name]
    with click.Context(command, info_name=f"capdisc session {name}") as ctx:
        text = command.get_help(ctx)

    section = " ".join(text[text.index("Exit status:") :].split())
    assert "1 " in section and "the tenant is unknown" in section


def test_the_tenant_option_says_a_tokens_tenant_is_the_default() -> None:
    result = CliRunner().invoke(cli, ["discover", "--help"])

    assert "(default: the token's tenant, else the settings tenant)" in " ".join(
        result.output.split()
    )


DEEP_JSON = "[" * 100_000


@pytest.mark.parametrize("command", ["call", "import"])
def test_json_nested_too_deeply_is_refused_without_a_traceback(
    tmp_path: Path, command: str
) -> None:
    exported = tmp_path / "session.json"
    exported.write_text(DEEP_JSON)
    args = {
        "call": ["session", "call", "run-1", "tool:x", "--args", DEEP_JSON],
        "import": ["session", "import", "run-1", str(exported)],
    }[command]

    result = CliRunner().invoke(cli, args)

    assert result.exit_code == 2, result.exception
    assert "nested too deeply" in result.output


def test_an_option_value_nested_too_deeply_is_passed_on_as_text() -> None:
    assert _parse_options((f"tier1_top_k={DEEP_JSON}",)) == {"tier1_top_k": DEEP_JSON}


WAITING = [(p, c) for p, c in leaf_commands(cli) if any("--timeout" in o.opts for o in c.params)]


@pytest.mark.parametrize("wait", ["0", "-1", "nan"])
@pytest.mark.parametrize(("path", "command"), WAITING, ids=lambda v: str(v))
def test_a_timeout_that_is_no_wait_is_a_usage_error_before_anything_is_sent(
    path: str, command: click.Command, wait: str
) -> None:
    result = CliRunner().invoke(cli, [*path.split()[1:], "--timeout", wait])

    assert result.exit_code == 2, result.output
    assert "Invalid value for '--timeout'" in result.output


@pytest.mark.parametrize(("option", "value"), [("--roles", "a b"), ("--user", " ")])
def test_publish_refuses_a_role_or_user_no_capability_may_name_before_sending(
    tmp_path: Path, option: str, value: str
) -> None:
    result = CliRunner().invoke(cli, ["publish", str(tmp_path), option, value])

    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output


@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_mcp_http_port_out_of_range_is_a_usage_error(port: str) -> None:
    result = CliRunner().invoke(cli, ["mcp", "--http", port])

    assert result.exit_code == 2, result.output
    assert "--http" in result.output and "1<=x<=65535" in result.output
    assert "Traceback" not in result.output
