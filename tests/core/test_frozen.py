"""app.core.frozen: exact cache keys and the plain values a remembered prefix may hold."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.conversation import OPAQUE_KEY, ORIGIN_KEY, PRICE_KEY
from app.core.frozen import has_price, is_plain, is_plain_message, prices_exact
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
