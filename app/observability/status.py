"""What the status page shows: recent requests (a bounded ring buffer), counters since start, the
upstream and the effective model table, as JSON-ready data (``GET /status.json``).

Only proxied requests (``/v1/...``) are recorded. A record holds the model name (cut to 80
characters), token figures, the ``X-Context-Actions`` value, status, outcome and timings: never a
message, a header value or a key. Upstream URLs are shown without user info and query string.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit, urlunsplit

from .metrics import FITTED_ROUTES
from .shared import SharedBoard, merge

RECENT_MAX = 200
MODEL_NAME_MAX = 80


def display_url(url: str) -> str:
    """``url`` without credentials, query or fragment (operators paste keys into URLs)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(invalid URL)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class RecentRequest(NamedTuple):
    """One finished proxied request as the status page lists it (a NamedTuple: immutable, and
    made for every request, where a frozen dataclass costs several times more)."""

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
    """Counters since start and the last ``RECENT_MAX`` proxied requests; thread-safe."""

    def __init__(
        self,
        *,
        version: str,
        upstream_base_url: str,
        upstream_routes: Mapping[str, str] | None = None,
        recent_max: int = RECENT_MAX,
        shared: SharedBoard | None = None,
    ) -> None:
        self.version = version
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
        self._counters: dict[str, Any] = {
            "requests": 0,
            "chat_requests": 0,
            "changed_requests": 0,
            "tokens_before": 0,
            "tokens_after": 0,
            "tokens_saved": 0,
            "emergency_retries": 0,
            "by_outcome": {},
            "by_route": {},
            "actions": {},
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
        if self._shared is not None:
            self._shared.changed(self._own)

    def finished(self) -> None:
        with self._lock:
            self.in_flight -= 1
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
        if self._shared is not None:
            self._shared.changed(self._own)

    def record(self, entry: RecentRequest, *, actions: Mapping[str, int]) -> None:
        if entry.model is not None and len(entry.model) > MODEL_NAME_MAX:
            entry = entry._replace(model=entry.model[:MODEL_NAME_MAX] + "…")
        with self._lock:
            self._recent.append(entry)
            c = self._counters
            c["requests"] += 1
            _bump(c["by_outcome"], entry.outcome)
            _bump(c["by_route"], entry.route)
            c["emergency_retries"] += entry.retries
            for kind in actions:
                _bump(c["actions"], kind)
            if (
                entry.route in FITTED_ROUTES
                and entry.tokens_before is not None
                and entry.tokens_after is not None
            ):
                c["chat_requests"] += 1
                c["tokens_before"] += entry.tokens_before
                if entry.outcome != "rejected":
                    c["tokens_after"] += entry.tokens_after
                    c["tokens_saved"] += max(0, entry.tokens_before - entry.tokens_after)
                    if entry.tokens_after != entry.tokens_before or actions:
                        c["changed_requests"] += 1
        if self._shared is not None:
            self._shared.changed(self._own)

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
                "counters": {k: dict(v) if isinstance(v, dict) else v for k, v in self._counters.items()},
                "recent": [r._asdict() for r in reversed(self._recent)],
                "upstream_health": dict(self._upstream),
            }

    def snapshot(self, *, summary_cache: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Everything ``GET /status.json`` returns; recent requests newest first. With a
        :class:`SharedBoard`, every worker of the server is in it (``workers`` says how many)."""
        own = self._own()
        if self._shared is not None:
            own = merge(own, self._shared.others(), recent_max=self._recent.maxlen or RECENT_MAX)
        with self._lock:
            models = list(self._models)
            default = self._default_model
        return {
            "version": self.version,
            "now_s": round(time.time(), 3),
            "started_at_s": own["started_at_s"],
            "uptime_s": round(time.monotonic() - self._started_mono, 1),
            "workers": own.get("workers", 1),
            "in_flight": own["in_flight"],
            "upstream": {**self.upstream, "health": own["upstream_health"]},
            "models": {"default": default, "entries": models},
            "counters": own["counters"],
            "summary_cache": dict(summary_cache or {}),
            "recent": own["recent"],
            "recent_max": self._recent.maxlen,
        }


def _bump(counter: dict[str, int], key: str) -> None:
    counter[key] = counter.get(key, 0) + 1
