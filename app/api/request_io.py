"""Reading a request and writing a JSON answer: the small helpers every route shares.

``service_of(request)`` the app's ``Service``; ``raw_headers(request)`` the headers as sent
(order and case kept); ``read_body(request, *, limit_bytes)`` the whole body within a limit
(``BodyTooLarge`` as soon as it is known to be over), ``receive_body(receive, headers, *,
limit_bytes)`` the same straight from the ASGI ``receive`` (the fitted routes' path: no
``Request`` stream); ``json_response(data, *, status)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive

from ..service.driver import Service
from ..service.request import RequestOptions
from ..upstream.headers import CONTEXT_PREFIX, Header, is_json_type, labelled_json
from ..wire import dump_document
from .errors import BodyTooLarge
from .headers import NO_OPTIONS, options_of


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def raw_headers(request: Request) -> list[Header]:
    return decoded_headers(request.scope["headers"])


def decoded_headers(raw: Sequence[tuple[bytes, bytes]]) -> list[Header]:
    """ASGI header pairs as text (latin-1: the HTTP/1.1 wire encoding), order and case kept."""
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What a fitted route reads of a request's ASGI headers, in one pass (:func:`request_head`):
    ``headers`` decoded and labelled JSON (``labelled_json(decoded_headers(raw))``), ``options``
    (``app.api.headers.options_of``) and the declared ``Content-Length`` (:func:`declared_length`)."""

    headers: list[Header]
    options: RequestOptions
    declared_length: int | None


def request_head(raw: Sequence[tuple[bytes, bytes]]) -> RequestHead:
    """See :class:`RequestHead`; ``InvalidRequest`` for a bad ``X-Context-*`` value."""
    pairs: list[Header] = []
    labels: list[str] = []
    ours: list[tuple[bytes, bytes]] | None = None
    declared: int | None = None
    length_seen = False
    for k, v in raw:
        value = v.decode("latin-1")
        size = len(k)
        if size in (_CONTENT_TYPE_LENGTH, _CONTENT_LENGTH_LENGTH):
            lower = k.lower()
            if lower == b"content-type":
                labels.append(value)
            elif lower == b"content-length" and not length_seen:
                length_seen = True
                declared = _length(v)
        elif size > _CONTEXT_PREFIX_LENGTH and k[:_CONTEXT_PREFIX_LENGTH].lower() == _CONTEXT_PREFIX:
            if ours is None:
                ours = []
            ours.append((k.lower(), v))
        pairs.append((k.decode("latin-1"), value))
    headers = pairs if len(labels) == 1 and is_json_type(labels[0]) else labelled_json(pairs)
    return RequestHead(headers, options_of(ours) if ours is not None else NO_OPTIONS, declared)


_CONTENT_TYPE_LENGTH = len(b"content-type")
_CONTENT_LENGTH_LENGTH = len(b"content-length")
_CONTEXT_PREFIX = CONTEXT_PREFIX.encode("latin-1")
_CONTEXT_PREFIX_LENGTH = len(_CONTEXT_PREFIX)


def json_response(data: object, *, status: int = 200) -> Response:
    """One of the proxy's own JSON documents (every figure checked finite: ``app.wire``)."""
    return Response(dump_document(data), status_code=status, media_type="application/json")


async def read_body(request: Request, *, limit_bytes: int) -> bytes:
    """The whole body, refused with ``BodyTooLarge`` as soon as it is known to be over the limit:
    from ``Content-Length`` before reading, else while counting the chunks as they arrive."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit_bytes:
        raise BodyTooLarge(limit_bytes=limit_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            raise BodyTooLarge(limit_bytes=limit_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def declared_length(raw: Sequence[tuple[bytes, bytes]]) -> int | None:
    """The first ``Content-Length`` when it is plain digits, else None."""
    for name, value in raw:
        if name.lower() == b"content-length":
            return _length(value)
    return None


def _length(value: bytes) -> int | None:
    """A ``Content-Length`` value when it is plain digits (spaces around allowed), else None."""
    text = value.strip()
    return int(text) if text.isdigit() else None


async def receive_body(
    receive: Receive, raw: Sequence[tuple[bytes, bytes]], *, limit_bytes: int, head: RequestHead | None = None
) -> bytes:
    """The whole body read from ``receive`` (``raw``: the request's ASGI headers, ``head``: what
    :func:`request_head` read of them), as :func:`read_body` reads it: ``BodyTooLarge`` from
    ``Content-Length`` before reading or while the chunks arrive, starlette's ``ClientDisconnect``
    when the client leaves first."""
    declared = declared_length(raw) if head is None else head.declared_length
    if declared is not None and declared > limit_bytes:
        raise BodyTooLarge(limit_bytes=limit_bytes)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if not chunks and not more and len(chunk) <= limit_bytes:
                return chunk  # the whole body in one message: the common case
            size += len(chunk)
            if size > limit_bytes:
                raise BodyTooLarge(limit_bytes=limit_bytes)
            chunks.append(chunk)
            if not more:
                return b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()
