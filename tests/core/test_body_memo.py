"""The body memo: a resent body parsed from the bytes appended to its history, equal to a full parse."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core import body_memo
from app.core.body_memo import KEEP_ENDS, BodyMemo, common_prefix, layout


def strict(value: Any) -> Any:
    """``value`` with every scalar tagged by its type, key order kept: equal only when the JSON
    values are the same with the same types (``1``, ``1.0`` and ``True`` differ)."""
    if isinstance(value, dict):
        return ("dict", [(k, strict(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [strict(v) for v in value])
    return (type(value).__name__, repr(value))


def loads(raw: bytes) -> Any:
    return orjson.loads(raw)


def memo() -> BodyMemo:
    return BodyMemo(min_bytes=0, min_reuse_bytes=0)


def chat(n: int, *, extra: str = "") -> bytes:
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} [x] {{y}}"} for i in range(n)
    ]
    return orjson.dumps(
        {"model": "m", "messages": messages, "max_tokens": 10, "tools": [[1, 2], {"a": extra}]}
    )


# -- layout --------------------------------------------------------------------------------------


def array_end(raw: bytes, key: str) -> int | None:
    """Where ``key``'s array ends in ``raw`` by its layout: just after its last element."""
    found = layout(raw, key)
    return None if found is None else found.ends[-1]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"messages":[1,2]}', b'{"messages":[1,2'),
        (b'{ "messages" : [ {"a":"]"} , "x\\"]" ]  ,"m":[3]}', b'{ "messages" : [ {"a":"]"} , "x\\"]"'),
        (
            b'{"a":{"messages":[9]},"messages":[[1],[2]],"b":"messages"}',
            b'{"a":{"messages":[9]},"messages":[[1],[2]',
        ),
        (b'{"x":"\\\\","messages":[true]}', b'{"x":"\\\\","messages":[true'),
    ],
)
def test_array_end_is_the_end_of_the_last_element(raw: bytes, expected: bytes) -> None:
    assert raw[: array_end(raw, "messages")] == expected


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages":[]}',  # nothing to append after
        b'{"messages":[ \n ]}',
        b'{"messages":"text"}',  # not an array
        b'{"messages":[1],"messages":[2]}',  # which one a parser keeps is its choice
        b'{"messages":[1],"\\u006dessages":[2]}',  # the same key, spelled with an escape
        b'{"other":[1]}',
    ],
)
def test_array_end_refuses_what_is_not_plain(raw: bytes) -> None:
    assert array_end(raw, "messages") is None


def test_common_prefix() -> None:
    assert common_prefix(b"abcdef", b"abcxef") == 3
    assert common_prefix(b"abc", b"abcdef") == 3
    assert common_prefix(b"", b"a") == 0
    assert common_prefix(b"same", b"same") == 4


def test_layout_finds_the_head_keys_and_the_ends_of_the_newest_elements() -> None:
    raw = b'{"model":"m", "system":[1,{"a":"]"}], "messages":[ [1,2] ,"x,]" , {"k":[3]} ,4],"n":5}'
    found = layout(raw, "messages")
    assert found is not None
    assert found.head_keys == ("model", "system") and found.count == 4
    assert [raw[found.opened : end] for end in found.ends] == [
        b" [1,2]",
        b' [1,2] ,"x,]"',
        b' [1,2] ,"x,]" , {"k":[3]}',
        b' [1,2] ,"x,]" , {"k":[3]} ,4',
    ]
    assert raw[found.closed : found.closed + 1] == b"]"
    many = orjson.dumps({"messages": list(range(3 * KEEP_ENDS))})
    assert len(layout(many, "messages").ends) == KEEP_ENDS  # type: ignore[union-attr]


# -- parse ---------------------------------------------------------------------------------------


def test_an_extended_body_reuses_the_remembered_parse_and_equals_a_full_parse() -> None:
    bodies = memo()
    first = bodies.parse(chat(6), key="messages", loads=loads)
    second = bodies.parse(chat(8), key="messages", loads=loads)  # scanned once here, then extended
    third = bodies.parse(chat(9), key="messages", loads=loads)
    assert strict(second) == strict(orjson.loads(chat(8)))
    assert strict(third) == strict(orjson.loads(chat(9)))
    # The history and the other values are the remembered objects: they were not parsed again.
    assert third["messages"][0] is second["messages"][0] is first["messages"][0]
    assert third["tools"] is first["tools"]
    assert third is not second and third["messages"] is not second["messages"]


