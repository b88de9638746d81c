"""Instrumentation in the upstream client: the request ID goes upstream, waits are reported."""

from __future__ import annotations

import httpx
import pytest

from app.upstream.client import UpstreamClient
from app.upstream.errors import UpstreamUnreachable
from app.upstream.instrument import Instrumentation

BASE = "http://u.test/v1"


def client(handler: object, instrumentation: Instrumentation) -> UpstreamClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))  # type: ignore[arg-type]
    return UpstreamClient(http, base_url=BASE, instrumentation=instrumentation)


async def test_sets_the_request_id_and_reports_the_wait() -> None:
    seen: list[httpx.Request] = []
    calls: list[tuple[str, str, float, int | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201)

    upstream = client(
        handler, Instrumentation(request_id=lambda: "rid-1", on_response=lambda *a: calls.append(a))
    )
    response = await upstream.send(
        "GET", "x", query="a=1", content=None, headers=[("X-Request-ID", "client bad id")], stream=False
    )
    assert response.status_code == 201
    assert seen[0].headers.get_list("x-request-id") == ["rid-1"]
    assert len(calls) == 1
    method, url, waited_s, status = calls[0]
    assert (method, url, status) == ("GET", f"{BASE}/x", 201) and waited_s >= 0


async def test_no_request_id_outside_a_request_and_failures_are_reported() -> None:
    calls: list[int | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert "x-request-id" not in request.headers
        raise httpx.ConnectError("refused", request=request)

    upstream = client(
        handler, Instrumentation(request_id=lambda: None, on_response=lambda *a: calls.append(a[3]))
    )
    with pytest.raises(UpstreamUnreachable):
        await upstream.send("GET", "x", content=None, headers=[])
    assert calls == [None]


async def test_a_failing_callback_does_not_fail_the_request() -> None:
    def boom(method: str, url: str, waited_s: float, status: int | None) -> None:
        raise RuntimeError("bug in observability")

    upstream = client(
        lambda r: httpx.Response(200), Instrumentation(request_id=lambda: None, on_response=boom)
    )
    assert (await upstream.send("GET", "x", content=None, headers=[], stream=False)).status_code == 200
