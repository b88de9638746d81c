"""The parse memo: a parse that reuses a remembered one equals a fresh parse, exactly (same
values, same types, same key order), whatever changed in between; and the dialects' fast paths
for plain dicts agree with their ``Mapping`` fallbacks."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.conversation import Conversation
from app.core.dialects.messages import MESSAGES
from app.core.dialects.responses import RESPONSES
from app.core.errors import InvalidRequest
from app.core.parse_memo import ParseMemo, equal_prefix, same_scalars, scalar_paths
from tests.core.dialects.responses_kit import body as responses_body
from tests.core.dialects.responses_kit import call, output, reasoning, said, user
from tests.core.dialects.test_messages import anthropic_bodies
from tests.core.dialects.test_responses_properties import sessions

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def exact(conversation: Conversation) -> str:
    """``repr`` tells ``1`` from ``True`` and ``1.0`` and shows key order: an exact comparison."""
    return repr(conversation)


def wire_items(body: dict[str, Any]) -> list[Any]:
    return body["input"] if "input" in body else body["messages"]


def with_items(body: dict[str, Any], items: list[Any]) -> dict[str, Any]:
    key = "input" if "input" in body else "messages"
    return {**body, key: items}


def dialect_of(body: dict[str, Any]) -> Any:
    return RESPONSES if "input" in body else MESSAGES


def resent(body: dict[str, Any], cut: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body as an earlier turn sent it (its first ``cut`` items) and as it is now, parsed from
    separate JSON (deep copies: equal, not identical)."""
    items = wire_items(body)
    earlier = with_items(copy.deepcopy(body), copy.deepcopy(items[: max(1, cut)]))
    return earlier, copy.deepcopy(body)


bodies = st.one_of(sessions(), anthropic_bodies())


@SETTINGS
@given(body=bodies, data=st.data())
def test_a_resent_conversation_parses_exactly_as_a_fresh_parse(
    body: dict[str, Any], data: st.DataObject
) -> None:
    dialect = dialect_of(body)
    cut = data.draw(st.integers(0, len(wire_items(body))))
    earlier, now = resent(body, cut)
    memo = ParseMemo(min_items=1)
    with contextlib.suppress(InvalidRequest):
        # A cut may orphan an output: refused, though what its items built is remembered (it is
        # a pure function of them, valid or not as a whole).
        dialect.parse(earlier, memo=memo)
    assert exact(dialect.parse(now, memo=memo)) == exact(dialect.parse(copy.deepcopy(body)))
    # and again, now from a remembered parse of the very same conversation
    assert exact(dialect.parse(copy.deepcopy(body), memo=memo)) == exact(dialect.parse(body))


@SETTINGS
@given(body=bodies, data=st.data())
def test_every_step_of_a_growing_session_parses_exactly_as_a_fresh_parse(
    body: dict[str, Any], data: st.DataObject
) -> None:
    # Each parse starts from the remembered parse of the step before (itself made from a taken
    # run and a tail): what is taken wholesale stays exact over many steps, also when one step
    # changes an earlier item.
    dialect = dialect_of(body)
    items = wire_items(body)
    cuts = sorted(data.draw(st.lists(st.integers(1, len(items)), min_size=1, max_size=5)))
    changed_at = data.draw(st.none() | st.integers(0, len(items) - 1))
    memo = ParseMemo(min_items=1)
    for step, cut in enumerate([*cuts, len(items)]):
        part = copy.deepcopy(items[:cut])
        if changed_at is not None and step == 1 and changed_at < cut:
            part[changed_at] = _changed(part[changed_at])
        now = with_items(copy.deepcopy(body), part)
        try:
            fresh = exact(dialect.parse(copy.deepcopy(now)))
        except InvalidRequest as error:
            with pytest.raises(InvalidRequest) as raised:
                dialect.parse(now, memo=memo)
            assert raised.value.param == error.param
            continue
        assert exact(dialect.parse(now, memo=memo)) == fresh


@SETTINGS
@given(body=bodies, data=st.data())
def test_a_memo_never_returns_a_stale_message_when_an_earlier_item_changed(
    body: dict[str, Any], data: st.DataObject
) -> None:
    dialect = dialect_of(body)
    memo = ParseMemo(min_items=1)
    dialect.parse(body, memo=memo)
    items = copy.deepcopy(wire_items(body))
    k = data.draw(st.integers(0, len(items) - 1))
    items[k] = _changed(items[k])
    changed = with_items(copy.deepcopy(body), items)
    assert exact(dialect.parse(changed, memo=memo)) == exact(dialect.parse(copy.deepcopy(changed)))


