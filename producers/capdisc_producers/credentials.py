"""The secrets of the embedded stack, under ``.capdisc/secrets/`` (0700; every file 0600):

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
