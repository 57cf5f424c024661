"""Capped exponential backoff with full jitter, so a fleet that lost its daemon does not come back
in step."""
from __future__ import annotations

import random

from .options import Backoff


def delay(attempt: int, b: Backoff, rand: "random.Random | None" = None) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): uniform in [cap/2, cap], cap growing from
    ``initial`` by ``multiplier`` up to ``max``."""
    cap = min(b.max, b.initial * (b.multiplier ** min(attempt, 64)))
    r = (rand or random).random()
    return cap / 2 + r * cap / 2
