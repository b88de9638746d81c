"""Floor 4: ctxproxy's own stack with its service bypassed (``bench.ab --forwarders stack-floor``).

The proxy's app exactly as ``app.main.create_app`` builds it (uvicorn, the dialect lane, the
observability middleware with its access line and metrics, our error layer, the request reader,
the upstream client and its aiohttp sender, the relaying response class), except that a fit route
forwards the client's bytes as they are instead of calling ``Service.handle``: no parse, no count,
no plan, no usage learning, no ``X-Context-*`` headers. Its added latency is what the stack costs;
the proxy's added latency minus this one is what the fitting costs on the critical path.

The upstream comes from ``BENCH_UPSTREAM_BASE_URL`` (as for the other forwarders) unless
``CTXPROXY_UPSTREAM_BASE_URL`` is set. Never used by the proxy itself: only ``bench.ab`` starts it.
"""

from __future__ import annotations

import os

from fastapi import FastAPI
from starlette.requests import Request

from app.api import lane
from app.api.request_io import receive_body, request_head
from app.api.responses import UpstreamStreamResponse
from app.core.routes import RouteMatch
from app.service.driver import Service
from app.service.peek import is_event_stream


async def forward_bare(request: Request, match: RouteMatch) -> UpstreamStreamResponse:
    """The fit route without the service: the same reading, upstream call and relay."""
    scope = request.scope
    service: Service = scope["app"].state.service
    pairs = scope["headers"]
    head = request_head(pairs)
    raw = await receive_body(request.receive, pairs, limit_bytes=service.settings.max_body_bytes, head=head)
    target = match.target
    upstream = await service.upstream.send(
        "POST",
        target.path,
        content=raw,
        headers=head.headers,
        stream=True,
        base_url=service.upstream.base_url,
        query=match.query,
        at_origin=target.at_origin,
    )
    if not is_event_stream(upstream):
        await upstream.aread()  # as the proxy relays a whole answer: one body message
    return UpstreamStreamResponse(upstream, dialect=match.dialect)


def create_app() -> FastAPI:
    os.environ.setdefault("CTXPROXY_UPSTREAM_BASE_URL", os.environ["BENCH_UPSTREAM_BASE_URL"])
    os.environ.setdefault("CTXPROXY_UPSTREAM_TRANSPORT", "aiohttp")
    from app.main import create_app as create_proxy

    lane.fitted = forward_bare  # type: ignore[assignment]  # the one seam this floor replaces
    return create_proxy()
