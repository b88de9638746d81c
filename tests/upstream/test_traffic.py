"""Client requests first: on an upstream with few slots, background calls wait and are cancelled."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.upstream.client import UpstreamClient
from app.upstream.errors import UpstreamPreempted
from app.upstream.traffic import Traffic, local_origin, origin_of


def test_local_servers_yield_and_public_ones_do_not() -> None:
    for url in ("http://127.0.0.1:8080", "http://localhost:11434", "http://[::1]:1", "http://10.0.0.7:80"):
        assert local_origin(origin_of(url)), url
    for url in ("http://llama:8080", "http://gpu.local:80", "http://192.168.1.9:80", "http://169.254.1.1:80"):
        assert local_origin(origin_of(url)), url
    for url in ("https://api.openai.com", "https://api.anthropic.com:443", "http://8.8.8.8:80"):
        assert not local_origin(origin_of(url)), url
    assert origin_of("http://H:8080/v1/chat") == origin_of("http://h:8080/other") == "http://h:8080"
    assert origin_of("https://api.example.com/v1") == "https://api.example.com:443"


async def test_a_client_request_cancels_the_background_call_which_is_sent_again_after_it() -> None:
    traffic = Traffic()
    base = "http://127.0.0.1:9/v1"
    attempts: list[asyncio.Event] = []
    release = asyncio.Event()

    async def attempt() -> str:
        started = asyncio.Event()
        attempts.append(started)
        started.set()
        await release.wait()  # a slow local model writing
        return "written"

    call = asyncio.create_task(traffic.background(base, attempt))
    while not attempts:
        await asyncio.sleep(0.01)
    ticket = traffic.client(base)  # the first attempt is cancelled
    await asyncio.sleep(0.1)
    assert traffic.preempted == 1 and traffic.busy(base) and len(attempts) == 1 and not call.done()
    ticket.release()
    ticket.release()  # idempotent
    while len(attempts) < 2:  # sent again once the client request is done
        await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.wait_for(call, 5) == "written"
    assert not traffic.busy(base)


async def test_the_callers_own_cancellation_is_not_a_preemption() -> None:
    traffic = Traffic()
    entered = asyncio.Event()

    async def attempt() -> str:
        entered.set()
        await asyncio.sleep(60)
        return "never"

    call = asyncio.create_task(traffic.background("http://localhost:8080/v1", attempt))
    await entered.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert traffic.preempted == 0


async def test_an_upstream_that_does_not_yield_serves_both_at_once() -> None:
    traffic = Traffic()
    base = "https://api.example.com/v1"
    ticket = traffic.client(base)

    async def attempt() -> str:
        traffic.client(base).release()  # a client request meanwhile: nothing to cancel
        return "written"

    assert await asyncio.wait_for(traffic.background(base, attempt), 5) == "written"
    ticket.release()
    assert traffic.preempted == 0 and not traffic.busy(base)


async def test_the_client_cancels_a_summary_in_flight_and_is_answered_first() -> None:
    release = asyncio.Event()
    seen: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path.endswith("/summary") and not release.is_set():
            await release.wait()  # the one slot is busy with the summary
        return httpx.Response(200, json={"path": request.url.path})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        traffic = Traffic()
        upstream = UpstreamClient(http, base_url="http://127.0.0.1:8080/v1", traffic=traffic)
        summary = asyncio.create_task(
            upstream.send("POST", "summary", content=b"{}", headers=[], stream=False, background=True)
        )
        while not seen:
            await asyncio.sleep(0.01)
        response = await upstream.send("POST", "chat", content=b"{}", headers=[], stream=False)
        assert response.status_code == 200 and traffic.preempted == 1
        release.set()
        assert (await asyncio.wait_for(summary, 5)).status_code == 200  # sent again, answered
        assert seen == ["/v1/summary", "/v1/chat", "/v1/summary"]


async def test_a_background_call_cancelled_too_often_is_given_up_not_sent_again_and_again() -> None:
    traffic = Traffic(max_preemptions=2, quiet_s=0)
    base = "http://127.0.0.1:9/v1"
    attempts: list[asyncio.Event] = []

    async def attempt() -> str:
        attempts.append(asyncio.Event())
        await asyncio.sleep(60)  # a slow local model writing: never done before the next client
        return "never"

    call = asyncio.create_task(traffic.background(base, attempt))
    for sent in (1, 2):
        while len(attempts) < sent:
            await asyncio.sleep(0.01)
        traffic.client(base).release()  # a conversation without pauses: the next client request
    with pytest.raises(UpstreamPreempted, match="cancelled it 2 times"):
        await asyncio.wait_for(call, 5)
    assert len(attempts) == 2 and traffic.preempted == 2 and traffic.abandoned == 1
    assert not traffic.busy(base)


async def test_a_background_call_waits_for_a_pause_not_the_gap_between_two_client_requests() -> None:
    traffic = Traffic(quiet_s=3600)
    base = "http://127.0.0.1:9/v1"
    sent: list[str] = []

    async def attempt() -> str:
        sent.append("summary")
        return "written"

    # No client request has been there yet: nothing to wait for.
    assert await asyncio.wait_for(traffic.background(base, attempt), 5) == "written"
    traffic.client(base).release()  # a client's answer: its next request may follow at once
    call = asyncio.create_task(traffic.background(base, attempt))
    for _ in range(50):
        await asyncio.sleep(0)
    assert sent == ["summary"] and not call.done()  # not sent in the gap
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert traffic.preempted == 0
