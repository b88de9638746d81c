"""The composition root: ``create_app`` wires settings, tokenizer, model table, upstream and API.

Run with ``uvicorn ctxproxy.main:create_app --factory``. Nothing happens at import time: the settings
are read when ``create_app`` runs (once, then passed down), and the lifespan opens the upstream
HTTP client, preloads the vocabularies and closes the client on shutdown. All state lives on
``app.state.service``.
"""

from __future__ import annotations

import copy
import gc
import json
import logging
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI

from . import __version__
from .api.auth import ProxyKeyMiddleware
from .api.compress import build_compress_router
from .api.errors import install_error_handlers
from .api.lane import DialectLane, ProxyApp
from .api.login import StatusLogin, session_granted
from .api.routes import build_router
from .core.dialect import Dialect
from .core.dialects import DIALECTS
from .core.knowledge import Knowledge
from .core.routes import RouteTable, key_slots
from .core.tokens import TokenCounter
from .observability import Observability, ObservabilityMiddleware, RequestIdFilter
from .observability import router as observability_router
from .observability.observer import discovery_call, discovery_result
from .service.discovery import Discovery
from .service.driver import Service
from .service.knowledge_share import KnowledgeShare, SharedCache
from .service.learning import Learner
from .service.ports import ModelResolver, Vocabularies
from .service.sessions import Sessions
from .service.worker_store import WorkerStore
from .settings import Settings, load_settings, unknown_variables
from .upstream.client import UpstreamClient
from .upstream.limits import ConcurrencyLimiter
from .upstream.senders import HttpxSender, Sender
from .upstream.traffic import Traffic, local_origin

_HANDLER_MARK = "_ctxproxy_handler"
# The API that speaks for requests of no API (an error on /healthz, a pass-through path no
# dialect owns): OpenAI's shape, what most clients of a /v1 base URL read; else the registry's first.
FALLBACK_API = "chat"
startup_logger = logging.getLogger("ctxproxy.startup")


class CountingPaths:
    """The paths of the registered APIs' token-counting endpoints, as a container (``path in
    paths``) for the observability's route labels: matched through the route table, so a templated
    counting route (``/v1beta/models/{model}:countTokens``) is one too."""

    def __init__(self, table: RouteTable) -> None:
        self.table = table

    def __contains__(self, path: object) -> bool:
        match = self.table.match(path) if isinstance(path, str) else None
        return match is not None and match.route.kind == "count"


class TiktokenVocabularies:
    """The production :class:`Vocabularies`: ``app.tokenizer`` (the only tiktoken import), its
    counting pool sized by ``count_threads`` (0: the CPUs the process may use) when preloaded."""

    def __init__(self, *, count_threads: int = 0) -> None:
        self.count_threads = count_threads

    def counter_for(self, encoding: str, /) -> TokenCounter:
        from .tokenizer import counter_for

        return counter_for(encoding)

    def preload(self) -> None:
        from .tokenizer import configure_counting, preload

        configure_counting(threads=self.count_threads)
        preload()

    def loaded_encodings(self) -> tuple[str, ...]:
        from .tokenizer import loaded_encodings

        return loaded_encodings()


def describe_table(settings: Settings, models: ModelResolver) -> str:
    """Where the model table came from, and what an unknown model gets, for the start-up log."""
    where = "built-in"
    if settings.models_file is not None:
        where = f"built-in merged with the operator file {settings.models_file}"
    default = getattr(models, "default", None)
    if default is None:
        return where
    return (
        f"{where}; unknown models: window {default.window_tokens}, max output "
        f"{default.max_output_tokens} ({default.source})"
    )


def load_model_registry(settings: Settings) -> ModelResolver:
    from .model_table import load_registry

    registry: ModelResolver = load_registry(
        operator_file=settings.models_file,
        default_window_tokens=settings.default_window_tokens,
        default_max_output_tokens=settings.default_max_output_tokens,
    )
    return registry


def shared_store(settings: Settings, cache: Any, *, name: str) -> SharedCache | None:
    """Where what one process keeps reaches the others: ``cache`` when it is shared (the summary
    cache on Redis: every replica), else files in ``settings.worker_dir`` under ``name`` (the
    workers of one ``ctxproxy serve --workers N``), else None (one process alone)."""
    if cache is not None and getattr(cache, "backend", "memory") != "memory":
        shared: SharedCache = cache
        return shared
    if settings.worker_dir is not None:
        return WorkerStore(settings.worker_dir / name)
    return None


