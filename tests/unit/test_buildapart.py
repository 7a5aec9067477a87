"""The poisoning policy a child build serves a tenant under: the same as its worker's."""

from __future__ import annotations

import pytest

from capdisc_workers.buildapart import policy_of


@pytest.mark.parametrize(
    ("stored", "default", "expected"),
    [
        (None, "warn", "warn"),
        ("quarantine", "warn", "quarantine"),
        ("warn", "quarantine", "warn"),
        ("not-a-policy", "warn", "quarantine"),
    ],
)
def test_the_policy_is_the_stored_one_else_the_default_and_unreadable_quarantines(
    stored: str | None, default: str, expected: str
) -> None:
    assert policy_of(stored, default) == expected  # type: ignore[arg-type]
