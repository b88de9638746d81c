"""app.core.frozen: exact cache keys and the plain values a remembered prefix may hold."""

from __future__ import annotations

from typing import Any

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
