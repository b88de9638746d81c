"""Prometheus metrics of one app, in a registry of its own (never the global one).

Every label value comes from a closed set or a capped one, never from user content (the sets are
in :mod:`app.observability.labels`): ``route``, ``api`` (the wire API: a dialect's name, ``none``
for requests of no API), ``model``, ``upstream``, and

* ``outcome``: ``ok``, ``upstream_error``, ``rejected``, ``invalid``, ``upstream_failed`` (502/504:
  unreachable, broken or timed out), ``unavailable`` (503 from the proxy: overloaded, not ready),
  ``client_closed``, ``error``;
* ``action``: the plan's action kinds (``app.core.plan.ActionKind``), else ``other``.

``prometheus-client`` is an optional dependency (the ``metrics`` extra): without it
:class:`Metrics` records nothing and ``available`` is False (``GET /metrics`` answers 503).
No ``_created`` series is exposed (they are left out of this app's scrape, see :meth:`render`).

Metrics (all prefixed ``ctxproxy_``):

* per request: ``requests_total{route,api,model,outcome}``, ``request_duration_seconds{route,api}``,
  ``proxy_overhead_seconds{route,api}`` (time to the response start, upstream waits excluded);
* per fitted request (a request of a wire API the proxy planned: its route label is its API's
  name): ``input_before_tokens{api,model}`` / ``input_after_tokens{api,model}`` (histograms of
  input tokens as the client sent them / as forwarded; a rejected request forwarded nothing and
  has no "after"), ``fits_total{api,model,result}`` (``unchanged``/``cut``/``rejected``),
  ``tokens_saved_total{api,model}``, ``prefix_reused_tokens_total{api,model}``,
  ``actions_total{api,action,model}`` (requests in which the action happened),
  ``emergency_retries_total{api,outcome}`` (``succeeded``/``overflowed_again``/``failed``),
  ``cut_memory_total{api,kind}`` (requests whose dropped turns were stood in for by a ``summary``
  or by the plain ``note``);
* summaries (hooks, see below): ``summary_calls_total{api,outcome}``,
  ``summary_tokens_total{api,direction}`` (``in``: sent to the summarizer, ``out``: the summaries),
  ``summary_cache_requests_total{api,result}`` (``hit``/``miss``/``error``; watched caches count
  under ``api="none"``) and ``summary_cache_entries``;
* recall (hook, see below): ``recall_total{api,event}`` (``calls`` of ``ctx_recall`` the proxy
  answered, ``rounds`` it continued an answer for, ``misses``) and ``recall_bytes_total{api}``
  (what it recalled);
* upstream: ``upstream_latency_seconds{api,upstream,status}`` (time to the upstream's response
  headers, per upstream call; ``status`` is ``2xx``..``5xx`` or ``error``),
  ``discovery_total{endpoint,result}`` (model discovery calls, see
  ``app.observability.observer.discovery_call``);
* ``in_flight_requests``, ``build_info{version}``, plus the process collector.

Hooks other code calls (cheap, thread-safe, never raising): :meth:`Metrics.record_summary`,
:meth:`Metrics.record_recall`, :meth:`Metrics.record_summary_cache`, :meth:`Metrics.watch_summary_cache`,
:meth:`Metrics.record_discovery`.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, get_args

from ..core.plan import ActionKind
from .labels import NONE, OTHER, ApiLabels, ModelLabels, TokenSet, retry_outcomes, status_class

logger = logging.getLogger("ctxproxy.observability")

ACTION_KINDS: frozenset[str] = frozenset(get_args(ActionKind))
OUTCOMES = (
    "ok", "upstream_error", "rejected", "invalid", "upstream_failed", "unavailable", "client_closed", "error",
)  # fmt: skip
RETRY_OUTCOMES = ("succeeded", "overflowed_again", "failed")
MEMORY_KINDS = ("summary", "index", "note")
SUMMARY_OK = "ok"
CACHE_RESULTS = ("hit", "miss", "error")

TOKEN_BUCKETS = (
    128, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152,
)  # fmt: skip
UPSTREAM_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


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


def fit_result(outcome: str, tokens_before: int, tokens_after: int, actions: Mapping[str, int]) -> str:
    """``rejected``, ``cut`` or ``unchanged``: what fitting did to one request (the status board
    counts ``changed_requests`` by the same rule)."""
    if outcome == "rejected":
        return "rejected"
    return "cut" if actions or tokens_after != tokens_before else "unchanged"


class Metrics:
    """The app's metrics; every method is cheap, thread-safe and never raises on bad input."""

    def __init__(
        self,
        *,
        version: str,
        model_labels: ModelLabels | None = None,
        apis: Iterable[str] = (),
        multiprocess_dir: Path | None = None,
    ) -> None:
        """``apis``: the registered wire APIs' names (their series exist from the start).
        ``multiprocess_dir``: the workers of one server share their metrics through
        prometheus-client's multiprocess mode; the directory must be the ``PROMETHEUS_MULTIPROC_DIR``
        that was set before prometheus-client was first imported (``ctxproxy serve`` does both).
        The scrape then sums every worker; the process collector (per process) is left out."""
        self.model_labels = model_labels or ModelLabels()
        self.api_labels = ApiLabels(apis)
        self.multiprocess_dir = multiprocess_dir
        self._endpoint = TokenSet()
        self._result = TokenSet()
        self._summary_outcome = TokenSet()
        self._cache_sources: list[tuple[Callable[[], CacheStatsLike], bool]] = []
        # Both keyed by label values only: bounded by the label sets (app.observability.labels:
        # each closed or capped), whatever the clients send.
        self._hook_cache: dict[tuple[str, str], int] = {(NONE, r): 0 for r in CACHE_RESULTS}
        self._lock = threading.Lock()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        try:
            import prometheus_client as prom
        except ImportError:
            self.registry: Any = None
            return
        self.registry = prom.CollectorRegistry(auto_describe=True)
        self._build(prom, version)
        for api in self.api_labels.names:
            for kind in RETRY_OUTCOMES:
                self._child(self.retries, api, kind)
            for kind in MEMORY_KINDS:
                self._child(self.cut_memory, api, kind)
            for direction in ("in", "out"):
                self._child(self.summary_tokens, api, direction)
            self._child(self.summary_calls, api, SUMMARY_OK)
        for kind in RETRY_OUTCOMES:
            self._child(self.retries, NONE, kind)
        if multiprocess_dir is None:
            prom.ProcessCollector(registry=self.registry)
            self.registry.register(_SummaryCacheCollector(self))

    def _build(self, prom: Any, version: str) -> None:
        reg = self.registry
        self.requests = prom.Counter(
            "ctxproxy_requests", "HTTP requests by route, wire API, model and outcome.",
            ["route", "api", "model", "outcome"], registry=reg,
        )  # fmt: skip
        self.duration = prom.Histogram(
            "ctxproxy_request_duration_seconds", "Time from request start to the last response byte.",
            ["route", "api"], buckets=DURATION_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.tokens_before = prom.Histogram(
            "ctxproxy_input_before", "Input tokens of a fitted request as the client sent it.",
            ["api", "model"], buckets=TOKEN_BUCKETS, registry=reg, unit="tokens",
        )  # fmt: skip
        self.tokens_after = prom.Histogram(
            "ctxproxy_input_after", "Input tokens of a fitted request as forwarded (not for rejected ones).",
            ["api", "model"], buckets=TOKEN_BUCKETS, registry=reg, unit="tokens",
        )  # fmt: skip
        self.fits = prom.Counter(
            "ctxproxy_fits", "Fitted requests by what fitting did: unchanged, cut or rejected.",
            ["api", "model", "result"], registry=reg,
        )  # fmt: skip
        self.tokens_saved = prom.Counter(
            "ctxproxy_tokens_saved", "Input tokens the proxy cut from fitted requests (before - after).",
            ["api", "model"], registry=reg,
        )  # fmt: skip
        self.prefix_reused = prom.Counter(
            "ctxproxy_prefix_reused_tokens",
            "Forwarded message tokens the previous forwarded request of the same conversation already "
            "sent as its prefix (an upstream prompt cache could reuse them); divide by the sum of "
            "ctxproxy_input_after_tokens for the share.",
            ["api", "model"], registry=reg,
        )  # fmt: skip
        self.actions = prom.Counter(
            "ctxproxy_actions", "Fitted requests in which the proxy took an action, by action kind.",
            ["api", "action", "model"], registry=reg,
        )  # fmt: skip
        self.retries = prom.Counter(
            "ctxproxy_emergency_retries", "Emergency retries after an upstream context-length error.",
            ["api", "outcome"], registry=reg,
        )  # fmt: skip
        self.cut_memory = prom.Counter(
            "ctxproxy_cut_memory",
            "Fitted requests with dropped turns, by what stands in for them: a summary or the plain note.",
            ["api", "kind"], registry=reg,
        )  # fmt: skip
        self.summary_calls = prom.Counter(
            "ctxproxy_summary_calls", "Summary requests to the summarizer, by outcome.",
            ["api", "outcome"], registry=reg,
        )  # fmt: skip
        self.summary_tokens = prom.Counter(
            "ctxproxy_summary_tokens",
            "Tokens sent to the summarizer (direction in) and summary tokens it answered (out).",
            ["api", "direction"], registry=reg,
        )  # fmt: skip
        self.recall = prom.Counter(
            "ctxproxy_recall", "ctx_recall calls the proxy answered, rounds it continued, misses.",
            ["api", "event"], registry=reg,
        )  # fmt: skip
        self.recall_bytes = prom.Counter(
            "ctxproxy_recall_bytes", "Bytes of removed content the proxy recalled for ctx_recall.",
            ["api"], registry=reg,
        )  # fmt: skip
        self.upstream_latency = prom.Histogram(
            "ctxproxy_upstream_latency_seconds", "Time from sending to the upstream's response headers.",
            ["api", "upstream", "status"], buckets=UPSTREAM_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.overhead = prom.Histogram(
            "ctxproxy_proxy_overhead_seconds",
            "Time the proxy added before the response started, upstream waits excluded.",
            ["route", "api"], buckets=OVERHEAD_BUCKETS_S, registry=reg,
        )  # fmt: skip
        self.discovery = prom.Counter(
            "ctxproxy_discovery", "Model discovery attempts against the upstream, by endpoint and result.",
            ["endpoint", "result"], registry=reg,
        )  # fmt: skip
        self.in_flight = prom.Gauge(
            "ctxproxy_in_flight_requests", "Proxied requests being served now.", registry=reg,
            multiprocess_mode="livesum",
        )  # fmt: skip
        info = prom.Gauge(
            "ctxproxy_build_info", "Always 1; the version as a label.", ["version"], registry=reg,
            multiprocess_mode="max",
        )  # fmt: skip
        info.labels(version=version).set(1)

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
        """The exposition (Prometheus text, or OpenMetrics when ``accept`` asks) and its type,
        without ``_created`` series (prometheus-client only turns them off process-wide, which is
        not this app's to decide: they are left out of this app's scrape instead)."""
        if self.registry is None:
            raise RuntimeError("prometheus-client is not installed")
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(_WithoutCreated(self._scrape_registry())), content_type

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
        api: str = NONE,
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
        memory: str | None = None,
    ) -> None:
        """One finished request; ``api`` and ``model`` are already bounded labels. Token figures,
        actions and ``memory`` (``summary``/``index``/``note``) are given for fitted requests."""
        if self.registry is None:
            return
        self._child(self.requests, route, api, model, outcome).inc()
        self._child(self.duration, route, api).observe(max(0.0, duration_s))
        if overhead_s is not None:
            self._child(self.overhead, route, api).observe(max(0.0, overhead_s))
        if tokens_before is not None and tokens_after is not None:
            # fit_result, inlined (per request)
            if outcome == "rejected":
                result = "rejected"
            else:
                result = "cut" if actions or tokens_after != tokens_before else "unchanged"
            self._child(self.tokens_before, api, model).observe(tokens_before)
            self._child(self.fits, api, model, result).inc()
            if result != "rejected":
                self._child(self.tokens_after, api, model).observe(tokens_after)
                if tokens_before > tokens_after:
                    self._child(self.tokens_saved, api, model).inc(tokens_before - tokens_after)
                if prefix_reused_tokens is not None:
                    self._child(self.prefix_reused, api, model).inc(max(0, prefix_reused_tokens))
                if memory in MEMORY_KINDS:
                    self._child(self.cut_memory, api, memory).inc()
        for kind in actions or {}:
            self._child(self.actions, api, kind if kind in ACTION_KINDS else OTHER, model).inc()
        for result in retry_outcomes(retries, final_upstream_status):
            self._child(self.retries, api, result).inc()

    def observe_upstream(
        self, waited_s: float, status: int | None, *, api: str = NONE, upstream: str = OTHER
    ) -> None:
        """One upstream call; ``api`` and ``upstream`` are already bounded labels."""
        if self.registry is not None:
            child = self._child(self.upstream_latency, api, upstream, status_class(status))
            child.observe(max(0.0, waited_s))

    def record_discovery(self, *, endpoint: str, result: str) -> None:
        """Hook for model discovery: one attempt against ``endpoint`` (e.g. ``models``, ``props``,
        ``show``) with ``result`` (e.g. ``found``, ``not_found``, ``failed``, ``timeout``)."""
        if self.registry is not None:
            self._child(self.discovery, self._endpoint(endpoint), self._result(result)).inc()

    def record_summary(
        self, *, api: str | None, outcome: str, tokens_in: int = 0, tokens_out: int = 0
    ) -> None:
        """Hook for the summarizer: one summary call made for a request of ``api`` (a wire API's
        name), its ``outcome`` (``ok``; a failure in a few words: ``failed``, ``timeout``,
        ``not_found``...; sanitized, at most 16 values), the tokens sent (``tokens_in``) and the
        summary's tokens (``tokens_out``, 0 when it failed)."""
        if self.registry is None:
            return
        try:
            label = self.api_labels(api)
            self._child(self.summary_calls, label, self._summary_outcome(outcome)).inc()
            if tokens_in > 0:
                self._child(self.summary_tokens, label, "in").inc(tokens_in)
            if tokens_out > 0:
                self._child(self.summary_tokens, label, "out").inc(tokens_out)
        except Exception:  # a hook must never fail its caller
            logger.debug("recording a summary call failed", exc_info=True)

    def record_recall(self, *, api: str | None, calls: int, bytes_: int, rounds: int, misses: int) -> None:
        """Hook for recall: one request's ``ctx_recall`` calls answered, the bytes recalled, the
        rounds continued and the misses, for a request of ``api``."""
        if self.registry is None:
            return
        try:
            label = self.api_labels(api)
            for event, value in (("calls", calls), ("rounds", rounds), ("misses", misses)):
                if value > 0:
                    self._child(self.recall, label, event).inc(value)
            if bytes_ > 0:
                self._child(self.recall_bytes, label).inc(bytes_)
        except Exception:  # a hook must never fail its caller
            logger.debug("recording recall failed", exc_info=True)

    def record_summary_cache(self, *, hit: bool, error: bool = False, api: str | None = None) -> None:
        """Hook for one summary-cache lookup made for a request of ``api`` (a wire API's name;
        None: unattributed), outside a watched cache (see :meth:`watch_summary_cache`: count each
        lookup through one of the two, not both)."""
        try:
            key = (self.api_labels(api), "error" if error else "hit" if hit else "miss")
            with self._lock:
                self._hook_cache[key] = self._hook_cache.get(key, 0) + 1
        except Exception:  # a hook must never fail its caller
            logger.debug("recording a summary cache lookup failed", exc_info=True)

    def watch_summary_cache(self, stats: Callable[[], CacheStatsLike], *, lookups: bool = True) -> None:
        """Read a cache's own counters at every scrape (``lambda: cache.stats()`` for the
        ``app.compaction`` caches); counted under ``api="none"``, added to the hook's counts.
        With ``lookups=False`` only its entries are read (its lookups are reported through
        :meth:`record_summary_cache`, by API)."""
        with self._lock:
            self._cache_sources.append((stats, lookups))

    def summary_cache_snapshot(self) -> tuple[dict[tuple[str, str], int], int]:
        """``({(api, result): lookups}, entries)`` over the hook and every watched cache (whose
        lookups count under ``none``); each watched cache is read once."""
        with self._lock:
            counts = dict(self._hook_cache)
            sources = list(self._cache_sources)
        entries = 0
        for source, lookups in sources:
            try:
                s = source()
                read = (("hit", s.hits), ("miss", s.misses), ("error", s.errors)) if lookups else ()
                entries += s.entries
            except Exception:  # a broken cache must not break the scrape
                continue
            for result, value in read:
                counts[(NONE, result)] = counts.get((NONE, result), 0) + value
        return counts, entries

    def summary_cache_totals(self) -> dict[str, int]:
        """``hit``, ``miss``, ``error`` and ``entries`` over every source and API."""
        counts, entries = self.summary_cache_snapshot()
        totals = dict.fromkeys(CACHE_RESULTS, 0)
        for (_api, result), value in counts.items():
            totals[result] += value
        totals["entries"] = entries
        return totals


class _WithoutCreated:
    """A registry's view for the encoders with every ``_created`` sample left out."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Any]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if len(samples) != len(family.samples):
                family = copy.copy(family)
                family.samples = samples
            yield family


class _SummaryCacheCollector:
    """Custom collector: the summary cache's counters, read when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        lookups = CounterMetricFamily(
            "ctxproxy_summary_cache_requests", "Summary cache lookups by wire API and result.",
            labels=["api", "result"],
        )  # fmt: skip
        counts, entries = self._metrics.summary_cache_snapshot()
        for (api, result), value in sorted(counts.items()):
            lookups.add_metric([api, result], value)
        yield lookups
        yield GaugeMetricFamily("ctxproxy_summary_cache_entries", "Summaries in the cache.", entries)
