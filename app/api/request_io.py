"""Reading a request and writing a JSON answer: the small helpers every route shares.

``service_of(request)`` the app's ``Service``; ``raw_headers(request)`` the headers as sent
(order and case kept); ``read_body(request, *, limit_bytes)`` the whole body within a limit
(``BodyTooLarge`` as soon as it is known to be over); ``json_response(data, *, status)``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..service.driver import Service
from ..upstream.headers import Header
from ..wire import dump_json
from .errors import BodyTooLarge


def service_of(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


def raw_headers(request: Request) -> list[Header]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw]


def json_response(data: object, *, status: int = 200) -> Response:
    return Response(dump_json(data), status_code=status, media_type="application/json")


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
