"""The agent's lifecycle, one state at a time (the same states as the TypeScript SDK's)::

    initialized ─start()─▶ starting ─registered─▶ running ─drain()/stop()/signal/daemon drain─▶ draining
                                                     ▲                                            │
                                                     └───────── undrained by the daemon ──────────┤
                         in-flight finished (or given back at the deadline), reported: the daemon's
                         drain pauses ─▶ paused ─undrained─▶ running; the process's own goes on ─▶ drained
                                                  stopped ◀─deregistered, connections closed─ drained
    any state but stopped ─unrecoverable error─▶ failed

Losing the daemon is not a state: the agent keeps its state and reconnects.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, List, Optional, Tuple

NEXT: Dict[str, Tuple[str, ...]] = {
    "initialized": ("starting", "stopped"),
    "starting": ("running", "draining", "failed", "stopped"),
    "running": ("draining", "failed"),
    "draining": ("running", "paused", "drained", "failed"),
    "paused": ("running", "drained", "failed"),
    "drained": ("stopped", "failed"),
    "stopped": (),
    "failed": (),
}


def is_terminal(state: str) -> bool:
    return state in ("stopped", "failed")


class Lifecycle:
    def __init__(self) -> None:
        self._state = "initialized"
        self._cond = threading.Condition()
        self._listeners: List[Callable[[str, str], None]] = []

    @property
    def state(self) -> str:
        return self._state

    def on_change(self, fn: Callable[[str, str], None]) -> None:
        self._listeners.append(fn)

    def to(self, next_: str) -> bool:
        """Moves to ``next_``; False (and nothing changes) when that is not a transition from here."""
        with self._cond:
            prev = self._state
            if next_ not in NEXT[prev]:
                return False
            self._state = next_
            self._cond.notify_all()
        for fn in self._listeners:
            fn(next_, prev)
        return True

    def wait_for(self, pred: Callable[[str], bool], timeout: Optional[float] = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: pred(self._state), timeout)
