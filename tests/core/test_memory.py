"""app.core.memory: the span a memory stands for, its stops, its placement, its room."""

from __future__ import annotations

from typing import Any

from app.core.budget import Budget, Policy
from app.core.memory import (
    MEMORY_MAX_TOKENS,
    MemorySpan,
    index_max_chars,
    memory_room_tokens,
    memory_span,
    memory_step_tokens,
    memory_stops,
    memory_text,
    memory_tokens_for,
    place_memory,
    span_messages,
    summary_tokens_for,
)
from app.core.strategies import is_ctxproxy_note
from tests.core.fakes import FakeMessageCounter, chat, system, tool_exchange, user


def budget(input_tokens: int) -> Budget:
    return Budget(window_tokens=input_tokens, reserve_tokens=0, margin_tokens=0, tool_tokens=0)


def test_the_memory_has_room_only_when_summaries_or_the_index_are_wanted() -> None:
    assert memory_tokens_for(budget(10_000), Policy()) == 0
    assert memory_tokens_for(budget(10_000), Policy(summarize=True)) == 1500
    assert memory_tokens_for(budget(10_000), Policy(summarize=True, mode="truncate")) == 0
    assert memory_tokens_for(budget(10_000), Policy(index_memory=True)) == 1500
    assert memory_tokens_for(budget(10_000), Policy(index_memory=True, mode="truncate")) == 1500
    assert memory_tokens_for(budget(10_000), Policy(index_memory=True, mode="reject")) == 0
    assert memory_tokens_for(budget(1_000_000), Policy(summarize=True)) == MEMORY_MAX_TOKENS
    # A fold is worth a call when it brings several memories' worth of new material.
    assert memory_step_tokens(budget(10_000), Policy(summarize=True)) == 6000
    assert memory_step_tokens(budget(1_000_000), Policy(summarize=True)) == 400_000  # the level step


def test_stops_are_unit_starts_crossing_each_step_from_the_first_turn(counter: FakeMessageCounter) -> None:
    messages = chat(20)  # system, then turns of a user and an assistant message
    tokens = counter.count_messages(messages)
    stops = memory_stops(messages, tokens, step_tokens=100)
    assert stops and stops == sorted(stops)
    running = 0
    expected, level = [], 0
    for i in range(1, len(messages)):
        if i > 1 and running // 100 > level:
            expected.append(i)
            level = running // 100
        running += tokens[i]
    assert stops == expected
    # The stops of a conversation do not move as it grows: a new turn only adds stops.
    longer = chat(30)
    assert memory_stops(longer, counter.count_messages(longer), step_tokens=100)[: len(stops)] == stops


def test_a_call_and_its_results_are_one_unit_never_split_by_a_stop(counter: FakeMessageCounter) -> None:
    messages: list[dict[str, Any]] = [system(), user(5)]
    for k in range(10):
        messages += tool_exchange([f"c{k}a", f"c{k}b"], 40)
    stops = memory_stops(messages, counter.count_messages(messages), step_tokens=50)
    assert stops and all(messages[s].get("tool_calls") for s in stops)


def test_the_span_covers_up_to_the_next_stop_and_skips_the_pinned(counter: FakeMessageCounter) -> None:
    messages = chat(20)
    tokens = counter.count_messages(messages)
    stops = memory_stops(messages, tokens, step_tokens=100)
    span = memory_span(messages, tokens, forgotten={2, 3, 4}, pinned=frozenset({0, 1}), step_tokens=100)
    assert span is not None
    assert span.at == 5  # after the unit holding the newest forgotten message
    assert span.stop == min(s for s in stops if s >= 5)
    assert span.indices == tuple(range(2, span.stop))  # the pinned task is shown, not summarized
    assert span.tokens == sum(tokens[i] for i in span.indices)
    assert span.earlier == tuple(reversed([s for s in stops if s < span.stop]))
    shorter = span.until(span.earlier[0]) if span.earlier else span
    assert shorter.indices == tuple(i for i in span.indices if i < shorter.stop)


def test_the_summary_ends_at_a_memory_stop_never_at_the_cut(counter: FakeMessageCounter) -> None:
    messages = chat(20)
    tokens = counter.count_messages(messages)
    stops = memory_stops(messages, tokens, step_tokens=100)
    last = len(messages) - 2
    assert last > stops[-1]

    def span_of(forgotten: int, step_tokens: int = 100) -> MemorySpan | None:
        return memory_span(
            messages, tokens, forgotten={forgotten}, pinned=frozenset({0}), step_tokens=step_tokens
        )

    # Past the last stop: the summary stays at it, whatever the gap; the index reads it all.
    past = span_of(last - 1)
    assert past is not None and past.at == last and past.stop == stops[-1]
    assert past.forgot == tuple(range(1, last)) and past.indices == tuple(range(1, stops[-1]))
    # Before the first stop: no summary at all, the index alone.
    first = span_of(2, step_tokens=10_000)
    assert first is not None and first.indices == () and first.forgot == (1, 2)
    assert summary_tokens_for(first, budget(10_000), Policy(summarize=True), index_tokens=0) == 0


