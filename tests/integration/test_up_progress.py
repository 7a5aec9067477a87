"""The first ``capdisc up`` says what it does and how far along it is while the indexing
workers embed the registry (their acknowledgements, not a spinner)."""

from __future__ import annotations

import re
from collections.abc import Callable

from .upstack import READY, UpProcess
from .upstack import start_up as start_up  # the fixture

LINE = re.compile(r"embedding capabilities: (\d+)/(\d+)")


def test_the_first_start_prints_embedding_progress_up_to_every_capability(
    start_up: Callable[..., UpProcess],
) -> None:
    output = start_up().output()
    before_ready = output[: output.index(READY)]
    counts = [(int(done), int(total)) for done, total in LINE.findall(before_ready)]

    assert "workers started in" in before_ready
    assert counts, output
    assert counts[-1][0] == counts[-1][1] == 98
    assert [done for done, _ in counts] == sorted(done for done, _ in counts)
