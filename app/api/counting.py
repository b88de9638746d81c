"""The token-counting endpoints of the fitted APIs, answered with the proxy's own count.

* ``POST /v1/responses/input_tokens`` (OpenAI): our count (``dialect.count_answer``) when the
  model's counter is exact (a shipped tiktoken vocabulary); else, and for a conversation whose
  history lives upstream (``previous_response_id``), the request goes to the upstream untouched.
* ``POST /v1/messages/count_tokens`` (Anthropic): the upstream's own count first (Anthropic's
  tokenizer is not public); when the upstream has no such endpoint (404 or 405, e.g. a vLLM or
  llama.cpp server behind an Anthropic-shaped front) our count, an estimate, in Anthropic's shape.

An upstream's successful count (``{"input_tokens": N}``) is passed back as it came and also
calibrates the model's estimate (``Service.learn_from_count``), like a response's usage: a client
that counts before it sends (Claude Code does) corrects the estimate before its first request.

Our answers carry ``X-Context-Count`` (``exact``, ``estimate``, ``calibrated``). Only dialects in
``app.core.dialects.DIALECTS`` get their endpoint (``counting_routes``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping

import orjson
from fastapi import Request
from starlette.responses import Response

from ..core.dialect import Dialect
from ..core.errors import CtxproxyError
from ..core.plan import Plan
from ..service.ports import UPSTREAM_KEY_HEADERS
from ..upstream.client import UpstreamResponse
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
MAX_COUNT_ANSWER_BYTES = 64 * 1024


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


async def _upstream_count(upstream: UpstreamResponse) -> int | None:
    """``input_tokens`` of a counting endpoint's JSON answer (read whole and kept, so it is still
    passed back byte for byte); None for anything else. A count answer is a few bytes: an answer
    that is not JSON or says it is over ``MAX_COUNT_ANSWER_BYTES`` is not a count, left unread."""
    headers = {k.lower(): v for k, v in upstream.headers}
    if headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        return None
    length = headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > MAX_COUNT_ANSWER_BYTES):
        return None
    try:
        await upstream.aread()
        answer = orjson.loads(upstream.decoded_body())
    except (orjson.JSONDecodeError, CtxproxyError):
        return None
    tokens = answer.get("input_tokens") if isinstance(answer, dict) else None
    return tokens if type(tokens) is int and tokens > 0 else None


def _endpoint(dialect: Dialect, path: str, *, upstream_first: bool) -> Endpoint:
    async def count(request: Request) -> Response:
        request.scope[DIALECT_SCOPE_KEY] = dialect
        service = service_of(request)
        options = parse_context_headers(request.headers)
        raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
        # Parsed first, so a bad body gets our clear 400 in the API's shape either way.
        counted = service.count(raw, options, dialect=dialect)
        plan = counted[1] if counted is not None else None
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
        if counted is not None and upstream.status_code == 200:
            tokens = await _upstream_count(upstream)
            if tokens is not None:
                service.learn_from_count(*counted, tokens)
        return UpstreamStreamResponse(upstream)

    count.__name__ = f"{dialect.name}_count"
    return count
