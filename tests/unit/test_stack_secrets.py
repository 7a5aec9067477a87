"""The embedded stack's secret files stay private: ``capdisc up`` makes any that group or
others may read private again, and says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from capdisc_producers.credentials import StackSecrets


def made_secrets(tmp_path: Path) -> StackSecrets:
    secrets = StackSecrets.under(tmp_path / ".capdisc")
    secrets.write_admin_token(secrets.ensure_keyring(time.time()), time.time())
    secrets.ensure_password()
    return secrets


def test_secrets_as_up_makes_them_are_left_alone(tmp_path: Path) -> None:
    secrets = made_secrets(tmp_path)

    assert secrets.tighten() == []
    assert secrets.directory.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("name", "loose", "private"),
    [
        ("redis.password", 0o644, 0o600),
        ("auth_keys.json", 0o640, 0o600),
        ("admin.token", 0o604, 0o600),
        ("", 0o755, 0o700),  # the directory itself
    ],
)
def test_a_secret_open_to_other_users_is_made_private_and_named(
    tmp_path: Path, name: str, loose: int, private: int
) -> None:
    secrets = made_secrets(tmp_path)
    path = secrets.directory / name if name else secrets.directory
    path.chmod(loose)

    (notice,) = secrets.tighten()

    assert path.stat().st_mode & 0o777 == private
    assert notice.startswith(f"{path} was open to other users (mode {loose:04o}); made it")
    assert "replace it" in notice
