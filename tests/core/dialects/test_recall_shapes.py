"""Each API's recall shape: the tool's offer and bytes, a whole answer's calls and the client's
answer, and the stream editors on the strict fakes' own event streams (a recall call among the
client's own, fed in one piece and byte by byte, and a continuation round)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from app.core.dialects import DIALECTS
from app.core.dialects.gemini_recall import GEMINI_RECALL
from app.core.recall import RECALL_TOOL
from app.core.recall_shape import RecallShape
from app.core.recall_stream import frame_json
from tests.fake_anthropic_upstream import sse_events
from tests.fake_gemini_upstream import sse_frames
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, _sse_events


def shape(name: str) -> RecallShape:
    found = DIALECTS[name].recall
    assert found is not None
    return found


BODIES: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}],
    },
    "responses": {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "read"}]},
    "messages": {
        "model": "m",
        "max_tokens": 9,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "read", "input_schema": {"type": "object"}}],
    },
    "gemini": {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "tools": [{"functionDeclarations": [{"name": "read"}]}],
    },
}
FORCED: dict[str, list[dict[str, Any]]] = {
    "chat": [{"tool_choice": "required"}, {"tool_choice": "none"}, {"n": 2},
             {"tool_choice": {"type": "function", "function": {"name": "read"}}}],
    "responses": [{"tool_choice": "required"}, {"tool_choice": {"type": "function", "name": "read"}},
                  {"background": True}, {"stream": True}],
    "messages": [{"tool_choice": {"type": "any"}}, {"tool_choice": {"type": "tool", "name": "read"}},
                 {"tool_choice": {"type": "none"}}],
    "gemini": [{"toolConfig": {"functionCallingConfig": {"mode": "ANY"}}},
               {"toolConfig": {"functionCallingConfig": {"mode": "AUTO", "allowedFunctionNames": ["read"]}}},
               {"generationConfig": {"candidateCount": 2}},
               {"generationConfig": {"responseMimeType": "application/json"}},
               {"tools": [{"googleSearch": {}}]}],
}  # fmt: skip


def _names(name: str, body: Mapping[str, Any]) -> list[str]:
    out = []
    for tool in body.get("tools") or []:
        if name == "chat":
            out.append(tool["function"]["name"])
        elif name == "gemini":
            out += [d["name"] for d in tool.get("functionDeclarations") or []] or ["(other)"]
        else:
            out.append(tool["name"])
    return out


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_tool_goes_after_the_clients_with_the_same_bytes_and_only_when_allowed(name: str) -> None:
    recall, body = shape(name), BODIES[name]
    assert recall.offered(body)
    offered = recall.with_tool(body)
    assert _names(name, offered) == [*_names(name, body), RECALL_TOOL]
    assert recall.with_tool(offered) == offered  # once
    assert json.dumps(recall.with_tool(body)) == json.dumps(offered)  # the same bytes every time
    assert not recall.offered(offered)  # a body that already has a ctx_recall is the client's
    for extra in FORCED[name]:
        assert not recall.offered({**body, **extra}), extra


# -- streams of the fakes ---------------------------------------------------------------------


def _chat_stream(reply: dict[str, Any]) -> bytes:
    async def collect() -> bytes:
        usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
        return b"".join([c async for c in _sse_events("chatcmpl-x", "m", reply, usage)])

    return asyncio.run(collect())


def _call(name: str, call_id: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def _anthropic_stream(content: list[dict[str, Any]], stop: str) -> bytes:
    usage = {"input_tokens": 5, "output_tokens": 1}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": content,
               "stop_reason": stop, "stop_sequence": None, "usage": usage}  # fmt: skip
    return b"".join(sse_events(message))


def _responses_stream(specs: list[dict[str, Any]]) -> bytes:
    fake = FakeResponsesUpstream([FakeModel("m", 10_000)])
    fake.responder = lambda body: specs
    answer = fake.answer(
        "POST", "/v1/responses", {}, json.dumps({"model": "m", "input": "hi", "stream": True}).encode()
    )
    return answer.body


def _gemini_stream(parts: list[dict[str, Any]]) -> bytes:
    chunks = []
    for n, part in enumerate(parts):
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        if n == len(parts) - 1:
            candidate["finishReason"] = "STOP"
        chunks.append({"candidates": [candidate], "usageMetadata": {"promptTokenCount": 5}})
    return b"".join(sse_frames(chunks))


def _events(data: bytes) -> list[dict[str, Any]]:
    frames = [f + b"\n\n" for f in data.replace(b"\r\n", b"\n").split(b"\n\n") if f.strip()]
    return [e for e in (frame_json(f) for f in frames) if e is not None]


def _run(name: str, rounds: list[bytes], *, byte_by_byte: bool = False) -> tuple[bytes, list[dict[str, Any]]]:
    """Feed ``rounds`` (the upstream answers) through a fresh editor; the client's bytes and each
    round's assembled answer."""
    editor = shape(name).stream()
    out = b""
    answers = []
    for k, data in enumerate(rounds):
        if k:
            editor.next_round()
        pieces = [data[i : i + 1] for i in range(len(data))] if byte_by_byte else [data]
        for piece in pieces:
            out += editor.feed(piece)
        answers.append(editor.answer())
    return out + editor.release() + editor.unfinished(), answers


