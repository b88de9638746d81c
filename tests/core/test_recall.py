"""Recall's pure rules: stable ids where the text was, what each id stands for, pages, the tool's offer."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest

from app.core.budget import Policy
from app.core.conversation import Conversation
from app.core.cutting import truncate_message
from app.core.dialects import CHAT
from app.core.fit import cut_tool_tokens, next_cut_headroom, plan_request
from app.core.memory import MEMORY_HEAD_RE, memory_text
from app.core.messages import Message, pairing_problems
from app.core.plan import Plan
from app.core.recall import (
    PAGE_CHARS,
    RECALL_TOOL,
    RECALLED_HEAD,
    Recallable,
    is_compaction,
    is_recalled,
    page_of,
    parse_arguments,
    prefix_refs,
    recall_answer,
    recall_ref,
    recallables,
    refs_in,
    span_text,
)
from app.core.strategies import is_ctxproxy_note, note_text, pruned_text
from tests.core.fakes import (
    SPEC,
    FakeMessageCounter,
    agent_session,
    assistant,
    body,
    system,
    tool_exchange,
    user,
    words,
)


def plan(
    messages: Sequence[Message], cap: int, counter: FakeMessageCounter, *, recall: str = "ids", **extra: Any
) -> Plan:
    return plan_request(
        body(messages, **extra),
        spec=SPEC,
        policy=Policy(recall=recall),  # type: ignore[arg-type]
        counter=counter,
        cap_tokens=cap,
        dialect=CHAT,
    )


def agentic(rounds: int, result_tokens: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [system(), user(10, "first")]
    for k in range(rounds):
        out += tool_exchange([f"c{k}"], result_tokens, tag=f"t{k}_")
        out.append(assistant(10, f"r{k}_"))
        out.append(user(10, f"q{k}_"))
    return out


def texts(messages: Sequence[Message]) -> str:
    return "\n".join(json.dumps(m.get("content")) for m in messages)


def test_an_id_is_a_pure_function_of_the_content() -> None:
    ref = recall_ref("the exact error text")
    assert ref == recall_ref("the exact error text")
    assert ref != recall_ref("the exact error text.")
    assert len(ref) == 12 and int(ref, 16) >= 0


def test_the_ids_of_a_drops_levels_are_those_of_their_transcripts() -> None:
    # One hash carried along names every prefix of the dropped blocks exactly as hashing each
    # level's transcript would (a recall's own turns left out, non-ASCII and lone surrogates kept).
    call = {"id": "c1", "type": "function", "function": {"name": RECALL_TOOL, "arguments": "{}"}}
    groups: list[list[Message]] = [
        [{"role": "user", "content": "first \u00e9 \ud800"}],
        [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "user", "content": "x"}],
        [],
        [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}]}],
    ]
    flat: list[Message] = []
    expected = [recall_ref(span_text(flat))]
    for group in groups:
        flat = [*flat, *group]
        expected.append(recall_ref(span_text(flat)))
    positions = itertools.count()
    assert prefix_refs([[(next(positions), m) for m in group] for group in groups]) == expected
    assert len(set(expected)) == 4  # the empty group names the same span as the one before


def test_a_level_that_brings_a_message_before_what_was_hashed_names_its_transcript_in_order() -> None:
    # A user message goes with its turn's last part (strategies._drop_levels): the levels before
    # it leave it out, the one that takes it names the transcript with it in its place.
    messages: list[Message] = [
        {"role": "user" if i in (2, 6) else "assistant", "content": f"m{i}"} for i in range(9)
    ]
    levels = [[0, 1], [3], [4, 5], [2, 7], [8], [6]]
    taken: list[int] = []
    expected = [recall_ref("")]
    for level in levels:
        taken = sorted([*taken, *level])
        expected.append(recall_ref(span_text([messages[i] for i in taken])))
    assert prefix_refs([[(i, messages[i]) for i in level] for level in levels]) == expected


def test_the_texts_the_steps_write_name_their_id_and_are_recognised_as_their_own() -> None:
    ref = recall_ref("x")
    placeholder = pruned_text(1234, "Read", ref)
    assert placeholder.endswith(f"(Read, 1,234 characters; recall id {ref})]")
    assert refs_in(placeholder) == [ref]
    note = note_text(3, ref)
    assert is_ctxproxy_note({"role": "user", "content": note})
    assert is_ctxproxy_note({"role": "user", "content": note_text(3)})
    memory = memory_text(4, "what happened", ref)
    assert MEMORY_HEAD_RE.match(memory) and is_ctxproxy_note({"role": "assistant", "content": memory})


def test_a_plan_names_what_it_pruned_dropped_and_cut_by_the_id_of_exactly_that() -> None:
    counter = FakeMessageCounter()
    messages = agentic(12, 300)
    fitted = plan(messages, 600, counter)
    assert fitted.changed and fitted.fits and fitted.recall
    assert {"pruned", "truncated", "dropped_messages"} <= {a.kind for a in fitted.actions}
    shown = texts(fitted.messages)
    sources = [m.get("content") for m in messages]
    for entry in fitted.recall:
        assert recall_ref(entry.text) == entry.ref
        assert entry.ref in shown  # named where it was
    # A pruned result stands for its own text, the drop's note for the transcript of what it dropped.
    whole = [e for e in fitted.recall if e.text in sources]  # pruned results and the cut message
    spans = [e for e in fitted.recall if e.text not in sources]
    assert len(whole) >= 2 and len(spans) == 1
    dropped = [i for span in fitted.dropped for i in range(span.start, span.stop)]
    assert spans[0].text == span_text([messages[i] for i in dropped])


def test_ids_keep_the_prompt_bytes_stable_from_one_request_to_the_next() -> None:
    counter = FakeMessageCounter()
    messages = agentic(12, 300)
    first = plan(messages, 1500, counter)
    again = plan(messages, 1500, FakeMessageCounter())
    assert first.messages == again.messages and first.recall == again.recall
    grown = plan([*messages, assistant(10, "next_"), user(10, "more_")], 1500, counter)
    shared = [m for m in grown.messages if m in first.messages]
    assert len(shared) >= len(first.messages) - 2  # the same placeholders, byte for byte


def test_without_recall_the_texts_are_as_before() -> None:
    counter = FakeMessageCounter()
    fitted = plan(agentic(12, 300), 1500, counter, recall="off")
    assert fitted.changed and not fitted.recall and "recall id" not in texts(fitted.messages)


def test_a_cut_names_the_whole_text_and_a_cut_again_keeps_that_id() -> None:
    counter = FakeMessageCounter()
    text = words(400, "long")
    message = {"role": "user", "content": text}
    cut = truncate_message(message, current_tokens=400, target_tokens=200, counter=counter, recall=True)
    assert cut is not None
    assert refs_in(cut[0]["content"]) == [recall_ref(text)]
    again = truncate_message(cut[0], current_tokens=cut[1], target_tokens=120, counter=counter, recall=True)
    assert again is not None and refs_in(again[0]["content"]) == [recall_ref(text)]


def test_a_recalled_answer_is_never_pruned_or_cut() -> None:
    counter = FakeMessageCounter()
    recalled = f"{RECALLED_HEAD}recall id 0123456789ab, page 1 of 1]\n" + words(600, "got")
    message = {"role": "tool", "tool_call_id": "c0", "content": recalled}
    assert is_recalled(message)
    assert (
        truncate_message(message, current_tokens=600, target_tokens=50, counter=counter, recall=True) is None
    )
    messages = agent_session(10, 300)
    messages[3] = {**messages[3], "content": recalled}
    fitted = plan(messages, 1500, counter)
    assert fitted.changed
    assert all(m.get("content") == recalled for m in fitted.messages if m.get("tool_call_id") == "c0_0")


def test_the_tool_is_offered_after_the_clients_tools_only_when_the_plan_names_an_id() -> None:
    counter = FakeMessageCounter()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    cut = plan(agentic(12, 300), 1500, counter, recall="tool", tools=tools)
    assert cut.recall_tool
    sent = cut.body(body(agentic(12, 300), tools=tools))
    assert [t["function"]["name"] for t in sent["tools"]] == ["lookup", RECALL_TOOL]
    assert not pairing_problems(sent["messages"])
    # The tool's definition is in the budget: what is sent is what the plan counted.
    assert cut.tokens_after == counter.count_request(sent)
    # The same bytes on the next request.
    again = plan(agentic(12, 300), 1500, counter, recall="tool", tools=tools).body(
        body(agentic(12, 300), tools=tools)
    )
    assert json.dumps(again["tools"]) == json.dumps(sent["tools"])
    fits = plan(agentic(2, 30), 100_000, counter, recall="tool", tools=tools)
    assert not fits.changed and not fits.recall_tool


@pytest.mark.parametrize(
    "extra",
    [
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "lookup"}}},
        {"tool_choice": "none"},
        {"n": 2},
    ],
)
def test_a_forced_choice_gets_the_ids_but_not_the_tool(extra: dict[str, Any]) -> None:
    counter = FakeMessageCounter()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    forced = plan(agentic(12, 300), 1500, counter, recall="tool", tools=tools, **extra)
    assert forced.recall and not forced.recall_tool
    assert [
        t["function"]["name"] for t in forced.body(body(agentic(12, 300), tools=tools, **extra))["tools"]
    ] == ["lookup"]


@pytest.mark.parametrize(
    "prompt",
    [
        "Your task is to create a detailed summary of the conversation so far, paying close attention",
        "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",
        "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary",
        "A previous <state_snapshot> exists.\n\nFirst, reason in your scratchpad. Then, generate the updated "
        "<state_snapshot>.",
    ],
)
def test_a_clients_own_compaction_request_is_not_offered_the_tool(prompt: str) -> None:
    counter = FakeMessageCounter()
    messages = [*agentic(12, 300), {"role": "user", "content": prompt}]
    assert is_compaction(messages)
    compaction = plan(messages, 1500, counter, recall="tool")
    assert compaction.recall and not compaction.recall_tool
    assert not is_compaction(agentic(2, 10))
    snapshot = [system(), {"role": "user", "content": "<state_snapshot>old</state_snapshot>"}, user(5, "now")]
    assert not is_compaction(snapshot)


def test_a_client_tool_of_the_same_name_turns_the_offer_off() -> None:
    counter = FakeMessageCounter()
    tools = [{"type": "function", "function": {"name": RECALL_TOOL, "parameters": {"type": "object"}}}]
    own = plan(agentic(12, 300), 1500, counter, recall="tool", tools=tools)
    assert not own.recall_tool


def test_pages_are_fixed_slices_and_every_miss_has_its_answer() -> None:
    text = "".join(f"{i:06d}" for i in range(10_000))  # 60,000 characters
    first = page_of(text, 1)
    assert first is not None and (first.start, first.stop, first.pages) == (0, PAGE_CHARS, 3)
    assert page_of(text, 4) is None
    answer, miss = recall_answer("0123456789ab", text, 2, max_chars=100_000)
    assert not miss and answer.startswith(RECALLED_HEAD)
    assert text[PAGE_CHARS : 2 * PAGE_CHARS] in answer and "page 3 holds the next" in answer
    short, miss = recall_answer("0123456789ab", text, 1, max_chars=1000)
    assert not miss and "does not fit" in short and text[:1000] in short and text[:1001] not in short
    for case in (
        recall_answer("0123456789ab", None, 1, max_chars=5000),
        recall_answer("0123456789ab", text, 9, max_chars=5000),
        recall_answer("0123456789ab", text, 1, max_chars=10),
    ):
        assert case[1] and case[0].startswith(RECALLED_HEAD)
    assert is_recalled({"role": "tool", "content": answer})


def test_arguments_are_read_forgivingly() -> None:
    assert parse_arguments('{"id": " 0123456789AB ", "page": 2}') == ("0123456789ab", 2)
    assert parse_arguments({"id": "x", "page": "3"}) == ("x", 3)
    assert parse_arguments({"id": "x", "page": -1}) == ("x", 1)
    assert parse_arguments("not json") == (None, 1)
    assert parse_arguments({}) == (None, 1)


def test_a_conversation_whose_history_lives_upstream_is_never_offered_the_tool() -> None:
    counter = FakeMessageCounter()
    messages = agentic(12, 300)
    upstream = Conversation(model="m", messages=tuple(messages), fittable=False)
    kept = plan_request(
        body(messages),
        spec=SPEC,
        policy=Policy(recall="tool"),
        counter=counter,
        cap_tokens=1500,
        conversation=upstream,
        dialect=CHAT,
    )
    assert not kept.changed and not kept.recall_tool


def test_the_next_cut_is_planned_with_the_budget_a_cut_has() -> None:
    counter = FakeMessageCounter()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    request = body(agentic(8, 100), tools=tools)
    fits = plan_request(
        request, spec=SPEC, policy=Policy(recall="tool"), counter=counter, cap_tokens=3000, dialect=CHAT
    )
    assert not fits.changed
    with_tool = cut_tool_tokens(
        request, CHAT.parse(request), dialect=CHAT, policy=Policy(recall="tool"), counter=counter
    )
    assert with_tool > fits.budget.tool_tokens  # a cut would offer ctx_recall: its tokens join the budget
    plain = next_cut_headroom(fits, Policy(recall="tool"))
    assert next_cut_headroom(fits, Policy(recall="tool"), cut_tool_tokens=with_tool) == plain - (
        with_tool - fits.budget.tool_tokens
    )
    off = cut_tool_tokens(request, CHAT.parse(request), dialect=CHAT, policy=Policy(), counter=counter)
    assert off == fits.budget.tool_tokens


def test_the_notes_id_takes_a_known_text_and_is_the_same_without_it() -> None:
    source = [system(), user(10, "first"), assistant(40, "a_"), user(40, "b_")]
    source += [assistant(10, "c_"), user(10, "d_")]
    dropped = span_text(source[2:4])
    ref = recall_ref(dropped)
    fitted = [source[0], source[1], {"role": "user", "content": note_text(2, ref)}, source[4], source[5]]
    origins = [0, 1, None, 4, 5]
    made = recallables(source, fitted, origins, note_at=2)
    assert made == (Recallable(ref, dropped),)
    # The memory's transcript of the same messages, made already: the same entry.
    assert recallables(source, fitted, origins, note_at=2, known=[Recallable(ref, dropped)]) == made
    # A known text the note does not name is not the note's.
    other = Recallable(recall_ref("something else"), "something else")
    assert recallables(source, fitted, origins, note_at=2, known=[other]) == made
