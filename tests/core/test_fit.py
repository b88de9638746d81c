"""The pipeline: order of the steps, policies, the plan's numbers, stability, the memory, the next cut."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from app.core.budget import Limits, Policy
from app.core.conversation import Conversation
from app.core.dialects import CHAT, RESPONSES
from app.core.errors import InvalidRequest
from app.core.fit import StructureGuardWarning, next_cut_headroom, plan_request
from app.core.memory import index_max_chars, memory_tokens_for, span_index_text
from app.core.messages import Message, pairing_problems
from app.core.plan import Plan, StrategyResult
from app.core.strategies import is_ctxproxy_note
from app.core.tokens import MessageCounter
from tests.core.fakes import (
    SPEC,
    FakeMessageCounter,
    assistant,
    body,
    chat,
    system,
    tool_exchange,
    user,
    words,
)


def plan(
    messages: Sequence[Message], cap: int, counter: MessageCounter, *, summaries: Any = None, **policy: Any
) -> Plan:
    return plan_request(
        body(messages),
        spec=SPEC,
        policy=Policy(**policy),
        counter=counter,
        cap_tokens=cap,
        summaries=summaries,
        dialect=CHAT,
    )


def agentic(rounds: int, result_tokens: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [system(), user(10, "first")]
    for k in range(rounds):
        out += tool_exchange([f"c{k}a", f"c{k}b"], result_tokens)
        out.append(assistant(10, f"r{k}_"))
        out.append(user(10, f"q{k}_"))
    return out


def test_a_fitting_request_is_unchanged_and_keeps_the_same_objects(counter: FakeMessageCounter) -> None:
    messages = chat(5)
    result = plan(messages, 100_000, counter)
    assert result.fits and not result.changed and result.actions == ()
    assert all(a is b for a, b in zip(result.messages, messages, strict=True))
    assert result.tokens_before == result.tokens_after == counter.count_request(body(messages))
    assert result.message_tokens == counter.count_messages(messages)
    assert result.count_kind == "exact"
    assert result.actions_header() == "none"


def test_fits_is_messages_plus_priming_within_the_input_budget(counter: FakeMessageCounter) -> None:
    messages = chat(5)
    need = sum(counter.count_messages(messages)) + 3
    assert not plan(messages, need, counter).changed
    assert plan(messages, need - 1, counter).changed


def test_tool_definitions_count_in_the_budget_and_the_totals(counter: FakeMessageCounter) -> None:
    messages = chat(5)
    tools = [{"type": "function", "function": {"name": "f", "description": words(50)}}]
    need = sum(counter.count_messages(messages)) + 3
    tool_tokens = counter.count_tools({"tools": tools})
    result = plan_request(
        body(messages, tools=tools),
        spec=SPEC,
        policy=Policy(),
        counter=counter,
        cap_tokens=need + tool_tokens,
        dialect=CHAT,
    )
    assert result.fits and not result.changed
    assert result.tokens_before == need + tool_tokens
    result = plan_request(
        body(messages, tools=tools),
        spec=SPEC,
        policy=Policy(),
        counter=counter,
        cap_tokens=need + tool_tokens - 1,
        dialect=CHAT,
    )
    assert result.changed


def test_policy_off_never_changes_or_fails(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    result = plan(messages, 100, counter, mode="off")
    assert result.fits and not result.changed and result.messages == tuple(messages)


def test_policy_reject_is_unchanged_and_rejected_when_over(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    result = plan(messages, 100, counter, mode="reject")
    assert not result.fits and not result.changed and result.messages == tuple(messages)
    assert [a.kind for a in result.actions] == ["rejected"]
    assert plan(messages, 100_000, counter, mode="reject").fits


def test_invalid_messages_raise_invalid_request(counter: FakeMessageCounter) -> None:
    with pytest.raises(InvalidRequest) as info:
        bad = {"messages": [{"role": "robot"}]}
        plan_request(bad, spec=SPEC, policy=Policy(), counter=counter, dialect=CHAT)
    assert info.value.param == "messages[0].role"
    with pytest.raises(InvalidRequest):
        plan_request({}, spec=SPEC, policy=Policy(), counter=counter, dialect=CHAT)


def test_prune_comes_first_and_stops_when_it_fits(counter: FakeMessageCounter) -> None:
    messages = agentic(15, 300)
    result = plan(messages, 7000, counter)
    assert result.fits and result.changed
    assert [a.kind for a in result.actions] == ["pruned"]
    assert len(result.messages) == len(messages)
    assert result.dropped == ()
    assert result.tokens_after <= result.budget.input_budget_tokens
    assert result.message_tokens == counter.count_messages(result.messages)
    assert result.tokens_after == sum(result.message_tokens) + 3


def test_middle_out_before_dropping(counter: FakeMessageCounter) -> None:
    messages = [*chat(10)[:-1], assistant(5000, "huge"), user(10, "newest")]
    result = plan(messages, 3000, counter)
    assert result.fits
    assert [a.kind for a in result.actions] == ["truncated"]
    cut = result.messages[-2]["content"]
    assert cut.startswith("huge0 huge1") and cut.endswith("huge4999")
    assert "characters removed from the middle of this message]" in cut


def test_drop_when_nothing_lighter_is_enough(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    result = plan(messages, 900, counter)
    assert result.fits
    kinds = [a.kind for a in result.actions]
    assert kinds == ["dropped_turns", "dropped_messages"]
    assert result.actions_header().startswith("dropped_turns=")
    (span,) = result.dropped
    assert result.messages[:2] == tuple(messages[:2])
    assert is_ctxproxy_note(result.messages[2])
    assert result.messages[3:] == tuple(messages[span.stop :])


def test_last_resort_and_cannot_fit(counter: FakeMessageCounter) -> None:
    # nothing over half; the newest turn and the reply before it are within the protected share
    messages = [system(80), user(80), assistant(20), user(120)]
    result = plan(messages, 300, counter)
    assert result.fits
    assert [a.kind for a in result.actions] == ["last_resort"]
    assert result.messages[:3] == tuple(messages[:3])
    assert result.messages[3]["content"].startswith("u0 u1")
    result = plan([system(300), user(5)], 200, counter)
    assert result.fits and [a.kind for a in result.actions] == ["last_resort"]
    impossible = [system(3000), {"role": "user", "content": None}]
    result = plan(impossible, 10, counter)
    assert not result.fits and result.changed
    assert result.tokens_after < result.tokens_before
    assert result.tokens_after == sum(counter.count_messages(result.messages)) + 3
    assert result.actions[-1].kind == "rejected"


def test_tool_call_arguments_are_never_cut(counter: FakeMessageCounter) -> None:
    call = tool_exchange(["c1"], 10)
    call[0]["tool_calls"][0]["function"]["arguments"] = '{"q": "' + words(3000) + '"}'
    messages = [system(), user(10), *call, user(10)]
    result = plan(messages, 500, counter)
    assert not pairing_problems(result.messages)
    for message in result.messages:
        for c in message.get("tool_calls") or []:
            assert c["function"]["arguments"] == call[0]["tool_calls"][0]["function"]["arguments"]


def test_the_input_is_never_mutated(counter: FakeMessageCounter) -> None:
    for messages, cap in [
        (agentic(15, 300), 2500),
        (chat(40), 900),
        ([system(), user(10), assistant(5000), user(5)], 800),
    ]:
        pristine = copy.deepcopy(messages)
        result = plan(messages, cap, counter)
        assert result.changed
        assert messages == pristine


def test_the_fitted_body_plans_as_unchanged(counter: FakeMessageCounter) -> None:
    for messages, cap in [(agentic(15, 300), 2500), (chat(40), 900)]:
        first = plan(messages, cap, counter)
        assert first.fits and first.changed
        again = plan(list(first.messages), cap, counter)
        assert not again.changed and again.fits


class Summaries:
    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.calls = 0

    def summary_for(self, span: Sequence[Message], /) -> str | None:
        self.calls += 1
        return self.answer


def test_summaries_only_under_auto_with_summarize(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    provider = Summaries("the gist")
    result = plan(messages, 900, counter, summaries=provider, summarize=True)
    assert provider.calls == 1
    assert "summarized" in [a.kind for a in result.actions]
    (span,) = result.dropped
    memory = result.memory
    assert memory is not None and memory.at == span.stop  # where the forgetting ends
    # It covers the turns up to a memory stop (the pinned task is shown, not summarized).
    assert memory.indices == tuple(range(2, memory.stop)) and memory.stop > 2
    # The memory stands where the note stood (the note is gone): one message for the whole cut,
    # the summary, then the exact strings of what the cut forgot.
    count = len(memory.indices)
    index = span_index_text(
        messages, memory, max_chars=index_max_chars(result.budget, Policy(summarize=True))
    )
    newest = messages[memory.at - 1]["content"].split()[-1]
    assert newest in index  # the newest forgotten message's words (identifier-like)
    head = f"[ctxproxy: summary of {count} earlier messages]\nthe gist\n"
    assert result.messages[2]["content"] == f"{head}[ctxproxy: exact strings from them]\n{index}"
    assert result.messages[3] is messages[span.stop]
    assert [m for m in result.messages if is_ctxproxy_note(m)] == [result.messages[2]]
    assert result.memory_kind == "summary"
    for mode, summarize in [("auto", False), ("truncate", True)]:
        provider = Summaries("the gist")
        result = plan(messages, 900, counter, summaries=provider, mode=mode, summarize=summarize)
        assert provider.calls == 0 and result.memory is None
        assert "summarized" not in [a.kind for a in result.actions]
        assert result.memory_kind == "note"


def test_the_index_alone_is_the_memory_without_summaries(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    for mode in ("auto", "truncate"):
        provider = Summaries("the gist")
        result = plan(messages, 900, counter, summaries=provider, mode=mode, index_memory=True)
        assert provider.calls == 0  # no summary wanted: never asked
        memory = result.memory
        assert memory is not None and memory.summary_tokens == 0
        index = span_index_text(
            messages, memory, max_chars=index_max_chars(result.budget, Policy(index_memory=True))
        )
        (note,) = [m for m in result.messages if is_ctxproxy_note(m)]
        head = (
            f"[ctxproxy: index of {len(memory.forgot)} earlier messages, removed to fit the context window]"
        )
        assert note["content"] == f"{head}\n{index}"
        assert ("indexed", len(memory.forgot)) in [(a.kind, a.count) for a in result.actions]
        assert result.memory_kind == "index" and result.fits
        # A pure function of the conversation: the same bytes every time.
        assert plan(messages, 900, counter, mode=mode, index_memory=True).messages == result.messages


def test_a_summary_is_asked_for_in_the_size_its_memory_stops_allow(counter: FakeMessageCounter) -> None:
    # The summary of a longer span (more memory stops covered) may be longer, never past the most
    # room less its index (the room a cut keeps is sized to both: app.core.memory).
    sizes = []
    for turns in (30, 60, 90):
        result = plan(chat(turns), 1500, counter, summaries=Summaries("the gist"), summarize=True)
        memory = result.memory
        assert memory is not None
        most = memory_tokens_for(result.budget, Policy(summarize=True))
        assert 0 < memory.summary_tokens <= most
        sizes.append((len(memory.earlier), memory.summary_tokens))
    assert sizes == sorted(sizes) and sizes[0][1] < sizes[-1][1]


def test_a_missing_summary_falls_back_to_the_index_with_the_same_cut(counter: FakeMessageCounter) -> None:
    # The cut leaves room for the memory whether or not a summary comes: the same cut either way,
    # so a request whose summary is late forwards the same prefix as the next one with it.
    with_memory = plan(chat(40), 900, counter, summaries=Summaries("the gist"), summarize=True)
    for answer in (None, "   "):
        result = plan(chat(40), 900, counter, summaries=Summaries(answer), summarize=True)
        assert result.fits
        assert "summary_failed" in [a.kind for a in result.actions]
        assert result.messages[2]["content"].startswith("[ctxproxy: index of ")
        assert result.dropped == with_memory.dropped and result.memory == with_memory.memory
        assert result.messages[3:] == with_memory.messages[3:]
        assert result.memory_kind == "index"


def test_a_summary_too_large_for_the_room_falls_back_to_the_index(counter: FakeMessageCounter) -> None:
    result = plan(chat(40), 900, counter, summaries=Summaries(words(5000)), summarize=True)
    assert result.fits and result.messages[2]["content"].startswith("[ctxproxy: index of ")
    (failed,) = [a for a in result.actions if a.kind == "summary_failed"]
    assert failed.detail == "summary too large to fit"


def test_the_memory_stands_for_pruned_tool_results_where_the_forgetting_ends(
    counter: FakeMessageCounter,
) -> None:
    # An agent session pruned but not cut: what the placeholders replaced is still known, from
    # one message after the last pruned exchange (the conversation before it is unchanged bytes).
    messages = agentic(15, 300)
    provider = Summaries("what the tools said")
    result = plan(messages, 2500, counter, summaries=provider, summarize=True)
    kinds = [a.kind for a in result.actions]
    assert "pruned" in kinds and "dropped_messages" not in kinds and "summarized" in kinds
    assert result.memory is not None
    at = next(i for i, m in enumerate(result.messages) if is_ctxproxy_note(m))
    assert "\nwhat the tools said\n[ctxproxy: exact strings from them]\n" in result.messages[at]["content"]
    assert result.messages[at]["role"] == "user"  # after a tool result
    pruned = [i for i, m in enumerate(messages[:at]) if result.messages[i] is not m]
    assert pruned and all(messages[i]["role"] == "tool" for i in pruned)
    assert max(pruned) < result.memory.at == at
    assert result.messages[:at] == tuple(
        m if i not in pruned else result.messages[i] for i, m in enumerate(messages[:at])
    )
    assert result.messages[at + 1 :] == tuple(messages[at:])
    # Every message up to the memory stop but the task (some of them may be shown after it).
    assert result.memory.indices == tuple(range(2, result.memory.stop))
    assert not pairing_problems(result.messages)


def test_dropped_spans_are_input_indices_with_block_stops(counter: FakeMessageCounter) -> None:
    messages = chat(40)
    result = plan(messages, 900, counter)
    (span,) = result.dropped
    assert span.start == 2
    assert list(span.block_stops) == sorted(span.block_stops) and span.block_stops[-1] == span.stop
    assert all(messages[stop]["role"] == "user" for stop in span.block_stops)


def test_forwarded_prefix_is_stable_as_the_conversation_grows(counter: FakeMessageCounter) -> None:
    full = chat(120)
    previous: Plan | None = None
    cuts = 0
    steps = 0
    for turns in range(20, 120):
        messages = full[: 1 + 2 * turns - 1]
        result = plan(messages, 1500, counter)
        assert result.fits
        if previous is not None and previous.dropped:
            (old,) = previous.dropped
            (new,) = result.dropped
            if new == old:
                keep = 3 + (len(previous.messages) - 3) - 4
                assert result.messages[:keep] == previous.messages[:keep]
            else:
                cuts += 1
                assert new.start == old.start and new.stop > old.stop
                assert new.block_stops[: len(old.block_stops)] == old.block_stops
        previous = result
        steps += 1
    assert 0 < cuts <= steps // 3  # cut in whole blocks, not on every turn


def test_the_next_cut_headroom_plans_what_the_next_overflow_forgets(counter: FakeMessageCounter) -> None:
    full = chat(80)
    cap = 1500
    policy = {"summarize": True}
    spans = []
    for turns in range(2, 80):
        messages = full[: 2 * turns]
        current = plan(messages, cap, counter, **policy)
        ahead = plan_request(
            body(messages),
            spec=SPEC,
            policy=Policy(**policy),
            counter=counter,
            cap_tokens=cap,
            headroom_tokens=next_cut_headroom(current, Policy(**policy)),
            dialect=CHAT,
        )
        now = current.memory.indices if current.memory is not None else ()
        next_ = ahead.memory.indices if ahead.memory is not None else ()
        assert next_[: len(now)] == now  # the same span or a longer one: never less
        at = current.memory.at if current.memory is not None else None
        spans.append((now, next_, at))
    # Each time the cut moves the memory on, it moves to the span the plan of the request before
    # it said: the summary made ahead of time is the one the cut needs. (A memory that catches up
    # with a cut made past the last stop, once the conversation grew a new one, is not foreseen:
    # the stop did not exist.)
    moves = [(b[1], a[0]) for b, a in itertools.pairwise(spans) if b[0] != a[0] and b[2] != a[2]]
    assert len(moves) >= 3
    assert all(predicted == actual for predicted, actual in moves)


def test_real_tokenizer_end_to_end() -> None:
    from app.tokenizer import counter_for

    counter = MessageCounter(counter_for("o200k_base"))
    text = "日本語のテキストと English words 🎉 " * 400
    messages = [system(), user(10), {"role": "assistant", "content": text}, *chat(30)[1:]]
    result = plan(messages, 2000, counter)
    assert result.fits and result.changed
    assert result.tokens_after == counter.count_request(body(list(result.messages)))
    assert result.tokens_after <= 2000
    for message in result.messages:
        content = message.get("content")
        if isinstance(content, str):
            assert "\ufffd" not in content
    again = plan(list(result.messages), 2000, counter)
    assert not again.changed


def test_real_tokenizer_middle_out_is_token_exact() -> None:
    from app.core.cutting import truncate_message
    from app.tokenizer import counter_for

    counter = MessageCounter(counter_for("o200k_base"))
    message = {"role": "user", "content": "汉字和emoji🎉混合的文本。" * 500}
    size = counter.count_message(message)
    new, tokens = truncate_message(message, current_tokens=size, target_tokens=300, counter=counter) or (
        {},
        0,
    )
    assert tokens == counter.count_message(new) <= 300
    assert "\ufffd" not in new["content"]
    assert new["content"].startswith("汉字和") and new["content"].endswith("混合的文本。")


def test_real_counter_prunes_old_images_and_tool_results() -> None:
    from app.tokenizer import counter_for
    from tests.core.fakes import image_user

    counter = MessageCounter(counter_for("o200k_base"))
    messages: list[dict[str, Any]] = [system(), user(10, "first")]
    for k in range(30):
        messages += [image_user(5, f"i{k}_"), *tool_exchange([f"c{k}"], 200), assistant(5, f"r{k}_")]
    messages.append(user(10, "newest"))
    before = counter.count_messages(messages)
    cap = sum(before) * 3 // 4
    result = plan(messages, cap, counter, prune_minimum_tokens=1)
    assert result.fits
    kinds = {a.kind: a.count for a in result.actions}
    assert kinds["pruned"] > 0 and kinds["images"] > 0
    assert [a.kind for a in result.actions] == ["pruned", "images"]
    assert not pairing_problems(result.messages)
    assert result.message_tokens == counter.count_messages(result.messages)


def test_a_pinned_message_inside_the_dropped_region_stays_and_splits_the_span(
    counter: FakeMessageCounter,
) -> None:
    messages = chat(40)
    mid = {"role": "developer", "content": "stay here"}
    messages.insert(11, mid)
    result = plan(messages, 900, counter, summaries=Summaries("gist"), summarize=True)
    assert result.fits
    assert mid in result.messages
    first, second = result.dropped
    assert (first.start, first.stop, second.start) == (2, 11, 12)
    assert first.block_stops[-1] == first.stop and second.block_stops[-1] == second.stop
    notes = [m for m in result.messages if is_ctxproxy_note(m)]
    # One memory for both runs, after the pinned message (where the forgetting ends).
    assert len(notes) == 1 and result.messages[3] is notes[0] and result.messages[2] is mid
    memory = result.memory
    assert memory is not None and memory.at == second.stop
    assert memory.indices == tuple(i for i in range(2, memory.stop) if i != 11)  # the pinned one is shown
    assert notes[0]["content"].startswith(f"[ctxproxy: summary of {len(memory.indices)} earlier messages]")
    assert result.memory is not None and 11 not in result.memory.indices


def orphaning(messages: Sequence[Message], ctx: Any) -> StrategyResult:
    """A broken strategy: drops every call and keeps the results."""
    return StrategyResult(tuple(m for m in messages if "tool_calls" not in m))


def test_the_final_guard_catches_a_strategy_that_breaks_pairing_and_falls_back_to_the_input(
    counter: FakeMessageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.fit as fit

    monkeypatch.setattr(fit, "STRATEGIES", (("broken", orphaning),))
    messages = agentic(3, 300)
    with pytest.warns(StructureGuardWarning, match="broke the chat structure"):
        result = plan(messages, 500, counter)
    # In the user's favour: the input unchanged (over its budget here, so not sent), never a body
    # with orphaned results; the problems are on the plan for the service to log.
    assert not result.changed and not result.fits and result.messages == tuple(messages)
    assert result.broken and all("tool" in problem for problem in result.broken)


def test_the_final_guard_falls_back_to_the_deterministic_cut_when_the_memory_broke_it(
    counter: FakeMessageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.fit as fit
    from app.core.memory import Placed

    def orphaning_placement(messages: Sequence[Message], tokens: Sequence[int], *_: Any, **__: Any) -> Placed:
        """A broken memory placement: every call goes, its results stay."""
        kept = [(m, t) for m, t in zip(messages, tokens, strict=True) if "tool_calls" not in m]
        return Placed(tuple(m for m, _ in kept), tuple(t for _, t in kept), index=0, memory_tokens=0)

    messages = agentic(12, 60)
    monkeypatch.setattr(fit, "place_memory", orphaning_placement)
    with pytest.warns(StructureGuardWarning):
        deterministic = plan(messages, 1500, counter, summarize=True)  # the index alone breaks it too
    assert deterministic.changed and deterministic.fits and deterministic.broken
    with pytest.warns(StructureGuardWarning):
        result = plan(messages, 1500, counter, summaries=Summaries("gist"), summarize=True)
    # The same cut without its memory (the note and placeholders): the deterministic cut.
    assert result.changed and result.fits and result.broken
    assert result.messages == deterministic.messages
    assert not {"summarized", "indexed"} & {a.kind for a in result.actions}


def test_the_final_guard_checks_the_rendered_body_of_the_plans_dialect(
    counter: FakeMessageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.fit as fit

    def drops_outputs(messages: Sequence[Message], ctx: Any) -> StrategyResult:
        return StrategyResult(tuple(m for m in messages if m.get("role") != "tool"))

    monkeypatch.setattr(fit, "STRATEGIES", (("broken", drops_outputs),))
    call = {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "w " * 400}
    body = {
        "model": "m",
        "input": [{"role": "user", "content": "go"}, call, output, {"role": "user", "content": "next"}],
    }
    with pytest.warns(StructureGuardWarning, match="responses"):
        result = plan_request(
            body, spec=SPEC, policy=Policy(), counter=counter, cap_tokens=100, dialect=RESPONSES
        )
    assert not result.changed and result.broken
    assert RESPONSES.problems(result.body(body)) == []


def agent_session(units: int, result_tokens: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [system(), user(20, "task")]
    for k in range(units):
        out += tool_exchange([f"c{k}"], result_tokens)
    return out


def test_a_long_single_turn_agent_session_is_pruned_and_dropped(counter: FakeMessageCounter) -> None:
    messages = agent_session(200, 100)
    result = plan(messages, 5000, counter)
    assert result.fits and result.changed
    assert result.tokens_after <= 5000
    kinds = {a.kind for a in result.actions}
    assert {"pruned", "dropped_messages"} <= kinds and "last_resort" not in kinds
    assert result.messages[:2] == tuple(messages[:2])  # the system prompt and the task
    assert result.messages[-10:] == tuple(messages[-10:])  # the newest tool exchanges, untouched
    assert pairing_problems(result.messages) == []
    assert not plan(list(result.messages), 5000, counter).changed


def test_keep_turns_alone_still_protects_a_turn_within_the_share(counter: FakeMessageCounter) -> None:
    messages = agent_session(200, 100)
    result = plan(messages, 5000, counter, protect_max_share=100.0)  # the old, unbounded rule
    assert {a.kind for a in result.actions} == {"last_resort", "rejected"}


def test_in_a_growing_agent_session_the_memory_only_moves_forward_and_ahead_work_is_never_wasted(
    counter: FakeMessageCounter,
) -> None:
    # Prune and drop take turns in a long agent turn (a prune that moves on can bring dropped
    # exchanges back as placeholders), but what is forgotten only grows: the memory's span is
    # always a prefix of the next one, so each summary folds the previous one. What the next-cut
    # plan prepares ahead of time is a prefix of a later memory: a summary the chain will use.
    cap = 3000
    policy = Policy(summarize=True)
    spans: list[tuple[int, ...]] = []
    predicted: list[tuple[int, ...]] = []
    for units in range(2, 200):
        messages = agent_session(units, 40)
        current = plan(messages, cap, counter, summarize=True)
        if current.memory is None:
            continue
        if spans:
            assert current.memory.indices[: len(spans[-1])] == spans[-1]
        spans.append(current.memory.indices)
        ahead = plan_request(
            body(messages),
            spec=SPEC,
            policy=policy,
            counter=counter,
            cap_tokens=cap,
            headroom_tokens=next_cut_headroom(current, policy),
            dialect=CHAT,
        )
        # Never less than now (the same span when nothing more can be forgotten yet: no work).
        assert ahead.memory is not None
        assert ahead.memory.indices[: len(current.memory.indices)] == current.memory.indices
        if ahead.memory.indices != current.memory.indices:
            predicted.append(ahead.memory.indices)
    assert len(set(spans)) >= 4
    # (Those the session ended before reaching cannot be checked. Most moves here come from a new
    # memory stop the conversation grew, which no plan of the request before could foresee.)
    reached = [p for p in predicted if len(p) <= len(spans[-1])]
    assert all(any(s[: len(p)] == p for s in spans) for p in reached)


def test_a_growing_agent_session_keeps_its_forwarded_prefix_most_of_the_time(
    counter: FakeMessageCounter,
) -> None:
    """Resent with one more tool exchange each time: the cut (and so the forwarded prefix) moves
    in groups of blocks, not on every resend, once the old blocks are pruned and cheap."""
    # a real session's proportions: a block holds about 15 tool exchanges, a pruned one is cheap
    tight = {
        "drop_block_tokens": 3000,
        "protect_max_share": 0.25,
        "prune_protect_tool_tokens": 300,
        "prune_minimum_tokens": 1,
    }
    messages = [system(200), user(20, "task")]
    previous: Plan | None = None
    steps = changes = 0
    for k in range(260):
        messages = [*messages, *tool_exchange([f"c{k}"], 150 + (k * 7) % 100)]
        result = plan(messages, 6000, counter, **tight)
        assert result.fits
        if previous is not None and previous.changed and result.changed:
            steps += 1
            if result.messages[: len(previous.messages)] != previous.messages:
                changes += 1
            else:
                assert result.messages[len(previous.messages) :] == tuple(messages[-2:])
        previous = result
    assert previous is not None and {"pruned", "dropped_messages"} <= {a.kind for a in previous.actions}
    assert steps > 200
    assert changes <= steps // 4  # 37 of 232; dropping the fewest blocks each time changes 100


def test_an_input_problem_mid_conversation_does_not_trip_the_guard_when_a_note_shifts_it(
    counter: FakeMessageCounter,
) -> None:
    # Found by the fuzz test: an unanswered call on a non-assistant message is the input's own
    # problem; the note inserted before it moves its position, and the guard compared positions.
    odd = {"role": "system", "tool_calls": [{"id": "call_1", "type": "function"}]}
    messages = [system(), user(10, "first"), *chat(6)[1:], assistant(400, "long"), odd]
    result = plan(messages, 300, counter)
    assert result.changed
    assert pairing_problems(result.messages) != [] and all(
        "call_1" in problem for problem in pairing_problems(result.messages)
    )


class _Upstairs:
    """A dialect stub: the chat dialect's rules, a conversation whose history lives upstream."""

    name = "stub"

    def __getattr__(self, attribute: str) -> Any:
        return getattr(CHAT, attribute)

    def parse(self, body: Any, /) -> Conversation:
        return replace(CHAT.parse(body), fittable=False, unfittable_reason="upstream")

    def render(self, body: Any, messages: Any, /, *, source: Any = None) -> dict[str, Any]:
        return {**body, "items": list(messages)}


