"""``GET /metrics`` (Prometheus), ``GET /`` (the status page; with a "Sign out" link when the
login's session opened it) and ``GET /status.json`` (its data)."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from ..wire import dump_document
from .context import SESSION_SCOPE_KEY
from .observer import Observability
from .page import CONTENT_SECURITY_POLICY, status_html

router = APIRouter()

_NO_STORE = {"Cache-Control": "no-store"}


def observability_of(request: Request) -> Observability:
    observability: Observability = request.app.state.observability
    return observability


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    m = observability_of(request).metrics
    if not m.available:
        body = orjson.dumps(
            {
                "error": {
                    "message": "Metrics need the prometheus-client package: pip install 'ctxproxy[metrics]'.",
                    "type": "server_error",
                    "param": None,
                    "code": "metrics_unavailable",
                }
            }
        )
        return Response(body, status_code=503, media_type="application/json")
    payload, content_type = m.render(request.headers.get("accept", ""))
    return Response(payload, media_type=content_type, headers=_NO_STORE)


@router.get("/status.json")
async def status_json(request: Request) -> Response:
    data = observability_of(request).status(getattr(request.app.state, "service", None))
    return Response(dump_document(data), media_type="application/json", headers=_NO_STORE)


@router.get("/")
async def status_page(request: Request) -> Response:
    headers = {
        **_NO_STORE,
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
    }
    page = status_html(signed_in=request.scope.get(SESSION_SCOPE_KEY) is True)
    return Response(page, media_type="text/html; charset=utf-8", headers=headers)
