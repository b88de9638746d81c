"""End to end on ``/v1/messages``: the official ``anthropic`` SDK -> ctxproxy -> the strict fake
Anthropic upstream, each a real uvicorn server on 127.0.0.1.

The fake serves ``claude-e2e`` with a 4,096-token window (its own cl100k count), verifies signed
thinking and Anthropic's structural rules, and answers in Anthropic's JSON or SSE. The proxy knows
the window from an operator model table.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude
from tests.fake_upstream import serve_proxy

WINDOW_TOKENS = 4096
MODEL = "claude-e2e"
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the project.",
        "input_schema": {"type": "object", "properties": {"step": {"type": "integer"}}},
    }
]
THINKING = {"type": "enabled", "budget_tokens": 1024}


@dataclass
class AnthropicStack:
    fake: FakeAnthropic
    upstream_url: str
    proxy_url: str
    sent: list[bytes] = field(default_factory=list)
    sent_headers: list[dict[str, str]] = field(default_factory=list)

    def client(self, *, direct: bool = False) -> anthropic.Anthropic:
        def record(request: Any) -> None:
            self.sent.append(request.read())
            self.sent_headers.append(dict(request.headers))

        # The SDK brings its own HTTP client class (httpx2 in SDK 2.x); hooks record what it sends.
        http = anthropic.DefaultHttpxClient(event_hooks={"request": [record]}, timeout=30)
        base = self.upstream_url if direct else self.proxy_url
        return anthropic.Anthropic(base_url=base, api_key="test", max_retries=0, http_client=http)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnthropicStack]:
    fake = FakeAnthropic([FakeClaude(MODEL, window_tokens=WINDOW_TOKENS, loop_calls=3)])
    models_file: Path = tmp_path_factory.mktemp("messages-e2e") / "models.toml"
    models_file.write_text(
        f'[models]\n"{MODEL}" = {{ window = {WINDOW_TOKENS}, max_output = 1024, encoding = "estimate" }}\n',
        encoding="utf-8",
    )
    with fake.serve() as upstream_url, serve_proxy(upstream_url, models_file=models_file) as proxy_url:
        yield AnthropicStack(fake=fake, upstream_url=upstream_url, proxy_url=proxy_url)


@pytest.fixture(autouse=True)
def _clear(stack: AnthropicStack) -> None:
    stack.fake.requests.clear()
    stack.sent.clear()
    stack.sent_headers.clear()


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def long_chat(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for k in range(turns):
        messages.append({"role": "user", "content": f"FACT-q{k} " + words(120, f"u{k}w")})
        messages.append({"role": "assistant", "content": words(120, f"a{k}w")})
    messages.append({"role": "user", "content": "FACT-last what did we say?"})
    return messages


def test_a_request_that_fits_reaches_the_upstream_byte_for_byte(stack: AnthropicStack) -> None:
    with stack.client() as client:
        reply = client.messages.create(
            model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hello FACT-plain"}]
        )
    assert reply.content[0].type == "text" and reply.content[0].text == "Done. FACT-plain"
    assert reply.usage.input_tokens > 0
    upstream = stack.fake.message_requests()
    assert len(upstream) == 1 and upstream[0].body == stack.sent[-1]
    assert upstream[0].headers["anthropic-version"] == stack.sent_headers[-1]["anthropic-version"]


def test_streaming_passes_anthropics_events_through(stack: AnthropicStack) -> None:
    with (
        stack.client() as client,
        client.messages.stream(
            model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "stream FACT-stream"}]
        ) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Done. FACT-stream"
    assert final.stop_reason == "end_turn" and final.usage.input_tokens > 0


def run_tool_loop(client: anthropic.Anthropic, *, result_words: int) -> tuple[anthropic.types.Message, int]:
    """A tool loop with thinking, passing every block back as the SDK returned it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "FACT-task read the three files"}]
    for step in range(6):
        reply = client.messages.create(
            model=MODEL, max_tokens=1100, thinking=THINKING, tools=TOOLS, messages=messages
        )
        if reply.stop_reason != "tool_use":
            return reply, step
        messages.append({"role": "assistant", "content": [b.to_dict() for b in reply.content]})
        calls = [b for b in reply.content if b.type == "tool_use"]
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": c.id,
                        "content": f"FACT-file{step} " + words(result_words, f"f{step}w"),
                    }
                    for c in calls
                ],
            }
        )
    raise AssertionError("the tool loop did not end")


def test_a_tool_loop_with_signed_thinking(stack: AnthropicStack) -> None:
    with stack.client() as client:
        reply, calls = run_tool_loop(client, result_words=50)
    assert calls == 3
    assert reply.content[0].type == "thinking"
    assert "FACT-file2" in reply.content[-1].text
    assert all(r.status == 200 for r in stack.fake.message_requests())


