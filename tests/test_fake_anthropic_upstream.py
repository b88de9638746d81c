"""The strict fake Anthropic upstream refuses what the real API (and our stricter promise) refuses."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude, Refused, check_structure, loop_results

MODELS = [FakeClaude("claude-small", window_tokens=400, loop_calls=2), FakeClaude("claude-big")]


@pytest.fixture
def fake() -> FakeAnthropic:
    return FakeAnthropic(MODELS)


def post(fake: FakeAnthropic, body: dict[str, Any], path: str = "/v1/messages") -> httpx.Response:
    transport = httpx.MockTransport(fake.handler)
    with httpx.Client(transport=transport, base_url="http://fake.invalid") as client:
        return client.post(path, json=body)


def tool_body(fake: FakeAnthropic, rounds: int) -> dict[str, Any]:
    """A tool loop with signed thinking, run against the fake itself for ``rounds`` calls."""
    body: dict[str, Any] = {
        "model": "claude-big",
        "max_tokens": 50,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [{"name": "read_file", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": "read the files FACT-start"}],
    }
    for step in range(rounds):
        reply = fake._message(fake.model("claude-big"), body, 10)
        call = next(b for b in reply["content"] if b["type"] == "tool_use")
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": f"content of file {step}"}
        body["messages"] += [
            {"role": "assistant", "content": reply["content"]},
            {"role": "user", "content": [result]},
        ]
    return body


def test_a_genuine_tool_loop_passes(fake: FakeAnthropic) -> None:
    fake = FakeAnthropic([FakeClaude("claude-big", loop_calls=5)], signer=fake.signer)
    body = tool_body(fake, 3)
    check_structure(body, fake.signer)
    answer = post(fake, body)
    assert answer.status_code == 200
    assert answer.json()["content"][0]["type"] == "thinking"


def test_an_edited_thinking_block_is_refused(fake: FakeAnthropic) -> None:
    fake = FakeAnthropic([FakeClaude("claude-big", loop_calls=5)], signer=fake.signer)
    body = tool_body(fake, 2)
    thinking = body["messages"][1]["content"][0]
    body["messages"][1]["content"][0] = {**thinking, "thinking": thinking["thinking"] + " edited"}
    with pytest.raises(Refused, match="Invalid `signature`"):
        check_structure(body, fake.signer)


def test_an_edited_result_before_a_kept_thinking_block_is_refused_but_a_dropped_unit_is_not() -> None:
    fake = FakeAnthropic([FakeClaude("claude-big", loop_calls=5)])
    body = tool_body(fake, 3)
    messages = body["messages"]
    edited = json.loads(json.dumps(body))
    edited["messages"][2]["content"][0]["content"] = "[pruned]"
    with pytest.raises(Refused, match="was changed"):
        check_structure(edited, fake.signer)
    # the oldest unit (call + result) dropped whole: the later thinking blocks stay valid
    dropped = {**body, "messages": [messages[0], *messages[3:]]}
    check_structure(dropped, fake.signer)
    assert (
        loop_results(dropped["messages"], len(dropped["messages"])).keys()
        < loop_results(messages, len(messages)).keys()
    )


def test_a_final_assistant_message_must_start_with_thinking_when_enabled(fake: FakeAnthropic) -> None:
    fake = FakeAnthropic([FakeClaude("claude-big", loop_calls=5)], signer=fake.signer)
    body = tool_body(fake, 1)
    body["messages"][1]["content"] = body["messages"][1]["content"][1:]
    with pytest.raises(Refused, match="must start with a thinking block"):
        check_structure(body, fake.signer)


@pytest.mark.parametrize(
    ("messages", "wording"),
    [
        ([{"role": "assistant", "content": "hi"}], 'first message must use the "user" role'),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "roles must alternate"),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {"role": "user", "content": "b"},
            ],
            "without `tool_result` blocks immediately after: t",
        ),
        (
            [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}],
            "unexpected `tool_use_id` found in `tool_result` blocks: x",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "system", "content": "s"},
            ],
            "must immediately follow a user message",
        ),
    ],
)
def test_structural_rules_are_refused_with_anthropics_wording(
    fake: FakeAnthropic, messages: list[dict[str, Any]], wording: str
) -> None:
    answer = post(fake, {"model": "claude-big", "max_tokens": 5, "messages": messages})
    assert answer.status_code == 400
    assert answer.json()["type"] == "error" and wording in answer.json()["error"]["message"]


def test_the_window_is_enforced_with_both_anthropic_wordings(fake: FakeAnthropic) -> None:
    big = {"model": "claude-small", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 600}]}
    message = post(fake, big).json()["error"]["message"]
    assert message.startswith("prompt is too long: ") and message.endswith(" tokens > 400 maximum")
    small = {**big, "max_tokens": 300, "messages": [{"role": "user", "content": "word " * 200}]}
    message = post(fake, small).json()["error"]["message"]
    assert "input length and `max_tokens` exceed context limit: " in message and "+ 300 > 400" in message
    count = post(fake, big, "/v1/messages/count_tokens").json()
    assert count["input_tokens"] > 400


def test_streams_real_sse_events(fake: FakeAnthropic) -> None:
    body = {
        "model": "claude-big",
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "FACT-7 hi"}],
    }
    answer = post(fake, body)
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [line[7:] for line in answer.text.splitlines() if line.startswith("event: ")]
    assert events == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert "FACT-7" in answer.text
    assert fake.message_requests()[0].json() == body
