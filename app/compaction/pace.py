"""How fast a summarizer answers: the time limit of its next call and whether a wait is worth it.

``Pace(*, floor_s, ceiling_s, factor=PACE_FACTOR, window=PACE_WINDOW)``: one per summarizer (a model
at an upstream). A slow local model on a loaded machine may take minutes where a hosted one takes
seconds, so no fixed limit suits both:

* ``observed(seconds)``: a call that answered took this long; ``timed_out()``: one did not answer
  within ``limit_s``;
* ``limit_s``: the time limit of a background call: ``factor`` times the slowest of the last
  ``window`` answers, at least ``floor_s`` and at most ``ceiling_s``; each call that timed out
  since the last answer doubles it (a model slower than anything seen so far gets its chance);
* ``expected_s``: the median of the last answers (None before the first): the service waits for a
  summary in line only when it can come within the request's wait (``app.service.summaries``).

Pure bookkeeping: no clock, no I/O (the caller measures).
"""

from __future__ import annotations

import statistics
from collections import deque

PACE_FACTOR = 4.0
PACE_WINDOW = 8


class Pace:
    """The observed latency of one summarizer's calls (see the module docstring)."""

    def __init__(
        self, *, floor_s: float, ceiling_s: float, factor: float = PACE_FACTOR, window: int = PACE_WINDOW
    ) -> None:
        self.floor_s = floor_s
        self.ceiling_s = max(floor_s, ceiling_s)
        self.factor = factor
        self._answers: deque[float] = deque(maxlen=window)
        self._timeouts = 0

    def observed(self, seconds: float) -> None:
        self._answers.append(max(0.0, seconds))
        self._timeouts = 0

    def timed_out(self) -> None:
        self._timeouts += 1

    @property
    def limit_s(self) -> float:
        seen = self.factor * max(self._answers) if self._answers else 0.0
        limit: float = max(self.floor_s, seen) * 2.0**self._timeouts
        return min(self.ceiling_s, limit)

    @property
    def expected_s(self) -> float | None:
        return float(statistics.median(self._answers)) if self._answers else None