def test_the_plan_renders_through_its_dialect_and_defaults_to_chat(counter: FakeMessageCounter) -> None:
    messages = agentic(6, 200)
    chat_plan = plan(messages, 600, counter)
    assert chat_plan.api == "chat" and chat_plan.changed
    assert chat_plan.body(body(messages))["messages"] == list(chat_plan.messages)
    stub = _Upstairs()
    fitted = plan_request(body(messages), spec=SPEC, policy=Policy(), counter=counter, dialect=stub)
    assert fitted.api == "stub" and fitted.body({"model": "m"}) == {"model": "m", "items": list(messages)}


def test_a_conversation_kept_upstream_is_planned_unchanged_with_a_warning(
    counter: FakeMessageCounter,
) -> None:
    messages = agentic(6, 200)
    result = plan_request(
        body(messages), spec=SPEC, policy=Policy(), counter=counter, cap_tokens=600, dialect=_Upstairs()
    )
    assert not result.changed and result.fits and result.warnings == ("history-upstream",)
    assert result.tokens_before == result.tokens_after > 600


def test_a_parsed_conversation_is_not_parsed_again(counter: FakeMessageCounter) -> None:
    messages = chat(4)
    conversation = CHAT.parse(body(messages))
    # The body's messages are ignored when the conversation is given: planning uses the parsed one.
    result = plan_request(
        {"model": "m", "messages": "not parsed"},
        spec=SPEC,
        policy=Policy(),
        counter=counter,
        conversation=conversation,
        dialect=CHAT,
    )
    assert result.messages == tuple(messages)


