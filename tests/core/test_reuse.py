"""PrefixMemory: what a prompt cache could reuse from the previous forwarded request."""

from __future__ import annotations

import threading
from typing import Any

from app.core.reuse import PrefixMemory, PrefixReuse


def chat(n: int, *, note: str | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "task"},
    ]
    if note is not None:
        messages.append({"role": "assistant", "content": note})
    messages += [{"role": "user" if i % 2 else "assistant", "content": f"m{i}"} for i in range(n)]
    return messages


def test_a_new_conversation_reuses_nothing_and_a_grown_one_its_whole_previous_request() -> None:
    memory = PrefixMemory()
    first = memory.observe(chat(4), [10] * 6)
    assert first == PrefixReuse(0, 60) and first.share == 0.0
    grown = memory.observe(chat(6), [10] * 8)
    assert grown == PrefixReuse(60, 80) and grown.share == 0.75


def test_a_changed_message_ends_the_reused_prefix() -> None:
    memory = PrefixMemory()
    memory.observe(chat(4), [10, 20, 1, 1, 1, 1])
    cut = chat(2, note="[ctxproxy: earlier messages were removed]")
    reuse = memory.observe(cut, [10, 20, 5, 1, 1])
    assert reuse.reused_tokens == 30  # the pinned system prompt and task only
    assert reuse.total_tokens == 37


def test_conversations_are_told_apart_by_their_start_and_forgotten_oldest_first() -> None:
    memory = PrefixMemory(max_conversations=2)
    other = [{"role": "system", "content": "other"}, {"role": "user", "content": "x"}]
    memory.observe(chat(2), [1] * 4)
    memory.observe(other, [1, 1])
    assert memory.observe(chat(3), [1] * 5).reused_tokens == 4
    memory.observe([{"role": "user", "content": "third"}], [1])  # evicts `other`
    assert memory.observe([*other, {"role": "user", "content": "y"}], [1, 1, 1]).reused_tokens == 0


def test_messages_that_are_not_json_are_never_remembered_and_counts_stay_exact() -> None:
    memory = PrefixMemory()
    odd: list[dict[str, Any]] = [{"role": "user", "content": float("nan")}]
    assert memory.observe(odd, [3]) == PrefixReuse(0, 3)
    assert memory.observe([], []) == PrefixReuse(0, 0)


def test_concurrent_observers_do_not_break_it() -> None:
    memory = PrefixMemory(max_conversations=8)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for n in range(50):
                messages = [{"role": "system", "content": f"s{k % 12}"}, *chat(n)[1:]]
                reuse = memory.observe(messages, [1] * len(messages))
                assert 0 <= reuse.reused_tokens <= reuse.total_tokens
        except BaseException as exc:  # collected, asserted empty in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
