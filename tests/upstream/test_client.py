"""UpstreamClient over injected transports: URLs, headers, streaming, replay, error translation."""

from __future__ import annotations

import gzip
import socket
from collections.abc import AsyncIterator

import aiohttp
import httpx
import pytest
import respx
from httpx_aiohttp import AiohttpTransport

from app.core.endpoints import AUTHORIZATION, KeySlot
from app.upstream.client import (
    UpstreamClient,
    UpstreamResponse,
    WrappedResponse,
    join_url,
    origin_url,
    route_base_url,
)
from app.upstream.errors import UpstreamProtocolError, UpstreamTimeout, UpstreamUnreachable
from app.upstream.senders import translate_httpx as translate

BASE = "http://up.test/v1"


def test_route_base_url_exact_then_longest_prefix_then_default() -> None:
    routes = {"llama": "http://a", "llama-3.1": "http://b", "llama-3.1-8b": "http://c"}
    assert route_base_url("llama-3.1-8b", routes=routes, default="http://d") == "http://c"
    assert route_base_url("llama-3.1-70b", routes=routes, default="http://d") == "http://b"
    assert route_base_url("llama-2", routes=routes, default="http://d") == "http://a"
    assert route_base_url("gpt-4o", routes=routes, default="http://d") == "http://d"
    assert route_base_url(None, routes=routes, default="http://d") == "http://d"


def test_join_url() -> None:
    assert join_url("http://u/v1/", "/models", "a=1") == "http://u/v1/models?a=1"
    assert join_url("http://u/v1", "chat/completions") == "http://u/v1/chat/completions"


def test_origin_url_keeps_scheme_host_and_port_only() -> None:
    assert origin_url("http://h:8/v1", "/v1beta/models/g:generate", "alt=sse") == (
        "http://h:8/v1beta/models/g:generate?alt=sse"
    )
    assert origin_url("https://h/a/b/", "/x") == "https://h/x"


async def test_a_request_sent_at_the_origin_with_its_key_in_the_query() -> None:
    query_key = KeySlot("key", in_query=True)
    router = respx.Router()
    route = router.post(url__regex=r"http://up\.test/v1beta/.*").mock(return_value=httpx.Response(200))
    upstream = client_for(router, api_key="sk-op", key_slots=(AUTHORIZATION, KeySlot("x-goog"), query_key))
    await upstream.send(
        "POST",
        "/v1beta/models/g%20x:generate",
        content=b"{}",
        headers=[("x-goog", "proxy-key"), ("Accept", "*/*")],
        query="key=proxy-key&alt=sse",
        stream=False,
        key_slot=query_key,
        at_origin=True,
    )
    sent = route.calls[0].request
    assert sent.url.raw_path == b"/v1beta/models/g%20x:generate?alt=sse&key=sk-op"
    assert "x-goog" not in sent.headers and "authorization" not in sent.headers


def client_for(router: respx.Router, **kwargs: object) -> UpstreamClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(router.handler))
    return UpstreamClient(http, base_url=BASE, **kwargs)  # type: ignore[arg-type]


async def test_send_adds_no_client_default_headers_and_filters_the_clients() -> None:
    router = respx.Router()
    route = router.post(f"{BASE}/chat/completions").mock(return_value=httpx.Response(200, content=b"ok"))
    upstream = client_for(router, api_key="sk-op")
    response = await upstream.send(
        "POST",
        "chat/completions",
        content=b"{}",
        headers=[("Authorization", "Bearer c"), ("X-Context-Budget", "1"), ("Connection", "close")],
        stream=False,
    )
    sent = route.calls[0].request
    assert {k.lower() for k in sent.headers} == {"host", "content-length", "authorization"}
    assert sent.headers["authorization"] == "Bearer sk-op"
    assert response.status_code == 200 and response.body == b"ok"


