"""AiohttpSender under UpstreamClient, against a raw loopback server that records the wire bytes."""

from __future__ import annotations

import asyncio
import errno
import gzip
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace

import aiohttp
import httpx
import pytest

from app.upstream.aiohttp_sender import AiohttpSender, broken_connection, connect_failure
from app.upstream.client import UpstreamClient
from app.upstream.errors import UpstreamProtocolError, UpstreamTimeout, UpstreamUnreachable

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """Reads one request per connection turn (headers + Content-Length or chunked body), records
    its raw bytes, and lets ``answer`` write whatever it likes."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lower = head.lower()
                body = b""
                if b"content-length:" in lower:
                    length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
                    body = await reader.readexactly(length)
                elif b"transfer-encoding: chunked" in lower:
                    while True:
                        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                        data = await reader.readexactly(size + 2)
                        body += data[:-2]
                        if size == 0:
                            break
                self.requests.append(head + body)
                await self.answer(head + body, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def reply(status: int, body: bytes, *headers: bytes) -> Answer:
    async def answer(_request: bytes, writer: asyncio.StreamWriter) -> None:
        extra = b"".join(h + b"\r\n" for h in headers)
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), extra, body))

    return answer


def header_lines(raw: bytes) -> list[bytes]:
    return raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]


async def test_sends_the_clients_headers_and_nothing_of_its_own() -> None:
    server = RawServer(reply(200, b"ok"))
    sender = AiohttpSender()
    try:
        async with server as base:
            upstream = UpstreamClient(sender, base_url=base, api_key="sk-op")
            response = await upstream.send(
                "POST",
                "chat/completions",
                content=b"{}",
                headers=[
                    ("Authorization", "Bearer client"),
                    ("X-Title", "caf\xc3\xa9"),  # the latin-1 reading of UTF-8 bytes, as ASGI gives it
                    ("X-Context-Budget", "1"),
                    ("Connection", "close"),
                ],
                stream=False,
            )
    finally:
        await sender.aclose()
    assert response.status_code == 200 and response.body == b"ok"
    names = sorted(line.split(b":")[0].lower() for line in header_lines(server.requests[0]))
    assert names == [b"authorization", b"content-length", b"host", b"x-title"]
    assert b"X-Title: caf\xc3\xa9" in header_lines(server.requests[0])  # the same bytes
    assert b"Authorization: Bearer sk-op" in header_lines(server.requests[0])
    assert server.requests[0].endswith(b"\r\n\r\n{}")


async def test_compressed_bodies_pass_undecoded_and_decode_for_classification() -> None:
    payload = b'{"error":{"code":"context_length_exceeded"}}'
    server = RawServer(reply(400, gzip.compress(payload), b"Content-Encoding: gzip"))
    sender = AiohttpSender()
    try:
        async with server as base:
            response = await UpstreamClient(sender, base_url=base).send(
                "POST", "chat/completions", content=b"{}", headers=[], stream=False
            )
    finally:
        await sender.aclose()
    assert gzip.decompress(response.body or b"") == payload
    assert response.decoded_body() == payload
    assert ("Content-Encoding", "gzip") in response.headers


async def test_streams_chunks_as_they_arrive_and_reuses_the_connection() -> None:
    release = asyncio.Event()

    async def answer(_request: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")

    server = RawServer(answer)
    sender = AiohttpSender()
    try:
        async with server as base:
            upstream = UpstreamClient(sender, base_url=base)
            for _ in range(2):
                release.clear()
                async with await upstream.send("GET", "x", content=None, headers=[]) as response:
                    chunks = response.aiter_raw()
                    assert await anext(chunks) == b"first"  # before the rest is even sent
                    release.set()
                    assert [c async for c in chunks] == [b"second"]
    finally:
        await sender.aclose()
    assert server.connections == 1  # read to the end: back to the pool


async def test_a_body_that_is_all_here_is_taken_at_once_and_the_rest_waits_for_its_chunks() -> None:
    release = asyncio.Event()

    async def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
        if b"/late" in request.split(b"\r\n", 1)[0]:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
            await writer.drain()
            await release.wait()
            writer.write(b"-rest")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwhole")

    server = RawServer(answer)
    sender = AiohttpSender()
    try:
        async with server as base:
            upstream = UpstreamClient(sender, base_url=base)
            response = await upstream.send("GET", "now", content=None, headers=[])
            await asyncio.sleep(0.05)  # the body is in, with its headers
            assert not response.closed
            assert await response.aread() == b"whole"
            assert response.closed  # released at once: nothing left to wait for
            assert [c async for c in response.aiter_raw()] == [b"whole"]
            late = await upstream.send("GET", "late", content=None, headers=[])
            reading = asyncio.ensure_future(late.aread())
            await asyncio.sleep(0.05)
            assert not reading.done()  # half of it: read as it comes, not taken
            release.set()
            assert await reading == b"first-rest"
            await late.aclose()
    finally:
        await sender.aclose()
    assert server.connections == 1


async def test_a_streamed_request_body_goes_chunked_or_with_the_declared_length() -> None:
    async def body() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    server = RawServer(reply(204, b""))
    sender = AiohttpSender()
    try:
        async with server as base:
            upstream = UpstreamClient(sender, base_url=base)
            await upstream.send("POST", "files", content=body(), headers=[], stream=False)
            await upstream.send("POST", "files", content=body(), headers=[], stream=False, content_length=4)
    finally:
        await sender.aclose()
    chunked, declared = server.requests
    assert b"Transfer-Encoding: chunked" in header_lines(chunked) and chunked.endswith(b"abcd")
    assert b"Content-Length: 4" in header_lines(declared) and declared.endswith(b"\r\n\r\nabcd")


async def test_upstream_cookies_are_not_kept() -> None:
    server = RawServer(reply(200, b"ok", b"Set-Cookie: session=secret; Path=/"))
    sender = AiohttpSender()
    try:
        async with server as base:
            upstream = UpstreamClient(sender, base_url=base)
            for _ in range(2):
                await upstream.send("GET", "models", content=None, headers=[], stream=False)
    finally:
        await sender.aclose()
    assert all(b"cookie" not in r.lower() for r in server.requests)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_errors_are_translated() -> None:
    sender = AiohttpSender()
    try:
        upstream = UpstreamClient(sender, base_url=f"http://127.0.0.1:{closed_port()}/v1")
        with pytest.raises(UpstreamUnreachable) as refused:
            await upstream.send("GET", "models", content=None, headers=[])
        # Plain words, the upstream named, none of aiohttp's own text ("ssl:default", "Cannot
        # connect to host") for a plain http upstream.
        assert "the connection was refused" in str(refused.value)
        assert "ssl" not in str(refused.value).lower() and "Cannot connect" not in str(refused.value)

        async def garbage(_request: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            writer.close()

        async with RawServer(garbage) as base:
            with pytest.raises(UpstreamProtocolError):
                await UpstreamClient(sender, base_url=base).send("GET", "x", content=None, headers=[])

        async def cut(_request: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            await writer.drain()
            writer.close()

        async with RawServer(cut) as base:
            response = await UpstreamClient(sender, base_url=base).send("GET", "x", content=None, headers=[])
            with pytest.raises(UpstreamProtocolError):
                await response.aread()
            await response.aclose()

        async def silent(_request: bytes, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(5)

        async with RawServer(silent) as base:
            quick = UpstreamClient(sender, base_url=base, timeout=httpx.Timeout(5.0, read=0.2))
            with pytest.raises(UpstreamTimeout):
                await quick.send("GET", "x", content=None, headers=[])
    finally:
        await sender.aclose()


def test_connect_and_broken_connection_reasons_are_worded_without_aiohttp_internals() -> None:
    key = SimpleNamespace(host="upstream.example", port=443, ssl=True)
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    assert connect_failure(aiohttp.ClientConnectorError(key, refused)) == (  # type: ignore[arg-type]
        "the connection was refused (nothing listens on that port?)"
    )
    dns = aiohttp.ClientConnectorDNSError(key, OSError(-2, "Name or service not known"))  # type: ignore[arg-type]
    assert connect_failure(dns) == "its host name does not resolve"
    odd = aiohttp.ClientConnectorError(key, OSError(errno.EACCES, "Permission denied"))  # type: ignore[arg-type]
    assert connect_failure(odd) == "permission denied"
    assert connect_failure(aiohttp.ServerDisconnectedError()) == "it closed the connection before answering"
    assert broken_connection(aiohttp.ClientPayloadError("Response payload is not completed")) == (
        "its answer ended before it was complete"
    )
    assert broken_connection(ConnectionResetError(errno.ECONNRESET, "reset")) == "the connection was reset"
    error = AiohttpSender().translate(
        aiohttp.ClientConnectorError(key, refused),  # type: ignore[arg-type]
        base_url="http://upstream.example/v1",
    )
    assert isinstance(error, UpstreamUnreachable)
    assert str(error) == (
        "The upstream is unreachable (http://upstream.example/v1): the connection was refused "
        "(nothing listens on that port?)."
    )
