"""The app's observability hub: metrics, the status board and the labels, wired together.

``Observability.from_settings(settings, apis=..., counting=...)`` is built once by ``create_app``
(which passes the registered wire APIs' names and the paths of their counting endpoints: no API
is named here) and kept on ``app.state.observability``. Hooks other code may call (all cheap,
never raising):

* ``observability.record_summary(api=..., outcome=..., tokens_in=..., tokens_out=...)``: one call
  to the summarizer for a request of ``api`` (metrics ``ctxproxy_summary_calls_total{api,outcome}``
  and ``ctxproxy_summary_tokens_total{api,direction}``, and the status board's per-API summaries);
* ``observability.record_summary_cache(api=..., hit=..., error=False)``: one summary-cache lookup
  (``ctxproxy_summary_cache_requests_total{api,result}`` and the board), or
  ``observability.metrics.watch_summary_cache(lambda: cache.stats())`` for a cache that counts
  its own lookups (not attributed to an API: ``api="none"``). Count a lookup through one, not both;
* ``observability.metrics.record_discovery(endpoint=..., result=...)`` for discovery outcomes
  beyond the HTTP answer (the HTTP answers themselves are counted already, see
  :func:`discovery_call`);
* ``observability.use_registry(registry)`` when the model table is (re)loaded, and
  ``observability.use_knowledge(knowledge.discovered)`` so that the models the upstream reported
  get their own ``model`` label;
* ``observability.instrumentation()`` for the upstream client that carries client traffic.

What stands in for a cut (``ctxproxy_cut_memory_total{api,kind}``) is read from the response's
``X-Context-Memory`` header (``summary``/``index``/``note``/``none``) when it has one, else from the plan's
actions (:func:`memory_of`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Mapping
from pathlib import Path
from typing import Any

from ..core.tenant import ANONYMOUS
from ..upstream.instrument import Instrumentation
from .context import RequestContext, api_of, current, current_request_id
from .labels import NONE, ModelLabels, RouteLabels, SpecLike, UpstreamLabels
from .metrics import MEMORY_KINDS, Metrics
from .shared import SharedBoard
from .status import RecentRequest, StatusBoard

logger = logging.getLogger("ctxproxy.observability")

# (method, path suffix) -> endpoint label, the most specific first: LM Studio's REST listing
# also ends in /models.
DISCOVERY_ENDPOINTS = (
    ("GET", "/api/v0/models", "lmstudio_models"),
    ("GET", "/models", "models"),
    ("GET", "/props", "props"),
    ("POST", "/api/show", "show"),
)
_DISCOVERY_METHODS = frozenset(verb for verb, _suffix, _endpoint in DISCOVERY_ENDPOINTS)


def discovery_call(method: str, path: str, *, route: str | None, api: str | None = None) -> str | None:
    """The discovery endpoint (``models``: an OpenAI-style ``GET {base}/models``;
    ``lmstudio_models``: LM Studio's ``GET /api/v0/models``; ``props``; ``show``) an upstream call
    was made to, when it is model discovery: made outside any request (``route`` None: start-up,
    background) or for a request that plans on a model (lazy discovery of a new model: a fitted
    request, or the gateway engine's, ``RouteLabels.plans_a_model``). A client's own
    ``GET /v1/models`` (pass-through) and the readiness probe are not discovery."""
    if method not in _DISCOVERY_METHODS:
        return None
    path = path.rstrip("/")
    for verb, suffix, endpoint in DISCOVERY_ENDPOINTS:
        if method == verb and path.endswith(suffix):
            return endpoint if route is None or RouteLabels.plans_a_model(route, api) else None
    return None


def discovery_result(status: int | None) -> str:
    if status is None:
        return "unreachable"
    if status < 300:
        return "answered"
    return "not_found" if status in (404, 405, 501) else "error"


def memory_of(actions: Mapping[str, int], header: str | None = None) -> str | None:
    """What stands in for a request's dropped turns: the ``X-Context-Memory`` value when it names
    one (``summary``/``index``/``note``; ``none``: nothing), else ``summary`` when the plan
    summarized, ``index`` when its memory was the index alone, ``note`` when it dropped turns
    otherwise (a failed summary, or none wanted), else None."""
    if header is not None:
        value = header.strip().lower()
        if value in MEMORY_KINDS:
            return value
        if value == NONE:
            return None
    if actions.get("summarized"):
        return "summary"
    if actions.get("indexed"):
        return "index"
    if actions.get("dropped_turns") or actions.get("summary_failed"):
        return "note"
    return None


LEARNED_MAX = 100
# A tenant is shown by the first characters of its hash: enough to tell clients apart on the page.
TENANT_SHOWN_CHARS = 9


def learned_models(service: Any, *, limit: int = LEARNED_MAX) -> list[dict[str, Any]]:
    """The effective figures of the models the proxy discovered (``tenant`` None: everyone's) or a
    client's requests taught it something about (``tenant``: the first characters of that client's
    tenant, a hash of its key) at run time (``service.learner.knowledge``; the most recent
    ``limit``), each figure with its source: the operator's view."""
    learner = getattr(service, "learner", None)
    registry = getattr(service, "registry", None)
    knowledge = getattr(learner, "knowledge", None)
    if learner is None or registry is None or knowledge is None:
        return []
    learned = list(knowledge.learned())
    taught = {model for _, model in learned}
    subjects = [(None, m) for m in knowledge.models() if m not in taught] + learned
    rows: list[dict[str, Any]] = []
    for tenant, model in subjects[-limit:]:
        spec = learner.effective(registry.resolve(model), tenant=tenant or ANONYMOUS)
        rows.append(
            {
                "name": model[:80],
                "tenant": None if tenant is None else tenant[:TENANT_SHOWN_CHARS],
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
        summary_base_url: str | None = None,
        worker_dir: Path | None = None,
        apis: tuple[str, ...] = (),
        counting: Container[str] = frozenset(),
    ) -> None:
        """``apis``: the registered wire APIs' names (the registry's order); ``counting``: the
        paths of their token-counting endpoints (see :class:`RouteLabels`). ``worker_dir``: the
        directory the workers of one ``ctxproxy serve --workers N`` share (metrics in
        prometheus-client's multiprocess mode, the status board through files)."""
        self._routes = dict(upstream_routes or {})
        self._resolve: Callable[[str], SpecLike] | None = None
        self._discovered: Callable[[str], Any] | None = None
        self.apis = apis
        self.routes = RouteLabels(counting=counting)
        self.upstreams = UpstreamLabels([upstream_base_url, *self._routes.values(), summary_base_url or ""])
        self.metrics = Metrics(
            version=version,
            model_labels=ModelLabels(routes=self._routes),
            apis=apis,
            multiprocess_dir=worker_dir / "metrics" if worker_dir is not None else None,
        )
        shared = SharedBoard(worker_dir / "status") if worker_dir is not None else None
        self.board = StatusBoard(
            version=version,
            upstream_base_url=upstream_base_url,
            upstream_routes=self._routes,
            apis=apis,
            shared=shared,
        )

    @classmethod
    def from_settings(
        cls, settings: Any, *, apis: tuple[str, ...] = (), counting: Container[str] = frozenset()
    ) -> Observability:
        from .. import __version__

        return cls(
            version=__version__,
            upstream_base_url=settings.upstream_base_url,
            upstream_routes=settings.upstream_routes,
            summary_base_url=getattr(settings, "summary_base_url", None),
            worker_dir=getattr(settings, "worker_dir", None),
            apis=apis,
            counting=counting,
        )

    def use_registry(self, registry: Any) -> None:
        """Model labels resolve through ``registry``; the status page lists its entries (when it
        has ``entries()``/``default``, as ``app.core.registry.ModelRegistry`` does)."""
        self._resolve = registry.resolve
        self._relabel()
        entries = getattr(registry, "entries", None)
        if callable(entries):
            self.board.set_model_table(entries(), getattr(registry, "default", None))

    def use_knowledge(self, discovered: Callable[[str], Any]) -> None:
        """``discovered(model)`` is truthy when the upstream reported ``model`` (the learner's
        ``knowledge.discovered``): such a model gets its own label (capped, see ``ModelLabels``)."""
        self._discovered = discovered
        self._relabel()

    def _relabel(self) -> None:
        labels = ModelLabels(self._resolve, routes=self._routes, discovered=self._discovered)
        self.metrics.model_labels = labels

    def labels(self, scope: Mapping[str, Any]) -> tuple[str, str | None]:
        """``(route, api)`` of a request from its scope, once its route ran: ``api`` is the
        bounded name of the wire API its route recorded (None: no API)."""
        name = api_of(scope)
        route = self.routes.after(scope.get("path") or "", name)
        return route, self.metrics.api_labels(name) if name is not None else None

    def instrumentation(self) -> Instrumentation:
        return Instrumentation(request_id=current_request_id, on_response=self.upstream_call)

    def upstream_call(self, method: str, url: str, waited_s: float, status: int | None) -> None:
        """One upstream call's wait for response headers. Within a request the middleware serves
        (``ctx.deferred`` set), only the request's own sum is updated now: the call's metrics and
        board entry are written by :meth:`flush_upstream` once the response's first body byte is
        out, off the request's critical path."""
        ctx = current()
        if ctx is not None:
            ctx.add_upstream(waited_s)
            if ctx.deferred is not None:
                ctx.deferred.append((method, url, waited_s, status))
                return
        self._upstream_call(ctx, method, url, waited_s, status)

    def flush_upstream(self, ctx: RequestContext) -> None:
        """Record the calls ``ctx`` deferred (see :meth:`upstream_call`); later ones as they come.
        Never raises (bookkeeping must not break the response it follows)."""
        deferred, ctx.deferred = ctx.deferred, None
        for method, url, waited_s, status in deferred or ():
            try:
                self._upstream_call(ctx, method, url, waited_s, status)
            except Exception:
                logger.exception("observability: recording an upstream call failed")

    def _upstream_call(
        self, ctx: RequestContext | None, method: str, url: str, waited_s: float, status: int | None
    ) -> None:
        route: str | None = None
        api: str | None = None
        if ctx is not None:
            route, api = self.labels(ctx.scope)
        endpoint = discovery_call(method, url, route=route, api=api)
        if endpoint is not None:
            self.metrics.record_discovery(endpoint=endpoint, result=discovery_result(status))
        self.metrics.observe_upstream(waited_s, status, api=api or NONE, upstream=self.upstreams(url))
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
        memory: str | None = None,
    ) -> None:
        """A finished request (``entry.route``/``entry.api`` from :meth:`labels`): metrics always,
        the status board for proxied (``tracked``) ones. ``memory``: the ``X-Context-Memory``
        value the response carried, if any."""
        model = self.metrics.model_labels.label(entry.model)
        # A fitted request's route label is its API's name (RouteLabels.fitted, inlined: per request).
        fitted = entry.route == entry.api
        fitted = fitted and entry.tokens_before is not None and entry.tokens_after is not None
        kind = memory_of(actions, memory) if fitted and (actions or memory) else None
        self.metrics.observe_request(
            route=entry.route,
            api=entry.api or NONE,
            model=model,
            outcome=entry.outcome,
            duration_s=entry.latency_ms / 1000,
            overhead_s=entry.overhead_ms / 1000 if entry.overhead_ms is not None else None,
            tokens_before=entry.tokens_before if fitted else None,
            tokens_after=entry.tokens_after if fitted else None,
            actions=actions if fitted else None,
            retries=entry.retries,
            final_upstream_status=final_upstream_status,
            prefix_reused_tokens=prefix_reused_tokens if fitted else None,
            memory=kind,
        )
        if tracked:
            self.board.record(
                entry,
                actions=actions if fitted else {},
                fitted=fitted,
                prefix_reused_tokens=prefix_reused_tokens,
                memory=kind,
            )

    def record_summary(
        self, *, api: str | None, outcome: str, tokens_in: int = 0, tokens_out: int = 0
    ) -> None:
        """One summary call for a request of ``api`` (a wire API's name): metrics and the status
        board (see the module docstring). Never raises."""
        self.metrics.record_summary(api=api, outcome=outcome, tokens_in=tokens_in, tokens_out=tokens_out)
        try:
            self.board.record_summary(
                api=self.metrics.api_labels(api),
                outcome=str(outcome).strip().lower(),
                tokens_in=tokens_in,
                tokens_out=tokens_out,
            )
        except Exception:  # a hook must never fail its caller
            logger.debug("recording a summary call on the board failed", exc_info=True)

    def record_recall(self, *, api: str, calls: int, bytes_: int, rounds: int, misses: int) -> None:
        """One request's recall rounds (``app.service.recall``: the calls answered, the bytes
        recalled, the rounds, the misses): metrics and the status board. Never raises."""
        self.metrics.record_recall(api=api, calls=calls, bytes_=bytes_, rounds=rounds, misses=misses)
        try:
            label = self.metrics.api_labels(api)
            self.board.record_recall(api=label, calls=calls, bytes_=bytes_, rounds=rounds, misses=misses)
        except Exception:  # a hook must never fail its caller
            logger.debug("recording recall on the board failed", exc_info=True)

    def record_summary_cache(self, *, api: str | None, hit: bool, error: bool = False) -> None:
        """One summary-cache lookup for a request of ``api``: metrics and the status board. Never
        raises."""
        self.metrics.record_summary_cache(api=api, hit=hit, error=error)
        try:
            result = "error" if error else "hit" if hit else "miss"
            self.board.record_summary_cache(api=self.metrics.api_labels(api), result=result)
        except Exception:  # a hook must never fail its caller
            logger.debug("recording a summary cache lookup on the board failed", exc_info=True)

    def status(self, service: Any = None) -> dict[str, Any]:
        """The status page's data; ``service`` (when running) adds the run-time model knowledge."""
        data = self.board.snapshot(summary_cache=self.metrics.summary_cache_totals())
        try:
            data["models"]["learned"] = learned_models(service)
        except Exception:  # the page must load whatever the learner's state
            logger.exception("status: listing the learned models failed")
            data["models"]["learned"] = []
        return data
