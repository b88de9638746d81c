"""The Anthropic Messages dialect: parsing, rendering, its rules, errors and usage; and property tests
of the real fit pipeline through it, checked by the strict fake upstream's own rules."""

from __future__ import annotations

import base64
import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.core.budget import Policy
from app.core.conversation import OPAQUE_KEY, PRICE_KEY, is_opaque, origin_of
from app.core.dialect import ErrorInfo, error_info
from app.core.dialects.messages import (
    DOCUMENT_PAGE_TOKENS,
    IMAGE_MAX_TOKENS,
    MESSAGES,
    TOOL_USE_SYSTEM_PROMPT_TOKENS,
    image_tokens,
    window_from_beta,
)
from app.core.dialects.messages_wire import SEPARATOR_TEXT
from app.core.endpoints import UpstreamTarget
from app.core.errors import CannotFit, InvalidRequest
from app.core.fit import plan_request
from app.core.overflow import classify_overflow
from app.core.plan import Plan
from app.core.registry import ModelSpec
from tests.core.fakes import TINY_PNG, FakeMessageCounter, words
from tests.fake_anthropic_upstream import Refused, Signer, check_structure, loop_results, loop_start

SIGNER = Signer(b"test-secret")
PNG_DATA = TINY_PNG.split(",", 1)[1]


def spec(window_tokens: int) -> ModelSpec:
    return ModelSpec(
        name="claude-test", window_tokens=window_tokens, max_output_tokens=8192, encoding="estimate"
    )


def fit(
    body: dict[str, Any], *, window_tokens: int, policy: Policy | None = None
) -> tuple[Plan, dict[str, Any]]:
    """The pipeline as the service drives it: plan through the dialect, render the plan's body."""
    plan = plan_request(
        body,
        spec=spec(window_tokens),
        policy=policy or Policy(),
        counter=FakeMessageCounter(),
        dialect=MESSAGES,
    )
    assert plan.api == "messages"
    return plan, plan.body(body) if plan.changed else body


