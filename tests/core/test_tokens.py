"""app.core.tokens: the per-message cache, remembered conversations and request totals."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import InvalidRequest
from app.core.estimate import EstimateCounter
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter
from app.tokenizer import counter_for
from tests.core.chat_samples import COOKBOOK_TOOLS, O200K, call_message, conversation, data_url, png

# -- cache ---------------------------------------------------------------------------------


def test_resend_with_one_new_message_counts_one_message() -> None:
    mc = MessageCounter(O200K)
    messages = conversation(20)
    first = mc.count_request({"messages": messages})
    info = mc.cache_info()
    assert info.misses == len(messages) and info.hits == 0
    grown = [*messages, {"role": "user", "content": "And now?"}]
    second = mc.count_request({"messages": grown})
    after = mc.cache_info()
    assert after.misses - info.misses == 1
    assert after.hits - info.hits == len(messages)
    assert second == first + mc.count_message(grown[-1])
    assert after.size == len(grown)


def test_cache_key_ignores_key_order_and_is_bounded() -> None:
    mc = MessageCounter(O200K, cache_size=3)
    mc.count_message({"role": "user", "content": "a b c"})
    mc.count_message({"content": "a b c", "role": "user"})
    assert mc.cache_info().hits == 1
    for i in range(10):
        mc.count_message({"role": "user", "content": f"message {i}"})
    assert mc.cache_info().size == 3
    mc.cache_clear()
    assert mc.cache_info() == (0, 0, 0)


def test_cache_is_bounded_by_characters_too() -> None:
    mc = MessageCounter(O200K, cache_max_chars=1000)
    for i in range(10):
        mc.count_message({"role": "user", "content": f"{i} " + "word " * 60})
    assert 0 < mc.cache_chars() <= 1000
    assert mc.cache_info().size < 10
    huge = {"role": "user", "content": "word " * 500}
    assert mc.count_message(huge) == 3 + 1 + O200K.count_text("word " * 500)
    assert mc.cache_chars() <= 1000  # too big to keep: counted, not cached
    mc.cache_clear()
    assert mc.cache_chars() == 0


def test_deeply_nested_parts_are_counted_not_cached() -> None:
    mc = MessageCounter(O200K)
    nested: Any = "deep"
    for _ in range(5000):
        nested = {"x": nested}
    message = {"role": "user", "content": [{"type": "custom", "value": nested}]}
    assert mc.count_message(message) >= 3 + 1
    assert mc.cache_info().size == 0


def test_odd_messages_are_counted_without_errors() -> None:
    mc = MessageCounter(O200K)
    lone = {"role": "user", "content": "bad \ud800 surrogate"}
    assert mc.count_message(lone) == mc.count_message(dict(lone)) > 3
    assert mc.cache_info().hits == 1
    unserializable = {"role": "user", "content": "x", "meta": object()}
    assert mc.count_message(unserializable) == 3 + 1 + 1
    assert mc.count_message({"role": "user", "content": 12345}) == 3 + 1 + O200K.count_text("12345")


def test_bad_input_is_invalid_request() -> None:
    mc = MessageCounter(O200K)
    with pytest.raises(InvalidRequest):
        mc.count_request({"messages": "hello"})
    with pytest.raises(InvalidRequest):
        mc.count_request({"messages": ["hello"]})
    assert mc.count_request({}) == REPLY_PRIMING_TOKENS


def test_estimate_correction_does_not_corrupt_the_cache() -> None:
    counter = EstimateCounter()
    mc = MessageCounter(counter)
    assert mc.exact is False and MessageCounter(O200K).exact is True
    messages = conversation(5)
    body = {"messages": messages, "tools": COOKBOOK_TOOLS}
    plain = mc.count_request(body)
    counter.correction = 1.5
    corrected = mc.count_request(body)
    fresh = MessageCounter(EstimateCounter(correction=1.5)).count_request(body)
    assert corrected == fresh > plain
    assert mc.cache_info().misses == len(messages) + 1  # nothing was recounted
    counter.correction = 1.0
    assert mc.count_request(body) == plain
    # the correction scales text only: the per-message overheads stay whole
    one = {"role": "user", "content": "word " * 100}
    assert MessageCounter(EstimateCounter(correction=0.5)).count_message(one) == 3 + math.ceil(
        (counter.raw_count("user") + counter.raw_count("word " * 100)) * 0.5
    )


# -- properties ----------------------------------------------------------------------------

TEXTS = st.text(alphabet=st.sampled_from([*'abc xyz,.\n{}"', "中", "文", "한", "😀", "é"]), max_size=40)
IMAGE = st.builds(
    lambda w, h, detail: {"type": "image_url", "image_url": {"url": data_url(png(w, h)), "detail": detail}},
    st.integers(1, 5000),
    st.integers(1, 5000),
    st.sampled_from(["low", "high", "auto"]),
)
PART = st.one_of(st.builds(lambda t: {"type": "text", "text": t}, TEXTS), IMAGE)
CONTENT = st.one_of(TEXTS, st.lists(PART, max_size=3))
CALL = st.builds(
    lambda i, name, args: {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    },
    st.integers(0, 99),
    st.sampled_from(["search", "read_file"]),
    TEXTS,
)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
    message: dict[str, Any] = {"role": role, "content": draw(CONTENT)}
    if draw(st.booleans()):
        message["name"] = draw(st.sampled_from(["alice", "bob_2"]))
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(st.lists(CALL, min_size=1, max_size=3))
        message["content"] = None
    if role == "tool":
        message["tool_call_id"] = f"call_{draw(st.integers(0, 99))}"
    return message


@settings(max_examples=200, deadline=None)
@given(
    conversation=st.lists(messages(), min_size=1, max_size=8),
    with_tools=st.booleans(),
    encoding=st.sampled_from(["o200k_base", "cl100k_base", "estimate"]),
)
def test_request_is_sum_of_messages_priming_and_tools(
    conversation: list[dict[str, Any]], with_tools: bool, encoding: str
) -> None:
    counter = counter_for(encoding)
    mc = MessageCounter(counter)
    body: dict[str, Any] = {"messages": conversation}
    if with_tools:
        body["tools"] = COOKBOOK_TOOLS
    per_message = mc.count_messages(conversation)
    assert sum(per_message) + REPLY_PRIMING_TOKENS + mc.count_tools(body) == mc.count_request(body)
    uncached = MessageCounter(counter, cache_size=0)
    assert uncached.count_messages(conversation) == per_message
    reordered = [dict(reversed(list(m.items()))) for m in conversation]
    assert mc.count_messages(reordered) == per_message
    for message, tokens in zip(conversation, per_message, strict=True):
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        assert tokens >= 3 + counter.count_text(text)


# -- remembered conversations ---------------------------------------------------------------


def test_a_resent_conversation_reuses_its_prefix_and_edits_are_recounted() -> None:
    mc = MessageCounter(O200K)
    fresh = MessageCounter(O200K, cache_size=0)
    messages = conversation(10)
    mc.count_messages(messages)
    hits = mc.cache_info().hits
    grown = [*messages, {"role": "user", "content": "one more"}]
    assert mc.count_messages(grown) == fresh.count_messages(grown)
    assert mc.cache_info().hits - hits == len(messages)
    question = {"role": "user", "content": "an edited question, much longer than before"}
    edited = [*grown[:4], question, *grown[5:]]
    assert mc.count_messages(edited) == fresh.count_messages(edited)
    truncated = edited[:9]
    assert mc.count_messages(truncated) == fresh.count_messages(truncated)
    reordered = [dict(reversed(list(m.items()))) for m in edited]
    assert mc.count_messages(reordered) == fresh.count_messages(edited)


def test_remembered_conversations_are_bounded() -> None:
    mc = MessageCounter(O200K, cache_max_chars=20_000)
    for i in range(100):
        mc.count_messages([{"role": "system", "content": f"session {i}"}, *conversation(5)])
    assert len(mc._conversations) <= 64
    assert 0 < mc._conversation_chars <= 10_000
    assert mc._conversation_chars == sum(sum(c.chars) for cs in mc._conversations.values() for c in cs)
    mc.cache_clear()
    assert mc._conversation_chars == 0 and not mc._conversations


SCALARS = st.one_of(TEXTS, st.integers(-3, 3), st.floats(-2, 2, allow_nan=False), st.booleans(), st.none())


@st.composite
def loose_messages(draw: st.DrawFn) -> dict[str, Any]:
    """Messages whose values may be numbers or booleans where ``==`` would confuse them."""
    message = draw(messages())
    if draw(st.booleans()):
        message = call_message(draw(SCALARS))
    if draw(st.booleans()):
        message["metadata"] = {"k": draw(SCALARS)}
    return message


@settings(max_examples=100, deadline=None)
@given(
    base=st.lists(loose_messages(), min_size=8, max_size=12),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "edit", "truncate", "same"]), st.integers(0, 20), loose_messages()
        ),
        max_size=6,
    ),
)
def test_remembered_prefixes_never_change_a_count(
    base: list[dict[str, Any]], steps: list[tuple[str, int, dict[str, Any]]]
) -> None:
    mc = MessageCounter(O200K)
    fresh = MessageCounter(O200K, cache_size=0)
    current = list(base)
    assert mc.count_messages(current) == fresh.count_messages(current)
    for op, index, message in steps:
        if op == "append":
            current = [*current, message]
        elif op == "edit":
            i = 2 + index % (len(current) - 2)
            current = [*current[:i], message, *current[i + 1 :]]
        elif op == "truncate":
            current = current[: max(8, len(current) - 1 - index % 3)]
        copy = [dict(m) for m in current]  # a new request: new objects, equal values
        assert mc.count_messages(copy) == fresh.count_messages(copy)


def test_unremembered_chars_is_what_a_resent_conversation_adds() -> None:
    mc = MessageCounter(O200K)
    messages = conversation(10)
    assert mc.unremembered_chars(messages) is None  # never seen
    mc.count_messages(messages)
    assert mc.unremembered_chars(messages) == 0
    grown = [*messages, {"role": "user", "content": "x" * 50}]
    assert mc.unremembered_chars(grown) == len("role") + len("user") + len("content") + 50
    assert mc.unremembered_chars(messages[:3]) is None  # too short to be remembered
    assert MessageCounter(O200K, cache_size=0).unremembered_chars(messages) is None


def test_a_list_that_departs_from_a_conversation_does_not_replace_it() -> None:
    mc = MessageCounter(O200K)
    messages = conversation(10)
    mc.count_messages(messages)
    cut = [*messages[:3], {"role": "user", "content": "[cut]"}, *messages[4:]]  # e.g. the plan's own cut
    mc.count_messages(cut)
    new = {"role": "user", "content": "y" * 40}
    assert mc.unremembered_chars([*messages, new]) == len("roleusercontent") + 40
    assert mc.unremembered_chars([*cut, new]) == len("roleusercontent") + 40


class CountingCounter:
    """o200k, recording the length of every text it is asked to count."""

    name = "o200k_base"
    exact = True

    def __init__(self) -> None:
        self.inner = counter_for("o200k_base")
        self.asked: list[int] = []

    def count_text(self, text: str, /) -> int:
        self.asked.append(len(text))
        return self.inner.count_text(text)

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        return self.inner.head_tail(text, head_tokens=head_tokens, tail_tokens=tail_tokens)


def test_a_long_text_is_encoded_once_in_its_message_and_when_counted_alone() -> None:
    from app.core.tokens import BIG_TEXT_CHARS

    tc = CountingCounter()
    mc = MessageCounter(tc)
    long_text = "lorem ipsum dolor " * (BIG_TEXT_CHARS // 10)
    short_text = "short text"
    message = {"role": "user", "content": long_text}
    tokens = mc.count_message(message)
    assert mc.text_tokens(long_text) == tc.inner.count_text(long_text) == tokens - 3 - 1  # 3/message, "user"
    assert mc.text_tokens(short_text) == tc.inner.count_text(short_text)
    assert mc.text_tokens(short_text) == tc.inner.count_text(short_text)
    assert tc.asked.count(len(long_text)) == 1  # counted in its message, then served from the cache
    assert tc.asked.count(len(short_text)) == 2  # short texts are cheaper to count than to key


def test_text_tokens_of_an_estimate_is_its_corrected_count() -> None:
    estimate = EstimateCounter(correction=1.37)
    mc = MessageCounter(estimate)
    text = "word " * 30_000
    assert mc.text_tokens(text) == estimate.count_text(text)


# -- a large cold request, counted in one batch ---------------------------------------------


class BatchingCounter(CountingCounter):
    """A ``BatchCounter``: records each batch it is given (counted one by one here)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def count_texts(self, texts: Any, /) -> list[int]:
        self.batches.append(list(texts))
        return [self.inner.count_text(text) for text in texts]


