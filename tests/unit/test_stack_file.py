"""Finding the running stack from its ``.capdisc/stack.json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capdisc.errors import StackNotFoundError
from capdisc_producers.stack import find_stack, resolve_redis_url


def write_stack_file(project: Path, pid: int) -> None:
    state = project / ".capdisc"
    state.mkdir(parents=True)
    (state / "stack.json").write_text(json.dumps({"redis_url": "redis://127.0.0.1:7/0",
                                                  "pid": pid}))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_stack_file_of_a_running_up_is_found_from_a_subdirectory(tmp_path: Path) -> None:
    write_stack_file(tmp_path, os.getpid())
    (tmp_path / "a" / "b").mkdir(parents=True)

    assert resolve_redis_url(None, {}, tmp_path / "a" / "b") == "redis://127.0.0.1:7/0"


def test_a_stack_file_left_by_a_killed_up_is_not_a_running_stack(tmp_path: Path) -> None:
    write_stack_file(tmp_path, dead_pid())

    assert find_stack(tmp_path) is None
    with pytest.raises(StackNotFoundError):
        resolve_redis_url(None, {}, tmp_path)