def build_learner(
    settings: Settings,
    upstream: UpstreamClient,
    *,
    observability: Observability | None = None,
    cache: Any = None,
) -> Learner:
    """The model knowledge (in memory) and, unless disabled, discovery over ``upstream`` (a client
    of its own, out of the chat traffic's upstream metrics; its calls go to the discovery metric).
    What is learned is shared through :func:`shared_store`: between replicas through a shared
    ``cache`` (the summary cache when it is Redis), else between the workers of one ``ctxproxy
    serve --workers N`` through files in ``settings.worker_dir`` (quickly: they are on one host)."""
    knowledge = Knowledge()
    store = shared_store(settings, cache, name="knowledge")
    share = None
    if isinstance(store, WorkerStore):
        share = KnowledgeShare(store, knowledge, publish_delay_s=0.2, refresh_every_s=1.0, timeout_s=0.2)
    elif store is not None:
        share = KnowledgeShare(store, knowledge)
    if not settings.discovery:
        return Learner(knowledge=knowledge, share=share)

    def on_call(method: str, path: str, status: int | None) -> None:
        if observability is None:
            return
        endpoint = discovery_call(method, path, route=None)
        if endpoint is not None:
            observability.metrics.record_discovery(endpoint=endpoint, result=discovery_result(status))

    discovery = Discovery(upstream, knowledge, timeout_s=settings.discovery_timeout_s, on_call=on_call)
    return Learner(knowledge=knowledge, discovery=discovery, share=share)


def build_sender(settings: Settings, *, transport: httpx.AsyncBaseTransport | None = None) -> Sender:
    """The upstream sender: ``transport`` (a test seam) under httpx's API when given, else per
    ``settings.upstream_transport``: ``aiohttp`` (default) a raw aiohttp session, ``httpx-aiohttp``
    httpx's API on ``httpx_aiohttp.AiohttpTransport``, ``httpx`` httpx's own transport.

    Sized for concurrency: LLM calls hold their connection for seconds to minutes, so the pool
    allows ``upstream_max_connections`` at once (aiohttp's default of 100 would queue the 101st
    stream) and keeps every idle one alive ``upstream_keepalive_s`` (httpx's default keeps only
    20, so a burst above 20 reconnects every time). The caller closes it (``await sender.aclose()``).
    """
    if transport is None and settings.upstream_transport == "aiohttp":
        from .upstream.aiohttp_sender import AiohttpSender

        return AiohttpSender(
            limit=settings.upstream_max_connections, keepalive_s=settings.upstream_keepalive_s
        )
    if transport is None:
        transport = build_httpx_transport(settings)
    timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
    http = httpx.AsyncClient(transport=transport, timeout=timeout, follow_redirects=False)
    return HttpxSender(http, owned=True)


def build_httpx_transport(settings: Settings) -> httpx.AsyncBaseTransport:
    """The transport under httpx's API: aiohttp's pool (``httpx-aiohttp``) or httpx's own."""
    limits = httpx.Limits(
        max_connections=settings.upstream_max_connections,
        max_keepalive_connections=settings.upstream_max_connections,
        keepalive_expiry=settings.upstream_keepalive_s,
    )
    if settings.upstream_transport == "httpx-aiohttp":
        import aiohttp
        from httpx_aiohttp import AiohttpTransport

        transport = AiohttpTransport(limits=limits)

        def session() -> aiohttp.ClientSession:
            # httpx_aiohttp's own session (same connector), but with no cookie jar: a proxy must not
            # keep one client's upstream cookies and send them with the next client's requests.
            connector = aiohttp.TCPConnector(
                keepalive_timeout=limits.keepalive_expiry,
                ssl=transport.ssl_context,
                limit=settings.upstream_max_connections,
            )
            return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

        transport.client = session
        return transport
    return httpx.AsyncHTTPTransport(limits=limits)


def build_limiter(settings: Settings) -> ConcurrencyLimiter | None:
    """The cap on concurrent upstream requests; never above the connection pool (a default cap over
    a lowered ``upstream_max_connections`` follows it; an explicit one above it is refused by the
    settings), so a request over the cap queues here instead of waiting for a connection."""
    if not settings.max_concurrent_upstream:
        return None
    return ConcurrencyLimiter(
        max_concurrent=min(settings.max_concurrent_upstream, settings.upstream_max_connections),
        queue_timeout_s=settings.queue_timeout_s,
    )


def build_traffic(settings: Settings) -> Traffic:
    """Which upstreams summary calls give way to client requests on (``CTXPROXY_SUMMARY_YIELD``:
    ``auto``, a server on this machine or the local network)."""
    if settings.summary_yield == "always":
        return Traffic(yields=lambda _origin: True)
    if settings.summary_yield == "never":
        return Traffic(yields=lambda _origin: False)
    return Traffic(yields=local_origin)