@pytest.mark.parametrize("byte_by_byte", [False, True])
def test_chat_stream_a_mixed_answer_keeps_the_clients_call_renumbered(byte_by_byte: bool) -> None:
    reply = {"role": "assistant", "content": "Looking.", "tool_calls": [
        _call(RECALL_TOOL, "call_r", {"id": "0123456789ab"}), _call("read", "call_c", {"n": 1})]}  # fmt: skip
    out, (answer,) = _run("chat", [_chat_stream(reply)], byte_by_byte=byte_by_byte)
    events = _events(out)
    calls = [c for e in events for ch in e.get("choices") or [] for c in ch["delta"].get("tool_calls") or []]
    assert {c["index"] for c in calls} == {0} and calls[0]["function"]["name"] == "read"
    assert [ch["finish_reason"] for e in events for ch in e.get("choices") or [] if ch["finish_reason"]] == [
        "tool_calls"
    ]
    assert b"[DONE]" in out and RECALL_TOOL.encode() not in out
    assert shape("chat").calls(answer).theirs == 1 and len(shape("chat").calls(answer).ours) == 1


def test_chat_stream_a_continuation_reads_as_one_answer() -> None:
    first = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [_call(RECALL_TOOL, "r", {"id": "x"})],
    }
    second = {"role": "assistant", "content": "It is 42."}
    out, answers = _run("chat", [_chat_stream(first), _chat_stream(second)])
    events = _events(out)
    text = "".join(ch["delta"].get("content") or "" for e in events for ch in e.get("choices") or [])
    assert text.split() == ["Let", "me", "look.", "It", "is", "42."]
    assert [ch["finish_reason"] for e in events for ch in e.get("choices") or [] if ch["finish_reason"]] == [
        "stop"
    ]
    assert sum(1 for e in events for ch in e.get("choices") or [] if "role" in ch["delta"]) == 1
    assert out.count(b"[DONE]") == 1 and RECALL_TOOL.encode() not in out
    assert shape("chat").calls(answers[0]).only_ours


@pytest.mark.parametrize("byte_by_byte", [False, True])
def test_anthropic_stream_renumbers_blocks_across_a_removed_call_and_rounds(byte_by_byte: bool) -> None:
    first = _anthropic_stream(
        [{"type": "thinking", "thinking": "hmm", "signature": "sig1"}, {"type": "text", "text": "Looking."},
         {"type": "tool_use", "id": "toolu_r", "name": RECALL_TOOL, "input": {"id": "0123456789ab"}}],
        "tool_use",
    )  # fmt: skip
    second = _anthropic_stream(
        [{"type": "thinking", "thinking": "ok", "signature": "sig2"}, {"type": "text", "text": "It is 42."},
         {"type": "tool_use", "id": "toolu_c", "name": "read", "input": {"n": 1}}],
        "tool_use",
    )  # fmt: skip
    out, answers = _run("messages", [first, second], byte_by_byte=byte_by_byte)
    events = _events(out)
    starts = [(e["index"], e["content_block"]["type"]) for e in events if e["type"] == "content_block_start"]
    assert starts == [(0, "thinking"), (1, "text"), (2, "thinking"), (3, "text"), (4, "tool_use")]
    assert [e["type"] for e in events].count("message_start") == 1
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["tool_use"]
    assert RECALL_TOOL.encode() not in out
    assert answers[0]["content"][0] == {"type": "thinking", "thinking": "hmm", "signature": "sig1"}
    assert shape("messages").calls(answers[0]).only_ours