def test_only_the_second_body_of_a_conversation_is_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[int] = []
    real = body_memo.layout
    monkeypatch.setattr(body_memo, "layout", lambda raw, key: scans.append(len(raw)) or real(raw, key))
    bodies = memo()
    for n in range(40, 48):
        bodies.parse(chat(n), key="messages", loads=loads)
    assert scans == [len(chat(40))]


def test_a_body_sharing_little_is_parsed_whole_and_never_scanned(monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[int] = []
    monkeypatch.setattr(body_memo, "layout", lambda raw, key: scans.append(1) or None)
    bodies = BodyMemo(min_bytes=0)  # the default least shared bytes
    for n in range(40, 46):
        raw = orjson.dumps({"seed": n, "messages": orjson.loads(chat(n))["messages"]})
        body = bodies.parse(raw, key="messages", loads=loads)
        assert strict(body) == strict(orjson.loads(raw))
    assert scans == []


def test_values_after_the_history_that_change_every_turn_are_parsed_alone() -> None:
    # Codex: fields after ``input`` (its client metadata) differ on every request.
    bodies = memo()
    first = bodies.parse(chat(40, extra="turn 40"), key="messages", loads=loads)
    for n in range(41, 44):
        raw = chat(n, extra=f"turn {n}")
        body = bodies.parse(raw, key="messages", loads=loads)
        assert strict(body) == strict(orjson.loads(raw))
        assert body["messages"][0] is first["messages"][0] and body["model"] is first["model"]


def test_a_changed_last_element_is_parsed_again_and_the_rest_reused() -> None:
    # Claude Code: the cache marker moves from the last message to the new last one.
    def marked(n: int) -> bytes:
        messages: list[Any] = orjson.loads(chat(n))["messages"]
        messages[-1] = {**messages[-1], "cache_control": {"type": "ephemeral"}}
        return orjson.dumps({"model": "m", "messages": messages, "tools": [1] * 50})

    bodies = memo()
    first = bodies.parse(marked(40), key="messages", loads=loads)
    for n in range(41, 45):
        body = bodies.parse(marked(n), key="messages", loads=loads)
        assert strict(body) == strict(orjson.loads(marked(n)))
        assert body["messages"][0] is first["messages"][0]
        assert body["tools"] is first["tools"]  # the same bytes after the history: not parsed
    assert len(bodies) == 1


def test_a_change_older_than_the_remembered_ends_is_parsed_whole() -> None:
    bodies = memo()
    base: list[Any] = orjson.loads(chat(40))["messages"]
    bodies.parse(orjson.dumps({"messages": base}), key="messages", loads=loads)
    bodies.parse(
        orjson.dumps({"messages": [*base, {"role": "user", "content": "x"}]}), key="messages", loads=loads
    )
    edited = [*base[:20], {"role": "user", "content": "edited"}, *base[21:]]
    raw = orjson.dumps({"messages": edited})
    body = bodies.parse(raw, key="messages", loads=loads)
    assert strict(body) == strict(orjson.loads(raw))
    assert body["messages"][0] is not base[0]


def test_the_same_bytes_parse_to_an_equal_new_dict() -> None:
    bodies = memo()
    first = bodies.parse(chat(5), key="messages", loads=loads)
    bodies.parse(chat(6), key="messages", loads=loads)
    again = bodies.parse(chat(6), key="messages", loads=loads)
    assert strict(again) == strict(orjson.loads(chat(6)))
    assert again["messages"][0] is first["messages"][0]


@pytest.mark.parametrize(
    "appended",
    [b",", b", ", b",1,", b",]", b",{", b'],"x":[1', b" 7", b",1] [2"],
)
def test_appended_bytes_that_are_not_values_fail_as_the_whole_body_does(appended: bytes) -> None:
    base = b'{"messages":[' + b",".join(b'"%d"' % i for i in range(20)) + b'],"k":1}'
    split = array_end(base, "messages")
    assert split is not None
    bodies = memo()
    bodies.parse(base, key="messages", loads=loads)
    bodies.parse(base[:split] + b',"x"' + base[split:], key="messages", loads=loads)
    raw = base[:split] + b',"x"' + appended + base[split:]
    try:
        expected: Any = ("ok", strict(orjson.loads(raw)))
    except orjson.JSONDecodeError:
        expected = ("error",)
    try:
        got: Any = ("ok", strict(bodies.parse(raw, key="messages", loads=loads)))
    except orjson.JSONDecodeError:
        got = ("error",)
    assert got == expected


@pytest.mark.parametrize(
    "tail",
    [b",}", b", }", b"}}", b"},", b',"k":}', b"} x", b"", b',"k":1,}', b',"k":1} '],
)
def test_what_follows_the_history_is_checked_as_the_whole_body_would_be(tail: bytes) -> None:
    bodies = memo()
    history = orjson.dumps({"messages": list(range(300))})  # ends with ]}
    bodies.parse(history, key="messages", loads=loads)
    bodies.parse(history[:-2] + b",300]}", key="messages", loads=loads)
    raw = history[:-2] + b",300,301]" + tail
    assert outcome(lambda r: bodies.parse(r, key="messages", loads=loads), raw) == outcome(loads, raw)


def test_a_last_element_the_new_body_continues_is_not_taken_for_a_whole_one() -> None:
    bodies = memo()
    bodies.parse(b'{"messages":[1,2,12]}', key="messages", loads=loads)
    bodies.parse(b'{"messages":[1,2,12,"x"]}', key="messages", loads=loads)
    for raw in (b'{"messages":[1,2,12,"x"5]}', b'{"messages":[1,2,12,"x",7]}', b'{"messages":[1,2,12,"xy"]}'):
        assert outcome(lambda r: bodies.parse(r, key="messages", loads=loads), raw) == outcome(loads, raw)
    assert bodies.parse(b'{"messages":[1,2,123]}', key="messages", loads=loads) == {"messages": [1, 2, 123]}


def test_an_insertion_elsewhere_is_not_taken_for_an_append() -> None:
    bodies = memo()
    history = list(range(2000))
    bodies.parse(orjson.dumps({"messages": history, "tools": [4]}), key="messages", loads=loads)
    for body in (
        {"messages": history, "tools": [4, 5]},
        {"messages": [*history[:-1], [history[-1], 9]], "tools": [4]},
        {"messages": history[:-3], "tools": [4]},
        {"messages": history, "tools": [4], "messages2": [1]},
    ):
        assert strict(bodies.parse(orjson.dumps(body), key="messages", loads=loads)) == strict(body)


def test_a_value_after_the_history_that_names_a_key_before_it_is_parsed_whole() -> None:
    bodies = memo()
    history = list(range(2000))
    bodies.parse(orjson.dumps({"model": "a", "messages": history}), key="messages", loads=loads)
    raw = orjson.dumps({"model": "a", "messages": history})[:-1] + b',"model":"b"}'
    assert (
        bodies.parse(raw, key="messages", loads=loads)
        == orjson.loads(raw)
        == {"model": "b", "messages": history}
    )
    raw = orjson.dumps({"model": "a", "messages": history})[:-1] + b',"messages":[1]}'
    assert (
        bodies.parse(raw, key="messages", loads=loads) == orjson.loads(raw) == {"model": "a", "messages": [1]}
    )


def test_small_bodies_are_not_remembered() -> None:
    bodies = BodyMemo(min_bytes=1000)
    bodies.parse(chat(2), key="messages", loads=loads)
    assert len(bodies) == 0
    bodies.parse(chat(40), key="messages", loads=loads)
    assert len(bodies) == 1


def test_the_memo_is_bounded_by_entries_and_bytes() -> None:
    by_count = BodyMemo(min_bytes=0, max_entries=3)
    for i in range(6):
        by_count.parse(chat(5, extra=str(i)), key="messages", loads=loads)
    assert len(by_count) == 3
    by_bytes = BodyMemo(min_bytes=0, max_bytes=2 * len(chat(5, extra="0")) + 1)
    for i in range(6):
        by_bytes.parse(chat(5, extra=str(i)), key="messages", loads=loads)
    assert len(by_bytes) == 2


def test_another_key_is_never_extended() -> None:
    bodies = memo()
    bodies.parse(chat(5), key="messages", loads=loads)
    bodies.parse(chat(6), key="messages", loads=loads)
    body = bodies.parse(chat(7), key="input", loads=loads)
    assert strict(body) == strict(orjson.loads(chat(7)))
    assert len(bodies) == 1  # the conversation under "messages" only: nothing for "input"


# -- property: any body, any appended values, any spacing -----------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.sampled_from('ab"\\[]{},: \n\u00e9\u2028'), max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "messages", "b"]), inner, max_size=3),
    ),
    max_leaves=8,
)