def freeze_startup_heap() -> None:
    """Move every object alive after start-up (the vocabularies, the model table, the modules) out
    of the cyclic collector's reach (``gc.freeze``), after one collection so no garbage is kept.

    Why: a full collection walks every tracked object, and the start-up heap makes one take
    15-30 ms (measured: 73K objects after the lifespan's start). Under load one came every ~1,000
    requests, a 30-50 ms stall of the event loop each time (the p99 of a busy route) and a few
    percent of its CPU; frozen, a full collection walks only what requests made since. Reference
    counting still frees everything frozen that is dropped without a cycle. Undone by
    :func:`thaw_startup_heap` when the lifespan ends (tests start many apps in one process)."""
    gc.collect()
    gc.freeze()


def thaw_startup_heap() -> None:
    """Give the frozen objects back to the collector (``gc.unfreeze``): an app that stopped leaves
    nothing uncollectable behind."""
    gc.unfreeze()


class _Formatter(logging.Formatter):
    """``message key=value ...`` or one JSON object per line; ``record.access`` holds the fields."""

    def __init__(self, *, as_json: bool) -> None:
        super().__init__()
        self.as_json = as_json

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = dict(getattr(record, "access", None) or {})
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            fields.setdefault("request_id", request_id)
        if self.as_json:
            line: dict[str, Any] = {
                "ts": round(record.created, 3),
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
                **fields,
            }
            if record.exc_info:
                line["exc"] = self.formatException(record.exc_info)
            return json.dumps(line, default=str)
        text = f"{record.levelname} {record.name} {record.getMessage()}"
        text += "".join([f" {k}={v}" for k, v in fields.items()])
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record is emitted (like logging's own last-resort
    handler), so a stderr that was swapped and closed since (a test runner's capture, a process
    manager's pipe) is never written to."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
_SAVED_FORMATTER = "_ctxproxy_saved_formatter"


def json_log_formatter() -> logging.Formatter:
    """The JSON formatter of our own lines, for a logging ``dictConfig`` (``"()"`` factory)."""
    return _Formatter(as_json=True)


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging configuration with our JSON formatter in place of its text ones, for
    ``uvicorn.run(log_config=...)`` under ``CTXPROXY_LOG_JSON=true``: its lines ("Started server
    process", "Uvicorn running on", the worker supervisor's) come out as JSON objects like ours, in
    the parent process and in every worker."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    factory = f"{__package__}.main.json_log_formatter"
    config["formatters"] = {name: {"()": factory} for name in config["formatters"]}
    return config


def configure_logging(settings: Settings) -> None:
    """Our handler on the ``ctxproxy`` logger (replaced, never stacked, when called again). Under
    ``log_json`` the handlers uvicorn installed on its own loggers write JSON too (their formatter is
    swapped, and put back when called again without it), so ``uvicorn ctxproxy.main:create_app
    --factory`` logs one format; ``ctxproxy serve`` also configures uvicorn so from the start
    (:func:`uvicorn_log_config`)."""
    logger = logging.getLogger("ctxproxy")
    logger.setLevel(settings.log_level)
    for handler in list(logger.handlers):
        if getattr(handler, _HANDLER_MARK, False):
            logger.removeHandler(handler)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(as_json=settings.log_json))
    handler.addFilter(RequestIdFilter())
    setattr(handler, _HANDLER_MARK, True)
    logger.addHandler(handler)
    for name in UVICORN_LOGGERS:
        for theirs in logging.getLogger(name).handlers:
            swapped = hasattr(theirs, _SAVED_FORMATTER)
            if settings.log_json and not swapped:
                setattr(theirs, _SAVED_FORMATTER, theirs.formatter)
                theirs.setFormatter(_Formatter(as_json=True))
            elif not settings.log_json and swapped:
                theirs.setFormatter(getattr(theirs, _SAVED_FORMATTER))
                delattr(theirs, _SAVED_FORMATTER)


def create_app(
    settings: Settings | None = None,
    *,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    registry: ModelResolver | None = None,
    vocabularies: Vocabularies | None = None,
    dialects: Mapping[str, Dialect] | None = None,
) -> FastAPI:
    """The ASGI app. ``upstream_transport``, ``registry``, ``vocabularies`` and ``dialects`` are
    test seams; by default the transport follows ``settings.upstream_transport``, the model table
    is ``app.model_table.load_registry``, the vocabularies are ``app.tokenizer``'s and the wire
    APIs are ``app.core.dialects.DIALECTS``. Everything that lists APIs is derived from that
    registry here and injected: the routes (served by ``DialectLane``) and the pass-through
    prefixes, the key slots auth accepts and the upstream clears, the dry run's choices, the
    summaries' API (``CTXPROXY_SUMMARY_API``, checked against it), and the fallback dialect that
    speaks for a request of no API (``FALLBACK_API``, ``app.state.fallback_dialect``)."""
    settings = settings or load_settings()  # bad values: InvalidSettings, one line per setting
    configure_logging(settings)
    for warning in unknown_variables():  # a mistyped variable must not be silently ignored
        startup_logger.warning(warning)
    vocab: Vocabularies = vocabularies or TiktokenVocabularies(count_threads=settings.count_threads)
    apis = dict(DIALECTS if dialects is None else dialects)
    settings.require_apis(tuple(apis))  # InvalidSettings: a summary API the registry lacks
    fallback = apis.get(FALLBACK_API) or next(iter(apis.values()))
    table = RouteTable.of(apis)  # ValueError for a registry whose routes clash
    slots = key_slots(apis.values())
    observability = Observability.from_settings(settings, apis=tuple(apis), counting=CountingPaths(table))
    sessions = Sessions()  # the status page's logins; shared once the cache exists (lifespan)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        models = registry or load_model_registry(settings)
        observability.use_registry(models)
        table = "given to create_app" if registry is not None else describe_table(settings, models)
        for line in settings.summary_lines(table=table):
            startup_logger.info(line)
        await anyio.to_thread.run_sync(vocab.preload)
        timeout = httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s)
        sender = build_sender(settings, transport=upstream_transport)
        try:
            upstream = UpstreamClient(
                sender,
                base_url=settings.upstream_base_url,
                api_key=settings.upstream_key(),
                routes=settings.upstream_routes,
                timeout=timeout,
                limiter=build_limiter(settings),
                traffic=build_traffic(settings),
                stream_idle_timeout_s=settings.stream_idle_timeout_s,
                instrumentation=observability.instrumentation(),
                key_slots=slots,
            )
            from .service.summaries import Summaries

            summaries = Summaries(
                settings=settings,
                registry=models,
                vocabularies=vocab,
                upstream=upstream,
                dialects=apis,
                events=observability,
            )
            # Its lookups are reported by API (the events); the cache itself tells its entries.
            observability.metrics.watch_summary_cache(summaries.cache.stats, lookups=False)
            learner = build_learner(
                settings,
                UpstreamClient(
                    sender,
                    base_url=settings.upstream_base_url,
                    api_key=settings.upstream_key(),
                    routes=settings.upstream_routes,
                    timeout=timeout,
                    key_slots=slots,
                ),
                observability=observability,
                cache=summaries.cache,
            )
            from .service.recall import Recall

            # Made even with CTXPROXY_RECALL off: X-Context-Recall: on turns it on for a request.
            recall = Recall(settings=settings, events=observability)
            app.state.service = Service(
                settings=settings,
                registry=models,
                vocabularies=vocab,
                upstream=upstream,
                summaries=summaries,
                learner=learner,
                recall=recall,
            )
            observability.use_knowledge(learner.knowledge.discovered)
            session_store = shared_store(settings, summaries.cache, name="sessions")
            if session_store is not None:
                sessions.share(session_store)
            if learner.discovery is not None:
                learner.discovery.start()
            freeze_startup_heap()
            try:
                yield
            finally:
                thaw_startup_heap()
                await learner.aclose()
                await summaries.aclose()
                await recall.aclose()
        finally:
            await sender.aclose()

    app = ProxyApp(
        title="ctxproxy",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.observability = observability
    app.state.dialects = apis
    app.state.fallback_dialect = fallback  # read by app.api.errors.dialect_of
    app.state.routes = table
    app.include_router(build_compress_router(apis))  # before the pass-through of every /v1/... path
    app.include_router(build_router(table))
    app.include_router(observability_router)
    app.add_middleware(DialectLane, table=table)  # innermost: inside the error handling installed next
    install_error_handlers(app)
    if settings.proxy_api_keys():
        keys = settings.proxy_api_keys()
        app.add_middleware(ProxyKeyMiddleware, keys=keys, slots=slots, table=table, granted=session_granted)
        app.add_middleware(StatusLogin, keys=keys, sessions=sessions)  # a person's way in
    app.add_middleware(ObservabilityMiddleware, observability=observability, access_log=True)
    return app
