"""The fast path's rule: the UTF-8 ceiling is never below the exact count, so "surely fits" is safe."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.budget import Policy
from app.core.ceiling import RequestCeiling, Utf8ByteCounter, surely_fits, token_ceiling
from app.core.errors import InvalidRequest
from app.core.fit import plan_request
from app.core.registry import ModelSpec
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter
from app.tokenizer import counter_for
from tests.core.test_tokens import COOKBOOK_TOOLS, data_url, png

EXACT = {name: MessageCounter(counter_for(name)) for name in ("o200k_base", "cl100k_base")}

# Text that tokenizes densely (digits, CJK, emoji, lone surrogates, special-token strings,
# long runs of spaces and punctuation) next to ordinary prose.
TEXTS = st.text(
    alphabet=st.sampled_from(
        [*"ab xyz,.\n\t{}\"'0123456789", "中", "文", "한", "😀", "é", "\u0301", "\ud800", "\udfff", "\x00"]
    ),
    max_size=60,
) | st.sampled_from(["<|endoftext|>", "<|fim_prefix|>x", " " * 40, "1" * 30, "😀" * 10, ""])
IMAGE = st.builds(
    lambda w, h, detail: {"type": "image_url", "image_url": {"url": data_url(png(w, h)), "detail": detail}},
    st.integers(1, 4000),
    st.integers(1, 4000),
    st.sampled_from(["low", "high", "auto"]),
)
REMOTE_IMAGE = st.just({"type": "image_url", "image_url": {"url": "https://x.test/a.png"}})
AUDIO = st.builds(
    lambda n: {"type": "input_audio", "input_audio": {"data": "A" * n, "format": "wav"}}, st.integers(0, 4000)
)
FILE = st.builds(lambda name: {"type": "file", "file": {"filename": name, "file_data": "data:x"}}, TEXTS)
UNKNOWN = st.builds(lambda t: {"type": "custom", "value": {"a": [t, 1, None]}}, TEXTS)
TEXT = st.builds(lambda t: {"type": "text", "text": t}, TEXTS)
PART = st.one_of(TEXT, IMAGE, REMOTE_IMAGE, AUDIO, FILE, UNKNOWN)
CALL = st.builds(
    lambda i, name, args: {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    },
    st.integers(0, 99),
    TEXTS,
    TEXTS,
)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "developer"]))
    content = draw(st.one_of(TEXTS, st.lists(PART, max_size=3), st.none()))
    message: dict[str, Any] = {"role": role, "content": content}
    if draw(st.booleans()):
        message["name"] = draw(TEXTS)
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = draw(st.lists(CALL, min_size=1, max_size=3))
    if role == "tool":
        message["tool_call_id"] = f"call_{draw(st.integers(0, 99))}"
    if draw(st.booleans()):
        message["reasoning_content"] = draw(TEXTS)
    return message


@settings(max_examples=200, deadline=None)
@given(conversation=st.lists(messages(), min_size=1, max_size=6), with_tools=st.booleans())
def test_ceiling_is_never_below_the_exact_count(conversation: list[dict[str, Any]], with_tools: bool) -> None:
    body: dict[str, Any] = {"messages": conversation}
    if with_tools:
        body["tools"] = COOKBOOK_TOOLS
    ceiling = token_ceiling(body)
    for exact in EXACT.values():
        assert ceiling.message_tokens >= sum(exact.count_messages(conversation))
        assert ceiling.tool_tokens >= exact.count_tools(body)
        assert ceiling.total_tokens >= exact.count_request(body)


@settings(max_examples=200, deadline=None)
@given(
    conversation=st.lists(messages(), min_size=1, max_size=6),
    window=st.integers(600, 3000),
    mode=st.sampled_from(["auto", "truncate", "reject", "off"]),
    cap=st.none() | st.integers(1, 2000),
    encoding=st.sampled_from(sorted(EXACT)),
)
def test_surely_fits_only_when_the_exact_plan_fits_unchanged(
    conversation: list[dict[str, Any]], window: int, mode: Any, cap: int | None, encoding: str
) -> None:
    spec = ModelSpec("m", window, 256, encoding, source="operator")
    policy = Policy(mode=mode, reserve_tokens=100, keep_turns=1)
    body = {"model": "m", "messages": conversation, "tools": COOKBOOK_TOOLS[:1]}
    if surely_fits(body, spec=spec, policy=policy, cap_tokens=cap):
        plan = plan_request(body, spec=spec, policy=policy, counter=EXACT[encoding], cap_tokens=cap)
        assert plan.fits and not plan.changed


def test_surely_fits_says_yes_below_the_budget_and_not_above() -> None:
    spec = ModelSpec("m", 10_000, 1000, "o200k_base", source="operator")
    policy = Policy(reserve_tokens=1000)  # margin: 1% of the window = 100
    small = {"model": "m", "messages": [{"role": "user", "content": "x" * 8000}]}
    assert surely_fits(small, spec=spec, policy=policy)
    assert not surely_fits(small, spec=spec, policy=policy, cap_tokens=8000)
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 9000}]}
    assert not surely_fits(big, spec=spec, policy=policy)
    # its exact count is far smaller (long runs of x merge), so "not sure" is not "too big"
    assert plan_request(big, spec=spec, policy=policy, counter=EXACT["o200k_base"]).fits
    assert surely_fits(big, spec=spec, policy=Policy(mode="off"))


def test_images_count_by_their_rule_not_their_base64() -> None:
    image = {"type": "image_url", "image_url": {"url": data_url(png(512, 512, padding=200_000))}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    ceiling = token_ceiling(body)
    assert ceiling == RequestCeiling(3 + len("user") + 85 + 170, 0)
    assert ceiling.total_tokens == ceiling.message_tokens + REPLY_PRIMING_TOKENS
    spec = ModelSpec("m", 2000, 100, "o200k_base", source="operator")
    assert surely_fits({"model": "m", **body}, spec=spec, policy=Policy(reserve_tokens=100))


def test_surely_fits_validates_like_the_planner() -> None:
    spec = ModelSpec("m", 2000, 100, "o200k_base", source="operator")
    for bad in ([], "hi", [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 5}]):
        with pytest.raises(InvalidRequest):
            surely_fits({"messages": bad}, spec=spec, policy=Policy())


def test_utf8_counter_counts_bytes_and_cuts_on_characters() -> None:
    counter = Utf8ByteCounter()
    assert counter.count_text("abc") == 3
    assert counter.count_text("é中😀") == 2 + 3 + 4
    assert counter.count_text("\ud800") == 3
    assert counter.head_tail("é中😀", head_tokens=4, tail_tokens=4) == ("é", "😀")
    assert counter.head_tail("abc", head_tokens=0, tail_tokens=0) == ("", "")


@st.composite
def responses_items(draw: st.DrawFn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for k in range(draw(st.integers(1, 4))):
        items.append(
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": draw(TEXTS)}]}
        )
        if draw(st.booleans()):
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{k}",
                    "summary": [],
                    "encrypted_content": "gAAAA" + "x" * 300,
                }
            )
        if draw(st.booleans()):
            items.append(
                {"type": "function_call", "call_id": f"c{k}", "name": draw(TEXTS), "arguments": draw(TEXTS)}
            )
            items.append({"type": "function_call_output", "call_id": f"c{k}", "output": draw(TEXTS)})
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": draw(TEXTS)}],
            }
        )
    return items


@settings(max_examples=150, deadline=None)
@given(
    items=responses_items(),
    window=st.integers(300, 3000),
    mode=st.sampled_from(["auto", "truncate", "reject", "off"]),
    cap=st.none() | st.integers(1, 2000),
    encoding=st.sampled_from(sorted(EXACT)),
)
def test_a_responses_conversation_surely_fits_only_when_its_exact_plan_fits_unchanged(
    items: list[dict[str, Any]], window: int, mode: Any, cap: int | None, encoding: str
) -> None:
    from app.core.ceiling import conversation_surely_fits
    from app.core.dialects import RESPONSES

    spec = ModelSpec("m", window, 256, encoding, source="operator")
    policy = Policy(mode=mode, reserve_tokens=100, keep_turns=1)
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    body = {"model": "m", "input": items, "tools": tools, "instructions": "be brief"}
    conversation = RESPONSES.parse(body)
    if conversation_surely_fits(
        body, conversation, dialect=RESPONSES, spec=spec, policy=policy, cap_tokens=cap
    ):
        plan = plan_request(
            body, spec=spec, policy=policy, counter=EXACT[encoding], cap_tokens=cap, dialect=RESPONSES
        )
        assert plan.fits and not plan.changed


def test_a_responses_conversation_surely_fits_below_the_budget_and_not_above() -> None:
    from app.core.ceiling import conversation_surely_fits
    from app.core.dialects import RESPONSES

    spec = ModelSpec("m", 10_000, 1000, "o200k_base", source="operator")
    policy = Policy(reserve_tokens=1000)
    small = {"model": "m", "input": "x" * 8000}
    big = {"model": "m", "input": "x" * 9000}
    fits = conversation_surely_fits(
        small, RESPONSES.parse(small), dialect=RESPONSES, spec=spec, policy=policy
    )
    assert fits
    capped = RESPONSES.parse(small)
    assert not conversation_surely_fits(
        small, capped, dialect=RESPONSES, spec=spec, policy=policy, cap_tokens=8000
    )
    assert not conversation_surely_fits(
        big, RESPONSES.parse(big), dialect=RESPONSES, spec=spec, policy=policy
    )
