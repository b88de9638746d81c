"""bench.llama's own figures (the server run is not part of the suite: it needs llama.cpp and a model)."""

from __future__ import annotations

from typing import Any

from app.compaction.prompts import SYSTEM_MARKER
from bench.llama import (
    CODE,
    Exchange,
    Turn,
    chat_turns,
    codes,
    degenerate,
    overlapping,
    placed_summaries,
    retention,
    worst_turn,
)


def test_the_chat_plants_one_code_a_turn_in_the_users_words_only() -> None:
    histories = list(chat_turns(1, 6))
    assert len(histories) == 6 and histories[-1][-1]["role"] == "user"
    planted = codes(1, 6)
    for k, history in enumerate(histories):
        assert CODE.findall(history[-1]["content"]) == [planted[k]]
    assert not any(CODE.search(m["content"]) for m in histories[-1] if m["role"] == "assistant")
    assert codes(1, 6) == planted and codes(2, 6) != planted  # seeded


def test_a_placed_summary_is_read_without_its_index_and_judged() -> None:
    memory = "[ctxproxy: summary of 8 earlier messages]\nThe team ships on Thursdays.\n"
    memory += "[ctxproxy: exact strings from them]\nidentifiers: QXV-4821"
    forwarded = {"messages": [{"role": "user", "content": memory}, {"role": "user", "content": "hi"}]}
    assert placed_summaries(forwarded) == ["The team ships on Thursdays."]
    assert degenerate("The team ships on Thursdays after the smoke tests.") is None
    assert degenerate("<start_of_turn>user\nhi<end_of_turn>") == "control tokens"
    assert degenerate("You write handoff summaries of earlier parts of a conversation") == "the prompt echoed"
    assert degenerate("[user]: Turn\n[user]: Turn\n") == "transcript labels"
    assert degenerate("same line\nsame line\nsame line") == "a repeated line"


def turn(client: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> Turn:
    return Turn(
        status=200,
        latency_s=1.0,
        model_s=0.5,
        memory="index",
        forwarded={"messages": forwarded},
        client=client,
    )


def test_retention_counts_the_codes_of_what_the_last_request_no_longer_shows() -> None:
    history = list(chat_turns(3, 5))[-1]
    kept = history[:1] + history[-3:]  # the oldest turns cut
    index = {
        "role": "user",
        "content": f"[ctxproxy: index of 6 earlier messages]\nidentifiers: {codes(3, 5)[0]}",
    }
    figures = retention([turn(history, [*kept[:1], index, *kept[1:]])])
    assert figures["forgotten_codes"] == 3 and figures["kept_codes"] == 1
    assert abs(figures["share"] - 1 / 3) < 1e-9


def test_a_turns_breakdown_lists_the_exchanges_in_flight_during_it_cancelled_ones_marked() -> None:
    summary = {"messages": [{"role": "system", "content": SYSTEM_MARKER + " ..."}]}
    answer = {"timings": {"prompt_ms": 900.0, "predicted_ms": 1100.0}}
    exchanges = [
        Exchange("/v1/chat/completions", {"messages": []}, answer, 200, 0.0, 2.0),  # the turn before
        Exchange("/v1/chat/completions", summary, {}, 0, 2.5, 3.2, cancelled=True),
        Exchange("/props", {}, {}, 200, 3.0, 3.01, method="GET"),
        Exchange("/v1/chat/completions", {"messages": []}, answer, 200, 3.2, 6.0),
    ]
    late = Turn(200, 3.5, 2.0, "index", {}, [], started_s=3.0, headers={"x-context-memory": "index"})
    late.upstream = overlapping(exchanges, late)
    assert [(e["kind"], e["cancelled"]) for e in late.upstream] == [
        ("summary", True),
        ("other", False),
        ("client", False),
    ]
    assert late.upstream[0]["start_s"] == -0.5 and late.upstream[2]["model_s"] == 2.0
    assert late.besides_model_s == 1.5 and late.breakdown()["headers"] == {"x-context-memory": "index"}
    quick = Turn(200, 2.0, 2.0, "none", {}, [], started_s=0.0)
    quick.upstream = overlapping(exchanges, quick)
    text = "\n".join(worst_turn([{"proxied": [quick, late]}]))
    assert (
        "run 1, turn 2, 3.50 s" in text
        and "| summary | /v1/chat/completions | -0.50 | 0.20 | cancelled |" in text
    )
