"""The token-counting endpoints of the fitted APIs: every route of kind ``count`` of a dialect.

A count route (``app.core.endpoints.Route``, ``kind="count"``) is answered in one of two ways, as
its ``upstream_first`` says:

* ``upstream_first=False`` (OpenAI's ``/v1/responses/input_tokens``): our count
  (``dialect.count_answer``) when the model's counter is exact (a shipped tiktoken vocabulary);
  else, and for a conversation whose history lives upstream (``previous_response_id``), the
  request goes to the upstream untouched.
* ``upstream_first=True`` (Anthropic's ``/v1/messages/count_tokens``, whose tokenizer is not
  public): the upstream's own count first; when the upstream has no such endpoint (404 or 405,
  e.g. a vLLM or llama.cpp server behind an Anthropic-shaped front) our count, an estimate, in
  the API's shape.

An upstream's successful count (``dialect.upstream_count`` of its JSON answer) is passed back as it
came and also calibrates the model's estimate (``Service.learn_from_count``), like a response's
usage: a client that counts before it sends (Claude Code does) corrects the estimate before its
first request. The request goes where the route says (``RouteMatch.target``), the operator's key
in the dialect's slot.

Our answers carry ``X-Context-Count`` (``exact``, ``estimate``, ``calibrated``).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..core.dialect import Dialect
from ..core.errors import CtxproxyError
from ..core.plan import Plan
from ..core.routes import RouteMatch
from ..upstream.client import UpstreamResponse
from .errors import DIALECT_SCOPE_KEY
from .headers import parse_context_headers
from .request_io import json_response, raw_headers, read_body, service_of
from .responses import UpstreamStreamResponse, record_plan

UPSTREAM_LACKS_IT = frozenset({404, 405})
MAX_COUNT_ANSWER_BYTES = 64 * 1024


def _ours(request: Request, dialect: Dialect, plan: Plan) -> Response:
    record_plan(request.scope, plan, retries=0)
    response = json_response(dialect.count_answer(plan.tokens_before))
    response.headers["X-Context-Count"] = plan.count_kind
    return response


async def _upstream_count(upstream: UpstreamResponse, dialect: Dialect) -> int | None:
    """The count in a counting endpoint's JSON answer (read whole and kept, so it is still passed
    back byte for byte); None for anything else. A count answer is a few bytes: an answer that is
    not JSON or says it is over ``MAX_COUNT_ANSWER_BYTES`` is not a count, left unread."""
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
    return dialect.upstream_count(answer) if isinstance(answer, dict) else None


async def count(request: Request, match: RouteMatch) -> Response:
    """Answer one request of a count route (see the module docstring)."""
    dialect = match.dialect
    request.scope[DIALECT_SCOPE_KEY] = dialect
    service = service_of(request)
    options = parse_context_headers(request.headers)
    raw = await read_body(request, limit_bytes=service.settings.max_body_bytes)
    headers = raw_headers(request)
    # Parsed first, so a bad body gets our clear 400 in the API's shape either way.
    counted = service.count(raw, options, route=match, headers=headers)
    plan = counted[1] if counted is not None else None
    upstream_first = match.route.upstream_first
    if plan is not None and not upstream_first and plan.count_kind == "exact":
        return _ours(request, dialect, plan)
    target = match.target
    upstream = await service.passthrough(
        "POST",
        target.path,
        query=match.query,
        headers=headers,
        content=raw,
        model=plan.model if plan is not None else None,
        key_slot=match.key_slot,
        at_origin=target.at_origin,
    )
    if plan is not None and upstream_first and upstream.status_code in UPSTREAM_LACKS_IT:
        await upstream.aclose()
        return _ours(request, dialect, plan)
    if counted is not None and upstream.status_code == 200:
        tokens = await _upstream_count(upstream, dialect)
        if tokens is not None:
            service.learn_from_count(*counted, tokens)
    return UpstreamStreamResponse(upstream, dialect=dialect)
