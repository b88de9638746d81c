"""What the status page shows: recent requests (a bounded ring buffer), counters since start (in
total and per wire API), the upstream and the effective model table, as JSON-ready data
(``GET /status.json``).

Only proxied requests (under an API version prefix, ``/v1...``) are recorded. A record holds the
model name (cut to 80 characters), the wire API, token figures, the ``X-Context-Actions`` value,
status, outcome and timings: never a message, a header value or a key. Upstream URLs are shown
without user info and query string.

Counters (``counters`` in the snapshot; the same keys in total and in ``counters.by_api[api]``):
``requests`` (every proxied request of the API: fitted, counting, dry runs, engine), ``fitted_requests``
(planned and forwarded, or rejected), ``changed_requests`` (cut), ``tokens_before``,
``tokens_after`` and ``tokens_saved`` (rejected requests forwarded nothing: no "after", nothing
saved), ``prefix_reused_tokens``, ``emergency_retries``, ``by_outcome``, ``actions``, ``memory``
(``summary``/``index``/``note``: what stands in for dropped turns) and ``summaries`` (``calls``,
``failures`` (``rejected`` among them: answers the summary checks refused), ``tokens_in``,
``tokens_out``, ``cache_hit``, ``cache_miss``, ``cache_error``, from the summary hooks) and
``recall`` (``calls`` of ``ctx_recall`` the proxy answered, the ``bytes`` it recalled, the
``rounds`` it continued answers for, ``misses``: an unknown or expired id, a page that does not
exist or no room). The totals also have ``by_route``. They follow the same rules as the
Prometheus metrics (``app.observability.metrics``), so the two agree.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol

from ..settings import display_url
from .shared import SharedBoard, add_counts, merge

RECENT_MAX = 200
MODEL_NAME_MAX = 80
NO_API = "no_api"  # the raw counters' bucket of the requests of no API (pass-through)
SUMMARY_KEYS = (
    "calls",
    "failures",
    "rejected",
    "tokens_in",
    "tokens_out",
    "cache_hit",
    "cache_miss",
    "cache_error",
)
RECALL_KEYS = ("calls", "bytes", "rounds", "misses")

__all__ = ["RecentRequest", "StatusBoard", "display_url"]


class RecentRequest(NamedTuple):
    """One finished proxied request as the status page lists it (a NamedTuple: immutable, and
    made for every request, where a frozen dataclass costs several times more). ``api``: the
    wire API's name, None for a request of no API (pass-through)."""

    at_s: float
    request_id: str
    method: str
    route: str
    model: str | None
    status: int | None
    outcome: str
    tokens_before: int | None
    tokens_after: int | None
    budget_tokens: int | None
    actions: str | None
    retries: int
    latency_ms: float
    upstream_ms: float | None
    overhead_ms: float | None
    stream: bool
    api: str | None = None


def _counters() -> dict[str, Any]:
    return {
        "requests": 0,
        "fitted_requests": 0,
        "changed_requests": 0,
        "tokens_before": 0,
        "tokens_after": 0,
        "tokens_saved": 0,
        "prefix_reused_tokens": 0,
        "emergency_retries": 0,
        "by_outcome": {},
        "actions": {},
        "memory": {"summary": 0, "index": 0, "note": 0},
        "summaries": dict.fromkeys(SUMMARY_KEYS, 0),
        "recall": dict.fromkeys(RECALL_KEYS, 0),
    }


