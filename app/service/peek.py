"""Read the opening events of a streamed answer before the client sees any of it, then replay them.

``await read_preamble(response, kinds) -> (response, head)``: reads ``response``'s raw chunks until
``app.core.preamble.preamble_done(head, kinds)`` (or the stream ends) and returns a response that
yields ``head`` first and then the rest of the same stream, byte for byte: nothing is parsed out of
or added to what the client gets. Used for APIs that report an overflow inside a 200 stream
(``app.core.preamble``); the caller closes ``response`` if this raises.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ..core.preamble import preamble_done
from ..upstream.client import UpstreamResponse, WrappedResponse


def is_event_stream(response: UpstreamResponse) -> bool:
    return any(
        name.lower() == "content-type" and value.split(";")[0].strip().lower() == "text/event-stream"
        for name, value in response.headers
    )


class ReplayedResponse(WrappedResponse):
    """``inner`` whose first bytes were read already: ``aiter_raw`` yields them, then the rest."""

    def __init__(self, inner: UpstreamResponse, head: bytes, rest: AsyncIterator[bytes]) -> None:
        super().__init__(inner)
        self._head = head
        self._rest = rest

    async def aread(self) -> bytes:
        return self._head + b"".join([chunk async for chunk in self._rest])

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        if self._head:
            yield self._head
        async for chunk in self._rest:
            yield chunk


async def read_preamble(response: UpstreamResponse, kinds: frozenset[str]) -> tuple[UpstreamResponse, bytes]:
    rest = aiter(response.aiter_raw())
    head = b""
    while not preamble_done(head, kinds):
        try:
            chunk = await anext(rest)
        except StopAsyncIteration:
            break
        head += chunk
    return ReplayedResponse(response, head, rest), head
