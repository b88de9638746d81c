"""The HTTP surface; each route parses, calls the service and renders, nothing more.

* ``POST /v1/{dialect.upstream_path}`` for every dialect of ``app.core.dialects.DIALECTS``
  (``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``): plan and forward
  (``Service.handle`` with that dialect); our errors in that API's shape. ``build_router`` makes
  one route per dialect, so a new dialect is served without a line here.
* The counting endpoints of those APIs (``app.api.counting``).
* ``POST /v1/context/plan``: the dry run; the plan as JSON, the upstream is not called. The API of
  the body: ``?api=NAME`` or the ``X-Context-Api: NAME`` header (``chat``, ``responses``,
  ``messages``), else ``messages`` when the request has an ``anthropic-version`` header, else
  ``responses`` for a body with ``input`` and no ``messages``, else ``chat``.
* ``HEAD /``: 200 (a client's connectivity check; ``GET /`` is the status page).
* ``GET /v1/context/models``: every model the proxy knows something about (discovered, learned,
  calibrated), with the source of each figure.
* ``GET /healthz``: the process is alive. ``GET /readyz``: vocabularies loaded, upstream answers.
* ``/v1/{path}`` (any method): passed through untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping
from urllib.parse import unquote

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ..core.dialect import Dialect
from ..core.dialects import CHAT
from ..core.errors import InvalidRequest
from ..service.driver import Service
from ..service.outcome import Outcome
from ..service.ports import UPSTREAM_KEY_HEADERS
from ..service.report import plan_report
from ..upstream.errors import UpstreamError
from ..upstream.headers import Header, labelled_json
from ..wire import dump_json
from .disconnect import ClientLeft, NoResponse, until_client_leaves
from .errors import DIALECT_SCOPE_KEY, BodyTooLarge
from .headers import API, parse_context_headers
from .responses import UpstreamStreamResponse, access_fields, fitted_response, read_whole, record_plan

router = APIRouter()

FittedRoute = Callable[[Request], Awaitable[UpstreamStreamResponse | NoResponse]]

PASSTHROUGH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


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


def route_path(dialect: Dialect) -> str:
    """The proxy's path for a dialect's API: the upstream's, under ``/v1``."""
    return f"/v1/{dialect.upstream_path}"


async def fitted(request: Request, dialect: Dialect) -> UpstreamStreamResponse | NoResponse:
    """Plan and forward one request of ``dialect``'s API (the route of every fitted API)."""
    request.scope[DIALECT_SCOPE_KEY] = dialect  # our errors from here on are in its shape
    service = service_of(request)
    options = parse_context_headers(request.headers)
    raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)

    async def answer() -> Outcome:
        # handle parses the body as JSON (a 400 if it is not), whatever its label.
        outcome = await service.handle(
            raw, labelled_json(raw_headers(request)), options=options, dialect=dialect
        )
        if not outcome.stream:
            await read_whole(outcome.response)
        return outcome

    try:
        outcome = await until_client_leaves(request.receive, answer)
    except ClientLeft:
        access_fields(request.scope)["client_disconnected"] = True
        return NoResponse()
    record_plan(request.scope, outcome.plan, retries=outcome.retries, prefix_reuse=outcome.prefix_reuse)
    access_fields(request.scope)["stream"] = outcome.stream
    return fitted_response(outcome, dialect)


async def chat_completions(request: Request) -> UpstreamStreamResponse | NoResponse:
    return await fitted(request, CHAT)


def fitted_route(dialect: Dialect) -> FittedRoute:
    if dialect is CHAT:
        return chat_completions

    async def route(request: Request) -> UpstreamStreamResponse | NoResponse:
        return await fitted(request, dialect)

    route.__name__ = f"{dialect.name}_route"
    return route


def plan_dialect(request: Request, dialects: Mapping[str, Dialect], raw: bytes) -> Dialect:
    """The API of a dry-run body (see the module docstring)."""
    named = request.query_params.get("api") or request.headers.get(API)
    if named is not None:
        dialect = dialects.get(named.strip().lower())
        if dialect is None:
            raise InvalidRequest(f"Unknown api {named!r}; known: {', '.join(sorted(dialects))}.", param="api")
        return dialect
    if "anthropic-version" in request.headers and "messages" in dialects:
        return dialects["messages"]
    if "responses" in dialects and b'"input"' in raw and b'"messages"' not in raw:
        return dialects["responses"]
    return CHAT


async def context_plan(request: Request) -> Response:
    service = service_of(request)
    options = parse_context_headers(request.headers)
    raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
    dialect = plan_dialect(request, request.app.state.dialects, raw)
    request.scope[DIALECT_SCOPE_KEY] = dialect
    plan = service.plan_raw(raw, options, dialect=dialect)
    record_plan(request.scope, plan, retries=0)
    return json_response(plan_report(plan))


