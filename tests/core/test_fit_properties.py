"""Property tests of the pipeline over generated conversations (tools, parallel calls, images, CJK,
names) with the word-counting fake."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from app.core.budget import Policy
from app.core.context import (
    block_tokens_for,
    droppable_blocks,
    newest_user_index,
    pinned_indices,
    protect_tokens_for,
    protected_start,
)
from app.core.dialects import CHAT
from app.core.fit import plan_request
from app.core.messages import group_turns, group_units, pairing_problems
from app.core.plan import Plan
from tests.core.fakes import SPEC, TINY_PNG, FakeMessageCounter, body

# Derandomized: CI runs the same 200 examples every time (a counterexample a random run found is
# kept as test_a_user_message_stays_with_its_turn_once_a_newer_one_arrives below).
SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
CJK = "汉字かなカナ한글"


@st.composite
def texts(draw: st.DrawFn) -> str:
    n = draw(st.integers(0, 120))
    if draw(st.booleans()):
        return " ".join(f"w{i}" for i in range(n))
    return " ".join(CJK[i % len(CJK)] * (1 + i % 3) for i in range(n))


@st.composite
def user_message(draw: st.DrawFn) -> dict[str, Any]:
    text = draw(texts())
    message: dict[str, Any]
    if draw(st.integers(0, 4)) == 0:
        message = {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": TINY_PNG}},
            ],
        }
    else:
        message = {"role": "user", "content": text}
    if draw(st.integers(0, 5)) == 0:
        message["name"] = "alice"
    return message


@st.composite
def turn(draw: st.DrawFn, k: int) -> list[dict[str, Any]]:
    out = [draw(user_message())]
    for r in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            ids = [f"call_{k}_{r}_{j}" for j in range(draw(st.integers(1, 3)))]
            calls = [
                {"id": i, "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": i})}}
                for i in ids
            ]
            out.append({"role": "assistant", "content": None, "tool_calls": calls})
            out += [{"role": "tool", "tool_call_id": i, "content": draw(texts())} for i in ids]
        else:
            out.append({"role": "assistant", "content": draw(texts())})
    return out


@st.composite
def conversations(draw: st.DrawFn, min_turns: int = 1, max_turns: int = 14) -> list[list[dict[str, Any]]]:
    """A conversation as its turns; the first item is the preamble (system messages)."""
    preamble = [{"role": "system", "content": draw(texts())} for _ in range(draw(st.integers(0, 2)))]
    n = draw(st.integers(min_turns, max_turns))
    return [preamble, *[draw(turn(k)) for k in range(n)]]


def flat(parts: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [m for part in parts for m in part]


policies = st.builds(
    Policy,
    keep_turns=st.integers(0, 3),
    pin_first_user=st.booleans(),
    prune_minimum_tokens=st.sampled_from([1, 20_000]),
    prune_protect_tool_tokens=st.sampled_from([0, 40_000]),
    drop_block_tokens=st.sampled_from([None, 150, 800]),
    protect_max_share=st.sampled_from([0.25, 0.5, 1.0]),
)


def run(messages: list[dict[str, Any]], cap: int, policy: Policy, counter: FakeMessageCounter) -> Plan:
    return plan_request(
        body(messages), spec=SPEC, policy=policy, counter=counter, cap_tokens=cap, dialect=CHAT
    )


def dropped_indices(plan: Plan) -> set[int]:
    return {i for span in plan.dropped for i in range(span.start, span.stop)}


def tail_start(
    messages: list[dict[str, Any]], plan: Plan, policy: Policy, counter: FakeMessageCounter
) -> int:
    """Where the protected tail of ``messages`` starts under ``plan``'s budget (client counts)."""
    return protected_start(
        messages,
        keep_turns=policy.keep_turns,
        tokens=counter.count_messages(messages),
        max_tokens=protect_tokens_for(plan.budget, policy),
    )


