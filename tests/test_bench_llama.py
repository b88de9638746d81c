"""bench.llama's own figures (the server run is not part of the suite: it needs llama.cpp and a model)."""

from __future__ import annotations

from typing import Any

from bench.llama import CODE, Turn, chat_turns, codes, degenerate, placed_summaries, retention


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
