"""The gateway engine's HTTP routes (the contracts are in ``app.service.compress``).

* ``POST /v1/compress`` (agentgateway's ``contextCompression``, Headroom's contract):
  ``{"messages": [...provider-native message objects...], "model": "gpt-4o"}`` ->
  ``{"messages": [...], "tokens_saved": N}`` plus ctxproxy's own figures (``api``,
  ``tokens_before``, ``tokens_after``, ``aside_tokens``, ``actions``), which the gateway ignores.
  The API of the messages: ``?api=NAME`` or ``X-Context-Api``, else guessed
  (``app.service.compress.messages_api``). ``X-Context-Aside-Tokens: N`` says how many tokens the
  gateway keeps aside (system prompt, tools); the other ``X-Context-*`` request headers work as on
  the proxy's own routes.
* ``POST /v1/context/compact/<the API's path>`` (llm-d's request-inline compaction):
  ``/v1/context/compact/v1/chat/completions``, ``.../v1/responses``, ``.../v1/messages`` (the API's own route
  path, templated ones included): a whole request
  body of that API in, a body of the same shape out (the same bytes when it fits).

Both answer 200 with the ``X-Context-*`` headers of the plan (``X-Context-Api`` too); a request
that cannot fit is the API's own 400 ``context_length_exceeded`` with the numbers (a gateway then
fails open or closed, as it is configured); bad input a 400. They decide as the live routes do
(``Service.decide``): the request itself is never sent upstream, but near the budget the
upstream's counting endpoint may be asked for its count of it (its API's, when it has one), and
with summaries on the summary calls of what a cut forgot are.

Wiring is one line in ``create_app``, *before* ``build_router`` (whose pass-through would take any
``/v1/...`` path first): ``app.include_router(build_compress_router(apis))``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..core.dialect import Dialect
from ..core.errors import InvalidRequest
from ..core.routes import RouteMatch, RouteTable
from ..service.compress import Compressed, Compressor, compress_answer, messages_api
from ..service.request import parse_body
from ..wire import dump_json
from .errors import DIALECT_SCOPE_KEY
from .headers import API, parse_context_headers
from .request_io import raw_headers, read_body, service_of
from .responses import context_headers, record_plan

COMPRESS_PATH = "/v1/compress"
COMPACT_PREFIX = "/v1/context/compact"
ASIDE = "X-Context-Aside-Tokens"

Route = Callable[[Request], Awaitable[Response]]


def compact_path(dialect: Dialect) -> str:
    """The whole-body endpoint of ``dialect``'s API: its first fitted route's own path under
    ``/v1/context/compact`` (``/v1/context/compact/v1/chat/completions``). Every fitted route of
    every dialect has one, templated ones included (the model then comes from the path)."""
    return COMPACT_PREFIX + RouteMatch.first(dialect).route.template


def _aside_tokens(request: Request) -> int | None:
    raw = request.headers.get(ASIDE)
    if raw is None:
        return None
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise InvalidRequest(f"Header {ASIDE} must be an integer >= 0, got {raw!r}.", param=ASIDE)
    return int(text)


def _compressor(request: Request) -> Compressor:
    compressor: Compressor | None = getattr(request.app.state, "compressor", None)
    service = service_of(request)
    if compressor is None or compressor.service is not service:
        compressor = request.app.state.compressor = Compressor(service)
    return compressor


def _answer(result: Compressed, content: bytes, *, extra: Mapping[str, str] | None = None) -> Response:
    headers = dict(context_headers(result.plan, retries=0, warnings=result.plan.warnings))
    headers["X-Context-Api"] = result.dialect.name
    headers.update(extra or {})
    return Response(content, media_type="application/json", headers=headers)


async def compress(request: Request) -> Response:
    """``POST /v1/compress``: see the module docstring."""
    service = service_of(request)
    options = parse_context_headers(request.headers)
    aside = _aside_tokens(request)
    raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
    body = parse_body(raw)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be an array of message objects.", param="messages")
    dialects: Mapping[str, Dialect] = request.app.state.dialects
    named = request.query_params.get("api") or request.headers.get(API)
    dialect = messages_api(messages, named=named, headers=request.headers, dialects=dialects)
    request.scope[DIALECT_SCOPE_KEY] = dialect  # our errors from here on are in its shape
    result = await _compressor(request).compress_messages(
        messages,
        model=body.get("model"),
        dialect=dialect,
        options=options,
        headers=raw_headers(request),
        aside_tokens=aside,
        size_bytes=len(raw),
    )
    record_plan(request.scope, result.plan, retries=0)
    extra = {ASIDE: str(result.aside_tokens)}
    return _answer(result, dump_json(compress_answer(result)), extra=extra)


async def compact(request: Request, path: str) -> Response:
    """``POST /v1/context/compact/<a fitted route's path>``: see the module docstring."""
    table: RouteTable = request.app.state.routes
    match = table.match("/" + path, request.url.query)
    if match is None or match.route.kind != "fit":
        raise InvalidRequest(
            f"No fitted API has the path /{path}: the compaction endpoint takes an API's own path "
            f"after {COMPACT_PREFIX} (e.g. {compact_path(next(iter(request.app.state.dialects.values())))}).",
            param=None,
        )
    request.scope[DIALECT_SCOPE_KEY] = match.dialect
    service = service_of(request)
    options = parse_context_headers(request.headers)
    raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
    result = await _compressor(request).compact_body(
        raw, route=match, options=options, headers=raw_headers(request)
    )
    record_plan(request.scope, result.plan, retries=0)
    return _answer(result, result.content)


def build_compress_router(dialects: Mapping[str, Dialect]) -> APIRouter:
    """``POST /v1/compress`` and one whole-body endpoint per dialect (include it before
    ``app.api.routes.build_router``)."""
    router = APIRouter()
    router.add_api_route(COMPRESS_PATH, compress, methods=["POST"], include_in_schema=False)
    router.add_api_route(COMPACT_PREFIX + "/{path:path}", compact, methods=["POST"], include_in_schema=False)
    return router
