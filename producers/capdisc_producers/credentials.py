"""The secrets of the embedded stack, under ``.capdisc/secrets/`` (0700; every file 0600, made
so again at every ``capdisc up``, which says so):

* ``auth_keys.json`` - the keyring identity tokens are signed and verified with (made at the
  first ``capdisc up``, kept; ``capdisc token keygen`` adds keys);
* ``admin.token`` - a token with the ``admin`` grant for every tenant, issued at each ``up``
  for the CLI run in the project (as ``stack.json`` tells it where Redis is);
* ``redis.password`` - the password of the stack's own redis-server (made once, kept).

``stack.json`` names these files and never holds a secret itself.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from capdisc.stackfile import read_secret

# identity.auth (PyJWT, cryptography) is imported where a key or a token is made: a command
# that only reads secret files starts without it.
if TYPE_CHECKING:
    from capdisc.identity import auth

__all__ = ["StackSecrets", "find_keys_file", "read_secret"]

SECRETS_DIR = "secrets"
KEYS_FILE = "auth_keys.json"
TOKEN_FILE = "admin.token"
PASSWORD_FILE = "redis.password"
#: How long the admin token ``up`` writes stays valid (a new one is written at every start).
ADMIN_TOKEN_TTL_S = 30 * 86400


@dataclass(frozen=True)
class StackSecrets:
    """The secret files of one stack's state directory."""

    directory: Path

    @classmethod
    def under(cls, state_dir: Path) -> StackSecrets:
        return cls(state_dir / SECRETS_DIR)

    @property
    def keys_file(self) -> Path:
        return self.directory / KEYS_FILE

    @property
    def token_file(self) -> Path:
        return self.directory / TOKEN_FILE

    @property
    def password_file(self) -> Path:
        return self.directory / PASSWORD_FILE

    def tighten(self) -> list[str]:
        """Make the directory (0700) and each secret file in it (0600) private again where
        group or others may read them (a copy, an archive, a chmod); what was changed, each
        saying what to do."""
        notices = []
        for path, private in [(self.directory, 0o700), *((f, 0o600) for f in self._files())]:
            mode = path.stat().st_mode & 0o777 if path.exists() else 0
            if mode & 0o077:
                path.chmod(private)
                notices.append(
                    f"{path} was open to other users (mode {mode:04o}); made it {private:04o}. "
                    "If someone else may have read it, replace it: remove it, and the next "
                    "capdisc up makes a new one"
                )
        return notices

    def _files(self) -> list[Path]:
        return [self.keys_file, self.token_file, self.password_file]

    def ensure_keyring(self, now: float) -> auth.Keyring:
        """The keyring, made with one fresh key when there is none yet."""
        from capdisc.identity import auth

        if self.keys_file.exists():
            return auth.load_keyring(self.keys_file)
        keyring = auth.Keyring([auth.new_key(now)])
        auth.save_keyring(self.keys_file, keyring)
        return keyring

    def ensure_password(self) -> str:
        """The Redis password, made (192 random bits, hex: URL-safe) when there is none yet."""
        password = read_secret(self.password_file)
        if password:
            return password
        password = secrets.token_hex(24)
        from capdisc.identity import auth

        auth.write_private(self.password_file, password + "\n")
        return password

    def write_admin_token(self, keyring: auth.Keyring, now: float) -> str:
        from capdisc.identity import auth

        token = auth.issue(
            keyring,
            tenant=auth.ALL_TENANTS,
            user="admin",
            grants=["admin"],
            ttl_s=ADMIN_TOKEN_TTL_S,
            now=now,
        )
        auth.write_private(self.token_file, token + "\n")
        return token


def find_keys_file(start: Path) -> Path | None:
    """The stack's keyring in ``start`` or a parent directory (running or not)."""
    for directory in (start, *start.parents):
        path = StackSecrets.under(directory / ".capdisc").keys_file
        if path.is_file():
            return path
    return None