def must_stay_tokens(
    messages: list[dict[str, Any]], plan: Plan, policy: Policy, counter: FakeMessageCounter
) -> int:
    """Tokens of what prune and drop may never touch: pinned, newest user message, protected tail."""
    pinned = pinned_indices(messages, pin_first_user=policy.pin_first_user)
    protected = tail_start(messages, plan, policy, counter)
    newest = newest_user_index(messages)
    counts = counter.count_messages(messages)
    return sum(counts[i] for i in range(len(messages)) if i in pinned or i == newest or i >= protected)


@SETTINGS
@given(parts=conversations(), cap=st.integers(40, 3000), policy=policies)
def test_pipeline_properties(parts: list[list[dict[str, Any]]], cap: int, policy: Policy) -> None:
    counter = FakeMessageCounter()
    messages = flat(parts)
    pristine = copy.deepcopy(messages)
    result = run(messages, cap, policy, counter)

    assert messages == pristine  # never mutated
    assert pairing_problems(result.messages) == []
    assert result.message_tokens == counter.count_messages(result.messages)
    assert result.tokens_after == sum(result.message_tokens) + 3
    assert result.tokens_after <= result.tokens_before
    target = result.budget.input_budget_tokens
    if not result.changed:
        assert all(a is b for a, b in zip(result.messages, messages, strict=True))
        assert result.fits == (result.tokens_before <= target)
    if result.fits:
        assert result.tokens_after <= target
        again = run(list(result.messages), cap, policy, counter)
        assert not again.changed  # idempotent

    # fitting is possible when the pinned messages and the protected tail fit with a note
    pinned = pinned_indices(messages, pin_first_user=policy.pin_first_user)
    keep = must_stay_tokens(messages, result, policy, counter)
    preamble = sum(counter.count_messages(messages)[: len(parts[0])])
    if keep + preamble + 30 + 3 <= target:
        assert result.fits

    kinds = {a.kind for a in result.actions}
    if "last_resort" not in kinds:
        ids = {id(m) for m in result.messages}
        for i in pinned:
            assert id(messages[i]) in ids
        newest_user = group_turns(messages)[-1].start
        assert id(messages[newest_user]) in ids


def completed_last_block(
    before: list[dict[str, Any]],
    after: list[dict[str, Any]],
    old: Plan,
    new: Plan,
    policy: Policy,
    counter: FakeMessageCounter,
) -> bool:
    """True when ``old``'s cut ended inside ``before``'s last droppable block (at one of its inner
    stops, or at its end: everything droppable was dropped) and, in ``after``, that block is
    followed by another (it is complete: only its level stops remain)."""
    size = block_tokens_for(old.budget, policy)

    def blocks(messages: list[dict[str, Any]], plan: Plan) -> list[tuple[int, int]]:
        tokens = counter.count_messages(messages)
        return droppable_blocks(
            messages, tokens, region_stop=tail_start(messages, plan, policy, counter), block_tokens=size
        )

    old_blocks = blocks(before, old)
    if not old_blocks:
        return False
    start, stop = old_blocks[-1]
    if not start < old.dropped[-1].stop <= stop:
        return False
    return any(block[0] == start for block in blocks(after, new)[:-1])