def test_anthropic_stream_ending_with_only_a_recall_call_ends_the_turn() -> None:
    only = _anthropic_stream(
        [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "r", "name": RECALL_TOOL, "input": {}},
        ],
        "tool_use",
    )
    out, _ = _run("messages", [only])
    events = _events(out)
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == ["end_turn"]
    assert events[-1]["type"] == "message_stop"


@pytest.mark.parametrize("byte_by_byte", [False, True])
def test_responses_stream_withholds_the_call_and_the_reasoning_that_led_to_it(byte_by_byte: bool) -> None:
    first = _responses_stream(
        [{"reasoning": "need it"}, {"call": RECALL_TOOL, "arguments": '{"id": "0123456789ab"}'}]
    )
    second = _responses_stream([{"reasoning": "have it"}, {"text": "It is 42."}])
    out, answers = _run("responses", [first, second], byte_by_byte=byte_by_byte)
    events = _events(out)
    added = [
        (e["output_index"], e["item"]["type"]) for e in events if e["type"] == "response.output_item.added"
    ]
    assert added == [(0, "reasoning"), (1, "message")]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    (completed,) = [e for e in events if e["type"] == "response.completed"]
    assert [i["type"] for i in completed["response"]["output"]] == ["reasoning", "message"]
    assert completed["response"]["id"] == answers[0]["id"]
    assert [e["type"] for e in events].count("response.created") == 1
    assert RECALL_TOOL.encode() not in out


def test_gemini_a_removed_call_hands_its_signature_to_the_next_call() -> None:
    answer = {"candidates": [{"content": {"role": "model", "parts": [
        {"text": "Looking."},
        {"functionCall": {"name": RECALL_TOOL, "args": {"id": "x"}}, "thoughtSignature": "c2lnMQ=="},
        {"functionCall": {"name": "read", "args": {"n": 1}}}]}, "finishReason": "STOP"}]}  # fmt: skip
    calls = GEMINI_RECALL.calls(answer)
    assert len(calls.ours) == 1 and calls.theirs == 1
    parts = GEMINI_RECALL.client_answer([answer])["candidates"][0]["content"]["parts"]
    assert parts == [
        {"text": "Looking."},
        {"functionCall": {"name": "read", "args": {"n": 1}}, "thoughtSignature": "c2lnMQ=="},
    ]


@pytest.mark.parametrize("byte_by_byte", [False, True])
def test_gemini_stream_moves_the_signature_and_holds_the_finish_for_a_continuation(
    byte_by_byte: bool,
) -> None:
    first = _gemini_stream(
        [
            {"text": "Looking."},
            {"functionCall": {"name": RECALL_TOOL, "args": {"id": "x"}}, "thoughtSignature": "c2ln"},
        ]
    )
    second = _gemini_stream([{"text": "It is 42.", "thoughtSignature": "c2lnMg=="}])
    out, answers = _run("gemini", [first, second], byte_by_byte=byte_by_byte)
    events = _events(out)
    parts = [p for e in events for p in e["candidates"][0]["content"]["parts"]]
    assert [p.get("text") for p in parts] == ["Looking.", "It is 42."]
    assert [
        e["candidates"][0].get("finishReason") for e in events if e["candidates"][0].get("finishReason")
    ] == ["STOP"]
    assert answers[0]["candidates"][0]["content"]["parts"][1]["thoughtSignature"] == "c2ln"
    assert RECALL_TOOL.encode() not in out
    mixed = _gemini_stream(
        [{"functionCall": {"name": RECALL_TOOL, "args": {"id": "x"}}, "thoughtSignature": "c2ln"},
         {"functionCall": {"name": "read", "args": {}}}]
    )  # fmt: skip
    out, _ = _run("gemini", [mixed], byte_by_byte=byte_by_byte)
    (part,) = [p for e in _events(out) for p in e["candidates"][0]["content"]["parts"]]
    assert part == {"functionCall": {"name": "read", "args": {}}, "thoughtSignature": "c2ln"}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_an_answer_that_never_calls_the_tool_passes_byte_for_byte(name: str) -> None:
    streams = {
        "chat": _chat_stream({"role": "assistant", "content": "No recall here."}),
        "messages": _anthropic_stream([{"type": "text", "text": "No recall here."}], "end_turn"),
        "responses": _responses_stream([{"reasoning": "r"}, {"text": "No recall here."}]),
        "gemini": _gemini_stream([{"text": "No recall"}, {"text": " here."}]),
    }
    out, _ = _run(name, [streams[name]], byte_by_byte=True)
    assert out == streams[name]
