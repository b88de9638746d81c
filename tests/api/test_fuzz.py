"""Fuzz the ASGI app with hypothesis: no client input ever gets a 5xx.

The app is the real one (real tokenizer, real model table, auth on, a concurrency cap) with an
in-process fake upstream injected through the transport seam: it answers JSON or SSE, and a
context-length 400 for large prompts so that the emergency retry path is fuzzed too. Inputs:
chat bodies shaped like OpenAI requests with wrong types, odd roles, odd parts and arbitrary JSON
anywhere; raw bytes (mutated and truncated JSON, binary); and headers (``X-Context-*``, content
types, authorization) with arbitrary latin-1 values, on every route.

3,000 cases in CI (under a minute). For a longer local run set ``CTXPROXY_FUZZ_EXAMPLES``,
the number of cases per test (default 1,000), e.g.
``CTXPROXY_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest -q tests/api/test_fuzz.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from app.main import create_app
from app.settings import Settings

EXAMPLES = int(os.environ.get("CTXPROXY_FUZZ_EXAMPLES", "1000"))
KEY = "fuzz-proxy-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 300 tokens. However, your messages resulted in "
        "900 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


def fake_upstream(request: httpx.Request) -> httpx.Response:
    """200 JSON or SSE; a context overflow for large chat bodies; 404 for unknown paths."""
    if request.url.path.endswith("/responses"):
        return responses_upstream(request)
    if "/messages" in request.url.path:
        return messages_upstream(request)
    if not request.url.path.endswith("/chat/completions"):
        return httpx.Response(200, json={"object": "list", "data": []})
    body = request.content
    if len(body) > 3000 and b"overflow" not in request.headers.get("x-fuzz", "").encode():
        return httpx.Response(400, json=OVERFLOW)
    try:
        stream = json.loads(body).get("stream") is True
    except (ValueError, AttributeError):
        stream = False
    if stream:
        sse = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\ndata: [DONE]\n\n'
        return httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})
    return httpx.Response(
        200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]}
    )


def responses_upstream(request: httpx.Request) -> httpx.Response:
    """The Responses API's answers: an overflow for large bodies, else a response or its events."""
    if len(request.content) > 3000:
        return httpx.Response(400, json={"error": {**OVERFLOW["error"], "param": "input"}})
    try:
        stream = json.loads(request.content).get("stream") is True
    except (ValueError, AttributeError):
        stream = False
    if stream:
        sse = (
            b'event: response.created\ndata: {"type":"response.created","sequence_number":0}\n\n'
            b'event: response.completed\ndata: {"type":"response.completed","sequence_number":1,'
            b'"response":{"usage":{"input_tokens":5,"output_tokens":1}}}\n\n'
        )
        return httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})
    return httpx.Response(
        200, json={"object": "response", "status": "completed", "output": [], "usage": None}
    )


