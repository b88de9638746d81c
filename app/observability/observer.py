"""The app's observability hub: metrics, the status board and the model labels, wired together.

``Observability.from_settings(settings)`` is built once by ``create_app`` and kept on
``app.state.observability``. Hooks other code may call (all cheap, never raising):

* ``observability.metrics.record_discovery(endpoint=..., result=...)`` for discovery outcomes
  beyond the HTTP answer (the HTTP answers themselves are counted already, see
  :func:`discovery_call`);
* ``observability.metrics.record_summary_cache(hit=...)`` or
  ``observability.metrics.watch_summary_cache(lambda: cache.stats())``;
* ``observability.use_registry(registry)`` when the model table is (re)loaded;
* ``observability.instrumentation()`` for the upstream client that carries client traffic.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..upstream.instrument import Instrumentation
from .context import current, current_request_id
from .metrics import Metrics, ModelLabels
from .shared import SharedBoard
from .status import RecentRequest, StatusBoard

logger = logging.getLogger("ctxproxy.observability")

DISCOVERY_ENDPOINTS = {
    ("GET", "/models"): "models",
    ("GET", "/props"): "props",
    ("POST", "/api/show"): "show",
}


def discovery_call(method: str, path: str, *, route: str | None) -> str | None:
    """The discovery endpoint (``models``, ``props``, ``show``) an upstream call was made to, when
    it is model discovery: made outside any request (start-up, background) or for a chat request
    (lazy discovery of a new model). A client's own ``GET /v1/models`` (pass-through) and the
    readiness probe are not discovery."""
    if route not in (None, "chat"):
        return None
    for (verb, suffix), endpoint in DISCOVERY_ENDPOINTS.items():
        if method == verb and path.rstrip("/").endswith(suffix):
            return endpoint
    return None


def discovery_result(status: int | None) -> str:
    if status is None:
        return "unreachable"
    if status < 300:
        return "answered"
    return "not_found" if status in (404, 405, 501) else "error"


LEARNED_MAX = 100


def learned_models(service: Any, *, limit: int = LEARNED_MAX) -> list[dict[str, Any]]:
    """The effective figures of the models the proxy discovered or learned something about at run
    time (``service.learner.knowledge``; the most recent ``limit``), each figure with its source."""
    learner = getattr(service, "learner", None)
    registry = getattr(service, "registry", None)
    knowledge = getattr(learner, "knowledge", None)
    if learner is None or registry is None or knowledge is None:
        return []
    rows: list[dict[str, Any]] = []
    for model in list(knowledge.models())[-limit:]:
        spec = learner.effective(registry.resolve(model))
        rows.append(
            {
                "name": model[:80],
                "window_tokens": spec.window_tokens,
                "max_output_tokens": spec.max_output_tokens,
                "encoding": spec.encoding,
                "source": spec.source,
                "sources": dict(getattr(spec, "sources", ())),
                "correction": round(float(getattr(spec, "correction", 1.0)), 4),
            }
        )
    return rows


def parse_actions(header: str | None) -> dict[str, int]:
    """``"pruned=4,dropped_turns=6"`` -> ``{"pruned": 4, "dropped_turns": 6}``; ``none`` -> {}."""
    actions: dict[str, int] = {}
    if not header or header == "none":
        return actions
    for item in header.split(","):
        kind, _, count = item.partition("=")
        kind = kind.strip()
        if kind:
            actions[kind] = actions.get(kind, 0) + (int(count) if count.strip().isdigit() else 1)
    return actions


class Observability:
    def __init__(
        self,
        *,
        version: str,
        upstream_base_url: str,
        upstream_routes: Mapping[str, str] | None = None,
        worker_dir: Path | None = None,
    ) -> None:
        """``worker_dir``: the directory the workers of one ``ctxproxy serve --workers N`` share
        (metrics in prometheus-client's multiprocess mode, the status board through files)."""
        self._routes = dict(upstream_routes or {})
        self.metrics = Metrics(
            version=version,
            model_labels=ModelLabels(routes=self._routes),
            multiprocess_dir=worker_dir / "metrics" if worker_dir is not None else None,
        )
        shared = SharedBoard(worker_dir / "status") if worker_dir is not None else None
        self.board = StatusBoard(
            version=version, upstream_base_url=upstream_base_url, upstream_routes=self._routes, shared=shared
        )

    @classmethod
    def from_settings(cls, settings: Any) -> Observability:
        from .. import __version__

        return cls(
            version=__version__,
            upstream_base_url=settings.upstream_base_url,
            upstream_routes=settings.upstream_routes,
            worker_dir=getattr(settings, "worker_dir", None),
        )

    def use_registry(self, registry: Any) -> None:
        """Model labels resolve through ``registry``; the status page lists its entries (when it
        has ``entries()``/``default``, as ``app.core.registry.ModelRegistry`` does)."""
        self.metrics.model_labels = ModelLabels(registry.resolve, routes=self._routes)
        entries = getattr(registry, "entries", None)
        if callable(entries):
            self.board.set_model_table(entries(), getattr(registry, "default", None))

    def instrumentation(self) -> Instrumentation:
        return Instrumentation(request_id=current_request_id, on_response=self.upstream_call)

    def upstream_call(self, method: str, url: str, waited_s: float, status: int | None) -> None:
        ctx = current()
        if ctx is not None:
            ctx.add_upstream(waited_s)
        endpoint = discovery_call(method, url, route=ctx.route if ctx else None)
        if endpoint is not None:
            self.metrics.record_discovery(endpoint=endpoint, result=discovery_result(status))
        self.metrics.observe_upstream(waited_s, status)
        self.board.upstream_call(waited_s, status)

    def request_started(self) -> None:
        self.metrics.request_started()
        self.board.started()

    def request_finished(self) -> None:
        self.metrics.request_finished()
        self.board.finished()

    def record(
        self,
        entry: RecentRequest,
        *,
        actions: Mapping[str, int],
        prefix_reused_tokens: int | None = None,
        final_upstream_status: int | None,
        tracked: bool,
    ) -> None:
        """A finished request: metrics always, the status board for proxied (``tracked``) ones."""
        model = self.metrics.model_labels.label(entry.model)
        chat = entry.route == "chat" and entry.tokens_before is not None and entry.tokens_after is not None
        self.metrics.observe_request(
            route=entry.route,
            model=model,
            outcome=entry.outcome,
            duration_s=entry.latency_ms / 1000,
            overhead_s=entry.overhead_ms / 1000 if entry.overhead_ms is not None else None,
            tokens_before=entry.tokens_before if chat else None,
            tokens_after=entry.tokens_after if chat else None,
            actions=actions if entry.route == "chat" else None,
            retries=entry.retries,
            final_upstream_status=final_upstream_status,
            prefix_reused_tokens=prefix_reused_tokens if chat else None,
        )
        if tracked:
            self.board.record(entry, actions=actions if entry.route == "chat" else {})

    def status(self, service: Any = None) -> dict[str, Any]:
        """The status page's data; ``service`` (when running) adds the run-time model knowledge."""
        data = self.board.snapshot(summary_cache=self.metrics.summary_cache_totals())
        try:
            data["models"]["learned"] = learned_models(service)
        except Exception:  # the page must load whatever the learner's state
            logger.exception("status: listing the learned models failed")
            data["models"]["learned"] = []
        return data
