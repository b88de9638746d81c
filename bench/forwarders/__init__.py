"""Minimal forwarders: the floors the proxy is compared to (no counting, streaming pass-through).

Each module has ``create_app() -> FastAPI`` for ``uvicorn MODULE:create_app --factory``; the upstream
base URL (with ``/v1``) comes from ``BENCH_UPSTREAM_BASE_URL``.

* ``httpx_plain``: FastAPI + a plain ``httpx.AsyncClient`` (httpx's default transport and limits).
* ``aiohttp_raw``: FastAPI + a raw ``aiohttp.ClientSession``.
* ``httpx_aiohttp``: FastAPI + ``httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport())``.

``STACK_FLOOR`` (``bench.ab`` only, not in ``TARGETS``): ``ctxproxy_floor``, the proxy's own app
with its service bypassed (what the stack costs without the fitting).
"""

TARGETS = {
    "fwd-httpx": "bench.forwarders.httpx_plain:create_app",
    "fwd-aiohttp": "bench.forwarders.aiohttp_raw:create_app",
    "fwd-httpx-aiohttp": "bench.forwarders.httpx_aiohttp:create_app",
}

STACK_FLOOR = {"stack-floor": "bench.forwarders.ctxproxy_floor:create_app"}
