"""The cache benchmark's arithmetic on hand-made sessions (no servers, no timings)."""

from __future__ import annotations

from typing import Any

from bench.cache import SHAPES, Record, measure, render


def record(messages: list[str], *, trimmed: bool, prompt_tokens: int) -> Record:
    forwarded: list[dict[str, Any]] = [{"role": "user", "content": m} for m in messages]
    return Record(trimmed, prompt_tokens, forwarded, [10] * len(forwarded))


def test_stability_reuse_and_utilization_follow_their_definitions() -> None:
    shape = SHAPES["chat-8k"]
    records = [
        record(["s", "a"], trimmed=False, prompt_tokens=20),
        record(["s", "a", "b"], trimmed=True, prompt_tokens=30),  # extends: reused 20 of 30
        record(["s", "a", "b", "c"], trimmed=True, prompt_tokens=40),  # extends: 30 of 40, stable pair
        record(["s", "note", "c", "d"], trimmed=True, prompt_tokens=40),  # cut moved: 10 of 40
    ]
    result = measure(shape, records)
    assert result["stability"] == 0.5  # 1 of the 2 consecutive trimmed pairs
    assert result["reuse"] == (20 + 30 + 10) / (30 + 40 + 40)
    assert result["reuse_trimmed"] == result["reuse"]
    assert result["utilization"] == 40 / (shape.window_tokens - shape.max_tokens)
    assert [turn for turn in result["per_turn"]] == [(20, 0), (30, 20), (40, 30), (40, 10)]
    table = render(
        [{**result, "shape": "chat-8k", "summaries": False, "cut_target": None, "over_window": 0}],
        runs=1,
        note="",
    )
    assert "| chat-8k | off | default |" in table and "FAIL >= 0.65" in table