def test_nothing_forgotten_is_no_memory(counter: FakeMessageCounter) -> None:
    messages = chat(5)
    tokens = counter.count_messages(messages)
    assert memory_span(messages, tokens, forgotten=(), pinned=frozenset(), step_tokens=10) is None


def test_the_span_a_summarizer_reads_has_no_reserved_keys() -> None:
    messages = [
        {"role": "user", "content": "a", "ctxproxy_origin": [[0]], "ctxproxy_opaque": True},
        {"role": "assistant", "content": "b", "ctxproxy_tokens": 3},
    ]
    span = MemorySpan(at=2, stop=2, indices=(0, 1), tokens=0)
    assert span_messages(messages, span) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
    ]


def test_the_memory_text_is_a_note_the_engine_recognises() -> None:
    text = memory_text(3, "  the gist \n")
    assert text == "[ctxproxy: summary of 3 earlier messages]\nthe gist"
    assert is_ctxproxy_note({"role": "user", "content": text})
    assert memory_text(1, "x").startswith("[ctxproxy: summary of 1 earlier message]")
    both = memory_text(3, "the gist", "identifiers: AKX-1")
    assert (
        both
        == "[ctxproxy: summary of 3 earlier messages]\nthe gist\n[ctxproxy: exact strings from them]\n"
        + ("identifiers: AKX-1")
    )
    alone = memory_text(4, " ", "identifiers: AKX-1")
    assert (
        alone
        == "[ctxproxy: index of 4 earlier messages, removed to fit the context window]\nidentifiers: AKX-1"
    )
    assert is_ctxproxy_note({"role": "assistant", "content": alone})
    assert is_ctxproxy_note({"role": "user", "content": both})


def test_the_room_is_the_memory_it_will_hold_in_steps() -> None:
    policy = Policy(summarize=True)
    big = budget(10_000)  # the most room: 1500, steps of 187
    assert memory_room_tokens(0, 0, big, policy) == 0
    assert memory_room_tokens(1, 0, big, policy) == 187
    assert memory_room_tokens(187, 0, big, policy) == 187
    assert memory_room_tokens(100, 100, big, policy) == 374
    assert memory_room_tokens(5000, 5000, big, policy) == 1500  # never more than the most room
    assert memory_room_tokens(100, 100, big, Policy()) == 0
    assert memory_room_tokens(1, 0, budget(500), policy) == 32  # a step is at least 32 tokens
    # The summary's size: a quarter of the most room per memory stop covered, beside the index.
    first = MemorySpan(at=5, stop=5, indices=(1, 2), tokens=10)
    later = MemorySpan(at=9, stop=9, indices=(1, 2), tokens=10, earlier=(7, 5, 3))
    assert summary_tokens_for(first, big, policy, index_tokens=100) == 375
    assert summary_tokens_for(later, big, policy, index_tokens=100) == 1400
    assert summary_tokens_for(later, big, policy, index_tokens=2000) == 0
    assert summary_tokens_for(later, big, Policy(index_memory=True), index_tokens=0) == 0
    # The index's characters: 60% of the most room, three a token.
    assert index_max_chars(big, policy) == 2700


def test_the_memory_replaces_the_note_where_the_forgetting_ends(counter: FakeMessageCounter) -> None:
    note = {
        "role": "assistant",
        "content": "[ctxproxy: 4 earlier messages were removed here to fit the context window]",
    }
    messages = [system(), user(5, "task"), note, user(5, "kept"), {"role": "assistant", "content": "ok"}]
    tokens = counter.count_messages(messages)
    origins = (0, 1, None, 6, 7)
    span = MemorySpan(at=6, stop=8, indices=(2, 3, 4, 5, 6, 7), tokens=100)
    placed = place_memory(
        messages, tokens, origins, span=span, summary="gist", counter=counter, limit_tokens=10_000, note_at=2
    )
    assert placed is not None
    assert [m.get("content") for m in placed.messages][2] == "[ctxproxy: summary of 6 earlier messages]\ngist"
    assert placed.messages[2]["role"] == "assistant"  # after a user message
    assert placed.messages[3] is messages[3] and len(placed.messages) == len(messages)
    assert placed.tokens[2] == placed.memory_tokens == counter.count_message(placed.messages[2])
    tight = sum(tokens) - tokens[2]
    assert (
        place_memory(
            messages,
            tokens,
            origins,
            span=span,
            summary="gist " * 50,
            counter=counter,
            limit_tokens=tight,
            note_at=2,
        )
        is None
    )


def test_the_memory_goes_before_the_first_kept_message_from_where_the_forgetting_ends(
    counter: FakeMessageCounter,
) -> None:
    calls = tool_exchange(["c1"], 5)
    messages = [system(), user(5), *calls, *tool_exchange(["c2"], 5)]
    tokens = counter.count_messages(messages)
    origins = tuple(range(len(messages)))
    span = MemorySpan(at=4, stop=4, indices=(2, 3), tokens=10)
    placed = place_memory(
        messages, tokens, origins, span=span, summary="s", counter=counter, limit_tokens=10_000
    )
    assert placed is not None and placed.index == 4
    assert placed.messages[4]["role"] == "user"  # after a tool result
    assert placed.messages[5] is messages[4]
