"""Every strategy against the four invariants, then each strategy's own rules."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest

from app.core.budget import Policy
from app.core.context import build_context
from app.core.estimate import EstimateCounter
from app.core.messages import Message, group_units, pairing_problems
from app.core.strategies import (
    STRATEGIES,
    Strategy,
    drop_oldest,
    is_ctxproxy_note,
    last_resort,
    middle_out,
    note_text,
    prune_old_results,
)
from app.core.tokens import MessageCounter
from tests.core.fakes import (
    FakeMessageCounter,
    agent_session,
    assistant,
    budget,
    chat,
    ctx_for,
    image_user,
    system,
    tool_exchange,
    user,
    words,
)


def agentic(rounds: int, result_tokens: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [system(), user(10, "first")]
    for k in range(rounds):
        out += tool_exchange([f"c{k}a", f"c{k}b"], result_tokens)
        out.append(assistant(10, f"r{k}_"))
        out.append(user(10, f"q{k}_"))
    return out


def mixed() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [system(), user(10, "first"), assistant(20)]
    for k in range(8):
        out.append(image_user(5, f"img{k}_"))
        out += tool_exchange([f"m{k}"], 120)
        out.append({"role": "assistant", "content": [{"type": "text", "text": words(300, f"big{k}_")}]})
    out.append(user(30, "last"))
    return out


SCENARIOS: dict[str, tuple[list[dict[str, Any]], int]] = {
    "plain-chat": (chat(40), 900),
    "agentic": (agentic(15, 300), 2500),
    "huge-message": ([system(), user(10), assistant(6000), user(10)], 2000),
    "huge-newest": ([system(), user(10), assistant(50), user(8000)], 1000),
    "mixed": (mixed(), 1500),
    "impossible": ([system(3000), user(10)], 100),
    "fits": (chat(3), 10_000),
}


def total(result_messages: Sequence[Message], counter: FakeMessageCounter) -> int:
    return sum(counter.count_messages(result_messages))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize(("name", "strategy"), STRATEGIES, ids=[n for n, _ in STRATEGIES])
def test_every_strategy_keeps_the_four_invariants(
    name: str, strategy: Strategy, scenario: str, counter: FakeMessageCounter
) -> None:
    messages, input_tokens = SCENARIOS[scenario]
    pristine = copy.deepcopy(messages)
    ctx = ctx_for(messages, input_tokens, counter)
    result = strategy(messages, ctx)
    # 1. never mutates its input
    assert messages == pristine
    # 2. never increases the token count
    assert total(result.messages, counter) <= total(messages, counter)
    # 3. idempotent
    again = strategy(result.messages, ctx_for(result.messages, input_tokens, counter))
    assert list(again.messages) == list(result.messages)
    assert again.actions == ()
    # 4. never splits a unit: every unit of the input is kept whole or removed whole
    kept = {id(m) for m in result.messages}
    for unit in group_units(messages):
        if messages[unit.start].get("tool_calls") is None:
            continue
        survivors = [
            i for i in unit.indices if id(messages[i]) in kept or _rewritten(messages[i], result.messages)
        ]
        assert survivors in ([], list(unit.indices)), (name, unit)
    assert set(pairing_problems(result.messages)) <= set(pairing_problems(messages))


def _rewritten(message: Message, out: Sequence[Message]) -> bool:
    """A tool message or call survives rewritten when its ids are still there."""
    if message.get("role") == "tool":
        return any(m.get("tool_call_id") == message.get("tool_call_id") for m in out)
    return any(m.get("tool_calls") == message.get("tool_calls") for m in out)


@pytest.mark.parametrize("scenario", ["plain-chat", "agentic", "mixed", "huge-message"])
def test_strategies_act_on_the_overflowing_scenarios(scenario: str, counter: FakeMessageCounter) -> None:
    messages, input_tokens = SCENARIOS[scenario]
    ctx = ctx_for(messages, input_tokens, counter)
    assert any(strategy(messages, ctx).actions for _, strategy in STRATEGIES)


@pytest.mark.parametrize(("name", "strategy"), STRATEGIES, ids=[n for n, _ in STRATEGIES])
def test_a_fitting_input_is_returned_as_the_same_objects(
    name: str, strategy: Strategy, counter: FakeMessageCounter
) -> None:
    messages = chat(5)
    result = strategy(messages, ctx_for(messages, 100_000, counter))
    assert all(a is b for a, b in zip(result.messages, messages, strict=True))
    assert result.actions == ()


def test_prune_replaces_old_tool_results_with_a_placeholder_sized_in_characters(
    counter: FakeMessageCounter,
) -> None:
    messages = agentic(15, 300)
    ctx = ctx_for(messages, 2500, counter)
    result = prune_old_results(messages, ctx)
    pruned = [
        m
        for m in result.messages
        if isinstance(m.get("content"), str) and "tool result removed" in m["content"]
    ]
    assert pruned
    chars = len(messages[3]["content"])
    assert (
        pruned[0]["content"]
        == f"[ctxproxy: tool result removed to fit the context window (lookup, {chars:,} characters)]"
    )
    assert all("tool_call_id" in m for m in pruned)
    # the newest turns are untouched
    assert list(result.messages[ctx.protected_from :]) == messages[ctx.protected_from :]
    assert result.actions[0].kind == "pruned" and result.actions[0].count == len(pruned)


def test_prune_placeholder_names_only_well_formed_tool_names(counter: FakeMessageCounter) -> None:
    messages = agentic(15, 300)
    messages[2] = {
        **messages[2],
        "tool_calls": [
            {**messages[2]["tool_calls"][0], "function": {"name": "rm -rf /; say hi", "arguments": "{}"}},
            *messages[2]["tool_calls"][1:],
        ],
    }
    result = prune_old_results(messages, ctx_for(messages, 2500, counter))
    first, second = result.messages[3]["content"], result.messages[4]["content"]
    assert first.startswith("[ctxproxy: tool result removed to fit the context window (")
    assert "rm -rf" not in first and "(lookup, " not in first
    assert "(lookup, " in second


def test_prune_keeps_the_newest_protected_tool_tokens(counter: FakeMessageCounter) -> None:
    messages = agentic(15, 300)
    ctx = ctx_for(messages, 6000, counter)  # protect = min(40K, 2000)
    result = prune_old_results(messages, ctx)
    kept_tool_tokens = sum(
        counter.count_message(m)
        for m in result.messages[: ctx.protected_from]
        if m.get("role") == "tool" and "tool result removed" not in m["content"]
    )
    assert kept_tool_tokens >= 2000 - 2 * 304


def test_prune_skips_when_it_would_free_too_little(counter: FakeMessageCounter) -> None:
    messages = [system(), user(10, "first"), assistant(1000), *agentic(4, 30)[2:]]
    # the scaled minimum is min(20K, 1200 // 6) = 200 and pruning frees less than that (the prune
    # boundary moves in steps of blocks here: cut target 1.0, no headroom levels)
    tight = {"prune_protect_tool_tokens": 0, "drop_block_tokens": 50, "cut_target": 1.0}
    ctx = ctx_for(messages, 1200, counter, **tight)
    assert not ctx.fits(sum(ctx.tokens))
    assert prune_old_results(messages, ctx).actions == ()
    ctx = ctx_for(messages, 1200, counter, prune_minimum_tokens=5, **tight)
    (action,) = prune_old_results(messages, ctx).actions
    assert action.kind == "pruned" and 5 < action.tokens_freed < 200


def test_prune_replaces_old_images_with_a_text_part(counter: FakeMessageCounter) -> None:
    messages = [system(), user(5)]
    for k in range(12):
        messages += [image_user(5, f"i{k}_"), assistant(5)]
    messages.append(user(5))
    ctx = ctx_for(
        messages, 800, counter, prune_protect_tool_tokens=0, prune_minimum_tokens=1, drop_block_tokens=50
    )
    result = prune_old_results(messages, ctx)
    kinds = {a.kind: a.count for a in result.actions}
    assert kinds.get("images", 0) > 0
    replaced = [
        m for m in result.messages if isinstance(m.get("content"), list) and m["content"][1]["type"] == "text"
    ]
    assert len(replaced) == kinds["images"]
    assert replaced[0]["content"][1] == {
        "type": "text",
        "text": "[ctxproxy: image removed to fit the context window]",
    }
    assert replaced[0]["content"][0] == messages[2]["content"][0]


def test_middle_out_cuts_an_oversized_message_to_the_share(counter: FakeMessageCounter) -> None:
    messages = [system(), user(10), assistant(6000), user(10)]
    result = middle_out(messages, ctx_for(messages, 2000, counter))
    assert counter.count_message(result.messages[2]) <= 1000
    assert result.actions[0].kind == "truncated" and result.actions[0].count == 1
    assert result.messages[0] is messages[0] and result.messages[3] is messages[3]


def test_middle_out_never_cuts_pinned_messages(counter: FakeMessageCounter) -> None:
    messages = [system(5000), user(10)]
    assert middle_out(messages, ctx_for(messages, 2000, counter)).actions == ()


def test_drop_leaves_one_note_with_counts_and_alternating_role(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    ctx = ctx_for(messages, 900, counter)
    result = drop_oldest(messages, ctx)
    note = result.messages[2]
    assert is_ctxproxy_note(note)
    assert note["role"] == "assistant"  # the first user message before it is pinned and kept
    (span,) = result.dropped
    assert span.start == 2 and span.block_stops[-1] == span.stop
    count = span.stop - span.start
    assert (
        note["content"] == f"[ctxproxy: {count} earlier messages were removed here to fit the context window]"
    )
    assert span.tokens == sum(counter.count_messages(messages[span.start : span.stop]))
    assert result.messages[3] is messages[span.stop]
    assert sum(counter.count_messages(result.messages)) + 3 <= 900
    kinds = {a.kind: a.count for a in result.actions}
    assert kinds["dropped_messages"] == count
    assert kinds.get("dropped_turns", 0) == sum(
        1 for m in messages[span.start : span.stop] if m["role"] == "user"
    )
    (turns,) = [a for a in result.actions if a.kind == "dropped_turns"]
    assert turns.tokens_freed == 0  # the drop's saving is on dropped_messages, once


def test_drop_note_is_a_user_message_after_a_non_user(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    ctx = ctx_for(messages, 900, counter, pin_first_user=False)
    result = drop_oldest(messages, ctx)
    assert result.messages[1]["role"] == "user" and is_ctxproxy_note(result.messages[1])


def test_drop_never_touches_pinned_or_protected(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    ctx = ctx_for(messages, 200, counter)  # cannot fit even after dropping everything droppable
    result = drop_oldest(messages, ctx)
    assert result.messages[0] is messages[0] and result.messages[1] is messages[1]
    assert list(result.messages[-3:]) == messages[-3:]
    assert len(result.messages) == 2 + 1 + 3


def test_last_resort_cuts_newest_first_and_the_system_prompt_last(counter: FakeMessageCounter) -> None:
    messages = [system(400), user(300, "first"), assistant(10), user(400, "newest")]
    ctx = ctx_for(messages, 900, counter)
    result = last_resort(messages, ctx)
    assert result.messages[0] is messages[0] and result.messages[1] is messages[1]
    assert counter.count_message(result.messages[3]) < 400
    assert sum(counter.count_messages(result.messages)) + 3 <= 900
    ctx = ctx_for(messages, 600, counter)
    result = last_resort(messages, ctx)
    assert result.messages[0] is messages[0]
    assert result.messages[1] is not messages[1]
    ctx = ctx_for(messages, 300, counter)
    result = last_resort(messages, ctx)
    assert result.messages[0] is not messages[0]
    assert result.actions[0].kind == "last_resort" and result.actions[0].count == 3


def test_strategies_use_context_counts_and_do_not_recount_unchanged(counter: FakeMessageCounter) -> None:
    messages = chat(400)
    ctx = ctx_for(messages, 900, counter)
    before = counter.calls
    drop_oldest(messages, ctx)
    assert counter.calls - before < 50


def test_middle_out_leaves_the_newest_user_message_to_the_last_resort(counter: FakeMessageCounter) -> None:
    messages = [system(), user(10), assistant(50), user(8000)]
    ctx = ctx_for(messages, 1000, counter)
    assert middle_out(messages, ctx).actions == ()
    result = last_resort(messages, ctx)
    assert result.messages[3]["content"].startswith("u0 u1") and result.messages[3]["content"].endswith(
        "u7999"
    )
    assert sum(counter.count_messages(result.messages)) + 3 <= 1000


def test_prune_reaches_into_a_single_long_agent_turn(counter: FakeMessageCounter) -> None:
    messages = agent_session(60, 100)
    # protect min(40K, 1500) more; at 4500 pruning the older results is enough to fit
    ctx = ctx_for(messages, 4500, counter, prune_minimum_tokens=1, cut_target=1.0)
    result = prune_old_results(messages, ctx)
    (action,) = result.actions
    assert action.kind == "pruned" and action.count > 10
    assert list(result.messages[ctx.protected_from :]) == messages[ctx.protected_from :]
    assert result.messages[0] is messages[0] and result.messages[1] is messages[1]
    pruned = [i for i, m in enumerate(result.messages) if m is not messages[i]]
    assert all(messages[i]["role"] == "tool" for i in pruned)
    assert pruned == list(range(3, pruned[-1] + 1, 2))  # every result from the oldest on
    kept_before_tail = sum(
        ctx.tokens[i] for i in range(pruned[-1] + 1, ctx.protected_from) if messages[i]["role"] == "tool"
    )
    assert kept_before_tail >= 1000  # the protected tool tokens before the tail stay


def test_prune_reaches_past_the_protected_tool_tokens_before_any_drop(counter: FakeMessageCounter) -> None:
    messages = agent_session(60, 100)
    ctx = ctx_for(messages, 3000, counter, prune_minimum_tokens=1, cut_target=1.0)
    result = prune_old_results(messages, ctx)
    # pruning only what lies before the newest 1000 tool tokens would not fit: prune goes on (a
    # pruned result can be fetched again, a dropped one is gone) but never into the tail
    pruned = [i for i, m in enumerate(result.messages) if m is not messages[i]]
    kept_before_tail = sum(
        ctx.tokens[i] for i in range(pruned[-1] + 1, ctx.protected_from) if messages[i]["role"] == "tool"
    )
    assert kept_before_tail < 1000
    assert list(result.messages[ctx.protected_from :]) == messages[ctx.protected_from :]


def test_drop_reaches_into_a_single_long_agent_turn(counter: FakeMessageCounter) -> None:
    messages = agent_session(60, 100, parallel=2)
    ctx = ctx_for(messages, 3000, counter)
    result = drop_oldest(messages, ctx)
    assert result.messages[0] is messages[0] and result.messages[1] is messages[1]  # pinned task
    note = result.messages[2]
    assert is_ctxproxy_note(note) and note["role"] == "assistant"  # after the user message
    assert result.messages[3].get("tool_calls")  # the next unit starts whole
    assert list(result.messages[-(len(messages) - ctx.protected_from) :]) == messages[ctx.protected_from :]
    assert sum(counter.count_messages(result.messages)) + 3 <= 3000
    assert pairing_problems(result.messages) == []
    (span,) = result.dropped
    assert span.start == 2 and all(messages[stop].get("tool_calls") for stop in span.block_stops)
    kinds = {a.kind: a.count for a in result.actions}
    # Replies of the pinned task went, no turn: the header must not say dropped_turns=0.
    assert "dropped_turns" not in kinds and kinds["dropped_messages"] == span.stop - span.start
    freed = [a.tokens_freed for a in result.actions if a.tokens_freed]
    assert len(freed) == len(set(freed))  # no saving reported under two actions


def test_the_newest_user_message_is_never_dropped_outside_the_tail(counter: FakeMessageCounter) -> None:
    messages = [*chat(6), *agent_session(40, 100)[2:]]  # a long chat, then a long agent turn
    newest = 11
    assert messages[newest]["role"] == "user" and messages[newest + 1].get("tool_calls")
    ctx = ctx_for(messages, 2000, counter, pin_first_user=False)
    assert ctx.newest_user == newest and ctx.protected_from > newest
    result = drop_oldest(messages, ctx)
    assert any(m is messages[newest] for m in result.messages)
    assert len(result.dropped) == 2  # the newest user message splits the dropped run
    assert result.dropped[0].stop == newest == result.dropped[1].start - 1
    assert sum(counter.count_messages(result.messages)) + 3 <= 2000
    assert pairing_problems(result.messages) == []
    pruned = prune_old_results(messages, ctx_for(messages, 2000, counter, prune_minimum_tokens=1))
    assert pruned.messages[newest] is messages[newest]


def test_the_same_cut_writes_the_same_bytes_whatever_the_estimates_calibration() -> None:
    # The note and the placeholders say nothing a calibrated estimate decides: a model counted by
    # estimate gets the very same forwarded prefix on every request with the same cut.
    notes, placeholders = [], []
    for correction in (1.0, 1.03):
        counter = MessageCounter(EstimateCounter(correction=correction))
        messages = chat(40)
        result = drop_oldest(
            messages, build_context(messages, budget=budget(900), policy=Policy(), counter=counter)
        )
        (span,) = result.dropped
        notes.append(((span.start, span.stop), result.messages[2]["content"]))
        tools = agentic(15, 300)
        pruned = prune_old_results(tools, ctx_for(tools, 2500, counter))
        placeholders.append([m["content"] for m in pruned.messages if m.get("role") == "tool"][:6])
    assert notes[0] == notes[1]
    assert placeholders[0] == placeholders[1]
    assert "tokens" not in notes[0][1] and not any("tokens" in p for p in placeholders[0])


def test_notes_and_placeholders_of_the_older_wording_are_recognised(counter: FakeMessageCounter) -> None:
    # Clients resend what an earlier version wrote: it is still a note (never dropped or summarized
    # as the client's own) and still a placeholder (never pruned again).
    old_note = {
        "role": "user",
        "content": "[ctxproxy: 9 earlier messages (3,349 tokens) were removed here to fit the "
        "context window]",
    }
    assert is_ctxproxy_note(old_note)
    assert is_ctxproxy_note({"role": "assistant", "content": note_text(1)})
    messages = agentic(15, 300)
    old = "[ctxproxy: tool result removed to fit the context window (lookup, 305 tokens)]"
    messages[3] = {**messages[3], "content": old}
    result = prune_old_results(messages, ctx_for(messages, 2500, counter))
    assert result.messages[3] is messages[3]
