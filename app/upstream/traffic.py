"""Client requests first: background calls (summaries) give way on an upstream with few slots.

``Traffic(*, yields, max_preemptions, quiet_s)``: one per ``UpstreamClient``, asked by base URL
(two base URLs of one server are one upstream: ``origin_of``). ``yields(origin) -> bool`` says
whether the upstream at ``origin`` (``scheme://host:port``) is one whose few slots client requests
must not wait behind (``local_origin``: a server on this machine or the local network, where a
model like llama.cpp's serves one or a few requests at a time; the settings may say always or
never). On such an upstream:

* a background call (``await background(base_url, attempt)``) waits, before it is sent, while a
  client request to the same upstream is in flight and until none has been for ``quiet_s`` (a
  pause of the conversation: a client that sends its next request as soon as it has an answer,
  an agent's quick tool call, would cancel a call sent in the gap, and wait while the upstream
  lets go of it), and only one at a time goes to it;
* a client request that starts there (``client(base_url)``) cancels the background calls in
  flight (their attempt, with the message ``PREEMPTED``; counted in ``preempted``): each is sent
  again once the client requests are done, so it lands in a pause of the conversation, at most
  ``max_preemptions`` times in all: the call that client requests cancelled that often raises
  ``UpstreamPreempted`` (a conversation without pauses; counted in ``abandoned``; the summarizer
  backs off its span, so it is not sent again and again, each time holding a slot the next client
  request waits for). The caller's own time limit bounds all of it. So a client request waits on
  a background call for no longer than the upstream takes to let go of a call it was cancelled
  (llama.cpp's server: about a second, to notice the closed connection, and the end of the prompt
  chunk it is processing).

Every other upstream serves both at once: nothing waits and nothing is cancelled. A client
request holds its place from before it is sent until its response is closed (a stream's end
included): ``client(base_url)`` returns a ``Ticket`` to ``release()`` then (idempotent).
``busy(base_url)``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .errors import UpstreamPreempted

T = TypeVar("T")

PREEMPTED = "preempted by a client request"
"""The message a background call's attempt is cancelled with."""

MAX_PREEMPTIONS = 3
"""Cancellations of one background call by client requests after which it is given up."""

QUIET_S = 1.0
"""How long an upstream that yields has had no client request before a background call goes:
longer than the gap between an answer and the next request of a client that does not pause (a
script, an agent's quick tool call), short beside a person's pause."""


def origin_of(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the port spelled out: one server, one origin)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


def local_origin(origin: str) -> bool:
    """True for a server on this machine or the local network: a loopback, private or
    link-local address, ``localhost``, a ``.local``/``.internal`` name or a bare host name."""
    host = urlsplit(origin).hostname or ""
    if _private(host):
        return True
    return host == "localhost" or host.endswith((".localhost", ".local", ".internal")) or "." not in host


def _private(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


@dataclass
class _Upstream:
    clients: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    lane: asyncio.Lock = field(default_factory=asyncio.Lock)
    background: set[asyncio.Future[Any]] = field(default_factory=set)
    released_s: float = -math.inf  # time.monotonic() when the last client request there ended

    def __post_init__(self) -> None:
        self.idle.set()


class Ticket:
    """A client request's place; ``release()`` once its response is closed (extra calls do
    nothing)."""

    __slots__ = ("_released", "_upstream")

    def __init__(self, upstream: _Upstream | None) -> None:
        self._upstream = upstream
        self._released = upstream is None

    def release(self) -> None:
        if self._released or self._upstream is None:
            return
        self._released = True
        upstream = self._upstream
        upstream.clients -= 1
        upstream.released_s = time.monotonic()
        if upstream.clients == 0:
            upstream.idle.set()


class Traffic:
    """Client requests and background calls in flight per upstream (see the module docstring)."""

    def __init__(
        self,
        *,
        yields: Callable[[str], bool] = local_origin,
        max_preemptions: int = MAX_PREEMPTIONS,
        quiet_s: float = QUIET_S,
    ) -> None:
        self.yields = yields
        self.max_preemptions = max(1, max_preemptions)
        self.quiet_s = quiet_s
        # Per base URL (the operator's and its routes': bounded), its upstream's state when it
        # yields, else None: one dict lookup per request.
        self._bases: dict[str, _Upstream | None] = {}
        self._upstreams: dict[str, _Upstream] = {}
        self.preempted = 0
        self.abandoned = 0  # background calls given up after max_preemptions

    def _upstream(self, base_url: str) -> _Upstream | None:
        try:
            return self._bases[base_url]
        except KeyError:
            pass
        origin = origin_of(base_url)
        found = self._upstreams.get(origin)
        if found is None and self.yields(origin):
            found = self._upstreams[origin] = _Upstream()
        self._bases[base_url] = found
        return found

    def client(self, base_url: str) -> Ticket:
        """A client request to the upstream at ``base_url`` starts now: background calls there
        are cancelled."""
        upstream = self._upstream(base_url)
        if upstream is None:
            return Ticket(None)
        upstream.clients += 1
        upstream.idle.clear()
        for task in list(upstream.background):
            if not task.done():
                task.cancel(PREEMPTED)
                self.preempted += 1
        upstream.background.clear()
        return Ticket(upstream)

    def busy(self, base_url: str) -> bool:
        """True while a client request to the upstream at ``base_url`` (one that yields) is in
        flight."""
        upstream = self._upstream(base_url)
        return upstream is not None and upstream.clients > 0

    async def _pause(self, upstream: _Upstream) -> None:
        """Until no client request is in flight at ``upstream`` and none has been for ``quiet_s``."""
        while True:
            while upstream.clients:
                await upstream.idle.wait()
            left_s = upstream.released_s + self.quiet_s - time.monotonic()
            if left_s <= 0:
                return
            await asyncio.sleep(left_s)

    async def background(self, base_url: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` as a background call to the upstream at ``base_url``: on one that yields,
        sent when no client request is in flight (none for ``quiet_s``) and no other background
        call is, and, when a client request cancels it, sent again once that request is done,
        until client requests cancelled it ``max_preemptions`` times: then ``UpstreamPreempted``
        (the caller's time limit bounds it all); elsewhere, at once."""
        upstream = self._upstream(base_url)
        if upstream is None:
            return await attempt()
        for _ in range(self.max_preemptions):
            async with upstream.lane:
                await self._pause(upstream)
                task = asyncio.ensure_future(attempt())
                upstream.background.add(task)
                try:
                    return await task
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if not task.cancelled() or (current is not None and current.cancelling()):
                        raise  # the caller itself was cancelled (its time limit, a shutdown)
                finally:
                    upstream.background.discard(task)
                    if not task.done():
                        task.cancel()
        self.abandoned += 1
        raise UpstreamPreempted(
            f"given up after client requests cancelled it {self.max_preemptions} times", base_url=base_url
        )
