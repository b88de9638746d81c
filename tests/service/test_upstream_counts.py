"""app.service.upstream_counts: the API's counting endpoint asked with the client's headers, bounded in
time, cached by the exact bytes, not asked again where it does not exist (respx through the seam)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import respx

from app.core.budget import Policy
from app.core.dialect import Dialect
from app.core.dialects import CHAT, MESSAGES, RESPONSES
from app.core.registry import ModelSpec
from app.core.routes import RouteMatch
from app.core.tenant import key_hash
from app.core.tokens import MessageCounter
from app.service.request import ProxyRequest, RequestOptions
from app.service.upstream_counts import UpstreamCounts
from app.upstream.client import UpstreamClient
from app.upstream.senders import HttpxSender
from tests.api import UPSTREAM, WordCounter

SPEC = ModelSpec(name="claude-x", window_tokens=200_000, max_output_tokens=64_000, encoding="estimate")


def request_of(body: dict[str, Any], dialect: Dialect = MESSAGES, *, key: str = "client-key") -> ProxyRequest:
    return ProxyRequest(
        raw=json.dumps(body).encode(),
        body=body,
        dialect=dialect,
        route=RouteMatch.first(dialect),
        conversation=dialect.parse(body),
        spec=SPEC,
        policy=Policy(),
        counter=MessageCounter(WordCounter()),
        base_url=UPSTREAM,
        options=RequestOptions(),
        tenant=key_hash(key),
        headers=(("x-api-key", key), ("anthropic-version", "2023-06-01"), ("content-length", "999")),
    )


def body(text: str = "hello there") -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 1000, "messages": [{"role": "user", "content": text}]}


def counts(router: respx.Router, **options: Any) -> UpstreamCounts:
    sender = HttpxSender(httpx.AsyncClient(transport=httpx.MockTransport(router.async_handler)))
    return UpstreamCounts(UpstreamClient(sender, base_url=UPSTREAM), **options)


async def test_the_count_is_asked_with_the_clients_headers_and_cached_by_its_bytes() -> None:
    router = respx.Router()
    route = router.post(f"{UPSTREAM}/messages/count_tokens").mock(
        return_value=httpx.Response(200, json={"input_tokens": 1234})
    )
    c = counts(router)
    assert await c.count(request_of(body())) == 1234
    assert await c.count(request_of(body())) == 1234
    assert await c.count(request_of(body("another text"))) == 1234
    assert route.call_count == 2 and (c.calls, c.hits) == (2, 1)
    sent = route.calls[0].request
    assert sent.headers["x-api-key"] == "client-key" and sent.headers["anthropic-version"] == "2023-06-01"
    assert json.loads(sent.content) == {"model": "claude-x", "messages": body()["messages"]}


async def test_another_clients_same_body_is_counted_for_it_not_answered_from_the_cache() -> None:
    router = respx.Router()
    route = router.post(f"{UPSTREAM}/messages/count_tokens").mock(
        return_value=httpx.Response(200, json={"input_tokens": 77})
    )
    c = counts(router)
    assert await c.count(request_of(body(), key="alice")) == 77
    assert await c.count(request_of(body(), key="mallory")) == 77  # no faster answer: no probe
    assert route.call_count == 2 and c.hits == 0
    assert [call.request.headers["x-api-key"] for call in route.calls] == ["alice", "mallory"]


async def test_an_upstream_without_the_endpoint_is_not_asked_again_and_chat_is_never_asked() -> None:
    router = respx.Router()
    route = router.post(f"{UPSTREAM}/responses/input_tokens").mock(return_value=httpx.Response(404))
    c = counts(router)
    responses_body = {"model": "gpt-x", "input": "hi", "max_output_tokens": 100}
    assert await c.count(request_of(responses_body, RESPONSES)) is None
    assert await c.count(request_of({**responses_body, "input": "other"}, RESPONSES)) is None
    assert route.call_count == 1
    assert (
        await c.count(request_of({"model": "m", "messages": [{"role": "user", "content": "x"}]}, CHAT))
        is None
    )
    assert c.calls == 1


async def test_what_is_not_a_count_is_none_and_not_cached() -> None:
    router = respx.Router()
    route = router.post(f"{UPSTREAM}/messages/count_tokens").mock(
        side_effect=[
            httpx.Response(500, json={"error": "boom"}),
            httpx.Response(200, content=b"not json"),
            httpx.Response(200, json={"input_tokens": "many"}),
            httpx.Response(200, json={"input_tokens": 77}),
        ]
    )
    c = counts(router)
    results = [await c.count(request_of(body())) for _ in range(4)]
    assert results == [None, None, None, 77] and route.call_count == 4


async def test_a_slow_count_is_given_up_within_its_time() -> None:
    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200, json={"input_tokens": 1})

    router = respx.Router()
    router.post(f"{UPSTREAM}/messages/count_tokens").mock(side_effect=slow)
    c = counts(router, timeout_s=0.05)
    assert await asyncio.wait_for(c.count(request_of(body())), 2) is None
