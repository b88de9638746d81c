"""Gemini's native API through a real proxy, driven by the official ``google-genai`` SDK.

A real ctxproxy (uvicorn on 127.0.0.1; its upstream base URL is the fake's ``/v1``, so every Gemini
request goes to the client's own ``/v1beta/...`` path at that origin) in front of the strict fake
Gemini upstream (``tests/fake_gemini_upstream.py``: HMAC thought signatures it alone can make,
pairing, alternation, its own tokenizer, Google's wordings). The proxy has an operator key and
proxy keys: clients present a proxy key in ``x-goog-api-key`` or ``?key=``; the fake accepts only
the operator's. What the fake received is the oracle: every request it answered passed its checks.

* a reading agent written with the SDK (function calling by hand, thoughts included, the SDK
  replaying every signature) runs past the window, streamed and not: every request is answered,
  within the fake's limit and valid there; requests that fit arrive byte for byte;
* ``streamGenerateContent`` without ``alt=sse`` (one JSON array) is fitted too;
* ``countTokens`` asks the upstream first (the tokenizer is not public) and calibrates;
* our own errors (policy ``reject``, a bad body, a wrong proxy key) are in Google's shape;
* an upstream refusal in Gemini's own wording is retried smaller and answered;
* ``usageMetadata`` calibrates the estimate, streamed (SSE or one JSON array) or not;
* model lookups pass through, and discovery reads ``inputTokenLimit``/``outputTokenLimit``;
* keys are replaced, never logged;
* a stream the upstream breaks off ends with an error in its own form (SSE frame, array element).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.fake_gemini_upstream import FACT_RE, FakeGemini, FakeGeminiModel, Reader, Recorded, Signer
from tests.fake_upstream import serve_proxy

pytestmark = pytest.mark.e2e

MODEL = "gemini-e2e"  # the table says its real input limit
SMALL = "gemini-small"  # the table says 16,000; the fake refuses over 6,000
RATIO = "gemini-ratio"  # the fake counts 1.5x what a quarter of the characters would be
UNTABLED = "gemini-untabled"  # not in the table: discovery reads its limits
LIMIT_TOKENS = 8000
SMALL_REAL_TOKENS = 6000
OPERATOR_KEY = "op-key-gemini"
PROXY_KEY = "proxy-key-gemini"
FILES = 10
TABLE = "\n".join(
    [
        "[models]",
        f'"{MODEL}" = {{ window = {LIMIT_TOKENS}, max_output = 4096, encoding = "estimate" }}',
        f'"{SMALL}" = {{ window = 16000, max_output = 4096, encoding = "estimate" }}',
        f'"{RATIO}" = {{ window = 100000, max_output = 4096, encoding = "estimate" }}',
    ]
)


@dataclass
class Stack:
    """The fake, the proxy in front of it and what the SDK sent (method, URL, body bytes)."""

    fake: FakeGemini
    url: str
    sent: list[tuple[str, str, bytes]] = field(default_factory=list)
    http_clients: list[httpx.Client] = field(default_factory=list)

    def client(self, *, api_version: str = "v1beta", headers: dict[str, str] | None = None) -> genai.Client:
        def capture(request: httpx.Request) -> None:
            self.sent.append((request.method, str(request.url), request.read()))

        http = httpx.Client(timeout=60, event_hooks={"request": [capture]})
        self.http_clients.append(http)  # the SDK does not close a client it was given
        options = types.HttpOptions(
            base_url=self.url,
            api_version=api_version,
            headers=headers or {},
            httpx_client=http,
            retry_options=types.HttpRetryOptions(attempts=1),
        )
        return genai.Client(api_key=PROXY_KEY, http_options=options)

    def generated(self, model: str = MODEL) -> list[Recorded]:
        """The client's requests for ``model`` as the fake received them (summary calls aside)."""
        return [r for r in self.fake.client_requests() if f"/models/{model}:" in r.path]

    def summaries(self, model: str = MODEL) -> list[Recorded]:
        """The proxy's summary calls for ``model``, each checked: Gemini's own route at the
        origin, the operator's key, answered (the fake's structure and window checks passed)."""
        found = [r for r in self.fake.summary_requests() if f"/models/{model}:" in r.path]
        model_spec = self.fake.model(model)
        for r in found:
            assert (r.path, r.query, r.status) == (f"/v1beta/models/{model}:generateContent", "", 200)
            assert r.headers["x-goog-api-key"] == OPERATOR_KEY and PROXY_KEY not in str(r.headers)
            assert self.fake.count(r.json(), model_spec) <= model_spec.input_token_limit
        assert self.fake.summary_calls == len(self.fake.summary_requests())
        return found

    def models(self) -> dict[str, Any]:
        report = httpx.get(f"{self.url}/v1/context/models", headers={"x-goog-api-key": PROXY_KEY}).json()
        return {entry["model"]: entry for entry in report["data"]}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    fake = FakeGemini(
        [
            FakeGeminiModel(MODEL, input_token_limit=LIMIT_TOKENS),
            FakeGeminiModel(SMALL, input_token_limit=SMALL_REAL_TOKENS),
            FakeGeminiModel(RATIO, ratio=1.5),
            FakeGeminiModel(UNTABLED, input_token_limit=32_000, output_token_limit=8192),
        ],
        signer=Signer(b"gemini-e2e-secret"),
        api_key=OPERATOR_KEY,
    )
    table = tmp_path / "models.toml"
    table.write_text(TABLE + "\n", encoding="utf-8")
    with (
        fake.serve() as upstream,
        serve_proxy(
            upstream,
            models_file=table,
            upstream_api_key=OPERATOR_KEY,
            api_keys=PROXY_KEY,
            log_level="DEBUG",
            # The fake serves any number of requests at once (not a local server with few slots):
            # a cut request's summary is waited for in line.
            summary_yield="never",
        ) as url,
    ):
        served = Stack(fake, url)
        try:
            yield served
        finally:
            for http in served.http_clients:
                http.close()