class SpecRow(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def window_tokens(self) -> int: ...

    @property
    def max_output_tokens(self) -> int: ...

    @property
    def encoding(self) -> str: ...

    @property
    def source(self) -> str: ...


def _spec_row(spec: SpecRow) -> dict[str, Any]:
    return {
        "name": spec.name,
        "window_tokens": spec.window_tokens,
        "max_output_tokens": spec.max_output_tokens,
        "encoding": spec.encoding,
        "source": spec.source,
    }


class StatusBoard:
    """Counters since start and the last ``RECENT_MAX`` proxied requests; thread-safe.

    ``apis``: the registered wire APIs' names, in the registry's order: each has its counters
    (zero) from the start, and ``apis`` in the snapshot lists them (then any other API seen)."""

    def __init__(
        self,
        *,
        version: str,
        upstream_base_url: str,
        upstream_routes: Mapping[str, str] | None = None,
        apis: Iterable[str] = (),
        recent_max: int = RECENT_MAX,
        shared: SharedBoard | None = None,
    ) -> None:
        self.version = version
        self.apis = tuple(dict.fromkeys(apis))
        self._shared = shared
        self.started_at_s = time.time()
        self._started_mono = time.monotonic()
        self.upstream = {
            "base_url": display_url(upstream_base_url),
            "routes": {k: display_url(v) for k, v in (upstream_routes or {}).items()},
        }
        self._recent: deque[RecentRequest] = deque(maxlen=recent_max)
        self._lock = threading.Lock()
        self._models: list[dict[str, Any]] = []
        self._default_model: dict[str, Any] | None = None
        self.in_flight = 0
        # Kept per API only (one dict to update per request); the totals are summed when read.
        # Keyed by label values (route, API, outcome, action and memory kinds): bounded by the
        # label sets (app.observability.labels), whatever the clients send.
        self._counters: dict[str, Any] = {
            "by_route": {},
            "by_api": {api: _counters() for api in self.apis},
            NO_API: _counters(),
        }
        self._upstream: dict[str, Any] = {
            "calls": 0,
            "errors": 0,
            "last_status": None,
            "last_latency_ms": None,
            "last_at_s": None,
        }
        if shared is not None:
            shared.changed(self._own)  # so that the other workers count this one from the start

    def set_model_table(self, entries: Iterable[SpecRow], default: SpecRow | None) -> None:
        rows = [_spec_row(spec) for spec in entries]
        with self._lock:
            self._models = rows
            self._default_model = _spec_row(default) if default is not None else None

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1
        self._changed()

    def finished(self) -> None:
        with self._lock:
            self.in_flight -= 1
        self._changed()

    def _changed(self) -> None:
        if self._shared is not None:
            self._shared.changed(self._own)

    def upstream_call(self, waited_s: float, status: int | None) -> None:
        with self._lock:
            u = self._upstream
            u["calls"] += 1
            if status is None or status >= 500:
                u["errors"] += 1
            u["last_status"] = status
            u["last_latency_ms"] = round(waited_s * 1000, 2)
            u["last_at_s"] = round(time.time(), 3)
        self._changed()

    def record(
        self,
        entry: RecentRequest,
        *,
        actions: Mapping[str, int],
        fitted: bool = False,
        prefix_reused_tokens: int | None = None,
        memory: str | None = None,
    ) -> None:
        """One finished proxied request. ``fitted``: a request of ``entry.api`` the proxy planned
        (its token figures, ``actions``, reuse and ``memory`` count; see the module docstring)."""
        if entry.model is not None and len(entry.model) > MODEL_NAME_MAX:
            entry = entry._replace(model=entry.model[:MODEL_NAME_MAX] + "…")
        with self._lock:
            self._recent.append(entry)
            _bump(self._counters["by_route"], entry.route)
            c = self._counters_of(entry.api)
            c["requests"] += 1
            _bump(c["by_outcome"], entry.outcome)
            c["emergency_retries"] += entry.retries
            if fitted and entry.tokens_before is not None and entry.tokens_after is not None:
                _add_fitted(c, entry, actions, prefix_reused_tokens, memory)
        self._changed()

    def record_summary(self, *, api: str, outcome: str, tokens_in: int = 0, tokens_out: int = 0) -> None:
        """One summary call for a request of ``api`` (a bounded label): see ``Metrics.record_summary``."""
        with self._lock:
            summaries = self._counters_of(api)["summaries"]
            summaries["calls"] += 1
            summaries["failures"] += outcome != "ok"
            summaries["rejected"] += outcome == "rejected"  # refused by the summary checks
            summaries["tokens_in"] += max(0, tokens_in)
            summaries["tokens_out"] += max(0, tokens_out)
        self._changed()

    def record_recall(self, *, api: str, calls: int, bytes_: int, rounds: int, misses: int) -> None:
        """One request's recall rounds (``app.service.recall``) for a request of ``api``."""
        with self._lock:
            recall = self._counters_of(api).setdefault("recall", dict.fromkeys(RECALL_KEYS, 0))
            for key, value in (("calls", calls), ("bytes", bytes_), ("rounds", rounds), ("misses", misses)):
                recall[key] = recall.get(key, 0) + max(0, value)
        self._changed()

    def record_summary_cache(self, *, api: str, result: str) -> None:
        """One summary-cache lookup (``hit``, ``miss`` or ``error``) for a request of ``api``."""
        with self._lock:
            summaries = self._counters_of(api)["summaries"]
            key = f"cache_{result}"
            summaries[key] = summaries.get(key, 0) + 1
        self._changed()

    def _counters_of(self, api: str | None) -> dict[str, Any]:
        """The counters of ``api`` (made when first seen), or of the requests of no API."""
        if api is None:
            counters: dict[str, Any] = self._counters[NO_API]
            return counters
        by_api: dict[str, dict[str, Any]] = self._counters["by_api"]
        mine = by_api.get(api)
        if mine is None:
            mine = by_api[api] = _counters()
        return mine

    def recent(self) -> list[RecentRequest]:
        with self._lock:
            return list(self._recent)

    def _own(self) -> dict[str, Any]:
        """This worker's share of the board (what a :class:`SharedBoard` publishes)."""
        with self._lock:
            return {
                "pid": os.getpid(),
                "started_at_s": round(self.started_at_s, 3),
                "in_flight": self.in_flight,
                "counters": _copy(self._counters),
                "recent": [r._asdict() for r in reversed(self._recent)],
                "upstream_health": dict(self._upstream),
            }

    def snapshot(self, *, summary_cache: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Everything ``GET /status.json`` returns; recent requests newest first. With a
        :class:`SharedBoard`, every worker of the server is in it (``workers`` says how many).
        ``apis``: the registered APIs, then any other API the counters have."""
        own = self._own()
        if self._shared is not None:
            own = merge(own, self._shared.others(), recent_max=self._recent.maxlen or RECENT_MAX)
        with self._lock:
            models = list(self._models)
            default = self._default_model
        counters = with_totals(own["counters"])
        apis = list(dict.fromkeys([*self.apis, *counters["by_api"]]))
        return {
            "version": self.version,
            "now_s": round(time.time(), 3),
            "started_at_s": own["started_at_s"],
            "uptime_s": round(time.monotonic() - self._started_mono, 1),
            "workers": own.get("workers", 1),
            "in_flight": own["in_flight"],
            "apis": apis,
            "upstream": {**self.upstream, "health": own["upstream_health"]},
            "models": {"default": default, "entries": models},
            "counters": counters,
            "summary_cache": dict(summary_cache or {}),
            "recent": own["recent"],
            "recent_max": self._recent.maxlen,
        }


def _add_fitted(
    c: dict[str, Any],
    entry: RecentRequest,
    actions: Mapping[str, int],
    prefix_reused_tokens: int | None,
    memory: str | None,
) -> None:
    assert entry.tokens_before is not None and entry.tokens_after is not None
    c["fitted_requests"] += 1
    c["tokens_before"] += entry.tokens_before
    for kind in actions:
        _bump(c["actions"], kind)
    if entry.outcome == "rejected":
        return
    c["tokens_after"] += entry.tokens_after
    c["tokens_saved"] += max(0, entry.tokens_before - entry.tokens_after)
    c["prefix_reused_tokens"] += max(0, prefix_reused_tokens or 0)
    if entry.tokens_after != entry.tokens_before or actions:
        c["changed_requests"] += 1
    if memory is not None:
        _bump(c["memory"], memory)


def with_totals(counters: Mapping[str, Any]) -> dict[str, Any]:
    """The counters as the snapshot shows them: the totals (the sum over every API and the
    requests of no API), ``by_route`` and ``by_api``, from a board's (or a merge's) raw counters."""
    by_api = {api: _copy(c) for api, c in (counters.get("by_api") or {}).items()}
    totals = _counters()
    for part in [*by_api.values(), counters.get(NO_API) or {}]:
        add_counts(totals, part)
    return {**totals, "by_route": dict(counters.get("by_route") or {}), "by_api": by_api}


def _copy(value: Any) -> Any:
    """A deep copy of nested counter dicts (the board's own stay private to its lock)."""
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def _bump(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1
