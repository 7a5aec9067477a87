"""The installed capdisc's version, for what states it (a snapshot's build fingerprint, the MCP
server's handshake)."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    """The version of the installed ``capdisc`` package, or ``unknown`` run from a source tree."""
    try:
        return metadata.version("capdisc")
    except metadata.PackageNotFoundError:
        return "unknown"
