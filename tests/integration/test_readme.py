"""Every command in README.md runs as written, from the repository directory, against a stack
this module starts (``capdisc up`` in a project of its own, found through ``CAPDISC_STACK``,
as a second terminal finds the one ``make up`` runs).

The shell commands are the lines of the fenced blocks that start with ``$ `` (the tour; the
other lines there are output), and every line of a fenced block that holds commands only. The
Python blocks run whole. JSON and YAML blocks are configuration, and the architecture diagram
is no command. What is not run is listed in :data:`SKIPPED` with the reason, and each shows as
a skipped test with it; a command added to the README is run unless it is listed there.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .conftest import ROOT
from .upstack import UpProcess, running_up

README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"
#: How a line of a fenced block that holds commands starts.
COMMAND_START = re.compile(r"(make|pip|capdisc|\.venv/bin/\S+|[A-Z_]+=\S*) ")

SYNOPSIS = "a synopsis: its capitals (DIR, FILE, ID, T, ...) and [options] are placeholders"
LONG_RUNNING = "runs until stopped (Ctrl-C)"
SKIPPED = {
    "make up": "long-running: the stack itself, which this module starts as `capdisc up`",
    "make test": "runs the whole suite, this test among it",
    "make unit": "runs the unit tests (the suite runs them)",
    "make lint": "lints the tree (CI runs it before the tests)",
    "make format": "rewrites the tree's files",
    "make bench": "runs every benchmark: tens of minutes, figures printed, never asserted",
    "pip install capdisc": "installs from PyPI: a network service, and changes the environment",
    "pip install 'capdisc[workers]'": "installs from PyPI: a network service",
    "pip install 'capdisc[workers,mcp]'": "installs from PyPI: a network service",
    "pip install 'capdisc[all]'": "installs from PyPI: a network service",
    ".venv/bin/capdisc watch examples/registry/finance --tenant acme": LONG_RUNNING,
    ".venv/bin/capdisc import mcp --url http://127.0.0.1:8000/mcp": (
        "needs a live MCP server at that URL (the same import over stdio runs)"
    ),
    "capdisc publish DIR": SYNOPSIS,
    "capdisc watch DIR": SYNOPSIS,
    "capdisc import jsonl FILE [--source S]": SYNOPSIS,
    "capdisc import mcp --url URL | --command CMD": SYNOPSIS,
    "capdisc delete ID... | --source S": SYNOPSIS,
    "capdisc reindex ID... | --source S": SYNOPSIS,
    "capdisc reindex --all [--fresh]": SYNOPSIS,
    "capdisc reconcile [--json]": SYNOPSIS,
    "capdisc dlq list | dlq replay ID... | --all": SYNOPSIS,
    "capdisc status [--json]": SYNOPSIS,
    'capdisc discover "post a message to slack" --session run-42 [--profile billing]': SYNOPSIS,
    "capdisc session show run-42 [--json]": SYNOPSIS,
    "capdisc session watch run-42 [--json] [--count N]": SYNOPSIS
    + "; and it follows until stopped",
    'capdisc session call run-42 tool:slack-post-message --args \'{"text": "hi"}\' [--json]': (
        SYNOPSIS
    ),
    "capdisc session export run-42 > s.json && capdisc session import sub-1 s.json": (
        "writes s.json into the working directory, and needs the session the synopsis above it "
        "starts"
    ),
    'OPENAI_API_KEY=... .venv/bin/python examples/agent_openai.py --model M "tell #releases '
    'the deploy is done"': "needs OpenAI's API (tests/integration/test_examples.py runs it "
    "against a scripted model server)",
    'ANTHROPIC_API_KEY=... .venv/bin/python examples/agent_anthropic.py --model M "..."': (
        "needs Anthropic's API (tests/integration/test_examples.py runs it against a scripted "
        "model server)"
    ),
    "capdisc mcp [--tenant T] [--profile P] [--stack DIR]": SYNOPSIS + "; and a server",
    "capdisc mcp --http 8765 [--host 127.0.0.1]": SYNOPSIS + "; and a server",
    "capdisc flags list --tenant T [--json]": SYNOPSIS,
    "capdisc approve tool:x --tenant T [--surface HASH]": SYNOPSIS,
    "capdisc policy set quarantine --tenant T": SYNOPSIS,
    ".venv/bin/capdisc bench retrieval --tools T.jsonl --queries Q.jsonl [--sample N] "
    "[--no-abstain] [--json]": SYNOPSIS,
    ".venv/bin/capdisc bench tokens (--tools T.jsonl | --registry DIR) [--queries Q.jsonl]": (
        SYNOPSIS
    ),
    # Python blocks, by a line of theirs
    "for event in client.watch_session(": "follows the session's events and never ends",
}


@dataclass(frozen=True)
class Snippet:
    """A shell command or a Python block of README.md."""

    kind: str  # "shell" or "python"
    text: str
    line: int

    @property
    def skipped(self) -> str | None:
        if self.kind == "shell":
            return SKIPPED.get(self.text)
        return next((why for key, why in SKIPPED.items() if key in self.text), None)


def without_comment(line: str) -> str:
    """``line`` without its shell comment (a ``#`` after a blank, outside quotes)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def snippets() -> list[Snippet]:
    text = README.read_text(encoding="utf-8")
    found = []
    for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        language, body = block.group(1), block.group(2)
        first_line = text[: block.start()].count("\n") + 2
        if language == "python":
            found.append(Snippet("python", body, first_line))
            continue
        if language not in ("", "sh", "shell", "bash", "console"):
            continue
        lines = body.splitlines()
        prompted = any(line.startswith("$ ") for line in lines)
        for offset, line in enumerate(lines):
            if prompted and not line.startswith("$ "):
                continue  # output
            command = without_comment(line.removeprefix("$ "))
            if command and (prompted or COMMAND_START.match(command)):
                found.append(Snippet("shell", command, first_line + offset))
    return found


SNIPPETS = snippets()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    """One ``capdisc up`` (auth on, as ``make up``) in a project of its own; stopped, with
    every child, at the end of the module."""
    if not (VENV_BIN / "capdisc").exists():
        pytest.skip(f"the README's commands run {VENV_BIN}/capdisc, which `make` installs")
    with running_up(tmp_path_factory.mktemp("project")) as process:
        yield process


def readme_env(up: UpProcess) -> dict[str, str]:
    """A terminal beside ``make up``'s: no capdisc settings of the test's, the stack named by
    ``CAPDISC_STACK``, and ``.venv/bin`` on the PATH (``source .venv/bin/activate``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPDISC_")}
    env["CAPDISC_STACK"] = str(up.project)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


def test_the_readme_has_commands_to_run() -> None:
    assert sum(s.skipped is None for s in SNIPPETS) >= 10


def test_every_skipped_command_is_still_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    listed = {s.text for s in SNIPPETS if s.kind == "shell"}
    assert [k for k in SKIPPED if k not in listed and k not in text] == []


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"line{s.line}" for s in SNIPPETS])
def test_a_readme_command_runs_as_written(up: UpProcess, snippet: Snippet) -> None:
    if snippet.skipped:
        pytest.skip(f"README.md:{snippet.line}: {snippet.skipped}")
    argv = (
        [str(VENV_BIN / "python"), "-c", snippet.text]
        if snippet.kind == "python"
        else ["bash", "-c", snippet.text]
    )
    done = subprocess.run(
        argv, cwd=ROOT, env=readme_env(up), capture_output=True, text=True, timeout=300
    )

    assert done.returncode == 0, f"README.md:{snippet.line}: {snippet.text}\n{done.stderr}"