# -- a reading agent written with the SDK -----------------------------------------------------------


def file_text(k: int) -> str:
    lines = [f"line {i} of part {k}: the quick brown fox jumps over the lazy dog" for i in range(60)]
    lines[30] = f"The secret of part {k} is FACT-part{k}."
    return "\n".join(lines)


PATHS = [f"part{k}.txt" for k in range(FILES)]
READ_FILE = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="read_file",
            description="Reads a file of the project.",
            parameters_json_schema={
                "type": "object",
                "properties": {"file_path": {"type": "string"}},
                "required": ["file_path"],
            },
        )
    ]
)
AGENT_CONFIG = types.GenerateContentConfig(
    system_instruction="You are a careful agent: read what you are asked to read.",
    tools=[READ_FILE],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    thinking_config=types.ThinkingConfig(include_thoughts=True),
)


def reply(
    client: genai.Client, contents: list[types.Content], *, stream: bool
) -> tuple[types.Content, dict[str, str]]:
    """One step: the model's content (a stream's parts in order, as agents keep them) and the
    proxy's ``X-Context-*`` headers."""
    if not stream:
        response = client.models.generate_content(model=MODEL, contents=contents, config=AGENT_CONFIG)
        assert response.candidates and response.candidates[0].content and response.sdk_http_response
        return response.candidates[0].content, dict(response.sdk_http_response.headers or {})
    parts: list[types.Part] = []
    headers: dict[str, str] = {}
    for chunk in client.models.generate_content_stream(model=MODEL, contents=contents, config=AGENT_CONFIG):
        assert chunk.candidates and chunk.candidates[0].content and chunk.sdk_http_response
        parts += chunk.candidates[0].content.parts or []
        headers = dict(chunk.sdk_http_response.headers or {})
    return types.Content(role="model", parts=parts), headers


def read_everything(client: genai.Client, *, stream: bool) -> tuple[str, list[dict[str, str]]]:
    """Run the agent to its answer; the answer's text and every step's proxy headers."""
    contents = [
        types.Content(role="user", parts=[types.Part(text="Read every part and tell me the secrets.")])
    ]
    seen: list[dict[str, str]] = []
    for _ in range(FILES + 2):
        content, headers = reply(client, contents, stream=stream)
        seen.append(headers)
        contents.append(content)
        calls = [part.function_call for part in content.parts or [] if part.function_call]
        if not calls:
            return "".join(part.text or "" for part in content.parts or [] if not part.thought), seen
        results = [
            types.Part.from_function_response(
                name="read_file",
                response={"output": file_text(PATHS.index(str((call.args or {})["file_path"])))},
            )
            for call in calls
        ]
        contents.append(types.Content(role="user", parts=results))
    raise AssertionError("the agent never answered")


