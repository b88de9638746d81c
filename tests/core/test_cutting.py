"""app.core.cutting: middle-out cuts of a message's text, token-exact, one marker."""

from __future__ import annotations

from app.core.cutting import truncate_message
from tests.core.fakes import FakeMessageCounter, tool_exchange, words


def test_truncate_message_is_token_exact_and_keeps_head_and_tail(counter: FakeMessageCounter) -> None:
    message = {"role": "user", "content": words(1000)}
    cut = truncate_message(
        message, current_tokens=counter.count_message(message), target_tokens=200, counter=counter
    )
    assert cut is not None
    new, tokens = cut
    assert tokens == counter.count_message(new) <= 200
    text = new["content"]
    assert text.startswith("w0 w1 ") and text.endswith(" w999")
    head, tail = text.split("\n\n[ctxproxy: ")[0], text.split(" middle of this message]\n\n")[1]
    removed = len(message["content"]) - len(head) - len(tail)
    assert f"[ctxproxy: {removed:,} characters removed from the middle of this message]" in text


def test_truncate_again_keeps_one_marker_and_adds_up_the_count(counter: FakeMessageCounter) -> None:
    message = {"role": "user", "content": words(1000)}
    first, tokens = truncate_message(message, current_tokens=1004, target_tokens=400, counter=counter) or (
        {},
        0,
    )
    second, tokens2 = truncate_message(first, current_tokens=tokens, target_tokens=100, counter=counter) or (
        {},
        0,
    )
    assert tokens2 <= 100
    text = second["content"]
    assert text.count("[ctxproxy:") == 1
    head, rest = text.split("\n\n[ctxproxy: ")
    count, tail = rest.split(" characters removed from the middle of this message]\n\n")
    # The count is in characters of the original text: a pure function of what was removed.
    assert len(head) + int(count.replace(",", "")) + len(tail) == len(message["content"])


def test_a_resent_marker_of_the_older_wording_is_cut_again_under_one_new_marker(
    counter: FakeMessageCounter,
) -> None:
    old = f"{words(300)}\n\n[ctxproxy: 700 tokens removed from the middle of this message]\n\n{words(300)}"
    message = {"role": "user", "content": old}
    cut = truncate_message(
        message, current_tokens=counter.count_message(message), target_tokens=100, counter=counter
    )
    assert cut is not None
    text = cut[0]["content"]
    assert text.count("[ctxproxy:") == 1 and "tokens removed" not in text
    head, rest = text.split("\n\n[ctxproxy: ")
    count, tail = rest.split(" characters removed from the middle of this message]\n\n")
    marker = "\n\n[ctxproxy: 700 tokens removed from the middle of this message]\n\n"
    # What was received, less what is kept: the older marker's own count is not carried over.
    assert len(head) + int(count.replace(",", "")) + len(tail) == len(old) - len(marker)


def test_truncate_never_touches_images_or_tool_call_arguments(counter: FakeMessageCounter) -> None:
    parts = [{"type": "text", "text": words(500)}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    message = {"role": "user", "content": parts}
    new, _ = truncate_message(
        message, current_tokens=counter.count_message(message), target_tokens=200, counter=counter
    ) or ({}, 0)
    assert new["content"][1] is parts[1]
    call = tool_exchange(["c1"], 1)[0]
    args_only = {**call, "content": None}
    assert truncate_message(args_only, current_tokens=10_000, target_tokens=5, counter=counter) is None
    with_text = {**call, "content": words(500)}
    cut = truncate_message(
        with_text, current_tokens=counter.count_message(with_text), target_tokens=100, counter=counter
    )
    assert cut is not None and cut[0]["tool_calls"] is call["tool_calls"]
