"""How many items the agent takes beyond its free slots, so that its slots do not sit idle through
a round trip to the daemon and each push carries more (the TypeScript SDK's claim-ahead.ts).

By Little's law the slots finish ``slots × round trip ÷ handler time`` items during one round trip;
that many (at most ``prefetch``) are taken ahead and wait, leased, for a slot. Handlers much slower
than a round trip get nothing ahead, so a slow agent never sits on items another could run. Nothing
is taken ahead until both have been measured.
"""
from __future__ import annotations

import threading
from typing import Optional

#: Weight of the newest sample in the moving averages.
WEIGHT = 0.2
#: A handler's time counts as at least this (seconds): a no-op's zero would make the allowance infinite.
MIN_HANDLER = 1e-6


class ClaimAhead:
    def __init__(self, slots: int, most: int) -> None:
        self._slots = slots
        self._most = most
        self._handler: Optional[float] = None
        self._round_trip: Optional[float] = None
        self._lock = threading.Lock()

    def handler_took(self, seconds: float) -> None:
        with self._lock:
            self._handler = _average(self._handler, seconds)

    def round_trip_took(self, seconds: float) -> None:
        with self._lock:
            self._round_trip = _average(self._round_trip, seconds)

    @property
    def allowance(self) -> int:
        h, rt = self._handler, self._round_trip
        if self._most == 0 or h is None or rt is None:
            return 0
        return min(self._most, int(self._slots * rt / max(h, MIN_HANDLER)))


def _average(previous: Optional[float], sample: float) -> float:
    return sample if previous is None else previous + WEIGHT * (sample - previous)
