"""Sessions in process memory: the same policy as the Redis-backed
:class:`capdisc.sessions.service.SessionService`, for tests, benchmarks and single-process use.
Not shared between processes and not durable."""

from __future__ import annotations

import time
from collections.abc import Callable

from capdisc.sessions import policy as policy_fns
from capdisc.sessions.policy import SessionPolicy, SessionState, SessionView, Turn


class InMemorySessions:
    """Binds discovery turns to sessions kept in a dict, keyed by tenant and session id."""

    def __init__(
        self, policy: SessionPolicy, clock: Callable[[], int] = lambda: int(time.time() * 1000)
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.states: dict[tuple[str, str], SessionState] = {}

    def after_discovery(self, turn: Turn) -> SessionView:
        now = self.clock()
        key = (turn.tenant, turn.session)
        state = self.states.get(key) or policy_fns.new_session(turn.session, turn.profile, now)
        state, _events, outcome = policy_fns.after_discovery(state, turn.found, now, self.policy)
        self.states[key] = state
        return SessionView.from_outcome(outcome)