def signed(thinking: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A thinking block as the fake upstream signs it after ``messages``."""
    return {
        "type": "thinking",
        "thinking": thinking,
        "signature": SIGNER.sign(thinking, loop_results(messages, len(messages))),
    }


def tool_use(call_id: str, n: int = 3) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": "read_file", "input": {"path": words(n, "p")}}


def result(call_id: str, n: int) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": words(n, f"r{call_id}_")}


def msgs_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 100, "messages": messages, **extra}


# ---- parsing --------------------------------------------------------------------------------


def test_parse_maps_blocks_onto_neutral_messages() -> None:
    body = msgs_body(
        [
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": [{"type": "text", "text": "let me look"}, tool_use("t1")]},
            {"role": "user", "content": [result("t1", 4), {"type": "text", "text": "and more"}]},
        ],
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    )
    messages = MESSAGES.parse(body).messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert [origin_of(m) for m in messages] == [((-1, 0),), ((0,),), ((1, 0), (1, 1)), ((2, 0),), ((2, 1),)]
    assistant = messages[2]
    assert assistant["tool_calls"] == [
        {
            "id": "t1",
            "type": "function",
            "function": {
                "name": "read_file",
                "arguments": json.dumps({"path": "p0 p1 p2"}, separators=(",", ":")),
            },
        }
    ]
    assert assistant["content"][0] is body["messages"][1]["content"][0]  # the body's own block
    assert messages[3]["tool_call_id"] == "t1" and messages[3]["content"] == "rt1_0 rt1_1 rt1_2 rt1_3"
    assert not any(is_opaque(m) for m in messages)
    assert MESSAGES.parse(body).requested_output_tokens == 100


def test_thinking_makes_the_assistant_message_opaque_and_hides_the_signature_from_counting() -> None:
    body = msgs_body(
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "S" * 400},
                    {"type": "text", "text": "a"},
                ],
            },
            {"role": "user", "content": "next"},
        ]
    )
    assistant = MESSAGES.parse(body).messages[1]
    assert assistant[OPAQUE_KEY] is True
    assert assistant["content"][0] == {"type": "thinking", "thinking": "hmm"}


def test_the_current_tool_loop_is_opaque_up_to_its_newest_thinking_message() -> None:
    wire: list[dict[str, Any]] = [{"role": "user", "content": "task " + words(5)}]
    wire.append({"role": "assistant", "content": [signed("plan", wire), tool_use("a")]})
    wire.append({"role": "user", "content": [result("a", 20)]})
    wire.append({"role": "assistant", "content": [signed("next", wire), tool_use("b")]})
    wire.append({"role": "user", "content": [result("b", 20)]})
    wire.append(
        {"role": "assistant", "content": [{"type": "text", "text": "no thinking here"}, tool_use("c")]}
    )
    wire.append({"role": "user", "content": [result("c", 20)]})
    messages = MESSAGES.parse(msgs_body(wire)).messages
    opaque = [(m["role"], origin_of(m)[0][0], is_opaque(m)) for m in messages]
    assert opaque == [
        ("user", 0, False),
        ("assistant", 1, True),
        ("tool", 2, True),
        ("assistant", 3, True),
        ("tool", 4, False),  # after the newest thinking message: may be pruned
        ("assistant", 5, False),
        ("tool", 6, False),
    ]


def test_images_and_documents_are_priced_by_anthropics_rules() -> None:
    pdf = base64.b64encode(b"%PDF-1.4 /Type /Pages /Type /Page x /Type /Page y /Type/Page z").decode()
    body = msgs_body(
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG_DATA},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://example.invalid/a.png"}},
                    {
                        "type": "document",
                        "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
                    },
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
                    },
                ],
            }
        ]
    )
    parts = MESSAGES.parse(body).messages[0]["content"]
    assert [p.get(PRICE_KEY) for p in parts] == [1, IMAGE_MAX_TOKENS, 3 * DOCUMENT_PAGE_TOKENS, None]
    assert parts[3] is body["messages"][0]["content"][3]


@pytest.mark.parametrize(
    ("size", "tokens"),
    [
        ((200, 200), 54),
        ((1000, 1000), 1334),
        ((1092, 1092), 1590),
        ((3000, 1000), 1093),
        ((4000, 4000), 1600),
    ],
)
def test_image_tokens_follow_width_times_height_over_750_after_the_resize(
    size: tuple[int, int], tokens: int
) -> None:
    assert image_tokens(*size) == tokens


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": "9", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "max_tokens": 5, "messages": "x"}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages.0.content.0",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "assistant", "content": [{"type": "tool_use"}]}],
            },
            "messages.0.content.0",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "system": 4},
            "system",
        ),
    ],
)
def test_bad_bodies_are_invalid_requests_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        MESSAGES.parse(body)
    assert caught.value.param == param


def test_tools_are_counted_with_the_tool_use_system_prompt() -> None:
    counter = FakeMessageCounter()
    tool = {
        "name": "read_file",
        "description": "reads a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    tokens = MESSAGES.tool_tokens(msgs_body([], tools=[tool]), counter)
    assert tokens > TOOL_USE_SYSTEM_PROMPT_TOKENS
    assert MESSAGES.tool_tokens(msgs_body([]), counter) == 0


# ---- rendering ------------------------------------------------------------------------------


def conversation(turns: int, *, result_tokens: int = 60) -> dict[str, Any]:
    wire: list[dict[str, Any]] = []
    for k in range(turns):
        wire.append({"role": "user", "content": f"question {k} " + words(10, f"q{k}_")})
        wire.append(
            {
                "role": "assistant",
                "content": [{"type": "text", "text": words(5, f"a{k}_")}, tool_use(f"c{k}")],
            }
        )
        wire.append({"role": "user", "content": [result(f"c{k}", result_tokens)]})
        wire.append({"role": "assistant", "content": f"answer {k} " + words(10, f"b{k}_")})
    wire.append({"role": "user", "content": "last question"})
    return msgs_body(wire, system="you are terse")


def test_render_of_the_parsed_messages_is_the_body_itself() -> None:
    body = conversation(3)
    rendered = MESSAGES.render(body, MESSAGES.parse(body).messages)
    assert rendered == body
    assert all(a is b for a, b in zip(rendered["messages"], body["messages"], strict=True))


def test_an_overflowing_conversation_is_fitted_into_a_valid_body() -> None:
    body = conversation(12, result_tokens=200)
    before = copy.deepcopy(body)
    plan, out = fit(body, window_tokens=1500)
    assert plan.changed and plan.fits
    assert body == before  # never mutated
    assert MESSAGES.problems(out) == []
    check_structure(out, SIGNER)
    assert out["messages"][0]["role"] == "user" and out["system"] == "you are terse"
    assert out["messages"][-1] is body["messages"][-1]
    texts = json.dumps(out)
    assert "ctxproxy:" in texts


def test_a_pruned_tool_result_keeps_its_block_and_cache_marker() -> None:
    body = conversation(6, result_tokens=400)
    marked = body["messages"][2]["content"][0] = {
        **body["messages"][2]["content"][0],
        "cache_control": {"type": "ephemeral"},
    }
    policy = Policy(prune_minimum_tokens=10, prune_protect_tool_tokens=100, keep_turns=1)
    plan, out = fit(body, window_tokens=2400, policy=policy)
    assert [a.kind for a in plan.actions][:1] == ["pruned"]
    block = out["messages"][2]["content"][0]
    assert block["tool_use_id"] == marked["tool_use_id"] and block["cache_control"] == {"type": "ephemeral"}
    assert block["content"].startswith("[ctxproxy: tool result removed") and "read_file" in block["content"]
    check_structure(out, SIGNER)


def test_a_dropped_cache_marker_moves_to_the_last_kept_block_before_it() -> None:
    body = conversation(10, result_tokens=100)
    body["messages"][5] = {
        **body["messages"][5],
        "content": [{"type": "text", "text": words(5, "m"), "cache_control": {"type": "ephemeral"}}],
    }
    # a window where pruning the tool results alone is not enough: message 5 is dropped
    plan, out = fit(body, window_tokens=900, policy=Policy(pin_first_user=True))
    assert any(a.kind == "dropped_messages" for a in plan.actions)
    assert all(m is not body["messages"][5] for m in out["messages"])
    markers = [
        b
        for m in out["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if "cache_control" in b
    ]
    assert len(markers) == 1
    assert "ctxproxy:" in markers[0]["text"]  # the note that stands for the dropped span


def test_a_note_after_a_user_message_joins_it_and_roles_alternate() -> None:
    body = conversation(10)
    _, out = fit(body, window_tokens=900, policy=Policy(pin_first_user=True))  # pruning is not enough
    first = out["messages"][0]
    assert first["role"] == "user" and isinstance(first["content"], list)
    assert first["content"][0]["text"] == body["messages"][0]["content"]
    assert first["content"][1]["text"].startswith("[ctxproxy:")
    roles = [m["role"] for m in out["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles))


def test_adjacent_assistant_messages_around_an_opaque_one_get_a_separator() -> None:
    body = msgs_body(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "plain"},
            {"role": "user", "content": "r"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "text", "text": "x"},
                ],
            },
            {"role": "user", "content": "last"},
        ]
    )
    messages = list(MESSAGES.parse(body).messages)
    out = MESSAGES.render(body, messages[:2] + messages[3:])
    assert [m["role"] for m in out["messages"]] == ["user", "assistant", "user", "assistant", "user"]
    assert out["messages"][2]["content"][0]["text"] == SEPARATOR_TEXT
    assert out["messages"][3] is body["messages"][3]


def test_problems_name_the_structural_rules() -> None:
    body = msgs_body(
        [
            {"role": "assistant", "content": [tool_use("x")]},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, result("y", 1)]},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "a"},
            {"role": "system", "content": "late"},
        ]
    )
    assert MESSAGES.problems(body) == [
        "a system message does not follow a user message",
        "the first message is not a user message",
        "tool_result 'y' without its tool_use in the previous message",
        "tool_result blocks after other content in a user message",
        "tool_use 'x' has no tool_result in the next message",
        "two adjacent user messages",
    ]
    assert MESSAGES.problems(conversation(2)) == []


def test_mid_conversation_system_messages_stay_where_they_are() -> None:
    body = conversation(8)
    body["messages"].insert(5, {"role": "system", "content": "new instructions " + words(3)})
    assert MESSAGES.problems(body) == []
    plan, out = fit(body, window_tokens=1000)
    assert plan.changed
    assert body["messages"][5] in out["messages"]
    assert MESSAGES.problems(out) == []


# ---- errors, usage, counting, beta ----------------------------------------------------------


def cannot_fit(tokens: int, budget: int, window: int, reserve: int) -> ErrorInfo:
    return error_info(
        CannotFit(
            tokens=tokens, budget_tokens=budget, window_tokens=window, reserve_tokens=reserve, reason="x"
        ),
        MESSAGES,
    )


def test_cannot_fit_speaks_anthropics_wordings_with_true_numbers() -> None:
    over_window = MESSAGES.error_body(cannot_fit(250_000, 150_000, 200_000, 32_000))
    assert over_window == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 250000 tokens > 200000 maximum",
        },
    }
    over_budget = MESSAGES.error_body(cannot_fit(180_000, 158_000, 200_000, 32_000))["error"]["message"]
    assert over_budget == (
        "input length and `max_tokens` exceed context limit: 180000 + 32000 > 190000, "
        "decrease input length or `max_tokens` and try again"
    )
    found = classify_overflow(
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": over_budget}}
    )
    assert found is not None and (found.prompt_tokens, found.limit_tokens) == (180_000, 190_000)


def test_other_errors_keep_their_message_and_get_anthropics_types() -> None:
    bad = MESSAGES.error_body(
        ErrorInfo(status=400, code="invalid_request_error", message="messages: Field required")
    )
    assert bad == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages: Field required"},
    }
    assert (
        MESSAGES.error_body(ErrorInfo(status=504, code="upstream_timeout", message="t"))["error"]["type"]
        == "timeout_error"
    )
    assert (
        MESSAGES.error_body(ErrorInfo(status=502, code="upstream_error", message="t"))["error"]["type"]
        == "api_error"
    )


def test_stream_error_is_an_sse_error_event_the_classifier_reads() -> None:
    raw = MESSAGES.stream_error(cannot_fit(250_000, 150_000, 200_000, 32_000))
    assert raw.startswith(b"event: error\ndata: {") and raw.endswith(b"\n\n")
    assert json.loads(raw.split(b"data: ", 1)[1])["type"] == "error"
    found = MESSAGES.overflow(200, raw)
    assert found is not None and found.dialect == "anthropic" and found.prompt_tokens == 250_000


@pytest.mark.parametrize(
    "message",
    [
        "prompt is too long: 208164 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 188011 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again",
    ],
)
def test_upstream_overflow_wordings_are_classified(message: str) -> None:
    found = MESSAGES.overflow(
        400, {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    )
    assert found is not None and found.limit_tokens == 200_000


def test_input_tokens_used_adds_the_cache_reads_and_writes() -> None:
    usage = {
        "input_tokens": 10,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 200,
        "output_tokens": 5,
    }
    assert MESSAGES.input_tokens_used({"type": "message", "usage": usage}) == 1210
    assert MESSAGES.input_tokens_used({"type": "message_start", "message": {"usage": usage}}) == 1210
    assert MESSAGES.input_tokens_used({"type": "message_delta", "usage": usage}) == 1210
    assert MESSAGES.input_tokens_used({"type": "message_delta", "usage": {"output_tokens": 5}}) is None
    assert MESSAGES.count_answer(42) == {"input_tokens": 42}


def test_the_long_context_beta_opens_the_1m_window_for_the_models_that_have_it() -> None:
    sonnet = ModelSpec(
        name="claude-sonnet-4-5-20250929",
        window_tokens=200_000,
        max_output_tokens=64_000,
        encoding="estimate",
        matched="claude-sonnet-4-5",
    )
    haiku = ModelSpec(
        name="claude-haiku-4-5",
        window_tokens=200_000,
        max_output_tokens=64_000,
        encoding="estimate",
        matched="claude-haiku-4-5",
    )
    header = "claude-code-20250219, context-1m-2025-08-07"
    assert window_from_beta(sonnet, header) == 1_000_000
    assert window_from_beta(sonnet, "claude-code-20250219") is None
    assert window_from_beta(sonnet, None) is None
    assert window_from_beta(haiku, header) is None


# ---- properties through the real pipeline ---------------------------------------------------

PROPERTIES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def anthropic_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """A valid Messages body: turns of user text (images, cache markers, a late system message),
    tool loops with signed thinking (parallel calls), and maybe an unfinished loop at the end."""
    thinking = draw(st.booleans())
    wire: list[dict[str, Any]] = []
    calls = markers = 0
    turns = draw(st.integers(1, 6))
    for k in range(turns):
        content: list[dict[str, Any]] = [{"type": "text", "text": words(draw(st.integers(1, 80)), f"u{k}_")}]
        if draw(st.integers(0, 5)) == 0:
            content.append(
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_DATA}}
            )
        if markers < 4 and draw(st.integers(0, 4)) == 0:
            markers += 1
            content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
        wire.append({"role": "user", "content": content})
        if draw(st.integers(0, 6)) == 0:
            wire.append({"role": "system", "content": words(draw(st.integers(1, 10)), f"s{k}_")})
        last = k == turns - 1
        for r in range(draw(st.integers(0, 4))):
            ids = [f"toolu_{calls + j}" for j in range(draw(st.integers(1, 3)))]
            calls += len(ids)
            blocks: list[dict[str, Any]] = []
            if thinking:
                blocks.append(signed(f"think {k} {r}", wire))
            blocks.append({"type": "text", "text": words(draw(st.integers(0, 20)), f"a{k}_{r}_")})
            blocks += [tool_use(i) for i in ids]
            wire.append({"role": "assistant", "content": blocks})
            results = [result(i, draw(st.integers(0, 150))) for i in ids]
            wire.append({"role": "user", "content": results})
        if not last or draw(st.booleans()):
            final = [signed(f"final {k}", wire)] if thinking else []
            final.append({"type": "text", "text": words(draw(st.integers(1, 60)), f"f{k}_")})
            wire.append({"role": "assistant", "content": final})
            if last:
                wire.append({"role": "user", "content": words(draw(st.integers(1, 20)), f"n{k}_")})
    extra: dict[str, Any] = {"system": words(draw(st.integers(0, 30)), "sys")}
    if thinking:
        extra["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    return msgs_body(wire, **extra)


def _loop_thinking_span(messages: list[dict[str, Any]]) -> tuple[int, int] | None:
    """Indices of the earliest and the newest thinking-bearing assistant message of the current
    tool loop, or None when it has none."""
    found = [
        i
        for i in range(loop_start(messages), len(messages))
        if messages[i]["role"] == "assistant"
        and isinstance(messages[i]["content"], list)
        and messages[i]["content"][0]["type"] == "thinking"
    ]
    return (found[0], found[-1]) if found else None


@PROPERTIES
@given(body=anthropic_bodies(), window=st.integers(300, 6000), keep_turns=st.integers(1, 3))
def test_fitting_keeps_every_rule_of_the_strict_upstream(
    body: dict[str, Any], window: int, keep_turns: int
) -> None:
    check_structure(body, SIGNER)  # the generator makes valid bodies
    before = copy.deepcopy(body)
    plan, out = fit(body, window_tokens=window, policy=Policy(keep_turns=keep_turns))
    assert body == before
    if not plan.changed:
        assert out is body
        return
    assert MESSAGES.problems(out) == []
    try:
        check_structure(out, SIGNER)
    except Refused as refused:  # pragma: no cover - the message is the point
        raise AssertionError(refused.message) from None
    kept_thinking = [
        b
        for m in out["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "thinking"
    ]
    originals = {id(b) for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]}
    assert all(id(b) in originals for b in kept_thinking)  # never edited, never rebuilt
    span = _loop_thinking_span(out["messages"])
    if span is not None:  # from the earliest to the newest kept thinking message of the loop
        first, last = span
        n = len(out["messages"]) - first
        kept = body["messages"][-n:][: last - first + 1]
        assert all(a is b for a, b in zip(out["messages"][first : last + 1], kept, strict=True))
    if plan.fits:
        again, _ = fit(out, window_tokens=window, policy=Policy(keep_turns=keep_turns))
        assert not again.changed  # idempotent: the fitted body fits as it is


@PROPERTIES
@given(body=anthropic_bodies())
def test_a_body_that_fits_is_left_unchanged(body: dict[str, Any]) -> None:
    plan, out = fit(body, window_tokens=1_000_000)
    assert not plan.changed and out is body
    assert MESSAGES.render(body, MESSAGES.parse(body).messages) == body


@PROPERTIES
@given(body=anthropic_bodies(), window=st.integers(2000, 6000))
def test_fits_when_the_newest_turn_alone_fits(body: dict[str, Any], window: int) -> None:
    messages = body["messages"]
    newest = MESSAGES.parse({**body, "messages": messages[loop_start(messages) - 1 :]})
    counter = FakeMessageCounter()
    small = sum(counter.count_messages(newest.messages)) * 2 + 200
    plan, _ = fit(body, window_tokens=max(window, small + 100 + 500))
    assert plan.fits


json_leaf = st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=20)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
block_types = st.sampled_from(
    [
        "text",
        "image",
        "document",
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "search_result",
        "x",
    ]
)
blocks = st.fixed_dictionaries(
    {"type": block_types},
    optional={
        "text": st.text(max_size=200) | json_any,
        "id": st.sampled_from(["t1", "t2"]) | json_any,
        "name": st.text(max_size=5) | json_any,
        "input": json_any,
        "tool_use_id": st.sampled_from(["t1", "t2", "t3"]) | json_any,
        "content": st.text(max_size=200) | st.lists(json_any, max_size=3) | json_any,
        "source": st.fixed_dictionaries(
            {"type": st.sampled_from(["base64", "url", "file", "text", "content"])},
            optional={
                "media_type": st.sampled_from(["image/png", "application/pdf"]) | json_any,
                "data": st.text(max_size=40) | json_any,
            },
        )
        | json_any,
        "thinking": st.text(max_size=20) | json_any,
        "signature": st.text(max_size=20),
        "data": st.text(max_size=40) | json_any,
        "cache_control": st.just({"type": "ephemeral"}),
    },
)
fuzz_messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "tool", ""]),
            "content": st.text(max_size=300) | st.lists(blocks, max_size=4) | json_any,
        },
    ),
    max_size=8,
)
fuzz_bodies = st.fixed_dictionaries(
    {"model": st.just("claude-test"), "max_tokens": st.integers(1, 500), "messages": fuzz_messages},
    optional={
        "system": st.text(max_size=100) | st.lists(blocks, max_size=2) | json_any,
        "tools": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=5)}, optional={"input_schema": json_any}),
            max_size=2,
        )
        | json_any,
    },
) | st.fixed_dictionaries({}, optional={"model": json_any, "max_tokens": json_any, "messages": json_any})


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(body=fuzz_bodies, window=st.integers(50, 3000))
def test_any_body_is_planned_or_refused_as_an_invalid_request(body: dict[str, Any], window: int) -> None:
    """No input makes the dialect or the pipeline fail otherwise (the route answers 400, not 500)."""
    try:
        plan, out = fit(body, window_tokens=window)
    except InvalidRequest as error:
        assert error.message
        return
    assert isinstance(MESSAGES.problems(out), list)
    new = set(MESSAGES.problems(out)) - set(MESSAGES.problems(body))
    assert not new, (new, plan.actions)


def test_the_count_request_drops_what_count_tokens_refuses() -> None:
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32_000,
        "stream": True,
        "metadata": {"user_id": "u"},
        "system": "Be careful.",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "thinking": {"type": "enabled", "budget_tokens": 2_000},
        "temperature": 1,
    }
    call = MESSAGES.count_request(body, "/v1/whatever")
    assert call is not None
    target, counted = call
    assert target == UpstreamTarget("messages/count_tokens")  # under the base URL, whatever the path
    assert counted == {k: body[k] for k in ("model", "system", "messages", "tools", "thinking")}


def test_lowering_max_tokens_lowers_a_thinking_budget_that_would_reach_it() -> None:
    body = {
        "model": "m",
        "max_tokens": 32_000,
        "messages": [],
        "thinking": {"type": "enabled", "budget_tokens": 31_999},
    }
    capped = MESSAGES.with_output_cap(body, 20_000)
    assert capped is not None
    assert capped["max_tokens"] == 20_000 and capped["thinking"] == {
        "type": "enabled",
        "budget_tokens": 19_999,
    }
    assert body["thinking"]["budget_tokens"] == 31_999
    small = {**body, "thinking": {"type": "enabled", "budget_tokens": 4_000}}
    assert MESSAGES.with_output_cap(small, 20_000) == {**small, "max_tokens": 20_000}
    # Below the smallest thinking budget the API takes, the cap cannot be lowered that far.
    assert MESSAGES.with_output_cap(body, 1_000) is None
    adaptive = {**body, "thinking": {"type": "adaptive"}}
    assert MESSAGES.with_output_cap(adaptive, 1_000) == {**adaptive, "max_tokens": 1_000}
    assert MESSAGES.with_output_cap({**body, "max_tokens": 500}, 1_000) == {**body, "max_tokens": 500}


def test_a_summary_is_asked_with_messages_its_key_and_its_version() -> None:
    prompt = [
        {"role": "system", "content": "You write handoff summaries"},
        {"role": "user", "content": "Summarize."},
    ]
    call = MESSAGES.summary_request(prompt, model="claude-x", max_tokens=300)
    assert call.path == "messages"
    assert call.body == {
        "model": "claude-x",
        "max_tokens": 300,
        "system": "You write handoff summaries",
        "messages": [{"role": "user", "content": "Summarize."}],
        "stream": False,
    }
    assert set(call.carry) == {"x-api-key", "authorization", "anthropic-version"}
    assert call.defaults == (("anthropic-version", "2023-06-01"),)
    answer = {"content": [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "- gist"}]}
    assert MESSAGES.summary_text(answer) == "- gist"
    assert MESSAGES.summary_text({"content": [{"type": "tool_use"}]}) is None
    assert MESSAGES.summary_text({"type": "error"}) is None