def _changed(item: Any) -> Any:
    """``item`` with one string changed (its first text, else an added key)."""
    if isinstance(item, dict):
        for key, value in item.items():
            if isinstance(value, str) and key not in ("type", "role", "call_id", "tool_use_id", "id"):
                return {**item, key: value + " changed"}
            if isinstance(value, list) and value:
                return {**item, key: [_changed(value[0]), *value[1:]]}
        return {**item, "note": "changed"}
    return item


@pytest.mark.parametrize(
    ("before", "after"),
    [(1, True), (1, 1.0), (True, 1), (0, False), (1.0, 1), (0.0, -0.0)],
)
def test_numbers_and_booleans_that_compare_equal_are_never_reused(before: Any, after: Any) -> None:
    def session(value: Any) -> dict[str, Any]:
        items: list[dict[str, Any]] = [user("hello")]
        items.append({"type": "computer_call", "id": "cu_1", "call_id": "k1", "action": {"x": value}})
        items.append({"type": "computer_call_output", "call_id": "k1", "output": {"n": value}})
        items.append({"type": "web_search_call", "id": "ws", "status": "completed", "action": {"n": value}})
        items.append(said("done"))
        return responses_body(items)

    memo = ParseMemo(min_items=1)
    RESPONSES.parse(session(before), memo=memo)
    assert session(before) == session(after)  # what makes the case: ``==`` takes one for the other
    assert exact(RESPONSES.parse(session(after), memo=memo)) == exact(RESPONSES.parse(session(after)))


