"""The ``capdisc`` command starts without the heavy modules it does not use (lazy imports).

Behavioural, never timed: each case runs in a fresh interpreter and looks at what it imported.
``benchmarks/cli_startup.py`` measures the time.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from capdisc.agents.formats import TOOL_FORMATS
from capdisc.registry.flags import FLAG_STATES, POLICIES
from capdisc_producers import cli

#: Modules that cost start-up and that neither `capdisc --help` nor `--version` needs.
HEAVY = (
    "numpy",
    "redis",
    "redis.asyncio",
    "structlog",
    "pydantic",
    "jwt",
    "celery",
    "capdisc.client",
    "capdisc.settings",
    "capdisc.discovery.engine",
    "capdisc.registry.poisoning",
    "capdisc_producers.bench_cli",
    "capdisc_producers.token_cli",
    "capdisc_producers.stack",
)

#: Prints, as the interpreter exits, which of the modules in argv[1] (JSON) were imported.
REPORT = (
    "import atexit, json, sys\n"
    "watched = json.loads(sys.argv.pop(1))\n"
    "atexit.register(lambda: print(json.dumps([m for m in watched if m in sys.modules]),"
    " file=sys.stderr))\n"
)


def loaded(code: str, *argv: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``modules`` a fresh interpreter running ``code`` (with ``argv``) imported."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT + code, json.dumps(modules), *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    found: list[str] = json.loads(done.stderr.strip().splitlines()[-1])
    return found


def test_importing_the_command_loads_no_heavy_module() -> None:
    assert loaded("import capdisc_producers.cli") == []


@pytest.mark.parametrize("option", ["--help", "--version"])
def test_help_and_version_load_no_heavy_module(option: str) -> None:
    code = "from capdisc_producers.launcher import main\nsys.argv[0] = 'capdisc'\nmain()"
    assert loaded(code, option) == []


def test_the_client_loads_neither_the_token_library_nor_status_nor_sessions() -> None:
    modules = ("jwt", "capdisc.status", "capdisc.sessions.store", "numpy")
    assert loaded("import capdisc.client", modules=modules) == []


@pytest.mark.parametrize("name", sorted(cli.LAZY_COMMANDS))
def test_a_lazy_command_is_listed_with_its_own_help(name: str) -> None:
    module, attribute, help_text = cli.LAZY_COMMANDS[name]
    command = getattr(importlib.import_module(module), attribute)
    assert " ".join(command.help.split()) == help_text


def test_the_choices_spelt_out_in_the_command_match_their_sources() -> None:
    assert (
        tuple(TOOL_FORMATS),
        tuple(FLAG_STATES),
        tuple(POLICIES),
    ) == (cli.TOOL_FORMATS, cli.FLAG_STATES, cli.POLICIES)
