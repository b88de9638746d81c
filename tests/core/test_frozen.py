"""app.core.frozen: exact cache keys and the plain values a remembered prefix may hold."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.conversation import OPAQUE_KEY, ORIGIN_KEY, PRICE_KEY
from app.core.frozen import freeze, freeze_counted, has_price, is_plain, is_plain_message, prices_exact
from app.core.tokens import MessageCounter
from tests.core.chat_samples import O200K, call_message, conversation


def test_cache_keys_are_exact_values_not_lookalikes() -> None:
    mc = MessageCounter(O200K)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

    def calling(arguments: Any) -> dict[str, Any]:
        function = {"name": "f", "arguments": arguments}
        return {"role": "assistant", "content": None, "tool_calls": [{**call, "function": function}]}

    variants: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        *(calling(arguments) for arguments in (1, 1.0, True, -0.0, 0.0, ["{}"], {"a": "{}"})),
        {"role": "assistant", "content": "x", "tool_calls": [call]},
    ]
    for message in variants:
        mc.count_message(message)
    assert mc.cache_info() == (0, len(variants), len(variants))  # no two of them share a key
    for message in variants:
        assert mc.count_message(message) == MessageCounter(O200K, cache_size=0).count_message(message)
    assert mc.cache_info().hits == len(variants)


def test_a_number_ends_the_remembered_prefix_so_lookalikes_are_not_reused() -> None:
    mc = MessageCounter(O200K)
    fresh = MessageCounter(O200K, cache_size=0)
    base = conversation(6)
    first = [*base[:5], call_message(1), *base[5:]]
    second = [*base[:5], call_message(1.0), *base[5:]]  # 1 == 1.0 in Python, not in the prompt
    assert mc.count_messages(first) == fresh.count_messages(first)
    assert mc.count_messages(second) == fresh.count_messages(second)
    assert mc.count_messages(first)[5] != mc.count_messages(second)[5]


def dialect_conversation(n: int, *, price: Any = 7) -> list[dict[str, Any]]:
    """Neutral messages as a dialect writes them: origins, an opaque priced message, priced parts."""
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(conversation(n)):
        messages.append({**message, ORIGIN_KEY: [[i], [i, 0]]})
    messages[3] = {**messages[3], OPAQUE_KEY: True, PRICE_KEY: 40}
    part = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}, PRICE_KEY: price}
    messages[5] = {**messages[5], "content": [{"type": "text", "text": "see"}, part]}
    return messages


def test_a_dialects_reserved_values_do_not_end_the_remembered_prefix() -> None:
    mc = MessageCounter(O200K)
    base = dialect_conversation(12)
    assert is_plain_message(base[3]) and is_plain_message(base[5]) and not is_plain(base[5])
    mc.count_messages(base)
    misses = mc.cache_info().misses
    grown = [*base, {"role": "user", "content": "one more", ORIGIN_KEY: [[12]]}]
    assert mc.count_messages(grown) == MessageCounter(O200K, cache_size=0).count_messages(grown)
    assert mc.cache_info().misses == misses + 1  # only the new message was counted


@pytest.mark.parametrize(("price", "lookalike"), [(1, True), (7, 7.0)])
def test_a_price_lookalike_is_not_served_from_the_remembered_prefix(price: int, lookalike: Any) -> None:
    mc = MessageCounter(O200K)
    fresh = MessageCounter(O200K, cache_size=0)
    first = dialect_conversation(12, price=price)
    second = dialect_conversation(12, price=lookalike)
    assert first == second  # equal for Python, not for the accounting
    assert not prices_exact(second[5]) and prices_exact(first[5]) and has_price(first[5])
    assert mc.count_messages(first) == fresh.count_messages(first)
    assert mc.count_messages(second) == fresh.count_messages(second)
    assert mc.count_messages(first)[5] != mc.count_messages(second)[5]


def test_origin_and_opaque_lookalikes_count_the_same() -> None:
    mc = MessageCounter(O200K)
    first = dialect_conversation(12)
    second = [{**m, ORIGIN_KEY: [[True]]} if i == 2 else m for i, m in enumerate(first)]
    mc.count_messages([{**m, ORIGIN_KEY: [[1]]} if i == 2 else m for i, m in enumerate(first)])
    assert mc.count_messages(second) == MessageCounter(O200K, cache_size=0).count_messages(second)
    assert not is_plain_message({"role": "user", "content": "x", ORIGIN_KEY: [[True]]})
    assert not is_plain_message({"role": "user", "content": "x", OPAQUE_KEY: 1})
    assert not is_plain_message({"role": "user", "content": "x", "seed": 1})


def test_a_message_counted_keys_leave_out_only_reserved_values_the_count_never_reads() -> None:
    text = {"role": "user", "content": "hello there"}
    with_origin = {**text, ORIGIN_KEY: [[0, 0]]}
    elsewhere = {**text, ORIGIN_KEY: [[3, 1], [4, 0]], OPAQUE_KEY: True}
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}], ORIGIN_KEY: [[1, 0]]}
    assert freeze_counted(with_origin) == freeze_counted(elsewhere) == freeze_counted(text) == freeze(text)
    assert freeze_counted(parts) == freeze_counted({k: v for k, v in parts.items() if k != ORIGIN_KEY})
    assert freeze(with_origin) != freeze(text)  # the exact key keeps it
    # A string is counted wherever it is (an unknown top-level string is text): kept in the key.
    assert freeze_counted({**text, ORIGIN_KEY: "x"}) != freeze_counted(text)
    # A price changes the count: never left out.
    assert freeze_counted({**text, PRICE_KEY: 5}) != freeze_counted(text)
    mc = MessageCounter(O200K)
    assert mc.count_message(with_origin) == mc.count_message(elsewhere) == mc.count_message(text)
    assert mc.count_message({**text, ORIGIN_KEY: "x"}) > mc.count_message(text)
    assert mc.cache_info().misses == 2  # the origin's variants share one entry


def test_freeze_walks_nested_values_to_the_same_keys_as_before() -> None:
    assert freeze({"b": [[1, 2], ["x", None]], "a": {"c": True, "d": 1.0}}) == (
        ("d", "a", ("d", "c", ("bool", True), "d", ("float", "1.0")), "b",
         ("l", ("l", ("int", 1), ("int", 2)), ("l", "x", ("NoneType", None)))),
        10,
    )  # fmt: skip
    assert freeze({"a": [object()]}) is None and freeze([{1: "x"}]) is None
