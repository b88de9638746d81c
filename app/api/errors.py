"""Every error the proxy itself answers with, in OpenAI's shape, and the one HTTP status mapping.

``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``

==============================  ======  ========================  ===========================
error                           status  type                      code
==============================  ======  ========================  ===========================
InvalidRequest (core)           400     invalid_request_error     None
CannotFit (core)                400     invalid_request_error     context_length_exceeded
BodyTooLarge (api)              413     invalid_request_error     request_too_large
UpstreamUnreachable             502     upstream_error            upstream_unreachable
UpstreamProtocolError           502     upstream_error            upstream_protocol_error
UpstreamTimeout                 504     upstream_error            upstream_timeout
UpstreamBusy                    503     server_error              upstream_busy (+ Retry-After)
missing/wrong proxy key (auth)  401     invalid_request_error     invalid_api_key
HTTPException (404, 405, ...)   as is   invalid_request_error     None
anything else (a bug)           500     server_error              None (logged with traceback)
==============================  ======  ========================  ===========================

Errors the *upstream* answers with are not ours: they are passed back unchanged.

On a route of another wire API (``/v1/responses``, ``/v1/messages``) the same errors are put in
that API's shape by its dialect (``error_info_of(exc)`` -> ``dialect.error_body``); the route
records its dialect in the scope (``DIALECT_SCOPE_KEY``) before anything can fail.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.dialect import Dialect, ErrorInfo, error_info
from ..core.dialects import CHAT
from ..core.errors import CannotFit, CtxproxyError, InvalidRequest
from ..observability.context import DIALECT_SCOPE_KEY as DIALECT_SCOPE_KEY
from ..observability.context import current_request
from ..service.outcome import PlanCannotFit
from ..upstream.errors import (
    UpstreamBusy,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .responses import context_headers, record_plan

logger = logging.getLogger("ctxproxy.errors")


class BodyTooLarge(CtxproxyError):
    """The request body is over ``max_body_bytes``; refused before it is read whole."""

    def __init__(self, *, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        super().__init__(
            f"The request body is larger than this proxy accepts ({limit_bytes} bytes; the operator "
            "can raise CTXPROXY_MAX_BODY_BYTES)."
        )


def error_payload(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def error_response(
    status: int, message: str, *, type: str, param: str | None = None, code: str | None = None
) -> Response:
    return Response(
        error_payload(message, type=type, param=param, code=code),
        status_code=status,
        media_type="application/json",
    )


def describe(exc: Exception) -> tuple[int, str, str, str | None, str | None]:
    """``(status, message, type, param, code)`` for an error the proxy raises on purpose."""
    if isinstance(exc, CannotFit):
        return 400, exc.message, "invalid_request_error", "messages", "context_length_exceeded"
    if isinstance(exc, InvalidRequest):
        return 400, exc.message, "invalid_request_error", exc.param, None
    if isinstance(exc, BodyTooLarge):
        return 413, str(exc), "invalid_request_error", None, "request_too_large"
    if isinstance(exc, UpstreamBusy):
        return 503, exc.message, "server_error", None, "upstream_busy"
    if isinstance(exc, UpstreamTimeout):
        return 504, exc.message, "upstream_error", None, "upstream_timeout"
    if isinstance(exc, UpstreamUnreachable):
        return 502, exc.message, "upstream_error", None, "upstream_unreachable"
    if isinstance(exc, UpstreamProtocolError | UpstreamError):
        return 502, str(exc), "upstream_error", None, "upstream_protocol_error"
    return 500, "The proxy failed unexpectedly; the error was logged.", "server_error", None, None


def error_info_of(exc: Exception) -> ErrorInfo:
    """Any error we answer with, before a dialect shapes it (a plain request error has the code
    ``invalid_request_error``; a cannot-fit error keeps its numbers)."""
    if isinstance(exc, CannotFit | InvalidRequest):
        return error_info(exc)
    status, message, _type, param, code = describe(exc)
    return ErrorInfo(status=status, code=code or "invalid_request_error", message=message, param=param)


def dialect_of(scope: Mapping[str, Any]) -> Dialect | None:
    """The dialect of the route that took the request (None: not a fitted route)."""
    dialect: Dialect | None = scope.get(DIALECT_SCOPE_KEY)
    return dialect


def render(exc: Exception, dialect: Dialect | None = None) -> Response:
    """Our error response for ``exc``: OpenAI's shape (chat, and every route of no dialect),
    else the shape of the request's ``dialect``."""
    if dialect is None or dialect is CHAT:
        status, message, type_, param, code = describe(exc)
        response = error_response(status, message, type=type_, param=param, code=code)
    else:
        info = error_info_of(exc)
        response = Response(
            orjson.dumps(dialect.error_body(info)), status_code=info.status, media_type="application/json"
        )
    if isinstance(exc, UpstreamBusy):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


