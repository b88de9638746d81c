"""What operators see: Prometheus metrics, request IDs, the status page.

::

    context.py     RequestContext in a contextvar: request ID, body/response/upstream timings
    request_id.py  logging filter that stamps every record with the request ID
    metrics.py     Metrics (per-app CollectorRegistry), bounded labels (ModelLabels, route_label)
    status.py      StatusBoard: recent requests (ring buffer), counters, upstream, model table
    observer.py    Observability: the hub create_app builds (hooks for discovery and caches)
    middleware.py  ObservabilityMiddleware (pure ASGI): X-Request-ID, in-flight, recording
    page.py        the status page's HTML (inline CSS/JS/canvas, no assets)
    routes.py      GET /metrics, GET /, GET /status.json

The upstream side is ``app.upstream.instrument.Instrumentation`` (X-Request-ID upstream and the
upstream wait), built by :meth:`Observability.instrumentation` and given to the upstream client.
Nothing here raises into a request: recording failures are logged and swallowed.
"""

from .middleware import ObservabilityMiddleware
from .observer import Observability
from .request_id import RequestIdFilter
from .routes import router

__all__ = ["Observability", "ObservabilityMiddleware", "RequestIdFilter", "router"]
