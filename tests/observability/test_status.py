"""StatusBoard: bounded ring buffer, counters, model table rows, URL display."""

from __future__ import annotations

from app.core.registry import ModelSpec
from app.observability.status import RecentRequest, StatusBoard


def entry(i: int, **changes: object) -> RecentRequest:
    data: dict[str, object] = dict(
        at_s=float(i), request_id=f"id-{i}", method="POST", route="chat", model="m", status=200,
        outcome="ok", tokens_before=100, tokens_after=60, budget_tokens=80, actions="dropped_turns=1",
        retries=0, latency_ms=1.0, upstream_ms=0.5, overhead_ms=0.2, stream=False,
    )  # fmt: skip
    data.update(changes)
    return RecentRequest(**data)  # type: ignore[arg-type]


def test_the_ring_buffer_keeps_only_the_newest_requests() -> None:
    board = StatusBoard(version="1", upstream_base_url="http://u/v1", recent_max=5)
    for i in range(12):
        board.record(entry(i, api="chat"), actions={"dropped_turns": 1}, fitted=True)
    snap = board.snapshot()
    assert [r["request_id"] for r in snap["recent"]] == [f"id-{i}" for i in (11, 10, 9, 8, 7)]
    assert snap["counters"]["requests"] == 12
    assert snap["counters"]["tokens_saved"] == 12 * 40
    assert snap["counters"]["actions"] == {"dropped_turns": 12}


def test_rejected_requests_save_nothing_and_long_model_names_are_cut() -> None:
    board = StatusBoard(version="1", upstream_base_url="http://u/v1")
    rejected = entry(1, outcome="rejected", model="x" * 500, api="chat")
    board.record(rejected, actions={"rejected": 1}, fitted=True)
    snap = board.snapshot()
    assert snap["counters"]["tokens_saved"] == 0 and snap["counters"]["tokens_after"] == 0
    assert len(snap["recent"][0]["model"]) == 81


def test_model_table_rows() -> None:
    board = StatusBoard(version="1", upstream_base_url="http://u/v1")
    spec = ModelSpec("gpt-4o", 128_000, 16_384, "o200k_base", source="builtin")
    board.set_model_table([spec], spec)
    models = board.snapshot()["models"]
    assert models["entries"] == [
        {"name": "gpt-4o", "window_tokens": 128_000, "max_output_tokens": 16_384,
         "encoding": "o200k_base", "source": "builtin"}
    ]  # fmt: skip
    assert models["default"]["window_tokens"] == 128_000


def test_counters_per_api_follow_the_totals_rules() -> None:
    board = StatusBoard(version="1", upstream_base_url="http://u/v1", apis=["chat", "responses", "messages"])
    assert board.snapshot()["apis"] == ["chat", "responses", "messages"]
    assert board.snapshot()["counters"]["by_api"]["messages"]["requests"] == 0
    board.record(entry(1, route="messages", api="messages", retries=1), actions={"dropped_turns": 2},
                 fitted=True, prefix_reused_tokens=30, memory="summary")  # fmt: skip
    board.record(entry(2, route="messages", api="messages", tokens_after=100), actions={}, fitted=True)
    board.record(entry(3, route="count", api="messages"), actions={"pruned": 1}, fitted=False)
    board.record(entry(4, route="responses", api="responses", outcome="rejected"), actions={"rejected": 1},
                 fitted=True, prefix_reused_tokens=99, memory="note")  # fmt: skip
    board.record(entry(5, route="passthrough", api=None), actions={}, fitted=False)
    c = board.snapshot()["counters"]
    m, r = c["by_api"]["messages"], c["by_api"]["responses"]
    assert (m["requests"], m["fitted_requests"], m["changed_requests"]) == (3, 2, 1)
    assert (m["tokens_before"], m["tokens_after"], m["tokens_saved"]) == (200, 160, 40)
    assert m["prefix_reused_tokens"] == 30 and m["emergency_retries"] == 1
    assert m["actions"] == {"dropped_turns": 1} and m["memory"] == {"summary": 1, "index": 0, "note": 0}
    assert (r["fitted_requests"], r["tokens_before"], r["tokens_after"], r["tokens_saved"]) == (1, 100, 0, 0)
    assert r["prefix_reused_tokens"] == 0 and r["memory"] == {"summary": 0, "index": 0, "note": 0}
    assert r["by_outcome"] == {"rejected": 1} and r["actions"] == {"rejected": 1}
    assert c["requests"] == 5 and c["fitted_requests"] == 3 and c["tokens_saved"] == 40
    assert c["by_route"] == {"messages": 2, "count": 1, "responses": 1, "passthrough": 1}
    assert c["by_api"]["chat"]["requests"] == 0


def test_summaries_per_api() -> None:
    board = StatusBoard(version="1", upstream_base_url="http://u/v1", apis=["chat", "messages"])
    board.record_summary(api="messages", outcome="ok", tokens_in=5000, tokens_out=200)
    board.record_summary(api="messages", outcome="timeout", tokens_in=4000)
    board.record_summary(api="messages", outcome="rejected", tokens_in=3000)
    board.record_summary_cache(api="messages", result="hit")
    board.record_summary_cache(api="messages", result="miss")
    board.record_summary_cache(api="toy", result="hit")
    snap = board.snapshot()
    summaries = snap["counters"]["by_api"]["messages"]["summaries"]
    # A summary the checks refused is a failure, counted as such too.
    assert summaries == {"calls": 3, "failures": 2, "rejected": 1, "tokens_in": 12000, "tokens_out": 200,
                         "cache_hit": 1, "cache_miss": 1, "cache_error": 0}  # fmt: skip
    assert snap["counters"]["summaries"]["calls"] == 3 and snap["counters"]["summaries"]["cache_hit"] == 2
    assert snap["apis"] == ["chat", "messages", "toy"]


def test_upstream_urls_are_shown_without_credentials() -> None:
    board = StatusBoard(version="1", upstream_base_url="https://k:s@h.test/v1?key=s", upstream_routes={"l": "http://u:p@l/v1"})
    assert board.snapshot()["upstream"]["base_url"] == "https://h.test/v1"
    assert board.snapshot()["upstream"]["routes"] == {"l": "http://l/v1"}