def agent_session(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for t in range(turns):
        items.append(user(f"turn {t}"))
        items.append(reasoning(f"rs_{t}"))
        items += [call(f"c{t}"), output(f"c{t}", f"result {t}")]
        items.append(said(f"answer {t}", item_id=f"msg_{t}"))
    return responses_body(items, instructions="be brief")


def test_the_unchanged_history_of_a_resent_session_is_reused_not_rebuilt() -> None:
    memo = ParseMemo()
    first = RESPONSES.parse(agent_session(8), memo=memo)
    again = RESPONSES.parse(agent_session(9), memo=memo)
    assert exact(again) == exact(RESPONSES.parse(agent_session(9)))
    # the messages of the first 8 turns are the remembered objects (instructions are rebuilt)
    shared = [a is b for a, b in zip(first.messages[1:], again.messages[1:], strict=False)]
    assert all(shared) and len(shared) == len(first.messages) - 1
    assert len(memo) == 1  # the entry it came from was replaced


def test_a_list_shorter_than_the_minimum_is_neither_looked_up_nor_remembered() -> None:
    memo = ParseMemo(min_items=8)
    short = agent_session(1)
    assert not memo.remembers(short["input"]) and memo.remembers(agent_session(2)["input"])
    assert exact(RESPONSES.parse(short, memo=memo)) == exact(RESPONSES.parse(short))
    assert len(memo) == 0
    RESPONSES.parse(agent_session(2), memo=memo)
    assert len(memo) == 1
    few = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert exact(MESSAGES.parse(few, memo=memo)) == exact(MESSAGES.parse(few))
    assert len(memo) == 1


def test_an_output_that_arrives_later_regroups_its_remembered_call() -> None:
    # call c0, then other items; its output only comes on the next request, after them: the
    # fresh parse keeps the whole span as one opaque message, so the remembered grouping of the
    # call (its own message) must not be reused.
    items = [user("go"), call("c0"), call("c1"), output("c1", "one")]
    items += [said(f"note {k}", item_id=f"m{k}") for k in range(4)]
    memo = ParseMemo(min_items=1)
    earlier = responses_body(copy.deepcopy(items))
    with contextlib.suppress(InvalidRequest):
        RESPONSES.parse(earlier, memo=memo)
    now = responses_body([*copy.deepcopy(items), output("c0", "zero"), user("next")])
    fresh = RESPONSES.parse(copy.deepcopy(now))
    assert exact(RESPONSES.parse(now, memo=memo)) == exact(fresh)
    assert any(len(m.get("ctxproxy_origin", [])) > 2 for m in fresh.messages)  # the span is whole


def _memo_parses_exactly(memo: ParseMemo, items: list[dict[str, Any]]) -> None:
    now = responses_body(copy.deepcopy(items))
    try:
        fresh = exact(RESPONSES.parse(copy.deepcopy(now)))
    except InvalidRequest:
        with pytest.raises(InvalidRequest):
            RESPONSES.parse(now, memo=memo)
        return
    assert exact(RESPONSES.parse(now, memo=memo)) == fresh


def test_a_decision_that_read_the_first_new_item_is_not_taken() -> None:
    # The call's decision looked past the reasoning after it, at the item that is now new (a
    # call that the reasoning glues it to): that decision is made again.
    memo = ParseMemo(min_items=1)
    _memo_parses_exactly(memo, [user("go"), call("c0"), reasoning("rs_0"), said("hm")])
    _memo_parses_exactly(memo, [user("go"), call("c0"), reasoning("rs_0"), call("c1"), output("c1", "one")])


def test_a_call_that_moved_to_an_earlier_decision_is_still_regrouped_by_its_late_output() -> None:
    # Three requests: the second merges two early items (the call's decision moves one place
    # up), the third brings the call's output late: the decision that holds the call must not
    # be taken, wherever the first request had it.
    memo = ParseMemo(min_items=1)
    head = [user("a"), user("b"), user("c"), user("d")]
    _memo_parses_exactly(memo, [*head, call("k"), said("s", item_id="m1")])
    merged = [user("a"), reasoning("rs_1"), user("c"), user("d")]
    _memo_parses_exactly(memo, [*merged, call("k"), said("s", item_id="m1")])
    _memo_parses_exactly(
        memo, [*merged, call("k"), said("s", item_id="m1"), said("t", item_id="m2"), output("k", "late")]
    )


def test_a_resent_anthropic_conversation_reuses_its_messages() -> None:
    wire: list[dict[str, Any]] = []
    for t in range(12):
        wire.append({"role": "user", "content": [{"type": "text", "text": f"question {t}"}]})
        wire.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {t}"}]})
    memo = ParseMemo()
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": wire}
    first = MESSAGES.parse(body, memo=memo)
    longer = copy.deepcopy({**body, "messages": [*wire, {"role": "user", "content": "more"}]})
    again = MESSAGES.parse(longer, memo=memo)
    assert exact(again) == exact(MESSAGES.parse(copy.deepcopy(longer)))
    assert all(a is b for a, b in zip(first.messages, again.messages[:-1], strict=True))


def test_a_loop_span_that_moves_rebuilds_the_messages_it_freezes_or_thaws() -> None:
    # A thinking-bearing assistant turn freezes the current tool loop; when the next request
    # starts a new loop, the messages frozen before are built again (not frozen) and vice versa.
    def thinking(t: int) -> dict[str, Any]:
        blocks = [{"type": "thinking", "thinking": f"hmm {t}", "signature": f"sig{t}"}]
        blocks.append({"type": "tool_use", "id": f"tu{t}", "name": "f", "input": {}})
        return {"role": "assistant", "content": blocks}

    def result(t: int) -> dict[str, Any]:
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"tu{t}", "content": "ok"}],
        }

    wire: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for t in range(10):
        wire += [thinking(t), result(t)]
    memo = ParseMemo()
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": wire}
    first = MESSAGES.parse(body, memo=memo)
    assert any(m.get("ctxproxy_opaque") for m in first.messages)  # the loop is frozen
    for more in (
        [{"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}],
        [thinking(99)],
    ):
        longer = copy.deepcopy({**body, "messages": [*wire, *more]})
        assert exact(MESSAGES.parse(longer, memo=memo)) == exact(MESSAGES.parse(copy.deepcopy(longer)))


def test_validation_still_runs_on_what_is_new() -> None:
    memo = ParseMemo(min_items=1)
    good = agent_session(4)
    RESPONSES.parse(good, memo=memo)
    bad = copy.deepcopy(good)
    bad["input"].append({"type": "message", "role": "robot", "content": "hi"})
    with pytest.raises(InvalidRequest) as raised:
        RESPONSES.parse(bad, memo=memo)
    assert raised.value.param == f"input[{len(bad['input']) - 1}].role"


@pytest.mark.parametrize(
    ("earlier", "now"),
    [
        # the earlier request had the orphan already: it is still one
        (
            [user("a"), output("c9", "lost"), said("b")],
            [user("a"), output("c9", "lost"), said("b"), user("c")],
        ),
        # the earlier request had the call after its output, the new one no longer has it
        (
            [user("a"), output("c1", "x"), said("b"), call("c1")],
            [user("a"), output("c1", "x"), said("b"), user("c")],
        ),
    ],
)
def test_an_orphan_output_in_the_reused_run_is_still_refused(
    earlier: list[dict[str, Any]], now: list[dict[str, Any]]
) -> None:
    memo = ParseMemo(min_items=1)
    with contextlib.suppress(InvalidRequest):
        RESPONSES.parse(responses_body(copy.deepcopy(earlier)), memo=memo)
    with pytest.raises(InvalidRequest) as raised:
        RESPONSES.parse(responses_body(copy.deepcopy(now)), memo=memo)
    assert raised.value.param == "input[1]"


def test_anthropic_validation_still_runs_on_what_is_new() -> None:
    wire = [{"role": "user" if t % 2 == 0 else "assistant", "content": f"m{t}"} for t in range(20)]
    body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": wire}
    memo = ParseMemo()
    MESSAGES.parse(body, memo=memo)
    bad = copy.deepcopy({**body, "messages": [*wire, {"role": "robot", "content": "hi"}]})
    with pytest.raises(InvalidRequest) as raised:
        MESSAGES.parse(bad, memo=memo)
    assert raised.value.param == "messages.20.role"


def test_short_lists_are_not_remembered_and_the_memo_is_bounded() -> None:
    memo = ParseMemo(max_entries=3)
    RESPONSES.parse(agent_session(1), memo=memo)
    assert len(memo) == 0  # 5 items: under MIN_ITEMS
    for t in range(6):
        body = agent_session(4)
        body["input"][0] = user(f"another conversation {t}")
        RESPONSES.parse(body, memo=memo)
    assert len(memo) == 3


def test_equal_prefix_counts_equal_items_and_marks_the_exactly_equal_ones_strict() -> None:
    remembered = ({"a": "x"}, {"n": 1}, {"b": ["y"]}, {"n": [2, 0.5, None]}, {"f": 0.0}, {"c": "z"})
    shapes = tuple(scalar_paths(item) for item in remembered)
    now = [{"a": "x"}, {"n": True}, {"b": ["y"]}, {"n": [2, 0.5, None]}, {"f": -0.0}, {"c": "?"}]
    assert equal_prefix(now, remembered, shapes) == (5, (True, False, True, True, False))
    assert equal_prefix([], remembered, shapes) == (0, ())


def test_scalar_paths_find_every_number_and_boolean() -> None:
    item = {"role": "assistant", "content": [{"type": "tool_use", "input": {"n": 1, "ok": False, "s": "x"}}]}
    assert sorted(scalar_paths(item) or (), key=str) == [
        ("content", 0, "input", "n"),
        ("content", 0, "input", "ok"),
    ]
    assert scalar_paths({"a": ["x", None, {"b": "y"}]}) == ()
    assert scalar_paths({"a": (1,)}) is None  # not JSON-shaped: never reused
    assert scalar_paths({1: "x"}) is None


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"k": [1, "s", None, {"x": False}]}, {"k": [1, "s", None, {"x": False}]}, True),
        ({"k": [1]}, {"k": [True]}, False),
        ({"k": 2.5}, {"k": 2.5}, True),
        ({"k": [0.0]}, {"k": [-0.0]}, False),
    ],
)
def test_same_scalars_tells_types_apart(a: Any, b: Any, same: bool) -> None:
    assert a == b
    paths = scalar_paths(a)
    assert paths
    assert same_scalars(a, b, paths) is same


# ---- fast paths (``type(x) is dict``) against the ``Mapping`` fallbacks ------------------------


class Frozen(Mapping[str, Any]):
    """A read-only mapping that is not a dict: it takes the dialects' ``Mapping`` fallbacks."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _wrapped(item: Any) -> Any:
    """Items and their content parts as ``Frozen`` mappings (deeper values stay as they are)."""
    if not isinstance(item, dict):
        return item
    content = item.get("content")
    if isinstance(content, list):
        item = {**item, "content": [Frozen(p) if isinstance(p, dict) else p for p in content]}
    return Frozen(item)


@SETTINGS
@given(body=sessions())
def test_the_responses_fast_paths_agree_with_the_mapping_fallbacks(body: dict[str, Any]) -> None:
    slow = {**body, "input": [_wrapped(item) for item in body["input"]]}
    assert RESPONSES.parse(slow) == RESPONSES.parse(body)
    assert RESPONSES.parse(slow, memo=ParseMemo(min_items=1)) == RESPONSES.parse(body)