def test_the_output_cap_comes_from_the_conversation(counter: FakeMessageCounter) -> None:
    messages = chat(2)
    capped = replace(CHAT.parse(body(messages)), requested_output_tokens=321)
    result = plan_request(
        body(messages), spec=SPEC, policy=Policy(), counter=counter, conversation=capped, dialect=CHAT
    )
    assert result.budget.reserve_tokens == 321


def test_an_output_cap_limit_lowers_the_forwarded_cap_and_says_so(counter: FakeMessageCounter) -> None:
    messages = chat(5)
    request = {**body(messages), "max_tokens": 5_000}
    plain = plan_request(request, spec=SPEC, policy=Policy(), counter=counter, dialect=CHAT)
    assert plain.output_cap_tokens is None and not plain.changed
    lowered = plan_request(
        request, spec=SPEC, policy=Policy(), counter=counter, limits=Limits(output_cap_tokens=1_000),
        dialect=CHAT,
    )
    assert lowered.fits and lowered.changed and lowered.output_cap_tokens == 1_000
    assert lowered.budget.reserve_tokens == 1_000
    assert [a.kind for a in lowered.actions] == ["output_lowered"]
    forwarded = lowered.body(request)
    assert forwarded["max_tokens"] == 1_000 and forwarded["messages"] == messages
    # A cap at or above the client's own lowers nothing; a body without a cap is left without one.
    same = plan_request(
        request, spec=SPEC, policy=Policy(), counter=counter, limits=Limits(output_cap_tokens=5_000),
        dialect=CHAT,
    )
    assert same.output_cap_tokens is None and not same.changed
    bare = plan_request(
        body(messages), spec=SPEC, policy=Policy(), counter=counter, limits=Limits(output_cap_tokens=10),
        dialect=CHAT,
    )
    assert bare.output_cap_tokens is None and bare.budget.reserve_tokens == 10