def messages_upstream(request: httpx.Request) -> httpx.Response:
    """The Anthropic Messages API's answers: Anthropic's overflow for large bodies, else a message
    or its events; a count for ``count_tokens``."""
    if request.url.path.endswith("/count_tokens"):
        return httpx.Response(200, json={"input_tokens": 5})
    if len(request.content) > 3000:
        message = "prompt is too long: 900 tokens > 300 maximum"
        return httpx.Response(
            400, json={"type": "error", "error": {"type": "invalid_request_error", "message": message}}
        )
    try:
        stream = json.loads(request.content).get("stream") is True
    except (ValueError, AttributeError):
        stream = False
    usage = {"input_tokens": 5, "cache_read_input_tokens": 0, "output_tokens": 1}
    message_json = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "hi"}],
        "usage": usage,
    }
    if stream:
        start = json.dumps({"type": "message_start", "message": {**message_json, "content": []}})
        sse = (
            f"event: message_start\ndata: {start}\n\n"
            'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
            '"usage":{"output_tokens":1}}\n\n'
            'event: message_stop\ndata: {"type":"message_stop"}\n\n'
        ).encode()
        return httpx.Response(200, content=sse, headers={"Content-Type": "text/event-stream"})
    return httpx.Response(200, json=message_json)


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings_ = Settings(
        upstream_base_url="http://upstream.fuzz/v1",
        upstream_transport="httpx",
        upstream_api_key="sk-upstream-fuzz",
        api_keys=KEY,
        max_concurrent_upstream=8,
        max_body_bytes=256 * 1024,
        log_level="CRITICAL",
    )
    app = create_app(settings_, upstream_transport=httpx.MockTransport(fake_upstream))
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "", "USER", "bot"])
text = st.text(max_size=300) | st.sampled_from(["word " * 400, "x" * 5000, "\ud800", "😀" * 50])
image_url = st.sampled_from(
    [
        "https://example.com/cat.png",
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        "data:image/png;base64,!!!!",
        "data:image/jpeg;base64,/9j/",
        "",
    ]
) | st.text(max_size=30)
part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries(
        {
            "type": st.just("image_url"),
            "image_url": st.fixed_dictionaries(
                {"url": image_url}, optional={"detail": st.sampled_from(["low", "high", "auto", "x"])}
            ),
        }
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["input_audio", "file", "refusal", "bogus"])}, optional={"text": json_any}
    ),
    json_any,
)
tool_call = st.fixed_dictionaries(
    {"id": st.sampled_from(["call_1", "call_2", "call_3"]), "type": st.just("function")},
    optional={
        "function": st.fixed_dictionaries({"name": st.text(max_size=10), "arguments": st.text(max_size=40)})
    },
)
message = st.fixed_dictionaries(
    {"role": roles},
    optional={
        "content": st.none() | text | st.lists(part, max_size=4) | json_any,
        "name": st.text(max_size=10) | json_any,
        "tool_calls": st.lists(tool_call, max_size=3) | json_any,
        "tool_call_id": st.sampled_from(["call_1", "call_2", "call_9"]) | json_any,
        "extra": json_any,
    },
)
tool = st.fixed_dictionaries(
    {"type": st.just("function")},
    optional={
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=10)}, optional={"description": text, "parameters": json_any}
        )
    },
)
chat_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["gpt-4o-mini", "gpt-4", "gpt-3.5-turbo", "llama-3-8b", "", "unknown/x"])
        | json_any,
        "messages": st.lists(message, max_size=8) | json_any,
        "max_tokens": st.integers(min_value=-10, max_value=10**12) | json_any,
        "max_completion_tokens": st.integers(min_value=-10, max_value=10**7),
        "stream": st.booleans() | json_any,
        "stream_options": json_any,
        "tools": st.lists(tool, max_size=3) | json_any,
        "tool_choice": json_any,
        "n": json_any,
        "base_url": st.just("http://evil.invalid/v1"),
    },
)
header_value = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"), max_size=30
).map(str.strip)
context_headers = st.dictionaries(
    st.sampled_from(
        [
            "X-Context-Budget",
            "X-Context-Reserve",
            "X-Context-Window",
            "X-Context-Policy",
            "X-Context-Keep-Turns",
        ]
    ),
    st.one_of(
        header_value,
        st.integers(min_value=-5, max_value=10**15).map(str),
        st.sampled_from(["auto", "truncate", "reject", "off", "OFF", "200", "1", "0"]),
    ),
    max_size=5,
)
paths = st.sampled_from(["/v1/chat/completions", "/v1/context/plan"])


def latin1(headers: dict[str, str]) -> dict[str, bytes]:
    """Header values as wire bytes (httpx would insist on ASCII for str values)."""
    return {name: value.encode("latin-1") for name, value in headers.items()}


def check(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    json_body = response.headers.get("content-type", "").startswith("application/json")
    if response.status_code >= 400 and json_body and response.request.method != "HEAD":
        error = response.json()["error"]
        assert isinstance(error["message"], str)


@FUZZ
@given(body=chat_body, headers=context_headers, path=paths)
def test_chat_bodies_never_5xx(
    client: TestClient, body: dict[str, Any], headers: dict[str, str], path: str
) -> None:
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    check(
        client.post(
            path, content=raw, headers=latin1({**AUTH, "Content-Type": "application/json", **headers})
        )
    )


def mutate(raw: bytes, cuts: list[tuple[int, int]]) -> bytes:
    data = bytearray(raw)
    for position, value in cuts:
        if data:
            data[position % len(data)] = value
    return bytes(data)


@FUZZ
@given(
    body=chat_body,
    cuts=st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)), max_size=4),
    truncate=st.none() | st.integers(min_value=0, max_value=400),
    noise=st.binary(max_size=200),
    use_noise=st.booleans(),
    path=paths,
)
def test_raw_bytes_never_5xx(
    client: TestClient,
    body: dict[str, Any],
    cuts: list[tuple[int, int]],
    truncate: int | None,
    noise: bytes,
    use_noise: bool,
    path: str,
) -> None:
    raw = noise if use_noise else mutate(json.dumps(body).encode("utf-8", "surrogatepass"), cuts)
    if truncate is not None:
        raw = raw[:truncate]
    check(client.post(path, content=raw, headers={**AUTH, "Content-Type": "application/json"}))


@FUZZ
@given(
    headers=st.dictionaries(
        st.sampled_from(
            [
                "Content-Type",
                "Authorization",
                "Accept",
                "Accept-Encoding",
                "Content-Encoding",
                "X-Context-Budget",
                "X-Context-Window",
                "X-Context-Policy",
                "Connection",
                "X-Forwarded-Host",
                "Expect",
                "Transfer-Encoding",
            ]
        ),
        header_value,
        max_size=6,
    ),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    path=st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/messages",
            "/v1/context/plan",
            "/v1/models",
            "/v1/embeddings",
            "/healthz",
            "/x",
            "/v1/%ff",
        ]
    ),
    keyed=st.booleans(),
)
def test_headers_methods_and_paths_never_5xx(
    client: TestClient, headers: dict[str, str], method: str, path: str, keyed: bool
) -> None:
    if keyed and "Authorization" not in headers:
        headers = {**headers, **AUTH}
    headers.pop("Transfer-Encoding", None)  # the test client sets framing itself
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}).encode()
    content = body if method not in {"GET", "HEAD"} else None
    response = client.request(method, path, content=content, headers=latin1(headers))
    check(response)
    if not keyed and path.startswith("/v1/") and "Authorization" not in headers:
        assert response.status_code == 401


