"""The seam under ``UpstreamClient``: a *sender* opens one HTTP exchange with the upstream.

``Sender.open(method, url, *, headers, content, timeout) -> Exchange`` sends the request and
returns when the response headers are in; ``Exchange`` gives the status, the raw headers and the
raw body chunks as they arrive (never decoded), and ``aclose()`` releases the connection. Every
library error comes back through ``Sender.translate`` as an :class:`~app.upstream.errors.UpstreamError`
(or None for an exception that is not a transport failure: a bug, which must stay visible).

Two senders:

* :class:`HttpxSender` over an ``httpx.AsyncClient``, whatever its transport: httpx's own pool,
  ``httpx_aiohttp.AiohttpTransport``, or a test's ``MockTransport``/respx router (the test seam);
* :class:`app.upstream.aiohttp_sender.AiohttpSender` straight on an ``aiohttp.ClientSession``:
  the production default, because httpx's request/response models on top of aiohttp cost about
  0.5 ms of CPU per request (``bench/``), a third of a small request's whole cost in the proxy.

The client never sees which one it has; both must send the headers they are given and nothing
else (no ``User-Agent``, ``Accept-Encoding``... of their own) and never decompress.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Sequence
from typing import Protocol

import httpx

from .errors import UpstreamError, UpstreamProtocolError, UpstreamTimeout, UpstreamUnreachable

WireHeader = tuple[bytes, bytes]


class Exchange(Protocol):
    """One upstream response: headers in, body not yet read."""

    @property
    def status_code(self) -> int: ...

    @property
    def raw_headers(self) -> Sequence[WireHeader]:
        """The response headers as sent, in order (not to be mutated)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The raw body as it arrives (library errors raised as they are; the caller translates)."""
        ...

    def arrived(self) -> bytes | None:
        """The whole raw body when all of it is here already, taken without waiting (a small
        answer comes in the packet of its headers); else None, and nothing is taken."""
        ...

    async def aclose(self) -> None:
        """Release the connection (closed if the body was not read to the end). Never raises."""
        ...


class Sender(Protocol):
    async def open(
        self,
        method: str,
        url: str,
        *,
        headers: list[tuple[str, str]],
        content: bytes | AsyncIterable[bytes] | None,
        timeout: httpx.Timeout,
    ) -> Exchange:
        """Send and return once the response headers are in. ``headers`` are sent as given
        (latin-1 text of the wire bytes), plus ``Host`` and the body's framing."""
        ...

    def translate(
        self, exc: BaseException, *, base_url: str | None, reading: bool = False
    ) -> UpstreamError | None:
        """The upstream error for ``exc`` (``reading``: raised while reading the body), or None."""
        ...

    async def aclose(self) -> None: ...


def wire(text: str) -> bytes:
    """A header name or value back to its wire bytes (they arrive latin-1 decoded)."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # an operator-configured value (the upstream key) outside latin-1
        return text.encode("utf-8")


def translate_httpx(exc: httpx.HTTPError, *, base_url: str | None) -> UpstreamError:
    """The upstream error for an httpx error (structure only: the exception types and causes)."""
    where = f" ({base_url})" if base_url else ""
    cause = exc.__cause__
    # httpx-aiohttp maps every aiohttp ClientConnectionError (refused, DNS) to ConnectTimeout;
    # a cause that is not itself a timeout means the upstream was unreachable, not slow.
    aiohttp_cause = cause is not None and type(cause).__module__.startswith("aiohttp")
    if isinstance(exc, httpx.ConnectTimeout) and aiohttp_cause and not isinstance(cause, TimeoutError):
        return UpstreamUnreachable(f"The upstream is unreachable{where}: {exc}", base_url=base_url)
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"The upstream did not answer in time{where}.", base_url=base_url)
    if isinstance(exc, httpx.ConnectError | httpx.UnsupportedProtocol | httpx.ProxyError):
        return UpstreamUnreachable(f"The upstream is unreachable{where}: {exc}", base_url=base_url)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamProtocolError(f"The upstream broke the connection{where}: {exc}", base_url=base_url)
    return UpstreamProtocolError(f"The upstream request failed{where}: {exc}", base_url=base_url)


def not_http(exc: BaseException, *, base_url: str | None) -> UpstreamError | None:
    """An error a transport let through untranslated (httpx-aiohttp does not map every aiohttp
    error: a status line that is not HTTP raises aiohttp's ``ClientResponseError``), or a raw
    socket error; None for anything else."""
    if type(exc).__module__.split(".")[0] in {"aiohttp", "h11", "httpcore"} or isinstance(exc, OSError):
        where = f" ({base_url})" if base_url else ""
        return UpstreamProtocolError(f"The upstream's answer was not valid HTTP{where}.", base_url=base_url)
    return None


def translate_httpx_side(
    exc: BaseException, *, base_url: str | None, reading: bool = False
) -> UpstreamError | None:
    """What :class:`HttpxSender` translates: httpx's errors, and what its transport let through."""
    if isinstance(exc, httpx.HTTPError):
        return translate_httpx(exc, base_url=base_url)
    return not_http(exc, base_url=base_url)


class Translate(Protocol):
    def __call__(
        self, exc: BaseException, *, base_url: str | None, reading: bool = False
    ) -> UpstreamError | None: ...


class HttpxExchange:
    __slots__ = ("_response",)

    def __init__(self, response: httpx.Response) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status_code

    @property
    def raw_headers(self) -> Sequence[WireHeader]:
        return self._response.headers.raw

    def chunks(self) -> AsyncIterator[bytes]:
        # A transport may hand back an already-read response (test doubles do); its stream still
        # holds the raw bytes, which httpx's aiter_raw would refuse to replay.
        if self._response.is_stream_consumed:
            return aiter(self._response.stream)  # type: ignore[arg-type]
        return self._response.aiter_raw()

    def arrived(self) -> bytes | None:
        return None  # httpx reads through its stream: the chunks, always

    async def aclose(self) -> None:
        # Closing a broken connection raises; there is nothing left to release then.
        with contextlib.suppress(httpx.HTTPError):
            await self._response.aclose()


class HttpxSender:
    """A sender over an ``httpx.AsyncClient``; :meth:`aclose` closes the client only when ``owned``
    (made for this sender), never a client lent by a caller (a test's, the CLI's).

    The request is built directly (``httpx.Request``, not ``AsyncClient.build_request``) so that
    no client default header (``User-Agent: python-httpx``, ``Accept-Encoding``...) is added.
    """

    def __init__(self, http: httpx.AsyncClient, *, owned: bool = False) -> None:
        self.http = http
        self.owned = owned

    async def open(
        self,
        method: str,
        url: str,
        *,
        headers: list[tuple[str, str]],
        content: bytes | AsyncIterable[bytes] | None,
        timeout: httpx.Timeout,
    ) -> Exchange:
        request = httpx.Request(
            method,
            url,
            # As bytes: as str, httpx would insist on ASCII and fail on a client's non-ASCII value.
            headers=[(wire(name), wire(value)) for name, value in headers],
            content=content,
            extensions={"timeout": timeout.as_dict()},
        )
        response = await self.http.send(request, stream=True, follow_redirects=False)
        return HttpxExchange(response)

    def translate(
        self, exc: BaseException, *, base_url: str | None, reading: bool = False
    ) -> UpstreamError | None:
        return translate_httpx_side(exc, base_url=base_url, reading=reading)

    async def aclose(self) -> None:
        if self.owned:
            await self.http.aclose()
