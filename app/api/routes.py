"""The HTTP surface; each route parses, calls the service and renders, nothing more.

* Every route of every dialect of the registry (``Dialect.routes``, matched by
  ``app.core.routes.RouteTable``) is served by ``app.api.lane.DialectLane``, ahead of FastAPI's
  router: ``fitted`` plans and forwards a route of kind ``fit`` (``Service.handle`` with the
  matched route), ``app.api.counting.count`` answers one of kind ``count``. Our errors are in
  that API's shape. A new dialect is served without a line here.
* ``POST /v1/context/plan``: the dry run; the live route's decision without its I/O
  (``Planner.dry_run``, ``app.service.decision``) as JSON (``app.service.report.plan_report``: the
  figures, ``body``, the request that would be forwarded, in the body's own API shape, and
  ``estimates``, what it could not know); the request is not sent (nor is the upstream's counting
  endpoint asked: its figure is then named an estimate). The API of the body: ``?api=NAME`` or the
  ``X-Context-Api: NAME`` header (a registry name), else detected (``app.core.routes.detect``:
  each dialect's ``recognition`` of the body and headers).
* ``HEAD /``: 200 (a client's connectivity check; ``GET /`` is the status page).
* ``GET /v1/context/models``: every model the proxy knows something about (discovered, learned,
  calibrated), with the source of each figure.
* ``GET /healthz``: the process is alive. ``GET /readyz``: vocabularies loaded, upstream answers.
* The pass-through, any method, under every prefix the dialects' routes live under
  (``RouteTable.passthrough_prefixes``: ``/v1/{path}``, ...): forwarded untouched, the rest of the
  path under the upstream base URL, or the client's whole path at its origin for a prefix whose
  routes all send theirs there; the operator's key goes in the key slot of the dialect that owns
  the path (``RouteTable.owner``), else where the client put its own. A route's path with its
  first segment doubled (``/v1/v1/messages``) is our 404 with a hint, and an upstream's 405 to
  another method on a route's path our 405 (``passthrough``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from urllib.parse import unquote

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ..core.dialect import Dialect
from ..core.errors import InvalidRequest
from ..core.routes import RouteMatch, RouteTable, detect
from ..service.driver import Service
from ..service.outcome import Outcome
from ..service.report import plan_report
from ..service.request import parse_body
from ..upstream.errors import UpstreamError
from .disconnect import ClientLeft, NoResponse, until_client_leaves
from .errors import (
    DIALECT_SCOPE_KEY,
    BodyTooLarge,
    dialect_of,
    doubled_prefix,
    method_not_allowed,
    unknown_path,
)
from .headers import API, parse_context_headers
from .request_io import json_response, raw_headers, read_body, receive_body, request_head, service_of
from .responses import (
    UpstreamStreamResponse,
    access_fields,
    fitted_response,
    read_whole,
    record_plan,
    render_ahead,
)

router = APIRouter()

PASSTHROUGH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


async def fitted(request: Request, match: RouteMatch) -> UpstreamStreamResponse | NoResponse:
    """Plan and forward one request of a fit route (``match``: its dialect and path parameters)."""
    scope = request.scope
    scope[DIALECT_SCOPE_KEY] = match.dialect  # our errors from here on are in its shape
    service: Service = scope["app"].state.service
    pairs = scope["headers"]
    head = request_head(pairs)
    options, headers = head.options, head.headers
    raw = await receive_body(request.receive, pairs, limit_bytes=service.settings.max_body_bytes, head=head)

    async def answer() -> Outcome:
        # handle parses the body as JSON (a 400 if it is not), whatever its label.
        outcome = await service.handle(raw, headers, options=options, route=match, render=render_ahead)
        if not outcome.stream:
            await read_whole(outcome.response)
        return outcome

    try:
        outcome = await until_client_leaves(request.receive, answer)
    except ClientLeft:
        access_fields(scope)["client_disconnected"] = True
        return NoResponse()
    response = fitted_response(outcome, match.dialect, scope=scope)
    access_fields(scope)["stream"] = outcome.stream
    return response


def plan_dialect(request: Request, dialects: Mapping[str, Dialect], body: Mapping[str, object]) -> Dialect:
    """The API of a dry-run body (see the module docstring)."""
    named = request.query_params.get("api") or request.headers.get(API)
    if named is None:
        return detect(dialects, body, request.headers)
    key = named.strip().lower()
    if key not in dialects:
        raise InvalidRequest(f"Unknown api {named!r}; known: {', '.join(sorted(dialects))}.", param="api")
    return dialects[key]


async def context_plan(request: Request) -> Response:
    service = service_of(request)
    options = parse_context_headers(request.headers)
    raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
    body = parse_body(raw)
    dialect = plan_dialect(request, request.app.state.dialects, body)
    request.scope[DIALECT_SCOPE_KEY] = dialect
    # The live route's request value and its decision, without I/O (``Planner.dry_run``): what
    # the upstream would have told the proxy is named among the estimates.
    route = RouteMatch.first(dialect)
    proxied = service.request(body, options, route=route, raw=raw, headers=raw_headers(request))
    decision = service.dry_run(proxied)
    record_plan(request.scope, decision.plan, retries=0)
    return json_response(plan_report(decision.plan, body, estimates=decision.explained))


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


def _raw_path(request: Request, path: str, *, prefix: str, at_origin: bool) -> str:
    """The path to forward as the client sent it (percent-encoding kept), when known: the part
    after ``prefix/`` (under the base URL), or all of it (``at_origin``).

    ``InvalidRequest`` for a dot segment (``..``, ``%2e%2e``, ``.``): pass-through stays under the
    upstream's base URL (or its origin's path as the client wrote it), whose path is not the
    client's to climb out of (the operator's key may be attached to everything this proxy
    forwards)."""
    raw = request.scope.get("raw_path")
    forwarded = f"{prefix}/{path}" if at_origin else path
    start = prefix.encode("latin-1") + b"/"
    if isinstance(raw, bytes) and raw.startswith(start):
        tail = raw[len(start) :].split(b"?", 1)[0].decode("latin-1")
        forwarded = f"{prefix}/{tail}" if at_origin else tail
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


def allowed_methods(upstream_headers: Iterable[tuple[str, str]]) -> str:
    """``Allow`` of our 405 on a route's path: POST (the route's), then what the upstream's own
    ``Allow`` lists besides."""
    methods = ["POST"]
    for name, value in upstream_headers:
        if name.lower() == "allow":
            methods += [m.strip().upper() for m in value.split(",") if m.strip()]
    return ", ".join(dict.fromkeys(methods))


async def passthrough(
    request: Request, path: str, *, prefix: str, at_origin: bool
) -> UpstreamStreamResponse | Response:
    """Forward untouched. The body streams through, except that a JSON body is read (within
    ``max_body_bytes``) when per-model routes exist, to route it by its ``model``.

    Two answers are ours, in the shape of the API whose route the path is: a route's path with its
    first segment doubled (``/v1/v1/messages``: the client's base URL ends in ``/v1``) is our 404
    with the hint, never forwarded (the proxy would not fit it); and when the upstream answers
    405 to another method than POST on a route's own path (``GET /v1/chat/completions`` of an
    upstream without OpenAI's stored completions), our 405 with ``Allow``, where the upstream's
    may be plain text. Every other answer of the upstream is passed back as it came (OpenAI's
    ``GET /v1/chat/completions`` lists stored completions: the method is the upstream's to refuse)."""
    table: RouteTable = request.app.state.routes
    full_path = f"{prefix}/{path}"
    if doubled_prefix(full_path, table) is not None:
        return unknown_path(request.method, full_path, table, fallback=dialect_of(request.scope))
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
    forwarded_path = _raw_path(request, path, prefix=prefix, at_origin=at_origin)
    owner = table.owner(full_path)
    try:
        upstream = await service.passthrough(
            request.method,
            forwarded_path,
            query=request.url.query,
            headers=raw_headers(request),
            content=content,
            content_length=content_length,
            model=model,
            key_slot=owner.key_slots[0] if owner is not None and owner.key_slots else None,
            at_origin=at_origin,
        )
    except UpstreamError:
        if limited is not None and limited.over:
            raise BodyTooLarge(limit_bytes=limit_bytes) from None
        raise
    if upstream.status_code == 405:
        route = table.match(full_path)
        if route is not None:
            await upstream.aclose()
            access_fields(request.scope)["upstream_status"] = 405
            allow = allowed_methods(upstream.headers)
            return method_not_allowed(request.method, full_path, route.dialect, allow=allow)
    # A stream the upstream breaks off ends with an error event in the owning API's shape.
    return UpstreamStreamResponse(upstream, dialect=owner or dialect_of(request.scope))


def passthrough_route(prefix: str, *, at_origin: bool) -> Callable[[Request, str], Awaitable[Response]]:
    """The pass-through endpoint of one prefix (see the module docstring)."""

    async def route(request: Request, path: str) -> Response:
        return await passthrough(request, path, prefix=prefix, at_origin=at_origin)

    route.__name__ = f"passthrough_{prefix.strip('/')}"
    return route


def build_router(table: RouteTable) -> APIRouter:
    """The routes FastAPI serves: the fixed ones, then the pass-through of every prefix the
    dialects' routes live under, in that order (a pass-through matches anything under it). The
    dialects' own routes are the lane's (``app.api.lane``)."""
    api = APIRouter()
    api.add_api_route("/v1/context/plan", context_plan, methods=["POST"])
    api.include_router(router)
    for prefix, at_origin in table.passthrough_prefixes():
        api.add_api_route(
            f"{prefix}/{{path:path}}",
            passthrough_route(prefix, at_origin=at_origin),
            methods=PASSTHROUGH_METHODS,
            response_model=None,
        )
    return api
