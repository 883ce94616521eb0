"""The producer's pacing (lakehouse_dev.rate_limit): the token bucket's schedule, checked on a fake clock
(timing is never asserted)."""

from __future__ import annotations

import pytest

from lakehouse_dev.rate_limit import RateLimiter


class FakeClock:
    """A clock that only moves when the limiter sleeps."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_rate_limiter_spaces_messages_at_the_rate_after_a_burst():
    clock = FakeClock()
    limiter = RateLimiter(100, burst=5, clock=clock, sleep=clock.sleep)
    for _ in range(105):
        limiter.acquire()
    assert clock.now == pytest.approx(1.0)  # 5 at once, then 100 more at 100/s
    assert max(clock.sleeps) <= 0.05        # sleeps are sliced so deliveries keep being served


def test_the_rate_limiter_default_burst_is_20ms_of_traffic():
    clock = FakeClock()
    limiter = RateLimiter(10_000, clock=clock, sleep=clock.sleep)
    assert limiter.burst == 200
    for _ in range(10_200):
        limiter.acquire()
    assert clock.now == pytest.approx(1.0)
    assert RateLimiter(1, clock=clock, sleep=clock.sleep).burst == 1  # never less than one message
