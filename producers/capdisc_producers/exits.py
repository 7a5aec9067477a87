"""The exit codes of the ``capdisc`` command, and the "Exit status" section of each command's
help that says what they mean for that command.

* 0: success.
* 1: the operation failed, or it named something capdisc does not hold (an id, a session, a
  source, a tenant, a profile, a key); what could be done for the other names was done.
* 2: a usage error, or the command could not run at all: no stack found, Redis unreachable, a
  token refused, workers that did not answer in time.
"""

from __future__ import annotations

import textwrap

OK = 0
FAILED = 1
TROUBLE = 2

#: What exit status 2 means for most commands.
COULD_NOT_RUN = (
    "a usage error, or the command could not run: no stack found, Redis unreachable, a token "
    "refused, workers that did not answer in time"
)
#: What exit status 2 means for a command that needs no stack.
USAGE_ONLY = "a usage error, or a file or setting it needs is missing or broken"
#: The width of the section's lines, so that it reads the same in any terminal.
WIDTH = 78


def exit_status(failed: str | None, trouble: str = COULD_NOT_RUN, ok: str = "success") -> str:
    """A command's "Exit status" help section (a click epilog, kept line by line): what 0, 1
    (left out when ``failed`` is None: the command never fails that way) and 2 mean."""
    lines = ["\b", "Exit status:", *_meaning(OK, ok)]
    if failed is not None:
        lines += _meaning(FAILED, failed)
    return "\n".join([*lines, *_meaning(TROUBLE, trouble)])


def _meaning(code: int, text: str) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=f"  {code}  ", subsequent_indent=" " * 5, break_on_hyphens=False
    )