def test_a_plan_that_does_not_fit_carries_no_lowered_cap(counter: FakeMessageCounter) -> None:
    request = {**body(chat(30)), "max_tokens": 5_000}
    over = plan_request(
        request,
        spec=SPEC,
        policy=Policy(mode="reject"),
        counter=counter,
        cap_tokens=50,
        limits=Limits(output_cap_tokens=100),
        dialect=CHAT,
    )
    assert not over.fits and over.output_cap_tokens is None
    assert "output_lowered" not in [a.kind for a in over.actions]


class OnlyFor:
    """A provider with the summary of one span only (by its length)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.asked: list[int] = []

    def summary_for(self, span: Sequence[Message], /) -> str | None:
        self.asked.append(len(span))
        return "the earlier gist" if len(span) == self.length else None


def test_the_summary_of_an_earlier_span_stands_in_while_the_new_one_is_not_there(
    counter: FakeMessageCounter,
) -> None:
    messages = chat(80)
    planned = plan(messages, 1500, counter, summarize=True)
    assert planned.memory is not None and planned.memory.earlier
    earlier = planned.memory.until(planned.memory.earlier[0])
    provider = OnlyFor(len(earlier.indices))
    result = plan(messages, 1500, counter, summaries=provider, summarize=True)
    assert provider.asked[:2] == [len(planned.memory.indices), len(earlier.indices)]
    memory = [m for m in result.messages if is_ctxproxy_note(m)]
    assert len(memory) == 1
    assert memory[0]["content"].startswith(
        f"[ctxproxy: summary of {len(earlier.indices)} earlier messages]\nthe earlier gist\n"
        "[ctxproxy: exact strings from them]\n"
    )
    assert ("summarized", len(earlier.indices)) in [(a.kind, a.count) for a in result.actions]
    assert result.memory == planned.memory  # the span to summarize is still the new one
    # The same cut either way: only the memory's text differs.
    with_new = plan(messages, 1500, counter, summaries=Summaries("gist"), summarize=True)
    assert len(with_new.messages) == len(result.messages)


# -- nothing done to what is dropped --------------------------------------------------------


def long_chat(turns: int, tokens: int) -> list[dict[str, Any]]:
    """Turns of two long messages: at a small budget every one is a middle-out candidate."""
    out: list[dict[str, Any]] = [system()]
    for k in range(turns):
        out += [user(tokens, f"u{k}_"), assistant(tokens, f"a{k}_")]
    out.append(user(10, "now"))
    return out


def mixed_session(rounds: int, reply_tokens: int) -> list[dict[str, Any]]:
    """An agent's turns: tool exchanges, then a long answer and the user's next message."""
    out: list[dict[str, Any]] = [system(), user(10, "task")]
    for k in range(rounds):
        out += tool_exchange([f"c{k}a", f"c{k}b"], 150 + 40 * (k % 5))
        out += [assistant(reply_tokens + 30 * (k % 7), f"r{k}_"), user(20 + 200 * (k % 3), f"q{k}_")]
    return out


CORPUS = [
    *(
        (long_chat(turns, tokens), cap)
        for turns, tokens in ((6, 120), (30, 300), (60, 400))
        for cap in (450, 900, 2500)
    ),
    *(
        (mixed_session(rounds, reply), cap)
        for rounds, reply in ((10, 300), (40, 700))
        for cap in (600, 1500, 4000)
    ),
    *(
        ([*chat(4), assistant(1500, "big"), user(10, "now")], cap) for cap in (1200, 2000)
    ),  # cutting alone fits
]
POLICIES: list[dict[str, Any]] = [{}, {"summarize": True}, {"keep_turns": 1, "cut_target": 0.8}]


def cutting_first(*, old: bool, cut: list[int] | None = None) -> Any:
    """Middle-out with every pending cut made before the drop decides; ``old``: handed to the drop
    as cut messages, as the pipeline did before the drop decided first (their indices in ``cut``)."""
    from app.core.plan import Action
    from app.core.strategies import middle_out

    def step(messages: Sequence[Message], ctx: Any) -> StrategyResult:
        result = middle_out(messages, ctx)
        if result.pending is None:
            return result
        made = {i: result.pending.cut(i) for i in result.pending.indices}
        if not old:
            return result
        cuts = {i: found for i, found in made.items() if found is not None}
        if cut is not None:
            cut.extend(cuts)
        out = tuple(cuts[i][0] if i in cuts else m for i, m in enumerate(messages))
        freed = sum(ctx.tokens[i] - found[1] for i, found in cuts.items())
        return StrategyResult(out, (Action("truncated", len(cuts), freed),) if cuts else ())

    return step


def with_middle_out(monkeypatch: pytest.MonkeyPatch, step: Any) -> None:
    import app.core.fit as fit

    steps = tuple((name, step if name == "middle_out" else s) for name, s in fit.STRATEGIES)
    monkeypatch.setattr(fit, "STRATEGIES", steps)


def dropped_indices(result: Plan) -> set[int]:
    return {i for span in result.dropped for i in range(span.start, span.stop)}


def test_a_message_the_drop_removes_is_not_cut_first(
    counter: FakeMessageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.core.cutting as cutting

    cut: list[int] = []
    messages = long_chat(60, 400)
    real = cutting.truncate_message

    def spy(message: Message, **options: Any) -> Any:
        cut.append(next(i for i, m in enumerate(messages) if m is message))
        return real(message, **options)

    monkeypatch.setattr(cutting, "truncate_message", spy)
    result = plan(messages, 1200, counter)
    assert result.fits and len(dropped_indices(result)) > 100
    # Before the drop decided first, all 120 long messages were cut, then almost all dropped. Now
    # only the kept ones are, and what the decision needed: the next level down (one message).
    kept_cut = [a.count for a in result.actions if a.kind == "truncated"]
    assert len(cut) <= sum(kept_cut) + 1
    assert len([i for i in cut if i in dropped_indices(result)]) <= 1


@pytest.mark.parametrize("case", range(len(CORPUS)))
def test_the_drop_decides_as_if_every_cut_were_made_first(
    case: int, counter: FakeMessageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages, cap = CORPUS[case]
    lazy = [plan(messages, cap, counter, **p) for p in POLICIES]
    with_middle_out(monkeypatch, cutting_first(old=False))
    eager = [plan(messages, cap, counter, **p) for p in POLICIES]
    for a, b in zip(lazy, eager, strict=True):
        assert (a.messages, a.message_tokens, a.actions, a.dropped, a.memory) == (
            b.messages,
            b.message_tokens,
            b.actions,
            b.dropped,
            b.memory,
        )


@pytest.mark.parametrize("case", range(len(CORPUS)))
def test_the_plans_are_those_of_cutting_everything_first_unless_that_dropped_a_cut(
    case: int, counter: FakeMessageCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the drop decided first, middle-out cut every candidate and the drop counted its
    levels on the cut counts. The plans are the same whenever none of those cuts was dropped;
    otherwise the levels are counted on the counts before the cuts (no cut is made to count them)
    and the cut may end at another level, fitting all the same."""
    messages, cap = CORPUS[case]
    new = [plan(messages, cap, counter, **p) for p in POLICIES]
    cut: list[int] = []
    with_middle_out(monkeypatch, cutting_first(old=True, cut=cut))
    for a, p in zip(new, POLICIES, strict=True):
        cut.clear()
        b = plan(messages, cap, counter, **p)
        assert a.fits == b.fits
        if not dropped_indices(b) & set(cut):
            assert (a.messages, a.message_tokens, a.memory, a.actions, a.dropped) == (
                b.messages,
                b.message_tokens,
                b.memory,
                b.actions,
                b.dropped,
            )