def test_an_overflowing_tool_loop_with_thinking_succeeds_through_the_proxy(stack: AnthropicStack) -> None:
    with stack.client(direct=True) as direct, pytest.raises(anthropic.BadRequestError):
        run_tool_loop(direct, result_words=900)
    stack.fake.requests.clear()
    with stack.client() as client:
        reply, calls = run_tool_loop(client, result_words=900)
    assert calls == 3 and reply.stop_reason == "end_turn"
    # Signatures and bindings always held; a window refusal (the calibrated estimate can be short
    # on text unlike what it learned from) is retried smaller by the proxy before the client sees it.
    refused = [
        stack.fake.respond("/v1/messages", r.json()) for r in stack.fake.message_requests() if r.status != 200
    ]
    wordings = ("prompt is too long: ", "input length and `max_tokens` exceed context limit: ")
    assert all(str(answer[1]["error"]["message"]).startswith(wordings) for answer in refused), refused
    assert stack.fake.message_requests()[-1].status == 200
    assert (
        max(
            stack.fake.count(r.json()) + r.json()["max_tokens"]
            for r in stack.fake.message_requests()
            if r.status == 200
        )
        <= WINDOW_TOKENS
    )


def test_an_overflowing_conversation_fails_directly_and_succeeds_through_the_proxy(
    stack: AnthropicStack,
) -> None:
    messages = long_chat(14)
    with stack.client(direct=True) as client, pytest.raises(anthropic.BadRequestError) as direct:
        client.messages.create(model=MODEL, max_tokens=200, messages=messages)
    assert re.search(r"prompt is too long|exceed context limit", str(direct.value))
    with stack.client() as client:
        reply = client.messages.create(model=MODEL, max_tokens=200, messages=messages)
    assert reply.content[0].text.startswith("Done.") and "FACT-last" in reply.content[0].text
    forwarded = stack.fake.message_requests()[-1].json()
    assert stack.fake.count(forwarded) + 200 <= WINDOW_TOKENS
    assert forwarded["messages"][0]["role"] == "user"


def test_count_tokens_answers_in_anthropics_shape(stack: AnthropicStack) -> None:
    with stack.client() as client:
        counted = client.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": words(50, "c")}]
        )
    assert counted.input_tokens >= 50


def test_a_request_that_cannot_fit_gets_anthropics_wording_with_true_numbers(stack: AnthropicStack) -> None:
    huge = [{"role": "user", "content": words(3000, "h")}]
    with stack.client() as client, pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model=MODEL, max_tokens=1000, messages=huge, extra_headers={"X-Context-Policy": "reject"}
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    message = body["error"]["message"]
    found = re.fullmatch(
        r"prompt is too long: (\d+) tokens > (\d+) maximum|input length and `max_tokens` exceed context "
        r"limit: (\d+) \+ (\d+) > (\d+), decrease input length or `max_tokens` and try again",
        message,
    )
    assert found is not None, message
    if found.group(1):
        assert int(found.group(1)) > int(found.group(2))
    else:
        assert int(found.group(3)) + int(found.group(4)) > int(found.group(5))
    assert stack.fake.message_requests() == []


@pytest.mark.parametrize(
    "payload",
    [
        b'{"model": "claude-e2e", "messages": [{"role": "user", "content": "x"}]}',
        b'{"model": "claude-e2e", "max_tokens": 5, "messages": "x"}',
        b'{"model": "claude-e2e", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": 1}]}]}',
        b'{"model": "claude-e2e", "max_tokens": 5, "messages": [',
    ],
)
def test_bad_input_is_a_4xx_in_anthropics_error_shape(stack: AnthropicStack, payload: bytes) -> None:
    answer = httpx.post(
        f"{stack.proxy_url}/v1/messages",
        content=payload,
        headers={"content-type": "application/json", "x-api-key": "test", "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert 400 <= answer.status_code < 500
    body = answer.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"]


def test_calibration_from_usage_counts_the_tool_definitions(stack: AnthropicStack) -> None:
    """The upstream's usage includes the tools: after one answer the proxy's calibrated count of a
    tool-heavy request stays close to the upstream's own (not doubled by a wrong correction)."""
    tools = [
        {
            "name": f"tool_{k}",
            "description": "Does one thing of the project well. " + words(40, f"d{k}_"),
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "a path"}},
            },
        }
        for k in range(8)
    ]
    messages = [{"role": "user", "content": "hello " + words(100, "m")}]
    with stack.client() as client:
        for _ in range(3):
            raw = client.messages.with_raw_response.create(
                model=MODEL, max_tokens=50, tools=tools, messages=messages
            )
    ours = int(raw.headers["x-context-tokens-before"])
    theirs = stack.fake.count(stack.fake.message_requests()[-1].json())
    assert 0.8 * theirs <= ours <= 1.3 * theirs, (ours, theirs)


def test_a_base_url_ending_in_v1_gets_our_404_with_the_hint_in_anthropics_shape(
    stack: AnthropicStack,
) -> None:
    """``ANTHROPIC_BASE_URL=http://HOST:PORT/v1``: the SDK posts ``/v1/v1/messages``."""
    http = anthropic.DefaultHttpxClient(timeout=30)
    base_url = f"{stack.proxy_url}/v1"
    with (
        anthropic.Anthropic(base_url=base_url, api_key="test", max_retries=0, http_client=http) as client,
        pytest.raises(anthropic.NotFoundError) as raised,
    ):
        client.messages.create(model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    error = raised.value
    assert error.response.url.path == "/v1/v1/messages"
    assert isinstance(error.body, dict) and error.body["type"] == "error"
    assert error.body["error"]["type"] == "not_found_error"
    assert "did you mean /v1/messages?" in error.body["error"]["message"]
    assert stack.fake.requests == []  # never forwarded