KNOWN_ERRORS = (InvalidRequest, CannotFit, BodyTooLarge, UpstreamError)


async def handle_known(request: Request, exc: Exception) -> Response:
    if isinstance(exc, UpstreamUnreachable):
        # The access line says 502; the operator needs the reason (DNS, refused, TLS) at WARNING.
        logger.warning("%s %s: %s", request.method, request.url.path, exc.message)
    response = render(exc, dialect_of(request.scope))
    if isinstance(exc, PlanCannotFit):
        record_plan(request.scope, exc.plan, retries=0)
        for name, value in context_headers(exc.plan, retries=0):
            response.headers[name] = value
    return response


# First path segments of the APIs the proxy serves under /v1: a client that sends them without the
# prefix has a base URL missing its /v1.
_API_SEGMENTS = frozenset(
    {"chat", "completions", "responses", "messages", "models", "embeddings", "context", "audio", "images",
     "moderations", "files", "batches", "uploads", "vector_stores", "assistants", "threads"}
)  # fmt: skip


def _missing_v1_hint(path: str) -> str:
    first = path.lstrip("/").split("/", 1)[0]
    if path.startswith("/v1/") or first not in _API_SEGMENTS:
        return ""
    return f" Did you mean /v1{path}? The client's base URL must end with /v1 (http://HOST:PORT/v1)."


async def _handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = exc.detail if isinstance(exc.detail, str) else "Request failed."
    if exc.status_code == 404:
        message = f"Unknown path: {request.method} {request.url.path}." + _missing_v1_hint(request.url.path)
    response = error_response(exc.status_code, message, type="invalid_request_error")
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def _handle_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, f"Invalid request: {exc.errors()!r}", type="invalid_request_error")


def install_error_handlers(app: FastAPI) -> None:
    for kind in KNOWN_ERRORS:
        app.add_exception_handler(kind, handle_known)
    app.add_exception_handler(HTTPException, _handle_http)
    app.add_exception_handler(RequestValidationError, _handle_validation)
    app.add_middleware(LastResortMiddleware)


class LastResortMiddleware:
    """Pure ASGI: a bug anywhere below becomes a logged, OpenAI-shaped 500 and the app keeps
    serving. (Starlette's own handler would re-raise into the server after responding.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = current_request.get()
        if ctx is not None:
            # Under the observability middleware, which times the response start on the same
            # context: no send wrapper of our own on every request.
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                await self._last_resort(exc, scope, receive, send, started=ctx.response_start_s is not None)
            return
        started = False

        async def send_tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception as exc:
            await self._last_resort(exc, scope, receive, send, started=started)

    @staticmethod
    async def _last_resort(
        exc: Exception, scope: Scope, receive: Receive, send: Send, *, started: bool
    ) -> None:
        logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
        if started:
            return  # headers already went out: the server closes the connection short
        response: Any = render(exc, dialect_of(scope))
        await response(scope, receive, send)
