"""The status boards of a server's workers, shared through files and merged into one picture."""

from __future__ import annotations

import os
import time
from pathlib import Path

from app.observability.shared import SharedBoard, merge
from app.observability.status import RecentRequest, StatusBoard, with_totals


def entry(at_s: float, *, before: int = 100, after: int = 60) -> RecentRequest:
    return RecentRequest(
        at_s,
        "req",
        "POST",
        "chat",
        "gpt-4o",
        200,
        "ok",
        before,
        after,
        1000,
        "pruned=1",
        0,
        5.0,
        4.0,
        1.0,
        False,
    )


def test_two_boards_make_one_picture(tmp_path: Path) -> None:
    a = StatusBoard(
        version="t", upstream_base_url="http://u/v1", shared=SharedBoard(tmp_path, flush_every_s=0.01)
    )
    a.record(entry(1.0)._replace(api="chat"), actions={"pruned": 1}, fitted=True)
    a.upstream_call(0.1, 200)
    other = {
        "pid": os.getpid(),  # alive
        "started_at_s": 0.5,
        "in_flight": 2,
        "counters": {"by_route": {"chat": 1, "messages": 1},
                     "by_api": {"chat": {"requests": 1, "fitted_requests": 1, "tokens_before": 100,
                                         "by_outcome": {"ok": 1}, "actions": {"pruned": 1}},
                                "messages": {"requests": 1, "fitted_requests": 1, "tokens_before": 200,
                                             "by_outcome": {"ok": 1}, "actions": {"truncated": 1}}}},
        "recent": [entry(3.0)._asdict(), entry(0.5)._asdict()],
        "upstream_health": {"calls": 4, "errors": 1, "last_status": 500, "last_latency_ms": 9.0,
                            "last_at_s": time.time() + 60},
    }  # fmt: skip
    merged = merge(a._own(), [other], recent_max=2)
    assert merged["workers"] == 2
    counters = with_totals(merged["counters"])
    assert counters["requests"] == 3 and counters["tokens_before"] == 400
    assert counters["by_outcome"] == {"ok": 3} and counters["by_route"] == {"chat": 2, "messages": 1}
    assert counters["actions"] == {"pruned": 2, "truncated": 1}
    by_api = counters["by_api"]
    assert (by_api["chat"]["requests"], by_api["chat"]["tokens_before"]) == (2, 200)
    assert (by_api["messages"]["requests"], by_api["messages"]["tokens_before"]) == (1, 200)
    assert [r["at_s"] for r in merged["recent"]] == [3.0, 1.0]
    assert merged["in_flight"] == 2 and merged["started_at_s"] == 0.5
    health = merged["upstream_health"]
    assert (health["calls"], health["errors"], health["last_status"]) == (5, 1, 500)


def test_a_dead_workers_requests_count_but_not_its_in_flight() -> None:
    own = {"pid": os.getpid(), "started_at_s": 1.0, "in_flight": 0, "counters": {"no_api": {"requests": 1}},
           "recent": [], "upstream_health": {"calls": 0, "errors": 0, "last_at_s": None}}  # fmt: skip
    dead = {**own, "pid": 2**22 + 12345, "in_flight": 3}
    merged = merge(own, [dead], recent_max=10)
    assert with_totals(merged["counters"])["requests"] == 2
    assert merged["in_flight"] == 0 and merged["workers"] == 1


def test_a_board_is_published_to_its_file_and_read_by_the_others(tmp_path: Path) -> None:
    shared = SharedBoard(tmp_path, flush_every_s=0.01)
    board = StatusBoard(version="t", upstream_base_url="http://u/v1", shared=shared)
    board.record(entry(1.0), actions={})
    deadline = time.monotonic() + 5
    path = tmp_path / f"{os.getpid()}.json"
    while time.monotonic() < deadline and '"requests": 1' not in (path.read_text() if path.exists() else ""):
        time.sleep(0.01)
    assert '"requests": 1' in path.read_text()
    reader = SharedBoard(tmp_path)
    reader.pid = -1  # another worker
    (seen,) = reader.others()
    assert with_totals(seen["counters"])["requests"] == 1
    (tmp_path / "999.json").write_text("{broken", encoding="utf-8")
    assert len(reader.others()) == 1
