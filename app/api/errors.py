"""Every error the proxy itself answers with, the one HTTP status mapping, rendered by a dialect.

==============================  ======  ===========================
error                           status  code (``ErrorInfo.code``)
==============================  ======  ===========================
InvalidRequest (core)           400     (none)
CannotFit (core)                400     context_length_exceeded
BodyTooLarge (api)              413     request_too_large
UpstreamUnreachable             502     upstream_unreachable
UpstreamProtocolError           502     upstream_protocol_error
UpstreamTimeout                 504     upstream_timeout
UpstreamBusy                    503     upstream_busy (+ Retry-After)
missing/wrong proxy key (auth)  401     invalid_api_key
unknown path (``unknown_path``)  404     (none; with a hint, below)
a route's path, another method  405     (none; + Allow, see below)
HTTPException (other)           as is   (none)
anything else (a bug)           500     (none; logged with traceback)
==============================  ======  ===========================

"(none)" is the code ``invalid_request_error``: no code of its own (OpenAI's ``code: null``).

Paths, from the route table alone (no API is named here): an unknown path gets a hint when it is
a route's path (or a pass-through resource's) without its prefix (``POST /messages``: "did you mean
/v1/messages?") or with its first segment doubled (``/v1/v1/messages``: the client's base URL ends
in ``/v1`` and the client adds it again; the pass-through answers it without forwarding), in the
shape of the API that owns the corrected path (``RouteTable.owner``; ``path_hint``). A method other
than POST on a route's path that the upstream refuses with 405 is our 405 in that route's API's
shape with ``Allow: POST`` (``method_not_allowed``; ``app.api.routes.passthrough``).

``error_info_of(exc)`` maps an exception to an ``ErrorInfo`` once; the request's dialect puts it
in its API's shape (``Dialect.error_body``; OpenAI's for chat:
``{"error": {"message", "type", "param", "code"}}``). The request's dialect is the one its route
recorded in the scope (``DIALECT_SCOPE_KEY``) before anything can fail; every route of no dialect
speaks the app's fallback dialect (``dialect_of``: ``app.state.fallback_dialect``, which the
composition root chooses; nothing here names an API). On a route whose answer
is one JSON array streamed element by element (``RouteMatch.json_stream``: Gemini's
``streamGenerateContent`` without ``alt=sse``) the error is that array's form, when the dialect
has one (``Dialect.json_stream_error(info, started=False)``), as the API's own server answers there.

Errors the *upstream* answers with are not ours: they are passed back unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.dialect import Dialect, ErrorInfo, error_info
from ..core.errors import CannotFit, CtxproxyError, InvalidRequest
from ..core.routes import RouteMatch, RouteTable
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
from ..wire import dump_json
from .responses import context_headers, record_plan

logger = logging.getLogger("ctxproxy.errors")

# The pass-through root of OpenAI-compatible clients, whose base URL ends in it.
BASE_PREFIX = "/v1"


class BodyTooLarge(CtxproxyError):
    """The request body is over ``max_body_bytes``; refused before it is read whole."""

    def __init__(self, *, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        super().__init__(
            f"The request body is larger than this proxy accepts ({limit_bytes} bytes; the operator "
            "can raise CTXPROXY_MAX_BODY_BYTES)."
        )


def error_info_of(exc: Exception, dialect: Dialect) -> ErrorInfo:
    """Any error we answer with on a request of ``dialect``, before the dialect shapes it (the
    table in the module docstring; a cannot-fit error keeps its numbers)."""
    if isinstance(exc, CannotFit | InvalidRequest):
        return error_info(exc, dialect)
    if isinstance(exc, BodyTooLarge):
        return ErrorInfo(status=413, code="request_too_large", message=str(exc))
    if isinstance(exc, UpstreamBusy):
        return ErrorInfo(status=503, code="upstream_busy", message=exc.message)
    if isinstance(exc, UpstreamTimeout):
        return ErrorInfo(status=504, code="upstream_timeout", message=exc.message)
    if isinstance(exc, UpstreamUnreachable):
        return ErrorInfo(status=502, code="upstream_unreachable", message=exc.message)
    if isinstance(exc, UpstreamProtocolError | UpstreamError):
        return ErrorInfo(status=502, code="upstream_protocol_error", message=str(exc))
    return ErrorInfo(
        status=500,
        code="invalid_request_error",
        message="The proxy failed unexpectedly; the error was logged.",
    )


def dialect_of(scope: Mapping[str, Any]) -> Dialect:
    """The dialect of the route that took the request; for every other route the app's fallback
    (``app.state.fallback_dialect``, injected by the composition root)."""
    found: Dialect | None = scope.get(DIALECT_SCOPE_KEY)
    if found is not None:
        return found
    fallback: Dialect = scope["app"].state.fallback_dialect
    return fallback


def render_info(info: ErrorInfo, dialect: Dialect, *, json_stream: bool = False) -> Response:
    """``info`` as a JSON response in ``dialect``'s shape, with its status (``json_stream``: the
    request asked for a JSON-array stream: the array's form when the dialect has one)."""
    body = dialect.json_stream_error(info, started=False) if json_stream else None
    if body is None:
        body = dump_json(dialect.error_body(info))  # a client's string in it may hold a lone surrogate
    return Response(body, status_code=info.status, media_type="application/json")