@pytest.mark.parametrize("stream", [False, True], ids=["generateContent", "streamGenerateContent"])
def test_a_reading_agent_runs_past_the_window_and_every_request_is_valid_upstream(
    stack: Stack, stream: bool
) -> None:
    stack.fake.script = Reader(PATHS)
    answer, headers = read_everything(stack.client(), stream=stream)

    requests = stack.generated()
    assert len(requests) == FILES + 1 and all(r.status == 200 for r in requests)  # none refused
    model = stack.fake.model(MODEL)
    assert all(stack.fake.count(r.json(), model) <= LIMIT_TOKENS for r in requests)
    verb = "streamGenerateContent" if stream else "generateContent"
    assert {(r.path, r.query) for r in requests} == {
        (f"/v1beta/models/{MODEL}:{verb}", "alt=sse" if stream else "")
    }
    actions = [h["x-context-actions"] for h in headers]
    assert actions[0] == "none" and actions[-1] != "none"  # the session outgrew the window
    assert all(h["x-context-count"] in ("estimate", "calibrated") for h in headers)
    # Requests that fit went on byte for byte; fitted ones changed only what the proxy cut.
    sent = [body for method, url, body in stack.sent if method == "POST" and f"{MODEL}:{verb}" in url]
    assert len(sent) == len(requests)
    for body, received, step in zip(sent, requests, actions, strict=True):
        assert (received.body == body) is (step == "none")
    # Every signed part the upstream got is one the model made (the fake verified each one), and
    # the newest step arrived whole: the last request's signed call is the agent's own.
    last_sent, last_received = json.loads(sent[-1]), requests[-1].json()
    assert last_received["contents"][-2:] == last_sent["contents"][-2:]
    # The model answers from what it was sent: the newest read is never lost.
    answered = set(FACT_RE.findall(answer))
    assert f"FACT-part{FILES - 1}." in {f"{fact}." for fact in answered}
    assert answered <= set(FACT_RE.findall(json.dumps(last_received["contents"])))
    # What the cut forgot was summarized (summaries are on by default), in Gemini's own API on the
    # same upstream, and the summary stands in the last request for the reads it no longer shows.
    assert stack.summaries()
    assert "[ctxproxy: summary of" in json.dumps(last_received["contents"])
    print(f"answer: {len(answered)} of {FILES} facts; {stack.fake.summary_calls} summary calls")


