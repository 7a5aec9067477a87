"""``capdisc import mcp`` and ``capdisc publish`` ride out a Redis restart while they wait for the
indexing workers: they say once that Redis is away, resume when it is back, and exit 0 with
everything applied, also when Redis came back without its data (the sync runs again against
the empty registry and sends it all). No indexing worker runs until Redis is back, so the
commands are certainly waiting when Redis goes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from capdisc import keys

from .conftest import EXAMPLES, ROOT
from .private import PrivateStack, private_on_defaults, wait_for

private = private_on_defaults

TENANT = "producers"
SERVER = ROOT / "tests" / "fixtures" / "mcp_weather_server.py"


def cli(private: PrivateStack, *args: str) -> subprocess.Popen[bytes]:
    return private.spawn(
        "cli",
        [
            sys.executable,
            "-m",
            "capdisc_producers.cli",
            *args,
            "--tenant",
            TENANT,
            "--timeout",
            "120",
        ],
    )


def output(private: PrivateStack) -> str:
    return (private.log_dir / "cli.log").read_text(errors="replace")


def restart_while_waiting(private: PrivateStack, *, lose_data: bool) -> None:
    """Once the command sent its events (none can be applied: no worker), restart Redis when
    the command said it waits, and start an indexing worker once it resumed."""
    connection = private.connection()
    wait_for(lambda: connection.hlen(keys.OUTBOX) > 0, 60, "events sent")
    private.stop_redis()
    wait_for(lambda: "redis unavailable" in output(private), 30, "the command noticing")
    private.start_redis(lose_data=lose_data)
    wait_for(lambda: "redis is back" in output(private), 30, "the command resuming")
    private.spawn_indexing()


def finished(private: PrivateStack, process: subprocess.Popen[bytes]) -> str:
    code = process.wait(timeout=120)
    text = output(private)
    assert code == 0, text
    assert text.count("redis unavailable") == 1
    assert "resumed after 1 Redis outage" in text
    return text


def test_import_mcp_waits_through_a_redis_restart_and_reports_everything_applied(
    private: PrivateStack,
) -> None:
    process = cli(private, "import", "mcp", "--command", f"{sys.executable} {SERVER}")

    restart_while_waiting(private, lose_data=False)

    finished(private, process)
    stored = {k.decode() for k in private.connection().hkeys(keys.caps(TENANT))}
    assert stored == {
        "tool:weather-station.get_forecast",
        "tool:weather-station.get_alerts",
        "tool:weather-station.convert_units",
    }


def test_publish_through_a_redis_restart_that_lost_its_data_sends_it_all_again(
    private: PrivateStack, tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    shutil.copytree(EXAMPLES / "developer", registry)
    manifests = len(list(registry.rglob("CAPABILITY.yaml")))
    process = cli(private, "publish", str(registry))

    restart_while_waiting(private, lose_data=True)

    text = finished(private, process)  # the registry it ran again against was empty
    assert f"{manifests} upserted, 0 deleted, 0 unchanged" in text
    assert "applied; index version" in text
    assert private.connection().hlen(keys.caps(TENANT)) == manifests