async def test_stream_yields_raw_bytes_as_they_come_and_read_body_replays() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for part in (b"a", b"b", b"c"):
            yield part

    router = respx.Router()
    router.get(f"{BASE}/x").mock(side_effect=lambda r: httpx.Response(200, content=chunks()))
    upstream = client_for(router)
    async with await upstream.send("GET", "x", content=None, headers=[]) as response:
        assert response.body is None
        assert [c async for c in response.aiter_raw()] == [b"a", b"b", b"c"]

    async with await upstream.send("GET", "x", content=None, headers=[]) as response:
        assert await response.aread() == b"abc"
        assert [c async for c in response.aiter_raw()] == [b"abc"]


async def test_decoded_body_undoes_gzip_but_the_raw_body_stays_compressed() -> None:
    payload = b'{"error":{"code":"context_length_exceeded"}}'
    router = respx.Router()
    router.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(400, content=gzip.compress(payload), headers={"content-encoding": "gzip"})
    )
    response = await client_for(router).send("POST", "chat/completions", content=b"{}", headers=[])
    raw = await response.aread()
    assert gzip.decompress(raw) == payload
    assert response.decoded_body() == payload
    await response.aclose()


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (httpx.ConnectError("refused"), UpstreamUnreachable),
        (httpx.ConnectTimeout("slow connect"), UpstreamTimeout),
        (httpx.ReadTimeout("slow"), UpstreamTimeout),
        (httpx.PoolTimeout("pool"), UpstreamTimeout),
        (httpx.RemoteProtocolError("bad"), UpstreamProtocolError),
        (httpx.ReadError("reset"), UpstreamProtocolError),
    ],
)
async def test_send_translates_transport_errors(error: httpx.HTTPError, kind: type[Exception]) -> None:
    router = respx.Router()
    router.post(f"{BASE}/chat/completions").mock(side_effect=error)
    with pytest.raises(kind):
        await client_for(router).send("POST", "chat/completions", content=b"{}", headers=[])


def test_aiohttp_connection_refused_mapped_to_connect_timeout_is_unreachable() -> None:
    # httpx-aiohttp turns every aiohttp ClientConnectionError into httpx.ConnectTimeout.
    cause = aiohttp.ClientConnectionError("Cannot connect")
    mapped = httpx.ConnectTimeout("Cannot connect")
    mapped.__cause__ = cause
    assert isinstance(translate(mapped, base_url=BASE), UpstreamUnreachable)
    timeout = httpx.ConnectTimeout("timeout")
    timeout.__cause__ = aiohttp.ConnectionTimeoutError("timeout")
    assert isinstance(translate(timeout, base_url=BASE), UpstreamTimeout)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
async def test_real_transports_report_a_closed_loopback_port_as_unreachable(transport: str) -> None:
    real: httpx.AsyncBaseTransport = (
        AiohttpTransport() if transport == "aiohttp" else httpx.AsyncHTTPTransport()
    )
    async with httpx.AsyncClient(transport=real) as http:
        upstream = UpstreamClient(http, base_url=f"http://127.0.0.1:{closed_port()}/v1")
        with pytest.raises(UpstreamUnreachable):
            await upstream.send("GET", "models", content=None, headers=[])
        assert await upstream.probe(upstream.base_url, timeout_s=2.0) is None


async def test_probe_counts_any_http_answer_as_reachable() -> None:
    router = respx.Router()
    router.get(f"{BASE}/models").mock(return_value=httpx.Response(404))
    assert await client_for(router).probe(BASE, timeout_s=1.0) == 404


async def test_a_wrapped_response_delegates_every_member_to_the_one_it_wraps() -> None:
    inner = UpstreamResponse.of_httpx(
        httpx.Response(418, headers={"x-kind": "teapot"}, content=b"short and stout"),
        base_url="http://upstream.test/v1",
    )
    wrapped = WrappedResponse(inner)
    assert wrapped.status_code == 418 and wrapped.base_url == "http://upstream.test/v1"
    assert ("x-kind", "teapot") in wrapped.headers
    assert await wrapped.aread() == b"short and stout" and wrapped.body == b"short and stout"
    assert wrapped.decoded_body() == b"short and stout"
    assert b"".join([chunk async for chunk in wrapped.aiter_raw()]) == b"short and stout"
    await wrapped.aclose()
    assert inner._closed
