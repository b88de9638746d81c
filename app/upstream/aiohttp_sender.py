"""The production sender: requests go straight out on one ``aiohttp.ClientSession``.

Why not httpx's API on aiohttp's pool (``httpx_aiohttp``): that builds an ``httpx.Request`` and an
``httpx.Response`` around every aiohttp exchange, about 0.5 ms of CPU per request on the
benchmark machine, as much as the rest of the proxy's own work on a small request. The seam is
:class:`app.upstream.senders.Sender`; tests that mock the upstream use the httpx sender.

What the session is told, and why:

* no auto headers (``User-Agent``, ``Accept``, ``Accept-Encoding``, ``Content-Type``): the upstream
  sees the client's headers and nothing of ours; in particular it must not be offered gzip the
  client did not ask for, since bodies pass through undecoded (``auto_decompress=False``);
* no cookie jar: one client's upstream cookies must never go out with another client's request;
* no redirects, no environment proxies or netrc (``trust_env=False``): a proxy forwards exactly;
* the pool: ``limit`` connections at once (LLM calls hold theirs for minutes) and idle ones kept
  ``keepalive_s``.

Header values arrive as latin-1 text of the client's bytes; aiohttp writes header text as UTF-8,
so a value whose bytes were UTF-8 is passed as that text (same bytes on the wire) and any other
byte string (obs-text, never sent by an SDK) goes out as the UTF-8 of its latin-1 reading.
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Sequence

import aiohttp
import httpx
import yarl
from multidict import CIMultiDict

from .errors import UpstreamError, UpstreamProtocolError, UpstreamTimeout, UpstreamUnreachable
from .senders import Exchange, WireHeader

SKIPPED_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_SKIPPED: CIMultiDict[None] = CIMultiDict((name, None) for name in SKIPPED_AUTO_HEADERS)


class BareRequest(aiohttp.ClientRequest):
    """aiohttp's request, adding none of its automatic headers (the session's
    ``skip_auto_headers`` says the same; this skips its per-request merge of the skipped names
    into a copy of the headers, ~8 us a request): the names it would add are all skipped, and the
    body's ``Content-Type`` default is skipped by the same set."""

    def update_auto_headers(self, skip_auto_headers: object) -> None:
        self._skip_auto_headers = _SKIPPED


