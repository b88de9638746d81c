"""PrefixMemory: what a prompt cache could reuse from the previous forwarded request."""

from __future__ import annotations

import threading
from typing import Any

from app.core.reuse import PrefixMemory, PrefixReuse


def observe(memory: PrefixMemory, messages: Any, tokens: list[int], *, model: str = "gpt-4o") -> PrefixReuse:
    return memory.observe(messages, tokens, model=model, api="chat", tenant="t")


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
    first = observe(memory, chat(4), [10] * 6)
    assert first == PrefixReuse(0, 60) and first.share == 0.0
    grown = observe(memory, chat(6), [10] * 8)
    assert grown == PrefixReuse(60, 80) and grown.share == 0.75


def test_a_changed_message_ends_the_reused_prefix() -> None:
    memory = PrefixMemory()
    observe(memory, chat(4), [10, 20, 1, 1, 1, 1])
    cut = chat(2, note="[ctxproxy: earlier messages were removed]")
    reuse = observe(memory, cut, [10, 20, 5, 1, 1])
    assert reuse.reused_tokens == 30  # the pinned system prompt and task only
    assert reuse.total_tokens == 37


def test_conversations_are_told_apart_by_their_start_and_forgotten_oldest_first() -> None:
    memory = PrefixMemory(max_conversations=2)
    other = [{"role": "system", "content": "other"}, {"role": "user", "content": "x"}]
    observe(memory, chat(2), [1] * 4)
    observe(memory, other, [1, 1])
    assert observe(memory, chat(3), [1] * 5).reused_tokens == 4
    observe(memory, [{"role": "user", "content": "third"}], [1])  # evicts `other`
    assert observe(memory, [*other, {"role": "user", "content": "y"}], [1, 1, 1]).reused_tokens == 0


def test_messages_that_are_not_json_are_never_remembered_and_counts_stay_exact() -> None:
    memory = PrefixMemory()
    odd: list[dict[str, Any]] = [{"role": "user", "content": float("nan")}]
    assert observe(memory, odd, [3]) == PrefixReuse(0, 3)
    assert observe(memory, [], []) == PrefixReuse(0, 0)


def test_concurrent_observers_do_not_break_it() -> None:
    memory = PrefixMemory(max_conversations=8)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for n in range(50):
                messages = [{"role": "system", "content": f"s{k % 12}"}, *chat(n)[1:]]
                reuse = observe(memory, messages, [1] * len(messages))
                assert 0 <= reuse.reused_tokens <= reuse.total_tokens
        except BaseException as exc:  # collected, asserted empty in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_the_same_opening_to_another_model_or_through_another_api_is_another_conversation() -> None:
    memory = PrefixMemory()
    observe(memory, chat(4), [10] * 6)
    # A brand-new model's first request: nothing of it is in that model's prompt cache.
    other_model = observe(memory, chat(6), [10] * 8, model="gpt-4o-mini")
    assert other_model == PrefixReuse(0, 80) and other_model.share == 0.0
    other_api = memory.observe(chat(6), [10] * 8, model="gpt-4o", api="responses", tenant="t")
    assert other_api.reused_tokens == 0
    # Each conversation still continues by itself.
    assert observe(memory, chat(6), [10] * 8).reused_tokens == 60
    assert observe(memory, chat(8), [10] * 10, model="gpt-4o-mini").reused_tokens == 80


def test_another_clients_same_opening_is_another_conversation() -> None:
    memory = PrefixMemory()
    memory.observe(chat(4), [10] * 6, model="gpt-4o", api="chat", tenant="t-alice")
    # Mallory repeats alice's opening: the figure tells her nothing of what alice sent...
    probe = memory.observe(chat(6), [10] * 8, model="gpt-4o", api="chat", tenant="t-mallory")
    assert probe == PrefixReuse(0, 80)
    # ...and alice's conversation goes on as if mallory had sent nothing.
    assert memory.observe(chat(6), [10] * 8, model="gpt-4o", api="chat", tenant="t-alice").reused_tokens == 60


def test_the_opening_is_matched_exactly_and_one_that_does_not_freeze_still_counts() -> None:
    memory = PrefixMemory()
    ones = [{"role": "user", "content": "x", "n": 1}, {"role": "user", "content": "y"}]
    trues = [{"content": "x", "n": True, "role": "user"}, {"role": "user", "content": "y"}]
    observe(memory, ones, [1, 1])
    assert observe(memory, trues, [1, 1]).reused_tokens == 0  # True is not 1: another conversation
    assert observe(memory, [*ones, {"role": "user", "content": "z"}], [1, 1, 1]).reused_tokens == 2
    odd = [{"role": "user", "content": "x"}, {"role": "user", "content": {"a"}}]  # a set: not JSON
    observe(memory, odd, [1, 1])
    assert observe(memory, odd, [1, 1]).reused_tokens == 2
