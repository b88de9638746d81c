"""The neutral conversation's reserved keys: origins survive edits, opaque messages are never
edited, dialect prices are counted."""

from __future__ import annotations

from typing import Any

from app.core.conversation import (
    OPAQUE_KEY,
    ORIGIN_KEY,
    PRICE_KEY,
    Conversation,
    is_opaque,
    neutral,
    origin_of,
    strip_reserved,
)
from app.core.cutting import truncate_message
from app.core.dialects import CHAT
from app.core.fit import plan_request
from app.core.tokens import MessageCounter
from tests.core.fakes import SPEC, FakeMessageCounter, WordCounter, body, policy, system, user, words


def test_neutral_sets_reserved_keys_only_when_they_say_something() -> None:
    plain = neutral("user", "hi")
    assert plain == {"role": "user", "content": "hi"}
    full = neutral("assistant", "x", origin=[(3,), (4, 1)], opaque=True, price_tokens=12)
    assert full[ORIGIN_KEY] == [[3], [4, 1]] and full[OPAQUE_KEY] is True and full[PRICE_KEY] == 12
    assert origin_of(full) == ((3,), (4, 1)) and is_opaque(full)
    assert strip_reserved(full) == {"role": "assistant", "content": "x"}


def test_the_accounting_adds_a_message_price_and_lets_a_part_price_replace_its_rule() -> None:
    counter = MessageCounter(WordCounter())
    base = counter.count_message({"role": "assistant", "content": "one two"})
    priced = counter.count_message({"role": "assistant", "content": "one two", PRICE_KEY: 40})
    assert priced == base + 40
    image = {"type": "image_url", "image_url": {"url": "https://example.invalid/x.png"}}
    by_openai = counter.count_message({"role": "user", "content": [image]})
    by_dialect = counter.count_message({"role": "user", "content": [{**image, PRICE_KEY: 7}]})
    assert by_dialect == by_openai - (by_openai - counter.count_message({"role": "user", "content": []})) + 7
    # Origins and opacity are not text: they cost nothing.
    assert counter.count_message(
        neutral("user", "one two", origin=[(1,)], opaque=True)
    ) == counter.count_message({"role": "user", "content": "one two"})


def test_an_opaque_message_is_never_cut() -> None:
    counter = FakeMessageCounter()
    message = neutral("assistant", words(500), origin=[(2,)], opaque=True)
    assert truncate_message(message, current_tokens=503, target_tokens=50, counter=counter) is None
    editable = neutral("assistant", words(500), origin=[(2,)])
    cut = truncate_message(editable, current_tokens=503, target_tokens=50, counter=counter)
    assert cut is not None and cut[0][ORIGIN_KEY] == [[2]]  # an edited message keeps its origin


def test_the_pipeline_drops_an_opaque_unit_whole_and_never_prunes_or_cuts_it() -> None:
    counter = FakeMessageCounter()
    signed = neutral(
        "assistant",
        words(300, "s"),
        origin=[(3,)],
        opaque=True,
        tool_calls=[{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
    )
    result_msg = neutral("tool", words(300, "r"), origin=[(4,)], opaque=True, tool_call_id="c1")
    messages: list[dict[str, Any]] = [
        system(),
        user(10, "task"),
        signed,
        result_msg,
        *[m for k in range(4) for m in (user(80, f"q{k}"), neutral("assistant", words(80, f"a{k}")))],
    ]
    plan = plan_request(
        body(messages), spec=SPEC, policy=policy(), counter=counter, cap_tokens=700, dialect=CHAT
    )
    assert plan.fits
    for message in plan.messages:
        if message.get(ORIGIN_KEY) in ([[3]], [[4]]):
            assert message is signed or message is result_msg  # kept byte-for-byte, or dropped
    kept = {id(m) for m in plan.messages}
    assert (id(signed) in kept) == (id(result_msg) in kept)


def test_a_conversation_is_a_frozen_value() -> None:
    conversation = Conversation(model="m", messages=(neutral("user", "hi"),))
    assert (
        conversation.fittable
        and conversation.tool_tokens == 0
        and conversation.requested_output_tokens is None
    )