def test_the_json_array_stream_is_fitted_too(stack: Stack) -> None:
    history: list[dict[str, Any]] = []
    for k in range(12):
        history += [
            {"role": "user", "parts": [{"text": f"question {k}: " + file_text(k)}]},
            {"role": "model", "parts": [{"text": f"answer {k}"}]},
        ]
    body = {"contents": [*history, {"role": "user", "parts": [{"text": "the last question"}]}]}
    response = httpx.post(
        f"{stack.url}/v1beta/models/{MODEL}:streamGenerateContent?key={PROXY_KEY}", json=body, timeout=60
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    chunks = response.json()  # one JSON array, element by element
    assert isinstance(chunks, list) and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert response.headers["x-context-actions"] != "none"
    (received,) = stack.generated()
    assert stack.summaries()  # what the cut forgot, summarized with the operator's key
    assert received.status == 200 and received.query == ""  # the client's query, without its key
    assert received.headers["x-goog-api-key"] == OPERATOR_KEY
    assert stack.fake.count(received.json(), stack.fake.model(MODEL)) <= LIMIT_TOKENS
    assert received.json()["contents"][-1] == body["contents"][-1]


def test_count_tokens_asks_the_upstream_first_and_calibrates(stack: Stack) -> None:
    client = stack.client()
    contents = [types.Content(role="user", parts=[types.Part(text=file_text(1))])]
    counted = client.models.count_tokens(model=RATIO, contents=contents)
    (asked,) = [r for r in stack.fake.requests if r.path.endswith(f"{RATIO}:countTokens")]
    assert asked.status == 200 and asked.headers["x-goog-api-key"] == OPERATOR_KEY
    assert counted.total_tokens == stack.fake.count(asked.json(), stack.fake.model(RATIO))
    # The upstream's count taught the proxy how Gemini counts against its estimate.
    learned = stack.models()[RATIO]
    assert learned["calibration_samples"] == 1 and learned["correction"] > 1.2


def test_our_own_errors_are_in_googles_shape(stack: Stack) -> None:
    client = stack.client(headers={"X-Context-Policy": "reject"})
    too_long = [types.Content(role="user", parts=[types.Part(text=file_text(k))]) for k in range(12)]
    with pytest.raises(errors.ClientError) as refused:
        client.models.generate_content(model=MODEL, contents=too_long)
    assert (refused.value.code, refused.value.status) == (400, "INVALID_ARGUMENT")
    assert refused.value.message is not None
    assert "exceeds the maximum number of tokens allowed" in refused.value.message  # Gemini's wording
    with pytest.raises(errors.ClientError) as streamed:
        list(client.models.generate_content_stream(model=MODEL, contents=too_long))
    assert streamed.value.code == 400 and streamed.value.status == "INVALID_ARGUMENT"

    bad_role = httpx.post(
        f"{stack.url}/v1beta/models/{MODEL}:generateContent",
        json={"contents": [{"role": "assistant", "parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": PROXY_KEY},
    )
    assert bad_role.status_code == 400
    assert bad_role.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "Please use a valid role: user, model." in bad_role.json()["error"]["message"]
    wrong_key = httpx.post(
        f"{stack.url}/v1beta/models/{MODEL}:generateContent?key=nope", json={"contents": []}
    )
    assert wrong_key.status_code == 401 and set(wrong_key.json()) == {"error"}
    assert wrong_key.json()["error"]["status"] == "UNAUTHENTICATED"
    # Before a JSON-array stream (no alt=sse), as Google answers there: the array's one element.
    array_key = httpx.post(f"{stack.url}/v1beta/models/{MODEL}:streamGenerateContent?key=nope", json={})
    assert array_key.status_code == 401 and array_key.json() == [wrong_key.json()]
    array_reject = httpx.post(
        f"{stack.url}/v1beta/models/{MODEL}:streamGenerateContent",
        json={"contents": [c.model_dump(exclude_none=True) for c in too_long]},
        headers={"x-goog-api-key": PROXY_KEY, "X-Context-Policy": "reject"},
    )
    (element,) = array_reject.json()
    assert array_reject.status_code == 400 and element["error"]["status"] == "INVALID_ARGUMENT"
    assert not stack.generated()  # none of them reached the upstream


def test_an_upstream_refusal_in_geminis_wording_is_retried_smaller(stack: Stack) -> None:
    contents = [
        types.Content(role="user", parts=[types.Part(text=f"question {k}: " + file_text(k))])
        for k in range(8)
    ]
    for k in range(7):
        contents.insert(2 * k + 1, types.Content(role="model", parts=[types.Part(text=f"answer {k}")]))
    response = stack.client().models.generate_content(model=SMALL, contents=contents)
    assert response.sdk_http_response and response.sdk_http_response.headers
    assert response.sdk_http_response.headers["x-context-retries"] == "1"
    refused, answered = stack.generated(SMALL)
    assert refused.status == 400 and answered.status == 200
    model = stack.fake.model(SMALL)
    assert (
        stack.fake.count(refused.json(), model)
        > SMALL_REAL_TOKENS
        >= stack.fake.count(answered.json(), model)
    )
    assert stack.models()[SMALL]["learned_window_tokens"] == SMALL_REAL_TOKENS
    # The emergency retry asks no summary of a model whose window was just found smaller than
    # thought (only a cached one would do): the cut's note stands in.
    assert stack.summaries(SMALL) == []


def test_usage_metadata_calibrates_the_estimate_streamed_or_not(stack: Stack) -> None:
    client = stack.client()
    contents = [types.Content(role="user", parts=[types.Part(text=file_text(3))])]
    first = client.models.generate_content(model=RATIO, contents=contents)
    assert first.sdk_http_response and first.sdk_http_response.headers
    assert first.sdk_http_response.headers["x-context-count"] == "estimate"
    assert stack.models()[RATIO]["calibration_samples"] == 1
    list(client.models.generate_content_stream(model=RATIO, contents=contents))
    learned = stack.models()[RATIO]
    assert learned["calibration_samples"] == 2 and learned["correction"] > 1.2
    third = client.models.generate_content(model=RATIO, contents=contents)
    assert third.sdk_http_response and third.sdk_http_response.headers
    assert third.sdk_http_response.headers["x-context-count"] == "calibrated"
    # The JSON-array stream (no alt=sse): pretty-printed elements, its usage read as they pass.
    array = httpx.post(
        f"{stack.url}/v1beta/models/{RATIO}:streamGenerateContent",
        json={"contents": [{"role": "user", "parts": [{"text": file_text(4)}]}]},
        headers={"x-goog-api-key": PROXY_KEY},
        timeout=60,
    )
    assert array.status_code == 200 and array.content.startswith(b"[")
    assert stack.models()[RATIO]["calibration_samples"] == 4


def test_model_lookups_pass_through_and_discovery_reads_the_limits(stack: Stack) -> None:
    client = stack.client()
    found = client.models.get(model=UNTABLED)
    assert (found.input_token_limit, found.output_token_limit) == (32_000, 8192)
    names = {m.name for m in client.models.list()}
    assert f"models/{UNTABLED}" in names
    client.models.generate_content(model=UNTABLED, contents="hello")
    learned = stack.models()[UNTABLED]
    assert (learned["window_tokens"], learned["max_output_tokens"]) == (32_000, 8192)
    assert learned["sources"]["window"].startswith("discovered")
    # Discovery asked the list at the base URL with the operator's key, in Google's header at last.
    listing = [r for r in stack.fake.requests if r.method == "GET" and r.path == "/v1/models"]
    assert listing[-1].status == 200 and listing[-1].headers["x-goog-api-key"] == OPERATOR_KEY
    lookups = [r for r in stack.fake.requests if r.method == "GET" and r.path.startswith("/v1beta/models")]
    assert lookups and all(r.status == 200 and r.api_key == OPERATOR_KEY for r in lookups)


def test_keys_are_replaced_and_never_logged(stack: Stack, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        stack.client().models.generate_content(model=MODEL, contents="hello")
        by_query = httpx.post(
            f"{stack.url}/v1/models/{MODEL}:generateContent?key={PROXY_KEY}&alt=json",
            json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        )
    assert by_query.status_code == 200
    header, query = stack.generated()
    assert header.path == f"/v1beta/models/{MODEL}:generateContent"
    assert query.path == f"/v1/models/{MODEL}:generateContent" and query.query == "alt=json"
    for received in (header, query):
        assert received.headers["x-goog-api-key"] == OPERATOR_KEY and PROXY_KEY not in str(received.headers)
    # The proxy's log lines (access lines included); the test's own httpx client logs its URLs.
    logged = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert any(r.name == "ctxproxy.access" for r in logged)
    assert all(PROXY_KEY not in str(r.__dict__) and OPERATOR_KEY not in str(r.__dict__) for r in logged)


# -- a stream the upstream breaks off ---------------------------------------------------------------


@contextmanager
def breaking_upstream() -> Iterator[str]:
    """Answers every request with a 200 stream of one chunk, then closes the connection (no end):
    SSE frames with ``alt=sse``, else the opening of a JSON array."""
    chunk = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Half"}]}, "index": 0}]}
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        sse = b"alt=sse" in head.split(b"\r\n")[0]
        data = (
            b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n" if sse else b"[" + json.dumps(chunk).encode()
        )
        media = b"text/event-stream" if sse else b"application/json"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + media + b"\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.close()

    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await stop[0].wait()
        server.close()
        await server.wait_closed()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(10)
        loop.close()


def test_a_stream_the_upstream_breaks_off_ends_with_an_error_in_its_own_form() -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    with breaking_upstream() as upstream, serve_proxy(upstream, discovery=False) as url:
        client = genai.Client(
            api_key="k",
            http_options=types.HttpOptions(base_url=url, retry_options=types.HttpRetryOptions(attempts=1)),
        )
        with pytest.raises(errors.ServerError) as broken:
            list(client.models.generate_content_stream(model=MODEL, contents="hi"))
        assert broken.value.code == 502 and broken.value.status == "UNAVAILABLE"
        sse = httpx.post(f"{url}/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", json=body)
        array = httpx.post(f"{url}/v1beta/models/{MODEL}:streamGenerateContent", json=body)
    frames = [f for f in sse.content.split(b"\r\n\r\n") if f.strip()]
    assert (
        json.loads(frames[0][6:])["candidates"] and json.loads(frames[-1].strip()[6:])["error"]["code"] == 502
    )
    elements = json.loads(array.content)  # a complete JSON array whose last element is the error
    assert elements[0]["candidates"] and elements[-1]["error"]["status"] == "UNAVAILABLE"
