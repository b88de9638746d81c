"""The fast path's rule: the UTF-8 ceiling is never below the exact count, so a fitting ceiling is
safe; its budget is the plan's own (one budget setup, every dialect's rule: Gemini's too)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.budget import Limits, Policy
from app.core.ceiling import Ceiling, Utf8ByteCounter, fitting_ceiling
from app.core.dialects import CHAT, DIALECTS, RESPONSES
from app.core.fit import plan_request
from app.core.registry import ModelSpec
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter
from app.tokenizer import counter_for
from tests.core.test_tokens import COOKBOOK_TOOLS, data_url, png

EXACT = {name: MessageCounter(counter_for(name)) for name in ("o200k_base", "cl100k_base")}
CEILING = MessageCounter(Utf8ByteCounter(), cache_size=0)


def ceiling_of(body: dict[str, Any], *, dialect: Any = CHAT, **options: Any) -> Ceiling | None:
    return fitting_ceiling(body, dialect.parse(body), dialect=dialect, **options)

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
    for exact in EXACT.values():
        assert sum(CEILING.count_messages(conversation)) >= sum(exact.count_messages(conversation))
        assert CEILING.count_tools(body) >= exact.count_tools(body)
        assert CEILING.count_request(body) >= exact.count_request(body)


@settings(max_examples=200, deadline=None)
@given(
    conversation=st.lists(messages(), min_size=1, max_size=6),
    window=st.integers(600, 3000),
    mode=st.sampled_from(["auto", "truncate", "reject", "off"]),
    cap=st.none() | st.integers(1, 2000),
    encoding=st.sampled_from(sorted(EXACT)),
)
def test_a_fitting_ceiling_only_when_the_exact_plan_fits_unchanged(
    conversation: list[dict[str, Any]], window: int, mode: Any, cap: int | None, encoding: str
) -> None:
    spec = ModelSpec("m", window, 256, encoding, source="operator")
    policy = Policy(mode=mode, reserve_tokens=100, keep_turns=1)
    body = {"model": "m", "messages": conversation, "tools": COOKBOOK_TOOLS[:1]}
    ceiling = ceiling_of(body, spec=spec, policy=policy, cap_tokens=cap)
    if ceiling is not None:
        plan = plan_request(
            body, spec=spec, policy=policy, counter=EXACT[encoding], cap_tokens=cap, dialect=CHAT
        )
        assert plan.fits and not plan.changed
        assert ceiling.tokens >= plan.tokens_before


def test_a_ceiling_fits_below_the_budget_and_not_above() -> None:
    spec = ModelSpec("m", 10_000, 1000, "o200k_base", source="operator")
    policy = Policy(reserve_tokens=1000)  # margin: 1% of the window = 100
    small = {"model": "m", "messages": [{"role": "user", "content": "x" * 8000}]}
    found = ceiling_of(small, spec=spec, policy=policy)
    assert found is not None and found.tokens == 3 + len("user") + 8000 + REPLY_PRIMING_TOKENS
    assert ceiling_of(small, spec=spec, policy=policy, cap_tokens=8000) is None
    assert ceiling_of(small, spec=spec, policy=policy, limits=Limits(window_tokens=9000)) is None
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 9000}]}
    assert ceiling_of(big, spec=spec, policy=policy) is None
    # its exact count is far smaller (long runs of x merge), so "not sure" is not "too big"
    assert plan_request(big, spec=spec, policy=policy, counter=EXACT["o200k_base"], dialect=CHAT).fits


def test_images_count_by_their_rule_not_their_base64() -> None:
    image = {"type": "image_url", "image_url": {"url": data_url(png(512, 512, padding=200_000))}}
    body = {"model": "m", "messages": [{"role": "user", "content": [image]}]}
    spec = ModelSpec("m", 2000, 100, "o200k_base", source="operator")
    found = ceiling_of(body, spec=spec, policy=Policy(reserve_tokens=100))
    assert found is not None and found.tokens == 3 + len("user") + 85 + 170 + REPLY_PRIMING_TOKENS


def tool_body(name: str, output_tokens: int) -> dict[str, Any]:
    """A short request of API ``name`` with one tool, asking for ``output_tokens`` of output."""
    text = "hello there"
    if name == "chat":
        messages = [{"role": "user", "content": text}]
        return {"model": "m", "max_tokens": output_tokens, "messages": messages, "tools": COOKBOOK_TOOLS[:1]}
    if name == "responses":
        tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
        return {"model": "m", "max_output_tokens": output_tokens, "input": text, "tools": [tool]}
    if name == "messages":
        tool = {"name": "f", "input_schema": {"type": "object"}}
        messages = [{"role": "user", "content": text}]
        return {"model": "m", "max_tokens": output_tokens, "messages": messages, "tools": [tool]}
    if name == "gemini":
        return {
            "model": "m",
            "contents": [{"role": "user", "parts": [{"text": text}]}],
            "generationConfig": {"maxOutputTokens": output_tokens},
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "object"}}]}],
        }
    raise AssertionError(f"add a request of the new API {name!r}")


@pytest.mark.parametrize("name", list(DIALECTS))
def test_the_ceilings_budget_is_the_plans_own(name: str) -> None:
    # One budget setup (``budget.request_budget``): window, reserve, margin and cap are the plan's,
    # the output reserve by the dialect's rule (none where the window limits the input alone), the
    # tools at their ceiling.
    dialect, body = DIALECTS[name], tool_body(name, 3000)
    spec = ModelSpec("m", 8000, 8000, "o200k_base", source="operator")
    limits = Limits(margin_tokens=10)
    found = ceiling_of(body, dialect=dialect, spec=spec, policy=Policy(), cap_tokens=3500, limits=limits)
    plan = plan_request(
        body,
        spec=spec,
        policy=Policy(),
        counter=EXACT["o200k_base"],
        dialect=dialect,
        cap_tokens=3500,
        limits=limits,
    )
    assert found is not None and plan.fits and not plan.changed
    ours, budget = found.budget, plan.budget
    assert (ours.window_tokens, ours.reserve_tokens, ours.margin_tokens, ours.cap_tokens) == (
        budget.window_tokens,
        budget.reserve_tokens,
        budget.margin_tokens,
        budget.cap_tokens,
    )
    assert budget.reserve_tokens == (3000 if dialect.output_in_window else 0)
    assert ours.tool_tokens >= budget.tool_tokens > 0 and found.tokens >= plan.tokens_before


@pytest.mark.parametrize("name", list(DIALECTS))
def test_a_ceiling_keeps_the_output_reserve_only_where_the_plan_does(name: str) -> None:
    # The drift the one budget setup ended: the ceiling kept Gemini's output reserve, so its fast
    # path refused what its plan forwards whole.
    dialect, body = DIALECTS[name], tool_body(name, 3990)
    spec = ModelSpec("m", 4000, 4000, "o200k_base", source="operator")
    found = ceiling_of(body, dialect=dialect, spec=spec, policy=Policy())
    plan = plan_request(body, spec=spec, policy=Policy(), counter=EXACT["o200k_base"], dialect=dialect)
    assert (found is not None) is (plan.fits and not plan.changed) is (not dialect.output_in_window)


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
def test_a_responses_ceiling_fits_only_when_its_exact_plan_fits_unchanged(
    items: list[dict[str, Any]], window: int, mode: Any, cap: int | None, encoding: str
) -> None:
    spec = ModelSpec("m", window, 256, encoding, source="operator")
    policy = Policy(mode=mode, reserve_tokens=100, keep_turns=1)
    tools = [{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    body = {"model": "m", "input": items, "tools": tools, "instructions": "be brief"}
    ceiling = ceiling_of(body, dialect=RESPONSES, spec=spec, policy=policy, cap_tokens=cap)
    if ceiling is not None:
        plan = plan_request(
            body, spec=spec, policy=policy, counter=EXACT[encoding], cap_tokens=cap, dialect=RESPONSES
        )
        assert plan.fits and not plan.changed
        assert ceiling.tokens >= plan.tokens_before


def test_a_responses_ceiling_fits_below_the_budget_and_not_above() -> None:
    spec = ModelSpec("m", 10_000, 1000, "o200k_base", source="operator")
    policy = Policy(reserve_tokens=1000)
    small = {"model": "m", "input": "x" * 8000}
    big = {"model": "m", "input": "x" * 9000}
    assert ceiling_of(small, dialect=RESPONSES, spec=spec, policy=policy) is not None
    assert ceiling_of(small, dialect=RESPONSES, spec=spec, policy=policy, cap_tokens=8000) is None
    assert ceiling_of(big, dialect=RESPONSES, spec=spec, policy=policy) is None