def serialize(body: dict[str, Any], style: int) -> bytes:
    if style == 0:
        return orjson.dumps(body)
    if style == 1:
        return json.dumps(body, indent=2).encode()
    return json.dumps(body, ensure_ascii=False, separators=(" , ", " : ")).encode()


@settings(max_examples=300, deadline=None)
@given(
    before=st.dictionaries(st.sampled_from(["model", "system", "x"]), values, max_size=2),
    after=st.dictionaries(st.sampled_from(["tools", "stream", "y"]), values, max_size=2),
    history=st.lists(values, min_size=1, max_size=4),
    turns=st.lists(st.tuples(st.lists(values, max_size=3), st.integers(0, 6)), min_size=1, max_size=6),
    style=st.integers(0, 2),
)
def test_every_parse_equals_the_full_parse(
    before: dict[str, Any],
    after: dict[str, Any],
    history: list[Any],
    turns: list[tuple[list[Any], int]],
    style: int,
) -> None:
    bodies = memo()
    items = list(history)
    for added, change in turns:
        items = [*items, *added]
        body = {**before, "messages": items, **after}
        if change == 1 and len(items) > 1:  # the client rewrote its history this turn
            body["messages"] = [*items[:-2], {"edited": True}, items[-1]]
        elif change == 2:  # a value after the history changed
            body = {**before, "messages": items, **after, "y": len(items)}
        elif change == 3:  # the last element carries a marker (it moves on the next turn)
            body["messages"] = [*items[:-1], {"last": items[-1], "cache_control": {"type": "ephemeral"}}]
        elif change == 4 and len(items) > 1:  # the newest element was taken back
            body["messages"] = items[:-1]
        elif change == 5:  # a key after the history that is also before it
            body = {**before, "messages": items, **after, "model": 1}
        raw = serialize(body, style)
        got = bodies.parse(raw, key="messages", loads=loads)
        assert strict(got) == strict(orjson.loads(raw))


