"""``capdisc up``'s progress lines while the indexing workers embed what it published."""

from __future__ import annotations

from capdisc_producers.stack import IndexingProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def progress() -> tuple[IndexingProgress, list[str], Clock]:
    said: list[str] = []
    clock = Clock()
    return IndexingProgress(said.append, interval_s=1.0, clock=clock), said, clock


def test_sending_alone_prints_nothing() -> None:
    tracker, said, _clock = progress()
    tracker("sent", 98)

    assert said == []


def test_the_first_acknowledgements_print_a_line_at_once() -> None:
    tracker, said, _clock = progress()
    tracker("sent", 98)
    tracker("applied", 20)

    assert said == ["embedding capabilities: 20/98"]


def test_lines_come_at_most_once_an_interval_and_always_at_the_end() -> None:
    tracker, said, clock = progress()
    tracker("sent", 500)
    tracker("sent", 400)
    for step in range(9):
        clock.now = step * 0.4
        tracker("applied", 100)

    assert said == [
        "embedding capabilities: 100/900",
        "embedding capabilities: 400/900",
        "embedding capabilities: 700/900",
        "embedding capabilities: 900/900",
    ]