@SETTINGS
@given(
    parts=conversations(min_turns=3, max_turns=16),
    cap=st.integers(200, 2500),
    policy=policies,
    new_words=st.integers(1, 40),
)
def test_forwarded_prefix_is_stable_as_a_conversation_grows(
    parts: list[list[dict[str, Any]]], cap: int, policy: Policy, new_words: int
) -> None:
    """The client resends the history plus one new user message."""
    counter = FakeMessageCounter()
    before = flat(parts)
    after = [*before, {"role": "user", "content": " ".join(f"n{i}" for i in range(new_words))}]
    old = run(before, cap, policy, counter)
    new = run(after, cap, policy, counter)
    lossy = {"pruned", "images", "truncated", "last_resort"}
    if not old.fits or not new.fits or {a.kind for a in (*old.actions, *new.actions)} & lossy:
        event("lossy or not fitting")
        return
    if (
        old.dropped
        and dropped_indices(old) != dropped_indices(new)
        and completed_last_block(before, after, old, new, policy, counter)
    ):
        # The old cut ended inside the old last block, whose every turn start is a stop (so a cut
        # into it can stay while the next turns fit), or dropped all that was droppable; the
        # history grew past a block boundary, that block is complete now and only its level stops
        # remain: the cut is chosen again (one upstream cache miss when a block completes under a
        # cut that reached into it, documented in app/core/context.py).
        event("old cut inside the last block, which has since completed")
        return
    if old.dropped and dropped_indices(old) != dropped_indices(new):
        # a new block was cut: the new cut strictly extends the old one
        assert new.dropped[0].start == old.dropped[0].start
        assert dropped_indices(old) < dropped_indices(new)
        assert new.dropped[-1].stop >= old.dropped[-1].stop
        event("new block cut")
        # every old block boundary stays; only the old last block may have grown (it was the end
        # of the droppable region then, not a block boundary)
        old_stops = [s for span in old.dropped for s in span.block_stops]
        new_stops = {s for span in new.dropped for s in span.block_stops}
        assert set(old_stops[:-1]) <= new_stops
        return
    event("same cut" if old.dropped else "first cut" if new.dropped else "no cut")
    if old.dropped or not new.dropped:
        newest = len(before) - tail_start(before, old, policy, counter)
        keep = len(old.messages) - newest
        assert new.messages[:keep] == old.messages[:keep]


@st.composite
def agent_sessions(
    draw: st.DrawFn, max_units: int = 40
) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """A single-turn agent session as (preamble + the one user message, units): every unit is an
    assistant message with 1-3 (parallel) tool calls and their results, or now and then a reply."""
    head = [{"role": "system", "content": draw(texts())} for _ in range(draw(st.integers(0, 2)))]
    head.append(draw(user_message()))
    units: list[list[dict[str, Any]]] = []
    for r in range(draw(st.integers(1, max_units))):
        if draw(st.integers(0, 5)) == 0:
            units.append([{"role": "assistant", "content": draw(texts())}])
            continue
        ids = [f"call_{r}_{j}" for j in range(draw(st.integers(1, 3)))]
        calls = [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": json.dumps({"q": i})}}
            for i in ids
        ]
        content = draw(st.one_of(st.none(), texts()))
        unit: list[dict[str, Any]] = [{"role": "assistant", "content": content, "tool_calls": calls}]
        unit += [{"role": "tool", "tool_call_id": i, "content": draw(texts())} for i in ids]
        units.append(unit)
    return head, units


agent_policies = st.builds(
    Policy,
    keep_turns=st.integers(0, 3),
    pin_first_user=st.booleans(),
    prune_minimum_tokens=st.sampled_from([1, 20_000]),
    prune_protect_tool_tokens=st.sampled_from([0, 300, 40_000]),
    drop_block_tokens=st.sampled_from([None, 150, 800]),
    protect_max_share=st.sampled_from([0.25, 0.5, 0.75]),
)