def large_conversation(salt: str, *, messages: int = 40) -> list[dict[str, Any]]:
    from app.core.tokens import BATCH_MIN_CHARS

    text = "alpha beta gamma delta " * (2 * BATCH_MIN_CHARS // (23 * messages))
    out: list[dict[str, Any]] = [{"role": "system", "content": f"{salt} be brief"}]
    for i in range(messages):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{salt} {i} {text}"})
    out.append(call_message('{"path": "' + salt + "/x" * 200 + '"}'))
    return out


def test_the_texts_of_a_large_cold_request_are_counted_in_one_batch_with_the_same_counts() -> None:
    tc = BatchingCounter()
    mc = MessageCounter(tc)
    messages = large_conversation("first")
    counts = mc.count_messages(messages)
    assert counts == MessageCounter(O200K).count_messages(messages)
    (batch,) = tc.batches
    # The long texts (contents, a call's arguments), each once; the short ones (a role, an id) are
    # counted in line, not batched.
    arguments = messages[-1]["tool_calls"][0]["function"]["arguments"]
    assert sorted(batch) == sorted([*(m["content"] for m in messages[1:-1]), arguments])
    assert not any(size >= 256 for size in tc.asked)  # nothing long was counted outside the batch


def test_a_batch_holds_only_what_the_cache_misses_and_a_small_request_takes_none() -> None:
    tc = BatchingCounter()
    mc = MessageCounter(tc)
    messages = large_conversation("first")
    mc.count_messages(messages)
    again = [*large_conversation("other")[:-1], *messages[1:5]]  # new messages and four known ones
    mc.count_messages(again)
    assert len(tc.batches) == 2
    assert not set(tc.batches[1]) & {m["content"] for m in messages[1:5]}
    mc.count_messages(conversation(6))
    assert len(tc.batches) == 2  # below BATCH_MIN_CHARS: counted message by message


def test_a_long_text_counted_in_a_batch_is_not_encoded_again_when_cut() -> None:
    from app.core.tokens import BIG_TEXT_CHARS

    tc = BatchingCounter()
    mc = MessageCounter(tc)
    long_text = "lorem ipsum dolor " * (BIG_TEXT_CHARS // 10)
    messages = [{"role": "user", "content": long_text}, {"role": "assistant", "content": "ok"}]
    mc.count_messages(messages)
    assert [long_text] in tc.batches
    assert mc.text_tokens(long_text) == O200K.count_text(long_text)
    assert len(long_text) not in tc.asked  # from the text cache the batch filled


@given(st.lists(st.text(min_size=0, max_size=400), min_size=1, max_size=30), st.integers(0, 3))
@settings(max_examples=40, deadline=None)
def test_batched_and_message_by_message_counts_are_equal(texts: list[str], repeat: int) -> None:
    from app.core import tokens

    messages = [{"role": "user", "content": text * (1 + repeat * 200)} for text in texts]
    expected = MessageCounter(O200K).count_messages(messages)
    original = tokens.BATCH_MIN_CHARS
    tokens.BATCH_MIN_CHARS = 1  # every request batched
    try:
        assert MessageCounter(BatchingCounter()).count_messages(messages) == expected
    finally:
        tokens.BATCH_MIN_CHARS = original
