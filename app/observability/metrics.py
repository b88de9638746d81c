"""Prometheus metrics of one app, in a registry of its own (never the global one).

Every label value comes from a closed set or a capped one, never from user content:

* ``route``: ``chat``, ``plan``, ``passthrough``, ``health``, ``observability``, ``other``
  (:func:`route_label`);
* ``model``: the model-table key the request's model resolved to (or an upstream route key), else
  ``other``; ``none`` when a request names no model; at most ``MAX_MODEL_LABELS`` distinct values
  (:class:`ModelLabels`);
* ``outcome``: ``ok``, ``upstream_error``, ``rejected``, ``invalid``, ``upstream_failed`` (502/504:
  unreachable, broken or timed out), ``unavailable`` (503 from the proxy: overloaded, not ready),
  ``client_closed``, ``error``;
* ``action``: the plan's action kinds (``app.core.plan.ActionKind``), else ``other``;
* discovery ``endpoint``/``result``: sanitized to ``[a-z0-9_]``, at most 16 distinct values each.

``prometheus-client`` is an optional dependency (the ``metrics`` extra): without it
:class:`Metrics` records nothing and ``available`` is False (``GET /metrics`` answers 503).

Metrics (all prefixed ``ctxproxy_``): ``requests_total{route,model,outcome}``,
``request_duration_seconds{route}``, ``tokens_before{model}`` and ``tokens_after{model}``
(histograms, chat requests), ``chat_fits_total{model,result}`` (``unchanged``/``cut``/``rejected``),
``tokens_saved_total{model}``, ``actions_total{action,model}`` (chat
requests in which the action happened), ``emergency_retries_total{outcome}``
(``succeeded``/``overflowed_again``/``failed``), ``summary_cache_requests_total{result}``
(``hit``/``miss``/``error``) and ``summary_cache_entries``, ``upstream_latency_seconds{status}``
(time to the upstream's response headers, per upstream call; ``status`` is ``2xx``..``5xx`` or
``error``), ``proxy_overhead_seconds{route}``, ``discovery_total{endpoint,result}`` (model discovery
calls to the upstream: ``models``/``props``/``show``, ``answered``/``not_found``/``error``/
``unreachable``, see ``app.observability.observer.discovery_call``),
``in_flight_requests``, ``build_info{version}``, plus the process collector.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, get_args

from ..core.plan import ActionKind

MAX_MODEL_LABELS = 256
MAX_TOKEN_VALUES = 16
OTHER = "other"
NONE = "none"

ACTION_KINDS: frozenset[str] = frozenset(get_args(ActionKind))
OUTCOMES = (
    "ok", "upstream_error", "rejected", "invalid", "upstream_failed", "unavailable", "client_closed", "error",
)  # fmt: skip
RETRY_OUTCOMES = ("succeeded", "overflowed_again", "failed")

TOKEN_BUCKETS = (
    128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152,
)  # fmt: skip
UPSTREAM_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

FITTED_ROUTES = frozenset({"chat", "responses", "messages"})  # one label per fitted wire API
_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/responses/input_tokens": "count",
    "/v1/messages/count_tokens": "count",
    "/v1/context/plan": "plan",
    "/healthz": "health",
    "/readyz": "health",
    "/metrics": "observability",
    "/": "observability",
    "/status.json": "observability",
}


def route_label(path: str) -> str:
    """The bounded ``route`` label of a request path."""
    label = _ROUTES.get(path)
    if label is not None:
        return label
    return "passthrough" if path.startswith("/v1/") else OTHER


class CacheStatsLike(Protocol):
    """What :meth:`Metrics.watch_summary_cache` reads (``app.compaction.CacheStats`` has it)."""

    @property
    def hits(self) -> int: ...

    @property
    def misses(self) -> int: ...

    @property
    def errors(self) -> int: ...

    @property
    def entries(self) -> int: ...


class SpecLike(Protocol):
    @property
    def matched(self) -> str | None: ...

    @property
    def guessed(self) -> bool: ...


class ModelLabels:
    """Maps a request's model name to a bounded label (see the module docstring).

    ``resolve`` is the model table's ``resolve`` (a spec with ``matched``/``guessed``); ``routes``
    the configured upstream route keys. Results are memoized in a bounded dict.
    """

    def __init__(
        self,
        resolve: Callable[[str], SpecLike] | None = None,
        *,
        routes: Iterable[str] = (),
        max_labels: int = MAX_MODEL_LABELS,
    ) -> None:
        self._resolve = resolve
        self._routes = sorted((r for r in routes if r), key=len, reverse=True)
        self._max = max_labels
        self._issued: set[str] = set()
        self._memo: dict[str, str] = {}
        self._lock = threading.Lock()

    def label(self, model: str | None) -> str:
        if not model:
            return NONE
        hit = self._memo.get(model)
        if hit is not None:
            return hit
        label = self._bounded(self._candidate(model))
        with self._lock:
            if len(self._memo) < 4 * self._max:
                self._memo[model] = label
        return label

    def _candidate(self, model: str) -> str:
        if self._resolve is not None:
            try:
                spec = self._resolve(model)
            except Exception:  # a resolver problem must not fail the request's bookkeeping
                spec = None
            if spec is not None and not spec.guessed and spec.matched:
                return spec.matched
        for key in self._routes:
            if model == key or model.startswith(key):
                return key
        return OTHER

    def _bounded(self, label: str) -> str:
        if label in (OTHER, NONE):
            return label
        with self._lock:
            if label in self._issued:
                return label
            if len(self._issued) >= self._max:
                return OTHER
            self._issued.add(label)
            return label


class _TokenSet:
    """A capped set of sanitized label values for free-form hook arguments."""

    def __init__(self, cap: int = MAX_TOKEN_VALUES) -> None:
        self._cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        token = re.sub(r"[^a-z0-9_]+", "_", str(value).lower()).strip("_")[:32] or OTHER
        with self._lock:
            if token in self._seen:
                return token
            if len(self._seen) >= self._cap:
                return OTHER
            self._seen.add(token)
            return token


def status_class(status: int | None) -> str:
    return "error" if status is None else f"{status // 100}xx"


def retry_outcomes(retries: int, final_status: int | None) -> list[str]:
    """One outcome per emergency retry: every retry but the last overflowed again; the last one
    succeeded when the final upstream status is below 400."""
    if retries <= 0:
        return []
    last = "succeeded" if final_status is not None and final_status < 400 else "failed"
    return ["overflowed_again"] * (retries - 1) + [last]


class Metrics:
    """The app's metrics; every method is cheap, thread-safe and never raises on bad input."""

    def __init__(
        self,
        *,
        version: str,
        model_labels: ModelLabels | None = None,
        multiprocess_dir: Path | None = None,
    ) -> None:
        """``multiprocess_dir``: the workers of one server share their metrics through
        prometheus-client's multiprocess mode; the directory must be the ``PROMETHEUS_MULTIPROC_DIR``
        that was set before prometheus-client was first imported (``ctxproxy serve`` does both).
        The scrape then sums every worker; the process collector (per process) is left out."""
        self.model_labels = model_labels or ModelLabels()
        self.multiprocess_dir = multiprocess_dir
        self._endpoint = _TokenSet()
        self._result = _TokenSet()
        self._cache_sources: list[Callable[[], CacheStatsLike]] = []
        self._hook_cache = {"hit": 0, "miss": 0, "error": 0}
        self._lock = threading.Lock()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        try:
            import prometheus_client as prom
        except ImportError:
            self.registry: Any = None
            return
        self.registry = prom.CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = prom.Counter(
            "ctxproxy_requests", "HTTP requests by route, model and outcome.",
            ["route", "model", "outcome"], registry=reg,
        )  # fmt: skip
        self.duration = prom.Histogram(
            "ctxproxy_request_duration_seconds", "Time from request start to the last response byte.",
            ["route"], buckets=DURATION_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.tokens_before = prom.Histogram(
            "ctxproxy_tokens_before", "Input tokens of a chat request as the client sent it.",
            ["model"], buckets=TOKEN_BUCKETS, registry=reg,
        )  # fmt: skip
        self.tokens_after = prom.Histogram(
            "ctxproxy_tokens_after", "Input tokens of a chat request as forwarded (after fitting).",
            ["model"], buckets=TOKEN_BUCKETS, registry=reg,
        )  # fmt: skip
        self.fits = prom.Counter(
            "ctxproxy_chat_fits", "Planned chat requests by what fitting did: unchanged, cut or rejected.",
            ["model", "result"], registry=reg,
        )  # fmt: skip
        self.tokens_saved = prom.Counter(
            "ctxproxy_tokens_saved", "Input tokens the proxy cut from chat requests (before - after).",
            ["model"], registry=reg,
        )  # fmt: skip
        self.prefix_reused = prom.Counter(
            "ctxproxy_prefix_reused_tokens",
            "Forwarded message tokens the previous forwarded request of the same conversation already "
            "sent as its prefix (an upstream prompt cache could reuse them); divide by the sum of "
            "ctxproxy_tokens_after for the share.",
            ["model"], registry=reg,
        )  # fmt: skip
        self.actions = prom.Counter(
            "ctxproxy_actions", "Chat requests in which the proxy took an action, by action kind.",
            ["action", "model"], registry=reg,
        )  # fmt: skip
        self.retries = prom.Counter(
            "ctxproxy_emergency_retries", "Emergency retries after an upstream context-length error.",
            ["outcome"], registry=reg,
        )  # fmt: skip
        self.upstream_latency = prom.Histogram(
            "ctxproxy_upstream_latency_seconds", "Time from sending to the upstream's response headers.",
            ["status"], buckets=UPSTREAM_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.overhead = prom.Histogram(
            "ctxproxy_proxy_overhead_seconds",
            "Time the proxy added before the response started, upstream waits excluded.",
            ["route"], buckets=OVERHEAD_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.discovery = prom.Counter(
            "ctxproxy_discovery", "Model discovery attempts against the upstream, by endpoint and result.",
            ["endpoint", "result"], registry=reg,
        )  # fmt: skip
        self.in_flight = prom.Gauge(
            "ctxproxy_in_flight_requests", "Proxied (/v1/) requests being served now.", registry=reg,
            multiprocess_mode="livesum",
        )  # fmt: skip
        info = prom.Gauge(
            "ctxproxy_build_info", "Always 1; the version as a label.", ["version"], registry=reg,
            multiprocess_mode="max",
        )  # fmt: skip
        info.labels(version=version).set(1)
        for kind in RETRY_OUTCOMES:
            self.retries.labels(outcome=kind)
        if multiprocess_dir is None:
            prom.ProcessCollector(registry=reg)
            reg.register(_SummaryCacheCollector(self))

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, memoized: ``labels()`` takes a lock and validates every call,
        the dominant cost per request otherwise. Bounded by the label sets' own bounds."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    @property
    def available(self) -> bool:
        return self.registry is not None

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition (Prometheus text, or OpenMetrics when ``accept`` asks) and its type."""
        if self.registry is None:
            raise RuntimeError("prometheus-client is not installed")
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(self._scrape_registry()), content_type

    def _scrape_registry(self) -> Any:
        if self.multiprocess_dir is None:
            return self.registry
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        # prometheus_client leaves this constructor unannotated.
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        registry.register(_SummaryCacheCollector(self))  # this worker's caches (each has its own)
        return registry

    def request_started(self) -> None:
        if self.registry is not None:
            self.in_flight.inc()

    def request_finished(self) -> None:
        if self.registry is not None:
            self.in_flight.dec()

    def observe_request(
        self,
        *,
        route: str,
        model: str,
        outcome: str,
        duration_s: float,
        overhead_s: float | None = None,
        tokens_before: int | None = None,
        tokens_after: int | None = None,
        actions: Mapping[str, int] | None = None,
        retries: int = 0,
        final_upstream_status: int | None = None,
        prefix_reused_tokens: int | None = None,
    ) -> None:
        """One finished request; ``model`` is already a bounded label. Token figures and actions are
        given for chat requests that were planned."""
        if self.registry is None:
            return
        self._child(self.requests, route, model, outcome).inc()
        self._child(self.duration, route).observe(max(0.0, duration_s))
        if overhead_s is not None:
            self._child(self.overhead, route).observe(max(0.0, overhead_s))
        if tokens_before is not None and tokens_after is not None:
            self._child(self.tokens_before, model).observe(tokens_before)
            self._child(self.tokens_after, model).observe(tokens_after)
            cut = bool(actions) or tokens_after != tokens_before
            result = "rejected" if outcome == "rejected" else "cut" if cut else "unchanged"
            self._child(self.fits, model, result).inc()
            if outcome != "rejected" and tokens_before > tokens_after:
                self._child(self.tokens_saved, model).inc(tokens_before - tokens_after)
            if prefix_reused_tokens is not None:
                self._child(self.prefix_reused, model).inc(max(0, prefix_reused_tokens))
        for kind in actions or {}:
            self._child(self.actions, kind if kind in ACTION_KINDS else OTHER, model).inc()
        for result in retry_outcomes(retries, final_upstream_status):
            self._child(self.retries, result).inc()

    def observe_upstream(self, waited_s: float, status: int | None) -> None:
        if self.registry is not None:
            self._child(self.upstream_latency, status_class(status)).observe(max(0.0, waited_s))

    def record_discovery(self, *, endpoint: str, result: str) -> None:
        """Hook for model discovery: one attempt against ``endpoint`` (e.g. ``models``, ``props``,
        ``show``) with ``result`` (e.g. ``found``, ``not_found``, ``failed``, ``timeout``)."""
        if self.registry is not None:
            self._child(self.discovery, self._endpoint(endpoint), self._result(result)).inc()

    def record_summary_cache(self, *, hit: bool, error: bool = False) -> None:
        """Hook for summary-cache lookups made outside a watched cache (see
        :meth:`watch_summary_cache`)."""
        with self._lock:
            self._hook_cache["error" if error else "hit" if hit else "miss"] += 1

    def watch_summary_cache(self, stats: Callable[[], CacheStatsLike]) -> None:
        """Read a cache's own counters at every scrape (``lambda: cache.stats()`` for the
        ``app.compaction`` caches); added to the hook's counts."""
        with self._lock:
            self._cache_sources.append(stats)

    def summary_cache_totals(self) -> dict[str, int]:
        """``hit``, ``miss``, ``error`` and ``entries`` over every source."""
        with self._lock:
            totals = dict(self._hook_cache)
            sources = list(self._cache_sources)
        totals["entries"] = 0
        for source in sources:
            try:
                s = source()
            except Exception:  # a broken cache must not break the scrape
                continue
            totals["hit"] += s.hits
            totals["miss"] += s.misses
            totals["error"] += s.errors
            totals["entries"] += s.entries
        return totals


class _SummaryCacheCollector:
    """Custom collector: the summary cache's counters, read when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        totals = self._metrics.summary_cache_totals()
        lookups = CounterMetricFamily(
            "ctxproxy_summary_cache_requests", "Summary cache lookups by result.", labels=["result"]
        )
        for result in ("hit", "miss", "error"):
            lookups.add_metric([result], totals[result])
        yield lookups
        yield GaugeMetricFamily(
            "ctxproxy_summary_cache_entries", "Summaries in the cache.", totals["entries"]
        )
