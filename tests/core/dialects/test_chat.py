"""The chat dialect is the identity: parse keeps the message objects, render replaces only
``messages``, errors and mid-stream errors are OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.dialect import ErrorInfo, error_info
from app.core.dialects import CHAT, DIALECTS
from app.core.errors import CannotFit, InvalidRequest
from tests.core.fakes import FakeMessageCounter, chat, tool_exchange, user


def test_the_registry_names_each_dialect_by_its_own_name() -> None:
    assert DIALECTS["chat"] is CHAT
    assert all(name == dialect.name for name, dialect in DIALECTS.items())


def test_parse_keeps_the_same_message_objects_and_the_request_figures() -> None:
    messages = chat(3)
    body = {"model": "m", "messages": messages, "max_completion_tokens": 77, "stream": True}
    conversation = CHAT.parse(body)
    assert conversation.model == "m" and conversation.stream and conversation.fittable
    assert conversation.requested_output_tokens == 77
    assert all(a is b for a, b in zip(conversation.messages, messages, strict=True))


def test_parse_refuses_what_planning_cannot_use() -> None:
    with pytest.raises(InvalidRequest) as caught:
        CHAT.parse({"model": "m", "messages": "hi"})
    assert caught.value.param == "messages"
    with pytest.raises(InvalidRequest):
        CHAT.parse({"model": "m", "messages": [{"role": "wizard", "content": "x"}]})


def test_render_replaces_only_the_messages() -> None:
    body: dict[str, Any] = {"model": "m", "messages": chat(2), "temperature": 0.2, "unknown": {"k": 1}}
    rendered = CHAT.render(body, [user(1)])
    assert rendered == {**body, "messages": [user(1)]}
    assert rendered["unknown"] is body["unknown"] and len(body["messages"]) == 4


def test_tools_are_counted_by_the_chat_accounting() -> None:
    counter = FakeMessageCounter()
    body = {"messages": chat(1), "tools": [{"type": "function", "function": {"name": "f"}}]}
    assert CHAT.tool_tokens(body, counter) == counter.count_tools(body) > 0
    assert CHAT.tool_tokens({"messages": chat(1)}, counter) == 0


def test_problems_are_position_free() -> None:
    calls = tool_exchange(["a", "b"], 3)
    orphan = [user(1), *calls[:2]]  # the call and one result: "b" is unanswered
    problems = CHAT.problems({"messages": orphan})
    assert problems and not any(" at " in p for p in problems)
    assert CHAT.problems({"messages": [user(1), *calls]}) == []


def test_our_errors_in_openai_shape() -> None:
    fit = CHAT.error_body(
        error_info(
            CannotFit(tokens=900, budget_tokens=500, window_tokens=800, reserve_tokens=100, reason="r"),
            CHAT,
        )
    )
    assert fit["error"]["type"] == "invalid_request_error"
    assert fit["error"]["code"] == "context_length_exceeded" and fit["error"]["param"] == "messages"
    bad = CHAT.error_body(error_info(InvalidRequest("nope", param="model"), CHAT))
    assert bad == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "model", "code": None}
    }
    for status, kind in ((502, "upstream_error"), (504, "upstream_error"), (503, "server_error")):
        shaped = CHAT.error_body(ErrorInfo(status=status, code="upstream_x", message="m"))
        assert shaped["error"]["type"] == kind and shaped["error"]["code"] == "upstream_x"
    too_large = CHAT.error_body(ErrorInfo(status=413, code="request_too_large", message="big"))
    assert too_large["error"]["type"] == "invalid_request_error"


def test_the_mid_stream_error_is_one_data_event() -> None:
    event = CHAT.stream_error(ErrorInfo(status=504, code="upstream_timeout", message="slow é"))
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n\n") == 1
    assert json.loads(event[len(b"data: ") :]) == {
        "error": {"message": "slow é", "type": "upstream_error", "param": None, "code": "upstream_timeout"}
    }


def test_overflow_and_usage() -> None:
    body = {
        "error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}
    }
    assert CHAT.overflow(400, body) is not None
    assert CHAT.overflow(429, body) is None
    assert CHAT.input_tokens_used({"usage": {"prompt_tokens": 12, "completion_tokens": 3}}) == 12
    assert CHAT.input_tokens_used({"usage": {"prompt_tokens": True}}) is None
    assert CHAT.input_tokens_used({"choices": []}) is None
    assert CHAT.count_answer(5)["input_tokens"] == 5


def test_chat_has_no_counting_endpoint_and_lowers_every_output_cap_it_sets() -> None:
    body = {"model": "m", "messages": [], "max_tokens": 5_000, "max_completion_tokens": 6_000, "n": 1}
    assert CHAT.count_request(body, "/v1/chat/completions") is None
    capped = CHAT.with_output_cap(body, 1_000)
    assert capped == {**body, "max_tokens": 1_000, "max_completion_tokens": 1_000}
    assert body["max_tokens"] == 5_000  # the input is never mutated
    assert CHAT.with_output_cap({"model": "m", "max_tokens": 500}, 1_000) == {"model": "m", "max_tokens": 500}
    assert CHAT.with_output_cap({"model": "m"}, 1_000) == {"model": "m"}


PROMPT = [
    {"role": "system", "content": "You write handoff summaries"},
    {"role": "user", "content": "Summarize."},
]


def test_a_summary_is_asked_as_a_non_streaming_chat_completion() -> None:
    call = CHAT.summary_request(PROMPT, model="m", max_tokens=300)
    assert call.path == "chat/completions"
    assert call.body == {"model": "m", "messages": PROMPT, "max_tokens": 300, "stream": False}
    assert call.body["messages"][0] is not PROMPT[0]  # its own copy
    assert "authorization" in call.carry and call.defaults == ()
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "- gist"}}]}
    assert CHAT.summary_text(answer) == "- gist"
    for broken in ({}, {"choices": []}, {"choices": [{"message": {"content": None}}]}, {"choices": "x"}):
        assert CHAT.summary_text(broken) is None
