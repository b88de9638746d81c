"""What operators see: Prometheus metrics, request IDs, the status page.

::

    context.py     RequestContext in a contextvar: request ID, body/response/upstream timings; the
                   scope keys the routes record into (access fields, the request's dialect)
    request_id.py  logging filter that stamps every record with the request ID
    labels.py      bounded label values: route, api, model, upstream, free-form hook values
    metrics.py     Metrics (per-app CollectorRegistry, every request metric labelled by API)
    status.py      StatusBoard: recent requests (ring buffer), counters in total and per API,
                   upstream, model table
    observer.py    Observability: the hub create_app builds (hooks for summaries, caches, discovery)
    middleware.py  ObservabilityMiddleware (pure ASGI): X-Request-ID, in-flight, recording
    page.py        the status page's HTML (inline CSS/JS/canvas, no assets)
    page_script.py its script (per-API tables, the API selector, the chart)
    routes.py      GET /metrics, GET /, GET /status.json

The upstream side is ``app.upstream.instrument.Instrumentation`` (X-Request-ID upstream and the
upstream wait), built by :meth:`Observability.instrumentation` and given to the upstream client.
Nothing here raises into a request: recording failures are logged and swallowed. Nothing here
names a wire API or imports ``app.api``: the composition root passes the registered APIs' names,
and each request is labelled by the dialect its route recorded in the scope.
"""

from .middleware import ObservabilityMiddleware
from .observer import Observability
from .request_id import RequestIdFilter
from .routes import router

__all__ = ["Observability", "ObservabilityMiddleware", "RequestIdFilter", "router"]