@router.get("/v1/context/models")
async def context_models(request: Request) -> Response:
    return json_response({"object": "list", "data": service_of(request).models_report()})


@router.head("/")
async def head_root() -> Response:
    return Response(status_code=200)


@router.get("/healthz")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    readiness = await service_of(request).readiness()
    return json_response(
        {
            "status": "ready" if readiness.ready else "not ready",
            "vocabularies": list(readiness.vocabularies),
            "vocabularies_ready": readiness.vocabularies_ready,
            "upstreams": {
                url: {"reachable": status is not None, "status": status}
                for url, status in readiness.upstreams.items()
            },
        },
        status=200 if readiness.ready else 503,
    )


def _has_body(request: Request) -> bool:
    return "content-length" in request.headers or "transfer-encoding" in request.headers


class _LimitedBody:
    """The body as it arrives, stopped with ``BodyTooLarge`` once it passes the limit. The
    transport may report that as its own failure (aiohttp sends bodies from a task of its own):
    ``over`` tells the route that the real cause was the size, a 413, not an upstream error."""

    def __init__(self, request: Request, *, limit_bytes: int) -> None:
        self.request = request
        self.limit_bytes = limit_bytes
        self.over = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self.request.stream():
            size += len(chunk)
            if size > self.limit_bytes:
                self.over = True
                raise BodyTooLarge(limit_bytes=self.limit_bytes)
            if chunk:
                yield chunk


def _raw_path(request: Request, path: str) -> str:
    """The path after ``/v1/`` as the client sent it (percent-encoding kept), when known.

    ``InvalidRequest`` for a dot segment (``..``, ``%2e%2e``, ``.``): pass-through stays under the
    upstream's base URL, whose path is not the client's to climb out of (the operator's key may be
    attached to everything this proxy forwards)."""
    raw = request.scope.get("raw_path")
    forwarded = path
    if isinstance(raw, bytes) and raw.startswith(b"/v1/"):
        forwarded = raw[4:].split(b"?", 1)[0].decode("latin-1")
    if any(unquote(segment) in (".", "..") for segment in forwarded.split("/")):
        raise InvalidRequest("The path must not contain '.' or '..' segments.", param=None)
    return forwarded


def _model_of(raw: bytes) -> str | None:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


async def passthrough(request: Request, path: str) -> UpstreamStreamResponse:
    """Forward untouched. The body streams through, except that a JSON body is read (within
    ``max_body_bytes``) when per-model routes exist, to route it by its ``model``."""
    service = service_of(request)
    content: bytes | AsyncIterable[bytes] | None = None
    limited: _LimitedBody | None = None
    model: str | None = None
    declared = request.headers.get("content-length", "").strip()
    content_length = int(declared) if declared.isascii() and declared.isdigit() else None
    limit_bytes = service.settings.max_body_bytes
    if content_length is not None and content_length > limit_bytes:
        raise BodyTooLarge(limit_bytes=limit_bytes)
    if _has_body(request) and content_length != 0:
        json_body = "json" in request.headers.get("content-type", "")
        if service.upstream.routes and json_body:
            content = await read_body(request, limit_bytes=service.settings.max_body_bytes)
            model = _model_of(content)
        else:
            content = limited = _LimitedBody(request, limit_bytes=limit_bytes)
    access_fields(request.scope)["model"] = model
    forwarded_path = _raw_path(request, path)
    try:
        upstream = await service.passthrough(
            request.method,
            forwarded_path,
            query=request.url.query,
            headers=raw_headers(request),
            content=content,
            content_length=content_length,
            model=model,
            key_header=UPSTREAM_KEY_HEADERS.get(forwarded_path.split("/", 1)[0]),
        )
    except UpstreamError:
        if limited is not None and limited.over:
            raise BodyTooLarge(limit_bytes=limit_bytes) from None
        raise
    return UpstreamStreamResponse(upstream)


def build_router(dialects: Mapping[str, Dialect]) -> APIRouter:
    """Every route: the fixed ones, one fitted route per dialect and its counting endpoint, then
    the pass-through for the rest of ``/v1/``, in that order (the pass-through matches anything)."""
    from .counting import counting_routes

    api = APIRouter()
    for dialect in dialects.values():
        api.add_api_route(route_path(dialect), fitted_route(dialect), methods=["POST"], response_model=None)
    for path, endpoint in counting_routes(dialects):
        api.add_api_route(path, endpoint, methods=["POST"], response_model=None)
    api.add_api_route("/v1/context/plan", context_plan, methods=["POST"])
    api.include_router(router)
    api.add_api_route("/v1/{path:path}", passthrough, methods=PASSTHROUGH_METHODS, response_model=None)
    return api