input_part = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "refusal"]), "text": text}),
    st.fixed_dictionaries(
        {"type": st.just("input_image")},
        optional={"image_url": image_url, "detail": st.sampled_from(["low", "high", "auto", "x"])},
    ),
    st.fixed_dictionaries(
        {"type": st.just("input_file")}, optional={"filename": json_any, "file_data": json_any}
    ),
    json_any,
)
call_ids = st.sampled_from(["call_1", "call_2", "call_9"]) | json_any
input_item = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system", "developer", "tool", "", "bot"])},
        optional={
            "type": st.sampled_from(["message", "bogus"]),
            "content": text | st.lists(input_part, max_size=3) | json_any,
            "id": json_any,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["function_call", "custom_tool_call", "computer_call", "local_shell_call"])},
        optional={"call_id": call_ids, "name": json_any, "arguments": text | json_any, "input": json_any},
    ),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["function_call_output", "custom_tool_call_output", "local_shell_call_output"]
            )
        },
        optional={
            "call_id": call_ids,
            "id": call_ids,
            "output": text | st.lists(input_part, max_size=2) | json_any,
        },
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["reasoning", "compaction", "web_search_call", "item_reference", "zzz"])},
        optional={"id": json_any, "summary": json_any, "encrypted_content": text | json_any},
    ),
    json_any,
)
responses_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["gpt-4o-mini", "gpt-5", "llama-3-8b", ""]) | json_any,
        "input": text | st.lists(input_item, max_size=8) | json_any,
        "instructions": text | json_any,
        "max_output_tokens": st.integers(min_value=-10, max_value=10**12) | json_any,
        "stream": st.booleans() | json_any,
        "tools": st.lists(tool | json_any, max_size=3) | json_any,
        "text": json_any,
        "previous_response_id": st.none() | st.text(max_size=10),
        "conversation": st.none() | json_any,
        "store": json_any,
    },
)


@FUZZ
@given(
    body=responses_body,
    headers=context_headers,
    path=st.sampled_from(["/v1/responses", "/v1/responses/input_tokens", "/v1/context/plan"]),
)
def test_responses_bodies_never_5xx(
    client: TestClient, body: dict[str, Any], headers: dict[str, str], path: str
) -> None:
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    check(
        client.post(
            path, content=raw, headers=latin1({**AUTH, "Content-Type": "application/json", **headers})
        )
    )


anthropic_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}, optional={"cache_control": json_any}),
    st.fixed_dictionaries(
        {"type": st.just("image")},
        optional={
            "source": st.fixed_dictionaries(
                {"type": st.sampled_from(["base64", "url", "file", "x"])},
                optional={
                    "media_type": st.sampled_from(["image/png", "image/jpeg"]) | json_any,
                    "data": text | json_any,
                },
            )
            | json_any
        },
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_use")},
        optional={"id": call_ids, "name": st.text(max_size=8) | json_any, "input": json_any},
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result")},
        optional={"tool_use_id": call_ids, "content": text | st.lists(json_any, max_size=2) | json_any},
    ),
    st.fixed_dictionaries(
        {"type": st.sampled_from(["thinking", "redacted_thinking", "document", "search_result", "zzz"])},
        optional={
            "thinking": text | json_any,
            "signature": text,
            "data": text | json_any,
            "source": json_any,
        },
    ),
    json_any,
)
anthropic_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "", "USER"]) | json_any},
    optional={"content": text | st.lists(anthropic_block, max_size=4) | json_any},
)
anthropic_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["claude-sonnet-4-5", "claude-haiku-4-5", "gpt-4o-mini", ""]) | json_any,
        "max_tokens": st.integers(min_value=-10, max_value=10**12) | json_any,
        "messages": st.lists(anthropic_message, max_size=8) | json_any,
        "system": text | st.lists(anthropic_block, max_size=2) | json_any,
        "stream": st.booleans() | json_any,
        "tools": st.lists(
            st.fixed_dictionaries({"name": st.text(max_size=8)}, optional={"input_schema": json_any})
            | json_any,
            max_size=3,
        )
        | json_any,
        "thinking": json_any,
        "context_management": json_any,
    },
)
anthropic_headers = st.dictionaries(
    st.sampled_from(["anthropic-version", "anthropic-beta", "x-api-key"]),
    st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40),
    max_size=3,
)


@FUZZ
@given(
    body=anthropic_body,
    headers=context_headers,
    anthropic=anthropic_headers,
    path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens"]),
)
def test_messages_bodies_never_5xx(
    client: TestClient, body: dict[str, Any], headers: dict[str, str], anthropic: dict[str, str], path: str
) -> None:
    raw = json.dumps(body).encode("utf-8", "surrogatepass")
    sent = {**AUTH, "Content-Type": "application/json", **anthropic, **headers}
    check(client.post(path, content=raw, headers=latin1(sent)))
