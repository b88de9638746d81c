"""Send one request to the upstream and hand back its streaming response.

``UpstreamClient.send(method, path, *, content, headers, stream, base_url) -> UpstreamResponse``
over a :class:`~app.upstream.senders.Sender` (aiohttp in production, httpx for tests and on
request). ``path`` is relative to the base URL, or from its origin with ``at_origin`` (an API
whose clients send their own versioned path: ``origin_url``); where the operator's key goes is
the caller's ``key_slot`` among the client's ``key_slots`` (``app.upstream.headers``), so nothing
here names an API. No default header of any library is added: the upstream sees the client's headers,
minus hop-by-hop and ``X-Context-*`` (``app.upstream.headers``), plus ``X-Request-ID`` when the
client is instrumented.

The response is opened in streaming mode; the caller must ``aclose()`` it (``async with`` works).
Every library error, whether raised while sending or later while reading the body, is translated
into the tree of ``app.upstream.errors``.

Guards: an optional :class:`~app.upstream.limits.ConcurrencyLimiter` (a slot is taken before
sending and given back when the response is closed) and ``stream_idle_timeout_s``, the longest
silence allowed between two body chunks once the headers are in (``UpstreamTimeout`` after it).
An optional :class:`~app.upstream.instrument.Instrumentation` stamps the request ID and reports
each wait for response headers (observability's hooks; this package does not know them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType

import httpx

from ..core.endpoints import KeySlot
from ..core.tenant import key_hash
from .errors import UpstreamError, UpstreamTimeout
from .headers import DEFAULT_KEY_SLOTS, Header, upstream_query, upstream_request_headers
from .instrument import Instrumentation
from .limits import ConcurrencyLimiter, Slot
from .senders import (
    Exchange,
    HttpxExchange,
    HttpxSender,
    Sender,
    Translate,
    WireHeader,
    translate_httpx_side,
)
from .traffic import Ticket, Traffic


def route_base_url(model: str | None, *, routes: Mapping[str, str], default: str) -> str:
    """The base URL for ``model``: an exact key, else the longest key that prefixes it, else ``default``."""
    if model:
        if model in routes:
            return routes[model]
        best = max((key for key in routes if key and model.startswith(key)), key=len, default=None)
        if best is not None:
            return routes[best]
    return default


def join_url(base_url: str, path: str, query: str = "") -> str:
    """``base_url`` + ``/path`` (exactly one slash between) + ``?query`` when there is one."""
    url = base_url.rstrip("/") + "/" + path.lstrip("/")
    return f"{url}?{query}" if query else url


def origin_url(base_url: str, path: str, query: str = "") -> str:
    """``path`` (from the root) at ``base_url``'s origin (scheme, host and port; the base URL's own
    path is dropped) + ``?query`` when there is one."""
    scheme, sep, rest = base_url.partition("://")
    origin = f"{scheme}{sep}{rest.split('/', 1)[0]}" if sep else base_url.split("/", 1)[0]
    return join_url(origin, path, query)


class UpstreamResponse:
    """An upstream answer: status and headers now, the body as it arrives (raw, never decoded).

    ``aread()`` reads the whole raw body once and keeps it; ``aiter_raw()`` then replays it, so a
    body read to classify an error can still be passed back as is. ``decoded_body()`` gives the
    read body with its ``Content-Encoding`` undone, for the error classifier only.
    """

    def __init__(
        self,
        exchange: Exchange,
        *,
        translate: Translate,
        base_url: str,
        idle_timeout_s: float | None = None,
        slot: Slot | None = None,
        ticket: Ticket | None = None,
    ) -> None:
        self._exchange = exchange
        self._translate = translate
        self.base_url = base_url
        self._body: bytes | None = None
        self._idle_timeout_s = idle_timeout_s
        self._slot = slot
        self._ticket = ticket
        self._closed = False

    @classmethod
    def of_httpx(cls, response: httpx.Response, *, base_url: str) -> UpstreamResponse:
        """An already-made ``httpx.Response`` as an upstream response (tests build them)."""
        return cls(HttpxExchange(response), translate=translate_httpx_side, base_url=base_url)

    @property
    def status_code(self) -> int:
        return self._exchange.status_code

    @property
    def headers(self) -> list[Header]:
        """Raw response headers in order, latin-1 decoded (the HTTP/1.1 wire encoding)."""
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._exchange.raw_headers]

    @property
    def raw_headers(self) -> Sequence[WireHeader]:
        """The response headers as they came, bytes, in order (not to be mutated)."""
        return self._exchange.raw_headers

    @property
    def body(self) -> bytes | None:
        """The raw body if it was read with :meth:`aread`, else None."""
        return self._body

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` ran (or :meth:`aread` found the whole body already here)."""
        return self._closed

    async def aread(self) -> bytes:
        """The whole raw body, read once and kept. A body that is all here already is taken at
        once and the connection released (there is nothing left to wait for)."""
        if self._body is None:
            arrived = self._exchange.arrived()
            if arrived is not None:
                self._body = arrived
                await self.aclose()
                return arrived
            chunks = [chunk async for chunk in self._iter_wire()]
            self._body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return self._body

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The raw body as it arrives (or as read), without re-encoding or decompressing."""
        if self._body is not None:
            if self._body:
                yield self._body
            return
        async for chunk in self._iter_wire():
            yield chunk

    async def _iter_wire(self) -> AsyncIterator[bytes]:
        chunks = self._exchange.chunks()
        idle_timeout_s = self._idle_timeout_s
        while True:
            idle = asyncio.timeout(idle_timeout_s) if idle_timeout_s is not None else None
            try:
                # The timeout covers the wait only, never a yield (a suspended consumer is not idle).
                if idle is None:
                    chunk = await anext(chunks)
                else:
                    async with idle:
                        chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except Exception as exc:
                if idle is not None and idle.expired():
                    raise UpstreamTimeout(
                        f"The upstream sent nothing for {idle_timeout_s:g} s in the middle of its answer"
                        f" ({self.base_url}).",
                        base_url=self.base_url,
                    ) from exc
                raise self._translated(exc) from exc
            if chunk:
                yield chunk

    def _translated(self, exc: Exception) -> Exception:
        error = self._translate(exc, base_url=self.base_url, reading=True)
        return exc if error is None else error

    def decoded_body(self) -> bytes:
        """The body read by :meth:`aread` with its ``Content-Encoding`` undone (b"" if unread)."""
        if not self._body:
            return self._body or b""
        headers = self._exchange.raw_headers
        if not any(name.lower() == b"content-encoding" for name, _ in headers):
            return self._body  # nothing to undo
        try:
            return httpx.Response(self.status_code, headers=headers, content=self._body).content
        except httpx.DecodingError:
            return self._body

    async def aclose(self) -> None:
        """Close the upstream response (and its connection if unread). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._exchange.aclose()
        finally:
            if self._slot is not None:
                self._slot.release()
            if self._ticket is not None:
                self._ticket.release()

    async def __aenter__(self) -> UpstreamResponse:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class WrappedResponse(UpstreamResponse):
    """An upstream response that delegates every member to ``inner``; subclasses override what
    they change (how the body is iterated or read)."""

    def __init__(self, inner: UpstreamResponse) -> None:
        # Not calling super().__init__: every member is delegated to ``inner``.
        self._inner = inner
        self.base_url = inner.base_url

    @property
    def status_code(self) -> int:
        return self._inner.status_code

    @property
    def headers(self) -> list[Header]:
        return self._inner.headers

    @property
    def raw_headers(self) -> Sequence[WireHeader]:
        return self._inner.raw_headers

    @property
    def body(self) -> bytes | None:
        return self._inner.body

    @property
    def closed(self) -> bool:
        return self._inner.closed

    async def aread(self) -> bytes:
        return await self._inner.aread()

    def decoded_body(self) -> bytes:
        return self._inner.decoded_body()

    def aiter_raw(self) -> AsyncIterator[bytes]:
        return self._inner.aiter_raw()

    async def aclose(self) -> None:
        await self._inner.aclose()