def _text(value: str) -> str:
    """The text aiohttp will write back as the same bytes, when there is one (see module doc)."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):  # obs-text, or an operator's non-latin-1 key
        return value


class _AiohttpExchange:
    __slots__ = ("_response",)

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    @property
    def status_code(self) -> int:
        return self._response.status

    @property
    def raw_headers(self) -> Sequence[WireHeader]:
        return self._response.raw_headers  # a tuple: nothing to copy

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            chunk = await content.readany()
            if not chunk:
                return
            yield chunk

    def arrived(self) -> bytes | None:
        content = self._response.content
        if not content.is_eof() or content.exception() is not None:
            return None
        return content.read_nowait(-1)

    async def aclose(self) -> None:
        # Back to the pool when the body was read to its end; otherwise the connection is closed
        # (aiohttp decides from the protocol's state). Never raises.
        self._response.release()


class AiohttpSender:
    """A sender on its own ``aiohttp.ClientSession``, created on first use (it must be made inside
    the running event loop) and closed by :meth:`aclose`."""

    def __init__(
        self,
        *,
        limit: int = 1000,
        keepalive_s: float = 300.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.limit = limit
        self.keepalive_s = keepalive_s
        # httpx's default context (certifi's CAs, SSL_CERT_FILE/SSL_CERT_DIR honoured), as the
        # httpx transports use: switching transports must not change which upstreams verify.
        self._ssl = ssl_context if ssl_context is not None else httpx.create_ssl_context()
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[float | None, ...], aiohttp.ClientTimeout] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self.limit, keepalive_timeout=self.keepalive_s, ssl=self._ssl
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=SKIPPED_AUTO_HEADERS,
                request_class=BareRequest,
                auto_decompress=False,
                trust_env=False,
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    def client_timeout(self, timeout: httpx.Timeout) -> aiohttp.ClientTimeout:
        """httpx's four timeouts as aiohttp's: ``connect`` covers the wait for a pooled connection
        plus connecting (httpx's ``pool``), ``sock_connect`` the TCP/TLS connect, ``sock_read`` the
        longest wait for any read, headers included; no total (a stream may last for minutes)."""
        key = (timeout.connect, timeout.read, timeout.pool)
        cached = self._timeouts.get(key)
        if cached is None:
            pool = None if timeout.pool is None or timeout.connect is None else timeout.pool + timeout.connect
            cached = aiohttp.ClientTimeout(
                total=None, connect=pool, sock_connect=timeout.connect, sock_read=timeout.read
            )
            if len(self._timeouts) < 64:  # a handful in practice (chat, discovery, probes)
                self._timeouts[key] = cached
        return cached

    async def open(
        self,
        method: str,
        url: str,
        *,
        headers: list[tuple[str, str]],
        content: bytes | AsyncIterable[bytes] | None,
        timeout: httpx.Timeout,
    ) -> Exchange:
        response = await self.session.request(
            method,
            # As given: yarl would otherwise re-quote the client's path and resolve dot segments.
            yarl.URL(url, encoded=True),
            headers=[(name, _text(value)) for name, value in headers],
            data=content if content else None,
            allow_redirects=False,
            compress=None,
            timeout=self.client_timeout(timeout),
        )
        return _AiohttpExchange(response)

    def translate(
        self, exc: BaseException, *, base_url: str | None, reading: bool = False
    ) -> UpstreamError | None:
        """The upstream error for an aiohttp (or socket) error, by type; None for anything else.
        ``reading``: raised while reading the body (the upstream had answered: a broken answer).
        The message says what happened in plain words (:func:`connect_failure`,
        :func:`broken_connection`), never aiohttp's own text (``ssl:default`` on a plain http
        upstream, connector internals)."""
        where = f" ({base_url})" if base_url else ""
        if isinstance(exc, TimeoutError):  # aiohttp's connect/read timeouts are TimeoutErrors too
            return UpstreamTimeout(f"The upstream did not answer in time{where}.", base_url=base_url)
        if not reading and isinstance(
            exc,
            aiohttp.ClientConnectorError
            | aiohttp.ServerDisconnectedError
            | aiohttp.InvalidURL
            | aiohttp.NonHttpUrlClientError,
        ):
            return UpstreamUnreachable(
                f"The upstream is unreachable{where}: {connect_failure(exc)}.", base_url=base_url
            )
        if isinstance(exc, aiohttp.ClientResponseError):
            return UpstreamProtocolError(
                f"The upstream's answer was not valid HTTP{where}.", base_url=base_url
            )
        if isinstance(exc, aiohttp.ClientError | OSError):
            return UpstreamProtocolError(
                f"The upstream broke the connection{where}: {broken_connection(exc)}.", base_url=base_url
            )
        return None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


_OS_REASONS = {
    errno.ECONNREFUSED: "the connection was refused (nothing listens on that port?)",
    errno.EHOSTUNREACH: "no route to its host",
    errno.ENETUNREACH: "its network is unreachable",
    errno.ECONNRESET: "the connection was reset",
    errno.EPIPE: "the connection was closed while sending",
}


def _os_reason(error: OSError | None) -> str | None:
    if error is None:
        return None
    known = _OS_REASONS.get(error.errno or 0)
    if known is not None:
        return known
    return error.strerror.lower() if error.strerror else None


def connect_failure(exc: BaseException) -> str:
    """Why a connection to the upstream could not be made, in words (no aiohttp internals)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name does not resolve"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate was not accepted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return _os_reason(exc.os_error) or "the connection could not be made"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "it closed the connection before answering"
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return "the URL is not a valid http(s) URL"
    return "the connection could not be made"


def broken_connection(exc: BaseException) -> str:
    """How an exchange with the upstream broke off, in words (no aiohttp internals)."""
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "its answer ended before it was complete"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "it closed the connection midway"
    if isinstance(exc, OSError):
        return _os_reason(exc) or "the connection failed"
    return "the connection failed"
