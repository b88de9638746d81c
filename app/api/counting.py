"""The token-counting endpoints of the fitted APIs, answered with the proxy's own count.

* ``POST /v1/responses/input_tokens`` (OpenAI): our count (``dialect.count_answer``) when the
  model's counter is exact (a shipped tiktoken vocabulary); else, and for a conversation whose
  history lives upstream (``previous_response_id``), the request goes to the upstream untouched.
* ``POST /v1/messages/count_tokens`` (Anthropic): the upstream's own count first (Anthropic's
  tokenizer is not public); when the upstream has no such endpoint (404 or 405, e.g. a vLLM or
  llama.cpp server behind an Anthropic-shaped front) our count, an estimate, in Anthropic's shape.

Our answers carry ``X-Context-Count`` (``exact``, ``estimate``, ``calibrated``). Only dialects in
``app.core.dialects.DIALECTS`` get their endpoint (``counting_routes``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping

from fastapi import Request
from starlette.responses import Response

from ..core.dialect import Dialect
from ..core.plan import Plan
from ..service.ports import UPSTREAM_KEY_HEADERS
from .errors import DIALECT_SCOPE_KEY
from .headers import parse_context_headers
from .responses import UpstreamStreamResponse, record_plan
from .routes import json_response, raw_headers, read_body, service_of

Endpoint = Callable[[Request], Awaitable[Response]]

# dialect name -> (path under /v1, ask the upstream first)
COUNTING_PATHS: Mapping[str, tuple[str, bool]] = {
    "responses": ("responses/input_tokens", False),
    "messages": ("messages/count_tokens", True),
}
UPSTREAM_LACKS_IT = frozenset({404, 405})


def counting_routes(dialects: Mapping[str, Dialect]) -> Iterator[tuple[str, Endpoint]]:
    """``(route path, endpoint)`` for every dialect in ``dialects`` that has a counting endpoint."""
    for name, (path, upstream_first) in COUNTING_PATHS.items():
        dialect = dialects.get(name)
        if dialect is not None:
            yield f"/v1/{path}", _endpoint(dialect, path, upstream_first=upstream_first)


def _ours(request: Request, dialect: Dialect, plan: Plan) -> Response:
    record_plan(request.scope, plan, retries=0)
    response = json_response(dialect.count_answer(plan.tokens_before))
    response.headers["X-Context-Count"] = plan.count_kind
    return response


def _endpoint(dialect: Dialect, path: str, *, upstream_first: bool) -> Endpoint:
    async def count(request: Request) -> Response:
        request.scope[DIALECT_SCOPE_KEY] = dialect
        service = service_of(request)
        options = parse_context_headers(request.headers)
        raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
        # Parsed first, so a bad body gets our clear 400 in the API's shape either way.
        plan = service.count(raw, options, dialect=dialect)
        if plan is not None and not upstream_first and plan.count_kind == "exact":
            return _ours(request, dialect, plan)
        upstream = await service.passthrough(
            "POST",
            path,
            query=request.url.query,
            headers=raw_headers(request),
            content=raw,
            model=plan.model if plan is not None else None,
            key_header=UPSTREAM_KEY_HEADERS.get(dialect.name),
        )
        if plan is not None and upstream_first and upstream.status_code in UPSTREAM_LACKS_IT:
            await upstream.aclose()
            return _ours(request, dialect, plan)
        return UpstreamStreamResponse(upstream)

    count.__name__ = f"{dialect.name}_count"
    return count