def json_stream_of(scope: Mapping[str, Any], table: RouteTable | None) -> bool:
    """True when the request of ``scope`` is on a route whose answer is one JSON array streamed
    element by element (``RouteMatch.json_stream``); looked up on error paths only."""
    if table is None or scope.get("type") != "http":
        return False
    query = scope.get("query_string", b"")
    try:
        match = table.match(
            str(scope.get("path") or ""), query.decode("latin-1") if isinstance(query, bytes) else ""
        )
    except InvalidRequest:
        return False
    return match is not None and match.json_stream


def _json_stream(scope: Mapping[str, Any], app: Any) -> bool:
    state = getattr(app, "state", None)
    return json_stream_of(scope, getattr(state, "routes", None))


def render(exc: Exception, dialect: Dialect, *, json_stream: bool = False) -> Response:
    """Our error response for ``exc`` in the shape of the request's ``dialect``."""
    response = render_info(error_info_of(exc, dialect), dialect, json_stream=json_stream)
    if isinstance(exc, UpstreamBusy):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


KNOWN_ERRORS = (InvalidRequest, CannotFit, BodyTooLarge, UpstreamError)


async def handle_known(request: Request, exc: Exception) -> Response:
    if isinstance(exc, UpstreamUnreachable):
        # The access line says 502; the operator needs the reason (DNS, refused, TLS) at WARNING.
        logger.warning("%s %s: %s", request.method, request.url.path, exc.message)
    response = render(exc, dialect_of(request.scope), json_stream=_json_stream(request.scope, request.app))
    if isinstance(exc, PlanCannotFit):
        record_plan(request.scope, exc.plan, retries=0)
        for name, value in context_headers(exc.plan, retries=0):
            response.headers[name] = value
    return response


