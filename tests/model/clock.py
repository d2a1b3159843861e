"""The simulated clock: the one "now" of a model run, moved only by the model's steps.

``timezone.now`` reads it while a run lasts (so the rows' own times, the return and dishonor
windows, the dedup window and the visibility timeouts all follow it); the database's ``Now()``
(the processor's circuit breaker) keeps real time, which is why the model's breaker pauses are
milliseconds long.
"""

from datetime import UTC, datetime, timedelta

# A Monday, a week before no Federal Reserve holiday: banking days are counted from here.
START = datetime(2026, 3, 2, 15, 0, tzinfo=UTC)


class SimClock:
    def __init__(self, start: datetime = START) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        if delta < timedelta(0):
            raise ValueError("the simulated clock only moves forward")
        self._now += delta

    def reset(self, start: datetime = START) -> None:
        self._now = start