class UpstreamClient:
    """Sends requests to the upstream through one shared sender (owned by the app).

    ``http`` is a :class:`~app.upstream.senders.Sender` or an ``httpx.AsyncClient`` (wrapped in
    :class:`~app.upstream.senders.HttpxSender`: the test seam). ``api_key`` (when set) replaces
    the client's Authorization; ``routes`` maps a model name or prefix to another base URL
    (:func:`route_base_url`); ``timeout`` applies to every request; ``limiter`` caps concurrent
    requests (probes are not counted); ``stream_idle_timeout_s`` bounds the silence between body
    chunks; ``instrumentation`` stamps request IDs and reports waits. ``key_slots``: every place a
    client's key may travel (the served APIs', ``app.core.routes.key_slots``), all cleared when
    ``api_key`` replaces the client's. ``traffic``: client requests first on an upstream with few
    slots (``app.upstream.traffic``): a ``background`` send gives way to them.
    """

    def __init__(
        self,
        http: Sender | httpx.AsyncClient,
        *,
        base_url: str,
        api_key: str | None = None,
        routes: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
        limiter: ConcurrencyLimiter | None = None,
        stream_idle_timeout_s: float | None = None,
        instrumentation: Instrumentation | None = None,
        key_slots: tuple[KeySlot, ...] = DEFAULT_KEY_SLOTS,
        traffic: Traffic | None = None,
    ) -> None:
        self.key_slots = key_slots
        self.traffic = traffic
        self.sender: Sender = HttpxSender(http) if isinstance(http, httpx.AsyncClient) else http
        self.base_url = base_url
        self._api_key = api_key
        self.routes: dict[str, str] = dict(routes or {})
        self._timeout = timeout or httpx.Timeout(10.0, read=600.0)
        self.limiter = limiter
        self._idle_timeout_s = stream_idle_timeout_s
        self.instrumentation = instrumentation

    @property
    def has_api_key(self) -> bool:
        """True when the operator's key replaces the clients' (never the key itself)."""
        return self._api_key is not None

    def credential_of(self, tenant: str) -> str:
        """Whose key the upstream sees on a request of ``tenant`` (``app.core.tenant``): the
        operator's key's hash when it replaces the clients', else ``tenant`` (the client's own).
        What an upstream refuses for the credential (401, 403) is kept per this value."""
        return key_hash(self._api_key) if self._api_key is not None else tenant

    def base_url_for(self, model: str | None) -> str:
        if not self.routes:
            return self.base_url
        return route_base_url(model, routes=self.routes, default=self.base_url)

    def base_urls(self) -> tuple[str, ...]:
        """Every distinct upstream this client may talk to, the default first."""
        return tuple(dict.fromkeys([self.base_url, *self.routes.values()]))

    async def send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | AsyncIterable[bytes] | None,
        headers: Iterable[Header],
        stream: bool = True,
        base_url: str | None = None,
        query: str = "",
        timeout: httpx.Timeout | None = None,
        content_length: int | None = None,
        limited: bool = True,
        key_slot: KeySlot | None = None,
        at_origin: bool = False,
        background: bool = False,
    ) -> UpstreamResponse:
        """Send and return the response with its body unread (``stream=True``) or read.

        ``path`` is relative to the base URL (``"chat/completions"``), or from its origin when
        ``at_origin``; ``headers`` and ``query`` are the client's, filtered here. A streamed
        ``content`` goes out chunked unless ``content_length`` (the client's declared length) is
        given. Raises an :class:`UpstreamError`, never a library's error (``UpstreamBusy`` when
        ``limited`` and the concurrency cap stays full). ``key_slot``: where the operator's key goes
        (``upstream.headers``; None: where the client put its own). Neither the query nor a key is
        reported to the instrumentation (only the endpoint). ``background`` (a summary call, read
        whole: ``stream=False``, its ``content`` bytes): on an upstream that yields to client
        requests it waits for them, and a client request cancels it and it is sent again after
        (``traffic``); any other send is a client request there.
        """
        base = base_url or self.base_url
        instrumentation = self.instrumentation
        rid = instrumentation.request_id() if instrumentation is not None else None
        api_key = self._api_key
        if api_key is not None:
            headers = list(headers)
            slots = self.key_slots
            forwarded = upstream_request_headers(
                headers, api_key=api_key, request_id=rid, key_slot=key_slot, key_slots=slots, query=query
            )
            query = upstream_query(query, headers, api_key=api_key, key_slot=key_slot, key_slots=slots)
        else:
            forwarded = upstream_request_headers(headers, request_id=rid)
        if content_length is not None and not isinstance(content, bytes):
            forwarded.append(("Content-Length", str(content_length)))
        endpoint = origin_url(base, path) if at_origin else join_url(base, path)
        url = f"{endpoint}?{query}" if query else endpoint
        traffic = self.traffic
        if traffic is None:
            return await self._open(method, endpoint, url, forwarded, content, base, stream, timeout, limited)
        if background:
            return await traffic.background(
                base,
                lambda: self._open(method, endpoint, url, forwarded, content, base, stream, timeout, limited),
            )
        ticket = traffic.client(base)
        return await self._open(
            method, endpoint, url, forwarded, content, base, stream, timeout, limited, ticket=ticket
        )

    async def _open(
        self,
        method: str,
        endpoint: str,
        url: str,
        forwarded: list[Header],
        content: bytes | AsyncIterable[bytes] | None,
        base: str,
        stream: bool,
        timeout: httpx.Timeout | None,
        limited: bool,
        *,
        ticket: Ticket | None = None,
    ) -> UpstreamResponse:
        """``send``'s exchange: the concurrency slot and the traffic ticket are held from here
        until the response is closed."""
        instrumentation = self.instrumentation
        slot = await self.limiter.acquire() if limited and self.limiter is not None else None
        started_s = time.perf_counter()
        status: int | None = None
        try:
            exchange = await self.sender.open(
                method, url, headers=forwarded, content=content, timeout=timeout or self._timeout
            )
            status = exchange.status_code
        except BaseException as exc:
            if slot is not None:
                slot.release()
            if ticket is not None:
                ticket.release()
            error = self.sender.translate(exc, base_url=base) if isinstance(exc, Exception) else None
            if error is not None:
                raise error from exc
            raise
        finally:
            if instrumentation is not None:
                instrumentation.report(method, endpoint, time.perf_counter() - started_s, status)
        upstream = UpstreamResponse(
            exchange,
            translate=self.sender.translate,
            base_url=base,
            idle_timeout_s=self._idle_timeout_s,
            slot=slot,
            ticket=ticket,
        )
        if not stream:
            try:
                await upstream.aread()
            finally:
                await upstream.aclose()
        return upstream

    async def probe(self, base_url: str, *, timeout_s: float) -> int | None:
        """``GET {base_url}/models``: the status of any HTTP answer, or None when unreachable."""
        headers: list[Header] = []
        try:
            response = await self.send(
                "GET",
                "models",
                content=None,
                headers=headers,
                stream=False,
                base_url=base_url,
                timeout=httpx.Timeout(timeout_s),
                limited=False,
            )
        except UpstreamError:
            return None
        return response.status_code
