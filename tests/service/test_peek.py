"""Reading a stream's preamble and replaying it: the client gets the same bytes, in order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from app.core.dialects import RESPONSES
from app.service.peek import is_event_stream, read_preamble
from app.upstream.client import UpstreamResponse

CREATED = b'event: response.created\ndata: {"type":"response.created"}\n\n'
DELTA = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'
DONE = b'event: response.completed\ndata: {"type":"response.completed"}\n\n'


def stream(chunks: list[bytes]) -> UpstreamResponse:
    async def gen() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    raw = httpx.Response(200, headers={"content-type": "text/event-stream; charset=utf-8"}, content=gen())
    return UpstreamResponse.of_httpx(raw, base_url="http://upstream.test/v1")


async def test_the_head_stops_at_the_first_event_past_the_preamble_and_is_replayed() -> None:
    chunks = [CREATED[:10], CREATED[10:], DELTA[:5], DELTA[5:] + DONE[:7], DONE[7:]]
    upstream = stream(chunks)
    assert is_event_stream(upstream)
    replayed, head = await read_preamble(upstream, RESPONSES.preamble_events)
    assert head.startswith(CREATED + DELTA) and len(head) < len(CREATED + DELTA + DONE)
    assert b"".join([chunk async for chunk in replayed.aiter_raw()]) == CREATED + DELTA + DONE
    assert replayed.status_code == 200 and replayed.headers == upstream.headers
    await replayed.aclose()


async def test_a_stream_that_ends_in_its_preamble_is_all_head() -> None:
    replayed, head = await read_preamble(stream([CREATED]), RESPONSES.preamble_events)
    assert head == CREATED
    assert b"".join([chunk async for chunk in replayed.aiter_raw()]) == CREATED
    await replayed.aclose()
