"""Non-streaming answers are read whole and sent in one message; streams are relayed (test_routes)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import anyio
import httpx
import respx

from app.api.responses import UpstreamStreamResponse, context_headers, read_whole
from app.core.budget import Budget
from app.core.dialects import CHAT as CHAT_API
from app.core.plan import Plan
from app.core.registry import ModelSpec
from app.upstream.client import UpstreamResponse
from tests.api import UPSTREAM, chat_ok, proxy

CHAT = f"{UPSTREAM}/chat/completions"
BODY = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


class Chunks(httpx.AsyncByteStream):
    """An upstream body in several chunks that may break off with a read error."""

    def __init__(self, chunks: list[bytes], *, fail: bool = False) -> None:
        self.chunks = chunks
        self.fail = fail
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.fail:
            raise httpx.ReadError("connection reset")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_read_answer_goes_out_in_one_message_with_its_length() -> None:
    payload = json.dumps(chat_ok()).encode()
    stream = Chunks([payload[:10], payload[10:]])
    upstream = UpstreamResponse.of_httpx(httpx.Response(200, stream=stream), base_url=UPSTREAM)
    await read_whole(upstream)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    response = UpstreamStreamResponse(upstream, dialect=CHAT_API, extra_headers=[("X-Context-Retries", "0")])
    await response({"type": "http"}, receive, send)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[1] == {"type": "http.response.body", "body": payload, "more_body": False}
    headers = dict(sent[0]["headers"])
    assert headers[b"content-length"] == str(len(payload)).encode()
    assert headers[b"x-context-retries"] == b"0"
    assert stream.closed


async def test_non_streaming_chat_answers_carry_a_content_length() -> None:
    router = respx.Router()
    router.post(CHAT).mock(return_value=httpx.Response(200, stream=Chunks([b'{"id":', b'"x"}'])))
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200
    assert response.content == b'{"id":"x"}'
    assert response.headers["content-length"] == "10"
    assert "transfer-encoding" not in response.headers


async def test_a_non_streaming_answer_that_breaks_off_is_a_502_not_a_cut_200() -> None:
    stream = Chunks([b'{"id":'], fail=True)
    router = respx.Router()
    router.post(CHAT).mock(return_value=httpx.Response(200, stream=stream))
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol_error"
    assert stream.closed


async def test_streams_are_still_relayed_chunk_by_chunk() -> None:
    events = [b'data: {"a":1}\n\n', b'data: {"a":2}\n\n', b"data: [DONE]\n\n"]
    router = respx.Router()
    headers = {"content-type": "text/event-stream"}
    router.post(CHAT).mock(return_value=httpx.Response(200, headers=headers, stream=Chunks(events)))
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
    assert response.content == b"".join(events)
    assert "content-length" not in response.headers


async def run_stream(*, hang_up_after_end: bool) -> dict[str, Any]:
    """Relay a 3-event stream to a client that hangs up after the last byte or after the first."""
    from app.api.responses import access_fields

    events = [b'data: {"a":1}\n\n', b'data: {"a":2}\n\n', b"data: [DONE]\n\n"]
    headers = {"content-type": "text/event-stream"}
    upstream = UpstreamResponse.of_httpx(
        httpx.Response(200, headers=headers, stream=Chunks(events)), base_url=UPSTREAM
    )
    bodies: list[bytes] = []
    hung_up = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        bodies.append(message["body"])
        if not hang_up_after_end:
            hung_up.set()
            await anyio.sleep_forever()  # the client stops reading
        if not message.get("more_body"):
            hung_up.set()

    async def receive() -> dict[str, Any]:
        await hung_up.wait()
        return {"type": "http.disconnect"}

    scope: dict[str, Any] = {"type": "http"}
    with anyio.fail_after(5):
        await UpstreamStreamResponse(upstream, dialect=CHAT_API)(scope, receive, send)
    return {"fields": access_fields(scope), "bodies": bodies}


async def test_a_stream_read_to_its_end_is_not_a_client_disconnect() -> None:
    done = await run_stream(hang_up_after_end=True)
    assert b"".join(done["bodies"]).endswith(b"data: [DONE]\n\n")
    assert "client_disconnected" not in done["fields"]


async def test_a_client_that_leaves_mid_stream_is_a_disconnect() -> None:
    done = await run_stream(hang_up_after_end=False)
    assert done["fields"]["client_disconnected"] is True


def test_context_headers_say_a_lowered_output_cap_and_the_upstreams_count() -> None:
    spec = ModelSpec(name="m", window_tokens=4096, max_output_tokens=4096, encoding="o200k_base")
    budget = Budget(window_tokens=4096, reserve_tokens=614, margin_tokens=41, tool_tokens=0)
    plan = Plan(
        model="m",
        spec=spec,
        budget=budget,
        count_kind="exact",
        tokens_before=3000,
        tokens_after=3000,
        changed=True,
        fits=True,
        messages=(),
        message_tokens=(),
        dialect=CHAT_API,
    )
    plain = dict(context_headers(plan, retries=0))
    assert plain["X-Context-Window"] == "4096" and plain["X-Context-Budget"] == str(4096 - 614 - 41)
    assert "X-Context-Output-Lowered" not in plain and "X-Context-Upstream-Tokens" not in plain
    told = dict(context_headers(replace(plan, output_cap_tokens=614, upstream_tokens=2950), retries=1))
    assert told["X-Context-Output-Lowered"] == "614" and told["X-Context-Upstream-Tokens"] == "2950"