@SETTINGS
@given(session=agent_sessions(), cap=st.integers(100, 4000), policy=agent_policies)
def test_single_turn_agent_sessions_fit(
    session: tuple[list[dict[str, Any]], list[list[dict[str, Any]]]], cap: int, policy: Policy
) -> None:
    head, units = session
    counter = FakeMessageCounter()
    messages = [*head, *flat(units)]
    pristine = copy.deepcopy(messages)
    result = run(messages, cap, policy, counter)

    assert messages == pristine
    assert pairing_problems(result.messages) == []
    assert result.tokens_after <= result.tokens_before
    assert result.message_tokens == counter.count_messages(result.messages)
    target = result.budget.input_budget_tokens
    if result.fits:
        assert result.tokens_after <= target
        assert not run(list(result.messages), cap, policy, counter).changed  # idempotent
    kinds = {a.kind for a in result.actions}
    # what prune and drop may never touch, plus a note, fits: so the request fits without cutting
    # the newest messages or the pinned ones
    if must_stay_tokens(messages, result, policy, counter) + 30 + 3 <= target:
        event("fitting is possible")
        assert result.fits
        assert "last_resort" not in kinds
    if "last_resort" not in kinds:
        ids = {id(m) for m in result.messages}
        assert all(
            id(messages[i]) in ids for i in pinned_indices(messages, pin_first_user=policy.pin_first_user)
        )
        assert id(messages[len(head) - 1]) in ids  # the one (newest) user message
        # the newest unit is never pruned or dropped
        assert all(id(m) in ids for m in units[-1]) or "truncated" in kinds
    # every tool group is kept whole or dropped whole
    out_ids = {m.get("tool_call_id") for m in result.messages if m.get("role") == "tool"}
    for unit in units:
        calls = [m["tool_call_id"] for m in unit[1:]]
        kept = [c in out_ids for c in calls]
        assert all(kept) or not any(kept)
    event(",".join(sorted(kinds)) or "unchanged")


def cut_of(plan: Plan, messages: list[dict[str, Any]]) -> tuple[frozenset[str], frozenset[int]]:
    """(tool_call_ids whose result was pruned, input indices dropped) of a plan."""
    pruned = frozenset(
        str(m["tool_call_id"])
        for m in plan.messages
        if m.get("role") == "tool" and str(m.get("content", "")).startswith("[ctxproxy: tool result removed")
    )
    return pruned, frozenset(dropped_indices(plan))


