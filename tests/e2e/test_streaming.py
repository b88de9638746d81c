"""Streaming through a real ctxproxy server: SSE chunks pass through, usage arrives, headers are set."""

from __future__ import annotations

import openai

from app.core.tokens import MessageCounter
from tests.e2e.conftest import WINDOW_TOKENS, Stack, conversation


def collect(stream: openai.Stream) -> tuple[str, list[object]]:
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_stream_with_usage(e2e: Stack, client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="fake-openai",
        messages=[{"role": "user", "content": "Stream me a short answer"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-context-retries"] == "0"
        tokens_after = int(response.headers["x-context-tokens-after"])
        text, chunks = collect(response.parse())
    assert len(chunks) > 3
    assert text.strip().startswith("Fake reply to 1 messages")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage is not None
    assert usage.prompt_tokens == tokens_after
    (received,) = e2e.fake.client_requests()
    assert received.body == e2e.sent[0]


def test_stream_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="fake-llamacpp", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text, chunks = collect(stream)
    assert text.startswith("Fake reply")
    assert all(c.usage is None for c in chunks)


def test_over_long_streaming_request_is_fitted(
    e2e: Stack, client: openai.OpenAI, counter: MessageCounter
) -> None:
    messages = conversation(counter, at_least_tokens=2 * WINDOW_TOKENS)
    with client.chat.completions.with_streaming_response.create(
        model="fake-vllm", messages=messages, stream=True, stream_options={"include_usage": True}
    ) as response:
        assert int(response.headers["x-context-tokens-before"]) > WINDOW_TOKENS
        assert int(response.headers["x-context-tokens-after"]) < WINDOW_TOKENS
        assert response.headers["x-context-actions"] != "none"
        text, chunks = collect(response.parse())
    assert text.startswith("Fake reply")
    assert chunks[-1].usage.prompt_tokens < WINDOW_TOKENS
    (received,) = e2e.fake.client_requests()
    forwarded = received.json()["messages"]
    assert forwarded[0] == messages[0]
    assert forwarded[-1] == messages[-1]
    assert received.json()["stream_options"] == {"include_usage": True}
