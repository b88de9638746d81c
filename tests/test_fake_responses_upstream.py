"""The strict fake Responses upstream holds the rules it exists to enforce (through its httpx handler)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.core.dialects.responses import RESPONSES
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel

MODEL = FakeModel("resp-small", 600)


@pytest.fixture
def fake() -> FakeResponsesUpstream:
    return FakeResponsesUpstream([MODEL])


def post(fake: FakeResponsesUpstream, body: Any, path: str = "/v1/responses") -> httpx.Response:
    with httpx.Client(transport=httpx.MockTransport(fake.handler), base_url="http://fake") as client:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return client.post(path, content=raw, headers={"content-type": "application/json"})


def test_a_plain_request_gets_a_response_with_usage(fake: FakeResponsesUpstream) -> None:
    answer = post(fake, {"model": MODEL.name, "input": "hello"})
    assert answer.status_code == 200
    data = answer.json()
    assert data["object"] == "response" and data["output"][0]["content"][0]["type"] == "output_text"
    assert data["usage"]["input_tokens"] == fake.responses()[0].prompt_tokens > 0


def test_over_the_window_is_openais_context_length_error(fake: FakeResponsesUpstream) -> None:
    answer = post(fake, {"model": MODEL.name, "input": "word " * 700})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert RESPONSES.overflow(400, answer.content) is not None
    near = post(fake, {"model": MODEL.name, "input": "word " * 500, "max_output_tokens": 200})
    assert near.status_code == 400  # prompt plus requested output over the window


def test_an_overflow_in_a_stream_is_a_failed_event(fake: FakeResponsesUpstream) -> None:
    fake.overflow_in_stream = True
    answer = post(fake, {"model": MODEL.name, "input": "word " * 700, "stream": True})
    assert answer.status_code == 200 and "event: response.failed" in answer.text
    assert RESPONSES.overflow(200, answer.content) is not None


def test_pairing_is_enforced_both_ways(fake: FakeResponsesUpstream) -> None:
    orphan = post(
        fake,
        {"model": MODEL.name, "input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]},
    )
    assert orphan.status_code == 400 and "No tool call found" in orphan.json()["error"]["message"]
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    lonely = post(fake, {"model": MODEL.name, "input": [{"role": "user", "content": "q"}, call]})
    assert lonely.status_code == 400 and "No tool output found" in lonely.json()["error"]["message"]


def test_reasoning_is_sealed_and_must_lead_to_an_item(fake: FakeResponsesUpstream) -> None:
    fake.responder = lambda body: [{"reasoning": "think"}, {"text": "answer"}]
    first = post(fake, {"model": MODEL.name, "input": "q", "store": False})
    reasoning, message = first.json()["output"]
    follow_up = [{"role": "user", "content": "q"}, reasoning, message, {"role": "user", "content": "again"}]
    assert post(fake, {"model": MODEL.name, "input": follow_up}).status_code == 200
    edited = {**reasoning, "summary": [{"type": "summary_text", "text": "other"}]}
    refused = post(fake, {"model": MODEL.name, "input": [follow_up[0], edited, message]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_encrypted_content"
    trailing = post(fake, {"model": MODEL.name, "input": [follow_up[0], reasoning]})
    assert trailing.status_code == 400 and "without its required following item" in trailing.text


def test_scripted_tool_calls_and_the_event_stream(fake: FakeResponsesUpstream) -> None:
    fake.responder = lambda body: [{"call": "exec_command", "arguments": '{"cmd":"cat a.txt"}'}]
    answer = post(fake, {"model": MODEL.name, "input": "run it", "stream": True})
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "function_call" and item["name"] == "exec_command"
    assert RESPONSES.input_tokens_used(events[-1]) == events[-1]["response"]["usage"]["input_tokens"]


def test_previous_response_id_counts_the_stored_history(fake: FakeResponsesUpstream) -> None:
    first = post(fake, {"model": MODEL.name, "input": "word " * 300}).json()
    second = post(fake, {"model": MODEL.name, "input": "word " * 300, "previous_response_id": first["id"]})
    assert second.status_code == 400 and second.json()["error"]["code"] == "context_length_exceeded"
    unknown = post(fake, {"model": MODEL.name, "input": "hi", "previous_response_id": "resp_nope"})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "previous_response_id"


def test_input_tokens_endpoint_and_bad_bodies(fake: FakeResponsesUpstream) -> None:
    counted = post(fake, {"model": MODEL.name, "input": "hello"}, "/v1/responses/input_tokens").json()
    assert counted["object"] == "response.input_tokens" and counted["input_tokens"] > 0
    assert post(fake, b"{not json").status_code == 400
    assert post(fake, {"model": MODEL.name, "input": 3}).json()["error"]["param"] == "input"
    assert post(fake, {"model": "nope", "input": "x"}).status_code == 404


def test_a_compaction_trigger_is_answered_with_one_sealed_compaction_item(
    fake: FakeResponsesUpstream,
) -> None:
    answer = post(
        fake,
        {"model": MODEL.name, "input": [{"role": "user", "content": "q"}, {"type": "compaction_trigger"}]},
    )
    (item,) = answer.json()["output"]
    assert item["type"] == "compaction" and fake.compactions == 1
    again = post(fake, {"model": MODEL.name, "input": [item, {"role": "user", "content": "next"}]})
    assert again.status_code == 200  # the sealed item is accepted back