# Resources OpenAI-compatible clients reach through the pass-through (besides the dialects' own
# routes): a client that sends them without the prefix has a base URL missing its /v1.
PASSTHROUGH_RESOURCES = frozenset(
    {"models", "embeddings", "completions", "context", "audio", "images", "moderations", "files", "batches",
     "uploads", "vector_stores", "assistants", "threads"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PathHint:
    """What an unknown path most likely meant: ``text`` (a sentence for the error message, with a
    leading space) and ``owner``, the dialect whose route the corrected path is (None: no API's,
    the answer is then in the request's fallback's shape)."""

    text: str
    owner: Dialect | None = None


def doubled_prefix(path: str, table: RouteTable | None) -> RouteMatch | None:
    """The route ``path`` is once its first segment, written twice, is written once
    (``/v1/v1/messages`` -> ``/v1/messages``: a client whose base URL ends in ``/v1`` and that adds
    ``/v1`` itself), else None. Any route of the table (fitted or counting)."""
    if table is None:
        return None
    first = "/" + path.lstrip("/").split("/", 1)[0]
    rest = path[len(first) :] if path.startswith(first) else ""
    if not rest.startswith(first + "/"):
        return None
    try:
        return table.match(rest)
    except InvalidRequest:  # a dot segment: no hint, the pass-through refuses it on its own
        return None


def path_hint(path: str, table: RouteTable | None) -> PathHint | None:
    """A hint for an unknown ``path``: the route it is with a doubled first segment
    (:func:`doubled_prefix`), or a route (or a pass-through resource) it is under a prefix the
    client's base URL left out; None when there is none. ``owner`` is the dialect that owns the
    corrected path (``RouteTable.owner``), so the hint comes in that API's shape."""
    doubled = doubled_prefix(path, table)
    if doubled is not None:
        first = doubled.route.prefix
        return PathHint(
            f" The client's base URL ends in {first} and the client adds {first} again: did you mean "
            f"{doubled.path}? Remove the trailing {first} from the client's base URL.",
            doubled.dialect,
        )
    first = path.lstrip("/").split("/", 1)[0]
    prefixes: dict[str, str] = dict.fromkeys(PASSTHROUGH_RESOURCES, BASE_PREFIX)
    for _dialect, route in table.routes if table is not None else ():
        rest = route.template[len(route.prefix) :].lstrip("/")
        segment = rest.split("/", 1)[0].split("{", 1)[0].split(":", 1)[0]
        if segment:
            prefixes.setdefault(segment, route.prefix)
    prefix = prefixes.get(first)
    if prefix is None or path.startswith(prefix + "/"):
        return None
    owner = table.owner(prefix + path) if table is not None else None
    return PathHint(
        f" Did you mean {prefix}{path}? The client's base URL must end with {prefix} (http://HOST:PORT{prefix}).",
        owner,
    )


def unknown_path(method: str, path: str, table: RouteTable | None, *, fallback: Dialect) -> Response:
    """Our 404 for ``method path``, with the hint of :func:`path_hint` when there is one, in the
    shape of the API that owns the corrected path (else ``fallback``'s)."""
    hint = path_hint(path, table)
    message = f"Unknown path: {method} {path}." + (hint.text if hint is not None else "")
    dialect = hint.owner if hint is not None and hint.owner is not None else fallback
    return render_info(ErrorInfo(status=404, code="invalid_request_error", message=message), dialect)


def method_not_allowed(method: str, path: str, dialect: Dialect, *, allow: str = "POST") -> Response:
    """Our 405 for ``method`` on a route's ``path``, in ``dialect``'s shape, with ``Allow``."""
    message = f"{method} is not allowed on {path}: this route takes {allow}."
    response = render_info(ErrorInfo(status=405, code="invalid_request_error", message=message), dialect)
    response.headers["Allow"] = allow
    return response


async def _handle_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        table = getattr(request.app.state, "routes", None)
        return unknown_path(request.method, request.url.path, table, fallback=dialect_of(request.scope))
    message = exc.detail if isinstance(exc.detail, str) else "Request failed."
    info = ErrorInfo(status=exc.status_code, code="invalid_request_error", message=message)
    json_stream = _json_stream(request.scope, request.app)
    response = render_info(info, dialect_of(request.scope), json_stream=json_stream)
    for name, value in (exc.headers or {}).items():
        response.headers[name] = value
    return response


async def _handle_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    info = ErrorInfo(status=400, code="invalid_request_error", message=f"Invalid request: {exc.errors()!r}")
    return render_info(info, dialect_of(request.scope), json_stream=_json_stream(request.scope, request.app))


def install_error_handlers(app: FastAPI) -> None:
    for kind in KNOWN_ERRORS:
        app.add_exception_handler(kind, handle_known)
    app.add_exception_handler(HTTPException, _handle_http)
    app.add_exception_handler(RequestValidationError, _handle_validation)
    app.add_middleware(LastResortMiddleware)


class LastResortMiddleware:
    """Pure ASGI: a bug anywhere below becomes a logged 500 in the request's dialect's shape and the
    app keeps serving. (Starlette's own handler would re-raise into the server after responding.)"""

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
        response: Any = render(exc, dialect_of(scope), json_stream=_json_stream(scope, scope.get("app")))
        await response(scope, receive, send)
