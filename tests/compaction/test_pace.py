"""app.compaction.pace: a summarizer's time limit follows what its answers took."""

from __future__ import annotations

from app.compaction.pace import Pace


def test_the_limit_starts_at_the_floor_and_follows_the_slowest_recent_answer() -> None:
    pace = Pace(floor_s=60, ceiling_s=600, factor=4, window=3)
    assert pace.limit_s == 60 and pace.expected_s is None
    pace.observed(2.0)
    assert pace.limit_s == 60 and pace.expected_s == 2.0  # fast: the floor holds
    pace.observed(40.0)
    assert pace.limit_s == 160
    pace.observed(10.0)
    assert pace.expected_s == 10.0
    for _ in range(3):  # the slow answer leaves the window
        pace.observed(5.0)
    assert pace.limit_s == 60 and pace.expected_s == 5.0
    pace.observed(1000.0)
    assert pace.limit_s == 600  # never past the ceiling


def test_each_timeout_doubles_the_limit_until_an_answer_comes() -> None:
    pace = Pace(floor_s=60, ceiling_s=600)
    pace.timed_out()
    assert pace.limit_s == 120
    pace.timed_out()
    pace.timed_out()
    assert pace.limit_s == 480
    pace.timed_out()
    assert pace.limit_s == 600
    pace.observed(100.0)  # a model this slow: four times its answer
    assert pace.limit_s == 400
