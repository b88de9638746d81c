"""Client requests first: on an upstream with few slots, background calls wait and are cancelled."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.upstream.client import UpstreamClient
from app.upstream.traffic import Traffic, local_origin, origin_of, preempted


def test_local_servers_yield_and_public_ones_do_not() -> None:
    for url in ("http://127.0.0.1:8080", "http://localhost:11434", "http://[::1]:1", "http://10.0.0.7:80"):
        assert local_origin(origin_of(url)), url
    for url in ("http://llama:8080", "http://gpu.local:80", "http://192.168.1.9:80", "http://169.254.1.1:80"):
        assert local_origin(origin_of(url)), url
    for url in ("https://api.openai.com", "https://api.anthropic.com:443", "http://8.8.8.8:80"):
        assert not local_origin(origin_of(url)), url
    assert origin_of("http://H:8080/v1/chat") == origin_of("http://h:8080/other") == "http://h:8080"
    assert origin_of("https://api.example.com/v1") == "https://api.example.com:443"


async def test_a_client_request_cancels_the_background_call_and_the_next_one_waits_for_it() -> None:
    traffic = Traffic()
    base = "http://127.0.0.1:9/v1"
    entered = asyncio.Event()

    async def summary_call() -> str:
        async with traffic.background(base):
            entered.set()
            await asyncio.sleep(60)  # a slow local model writing
        return "written"

    call = asyncio.create_task(summary_call())
    await entered.wait()
    ticket = traffic.client(base)
    with pytest.raises(asyncio.CancelledError) as info:
        await call
    assert preempted(info.value) and traffic.preempted == 1 and traffic.busy(base)
    # A background call started now waits while the client request is in flight.
    entered.clear()
    waiting = asyncio.create_task(summary_call())
    await asyncio.sleep(0.1)
    assert not entered.is_set() and not waiting.done()
    ticket.release()
    ticket.release()  # idempotent
    await asyncio.wait_for(entered.wait(), 5)
    assert not traffic.busy(base)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError) as other:
        await waiting
    assert not preempted(other.value)  # cancelled for another reason


async def test_an_upstream_that_does_not_yield_serves_both_at_once() -> None:
    traffic = Traffic()
    base = "https://api.example.com/v1"
    ticket = traffic.client(base)
    async with asyncio.timeout(5), traffic.background(base):
        second = traffic.client(base)  # nothing to cancel
    ticket.release()
    second.release()
    assert traffic.preempted == 0 and not traffic.busy(base)


async def test_the_client_cancels_a_summary_in_flight_and_is_answered() -> None:
    release = asyncio.Event()
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path.endswith("/summary"):
            await release.wait()  # the one slot is busy with the summary
        return httpx.Response(200, json={"path": request.url.path})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        upstream = UpstreamClient(http, base_url="http://127.0.0.1:8080/v1", traffic=Traffic())

        async def summarize() -> int:
            response = await upstream.send(
                "POST", "summary", content=b"{}", headers=[], stream=False, background=True
            )
            return response.status_code

        summary = asyncio.create_task(summarize())
        while not seen:
            await asyncio.sleep(0.01)
        response = await upstream.send("POST", "chat", content=b"{}", headers=[], stream=False)
        assert response.status_code == 200
        with pytest.raises(asyncio.CancelledError) as info:
            await summary
        assert preempted(info.value)
        # Asked again once the client's response is closed: it runs, then the client can go.
        release.set()
        assert await asyncio.wait_for(summarize(), 5) == 200
        assert seen == ["/v1/summary", "/v1/chat", "/v1/summary"]