def outcome(parse: Any, raw: bytes) -> Any:
    try:
        return ("ok", strict(parse(raw)))
    except orjson.JSONDecodeError:
        return ("error",)


@settings(max_examples=400, deadline=None)
@given(
    history=st.lists(values, min_size=2, max_size=6),
    added=st.lists(values, max_size=2),
    edits=st.lists(
        st.tuples(
            st.floats(0.5, 1.0), st.sampled_from(["insert", "delete", "replace"]), st.binary(max_size=2)
        ),
        min_size=1,
        max_size=3,
    ),
    style=st.integers(0, 2),
)
def test_bytes_edited_near_the_end_parse_or_fail_exactly_as_the_whole_body(
    history: list[Any], added: list[Any], edits: list[tuple[float, str, bytes]], style: int
) -> None:
    """Whatever bytes a client sends after a remembered body (valid JSON or not, a split in the
    middle of a string, a bracket too many), the memo answers what parsing the whole body does."""
    bodies = memo()
    first = serialize({"model": "m", "messages": history, "tools": [1, "]"]}, style)
    second = serialize({"model": "m", "messages": [*history, *added], "tools": [1, "]"]}, style)
    bodies.parse(first, key="messages", loads=loads)
    raw = bytearray(second)
    for where, how, data in edits:
        at = min(len(raw), int(where * len(raw)))
        if how == "insert":
            raw[at:at] = data
        elif how == "delete":
            del raw[at : at + len(data) + 1]
        else:
            raw[at : at + len(data)] = data
    edited = bytes(raw)
    assert outcome(lambda r: bodies.parse(r, key="messages", loads=loads), edited) == outcome(loads, edited)