@SETTINGS
@given(
    session=agent_sessions(max_units=60), cap=st.integers(600, 3000), policy=agent_policies, data=st.data()
)
def test_agent_session_forwarded_prefix_is_stable_as_it_grows(
    session: tuple[list[dict[str, Any]], list[list[dict[str, Any]]]],
    cap: int,
    policy: Policy,
    data: st.DataObject,
) -> None:
    """Session k and k+1 (one more unit): the same cut forwards the old output plus the new unit;
    a changed cut only grows the pruned set (the prune boundary moves forward in whole blocks)."""
    head, units = session
    k = data.draw(st.integers(len(units) // 2, len(units) - 1))
    before = [*head, *flat(units[:k])]
    after = [*before, *units[k]]
    counter = FakeMessageCounter()
    old = run(before, cap, policy, counter)
    new = run(after, cap, policy, counter)
    if (
        not old.fits
        or not new.fits
        or {a.kind for a in (*old.actions, *new.actions)} & {"truncated", "last_resort"}
    ):
        event("cut middle-out or not fitting")
        return
    old_pruned, old_dropped = cut_of(old, before)
    new_pruned, new_dropped = cut_of(new, after)
    assert old_pruned <= new_pruned | {str(after[i].get("tool_call_id")) for i in new_dropped}
    if (old_pruned, old_dropped) == (new_pruned, new_dropped):
        event("same cut" if old.changed else "unchanged")
        assert new.messages[: len(old.messages)] == old.messages
        assert list(new.messages[len(old.messages) :]) == units[k]
    else:
        event("new cut")


@st.composite
def messy_messages(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Any order of users, replies, tool calls, matching and stray tool results, legacy functions."""
    out: list[dict[str, Any]] = [{"role": "user", "content": "u"}]
    for k in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["user", "reply", "calls", "tool", "legacy", "function"]))
        if kind == "user":
            out.append({"role": "user", "content": "u"})
        elif kind == "reply":
            out.append({"role": "assistant", "content": "a"})
        elif kind == "calls":
            out.append({"role": "assistant", "tool_calls": [{"id": f"c{k}"}, {"id": f"d{k}"}]})
        elif kind == "tool":
            cid = draw(st.sampled_from([f"c{k - 1}", f"d{k - 2}", "stray"]))
            out.append({"role": "tool", "tool_call_id": cid, "content": "r"})
        elif kind == "legacy":
            out.append({"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}})
        else:
            out.append({"role": "function", "name": "f", "content": "r"})
    return out


def reference_protected_start(
    messages: list[dict[str, Any]], keep_turns: int, tokens: list[int], max_tokens: int
) -> int:
    start = protected_start(messages, keep_turns=keep_turns)
    bound, tail = len(messages), 0
    for unit in reversed(group_units(messages)):
        size = sum(tokens[unit.start : unit.stop])
        if unit.start < start or (bound < len(messages) and tail + size > max_tokens):
            break
        tail, bound = tail + size, unit.start
    return max(start, bound)


@SETTINGS
@given(messages=messy_messages(), keep_turns=st.integers(0, 4), max_tokens=st.integers(0, 40), data=st.data())
def test_the_protected_tail_walks_whole_units_back(
    messages: list[dict[str, Any]], keep_turns: int, max_tokens: int, data: st.DataObject
) -> None:
    tokens = data.draw(st.lists(st.integers(1, 9), min_size=len(messages), max_size=len(messages)))
    got = protected_start(messages, keep_turns=keep_turns, tokens=tokens, max_tokens=max_tokens)
    assert got == reference_protected_start(messages, keep_turns, tokens, max_tokens)
    assert got in {unit.start for unit in group_units(messages)}


def forwarded_bytes(plan: Plan) -> list[str]:
    """The forwarded messages as the bytes a prompt cache compares (one JSON text per message)."""
    return [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in plan.messages]


def growing_block_start(
    messages: list[dict[str, Any]], plan: Plan, policy: Policy, counter: FakeMessageCounter
) -> int:
    """Where the last droppable block of ``messages`` starts (the one that still grows)."""
    blocks = droppable_blocks(
        messages,
        counter.count_messages(messages),
        region_stop=tail_start(messages, plan, policy, counter),
        block_tokens=block_tokens_for(plan.budget, policy),
    )
    return blocks[-1][0] if blocks else len(messages)


def dropped_all_it_could(
    messages: list[dict[str, Any]], plan: Plan, policy: Policy, counter: FakeMessageCounter
) -> bool:
    """``plan`` dropped every message it may drop (outside the tail, not pinned, not the newest
    user message): the drop's fallback when no level fits."""
    stop = tail_start(messages, plan, policy, counter)
    pinned = pinned_indices(messages, pin_first_user=policy.pin_first_user)
    newest = newest_user_index(messages)
    start = next((i for i, m in enumerate(messages) if m.get("role") == "user"), stop)
    droppable = {i for i in range(start, stop) if i not in pinned and i != newest}
    return droppable <= dropped_indices(plan)


def pruned_count(plan: Plan) -> int:
    return sum(a.count for a in plan.actions if a.kind in ("pruned", "images"))


headroom_policies = st.builds(
    Policy,
    keep_turns=st.integers(1, 3),
    pin_first_user=st.booleans(),
    prune_minimum_tokens=st.sampled_from([1, 20_000]),
    prune_protect_tool_tokens=st.sampled_from([0, 300, 40_000]),
    drop_block_tokens=st.sampled_from([None, 150]),
    cut_target=st.sampled_from([0.5, 0.6, 0.8, 1.0]),
)


def check_growing_conversation(
    parts: list[list[dict[str, Any]]], cap: int, policy: Policy, note: Callable[[str], None]
) -> None:
    """Every request of a growing conversation (one more turn each time) whose new messages fit
    behind the previous forwarded request is forwarded as exactly those bytes plus the new
    messages: the cut moves only when the budget is reached again. ``note`` hears what each
    request was (``kept``: its bytes were checked)."""
    counter = FakeMessageCounter()
    previous: Plan | None = None
    kept = crossed = 0
    for n in range(2, len(parts) + 1):
        messages = flat(parts[:n])
        result = run(messages, cap, policy, counter)
        new = parts[n - 1]
        if previous is not None and previous.fits and result.fits:
            lossy = {"truncated", "last_resort"} & {a.kind for a in (*previous.actions, *result.actions)}
            grown = sum(previous.message_tokens) + sum(counter.count_messages(new)) + 3
            if pruned_count(result) or pruned_count(previous):
                # Prune's raw bound (the protected tool tokens) moves with the conversation: when
                # it reaches a new level the request may fit by pruning where the previous one
                # dropped. A miss per prune level, not per turn (test_agent_session_... below).
                note("pruned")
            elif previous.dropped and previous.dropped[-1].stop > growing_block_start(
                flat(parts[: n - 1]), previous, policy, counter
            ):
                # The previous cut reached past the last complete level into the block that still
                # grows (the region outside the tail was smaller than a level): its turn starts were
                # stops then and are not once that block is complete. One miss when it completes.
                note("cut inside the growing block")
            elif previous.dropped and dropped_all_it_could(flat(parts[: n - 1]), previous, policy, counter):
                # No level fitted, so the previous cut dropped everything droppable (the newest
                # user message aside): once that message is history, there is more to drop.
                note("dropped all it could")
            elif not lossy and grown <= result.budget.input_budget_tokens:
                kept += 1
                note("kept")
                assert forwarded_bytes(result) == forwarded_bytes(previous) + [
                    json.dumps(m, sort_keys=True, ensure_ascii=False) for m in new
                ]
            else:
                crossed += 1
                note("crossed")
        previous = result
    note(f"kept {min(kept, 3)}+, crossed {min(crossed, 3)}+")


@SETTINGS
@given(parts=conversations(min_turns=4, max_turns=24), cap=st.integers(300, 2500), policy=headroom_policies)
def test_a_growing_conversation_keeps_its_forwarded_bytes_until_it_crosses_the_budget(
    parts: list[list[dict[str, Any]]], cap: int, policy: Policy
) -> None:
    check_growing_conversation(parts, cap, policy, event)


@SETTINGS
@given(parts=conversations(min_turns=3, max_turns=20), cap=st.integers(200, 2500), policy=headroom_policies)
def test_the_cut_is_a_function_of_the_history(
    parts: list[list[dict[str, Any]]], cap: int, policy: Policy
) -> None:
    """Two instances (one that saw the conversation grow turn by turn, one that sees it cold)
    forward the same bytes for the same history."""
    warm = FakeMessageCounter()
    for n in range(2, len(parts)):
        run(flat(parts[:n]), cap, policy, warm)
    messages = flat(parts)
    a = run(messages, cap, policy, warm)
    b = run(copy.deepcopy(messages), cap, policy, FakeMessageCounter())
    assert forwarded_bytes(a) == forwarded_bytes(b)
    assert a.dropped == b.dropped and a.actions == b.actions


def test_a_user_message_stays_with_its_turn_once_a_newer_one_arrives() -> None:
    # A counterexample a random run found (an empty named user message, CJK text, an image,
    # parallel tool calls): the third turn's user message sat outside the protected tail, newest
    # (so kept) while the cut took the rest of its block; once the next user message made it
    # history, the same level took it too and the cut moved (5 -> 6 removed) although the grown
    # request fitted behind the previous one. A user message now goes with its turn's last message.
    parts = json.loads((Path(__file__).parent / "growing_counterexample.json").read_text(encoding="utf-8"))
    policy = Policy(keep_turns=3, pin_first_user=False, prune_minimum_tokens=20000, cut_target=1.0)
    heard: list[str] = []
    check_growing_conversation(parts, 499, policy, heard.append)
    assert heard == ["kept", "crossed", "kept", "kept 2+, crossed 1+"]
