"""Pacing a producer: a token bucket that lets one message out at a time at a given rate per second.

lakehouse_dev.produce paces `lakehouse produce --rate` with it; its clock and sleep are injectable so the
schedule can be checked without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class RateLimiter:
    """A token bucket: `acquire()` returns when one more message may go out at `rate` per second.

    The bucket starts full with `burst` tokens (default: 20 ms worth, at least 1)
    so sleeps are few and not shorter than the OS can honour; waits are sliced
    into at most `max_slice` seconds so the caller's `sleep` (the producer's poll)
    keeps serving delivery reports. `clock` and `sleep` are injectable so the
    schedule can be checked without waiting.
    """

    def __init__(self, rate: float, burst: float | None = None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = time.sleep, max_slice: float = 0.05):
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        self.rate = float(rate)
        self.burst = max(1.0, float(burst) if burst is not None else self.rate * 0.02)
        self.clock = clock
        self.sleep = sleep
        self.max_slice = max_slice
        self.tokens = self.burst
        self.updated = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def acquire(self) -> float:
        """Take one token, sleeping until one is available; returns the seconds waited."""
        waited_from = self.clock()
        self._refill()
        # a tolerance: float rounding can leave 0.999999... tokens and a sleep too short to move the clock
        while self.tokens < 1.0 - 1e-9:
            self.sleep(min(self.max_slice, (1.0 - self.tokens) / self.rate))
            self._refill()
        self.tokens = max(0.0, self.tokens - 1.0)
        return self.clock() - waited_from
