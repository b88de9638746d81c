"""The engine in-process: fit or count a request body with no HTTP, as the proxy would.

Public API (re-exported lazily by the package: ``ctxproxy.fit``, ``ctxproxy.count``,
``ctxproxy.FitResult``, ``ctxproxy.InvalidRequest``, ``ctxproxy.APIS``)::

    result = ctxproxy.fit(body, window_tokens=8192)
    result.fits, result.tokens_before, result.tokens_after, result.actions, result.body

* ``api`` names a wire API the proxy fits (``APIS``: the registry's names); when it is not given,
  the API is detected from the body as the dry run does (``app.core.routes.detect``: the
  dialect that recognises it most surely).
* The decision is the proxy's own (``app.service.decision``, through a planner of this process:
  ``app.service.planner.offline_planner``): the same request value, the same plan, the same
  refinements near the budget (an output cap that leaves no room is lowered, as the proxy
  forwards it: ``X-Context-Output-Lowered``). What a running proxy would know and this call
  cannot (a window it learned, the upstream's own count near the budget) is named in
  ``result.estimates`` (``app.service.decision.ESTIMATES``).
* Counts are exact and offline for models with a public tokenizer (the shipped tiktoken
  vocabularies), a labelled estimate for the others (``count_kind``), exactly as the proxy counts.
* The model's window comes from ``window_tokens`` when given (as ``X-Context-Window`` would), else
  the built-in model table merged with ``models_file`` (the same TOML as
  ``CTXPROXY_MODELS_FILE``). Nothing reads the environment: the policy is the engine's default,
  refined by the keyword options (as the proxy's ``X-Context-*`` headers refine its own), with no
  summaries (the engine makes no LLM call): what a cut forgot is remembered by its index of exact
  strings (``app.core.span_index``), as the proxy does with summaries off.
* The input body is never mutated. ``result.body`` is the body to send: the input object itself
  when nothing had to change (``changed`` False), else a new dict in which only the conversation
  (and a lowered output cap) was replaced. A body that cannot be made to fit has ``fits`` False
  and ``body`` is the input.
* Bad input raises ``InvalidRequest`` (``message``, ``param``), an unknown ``api`` ``ValueError``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.budget import Policy, PolicyMode
from .core.dialect import Dialect
from .core.dialects import DIALECTS
from .core.errors import InvalidRequest
from .core.plan import Plan
from .core.registry import ModelRegistry
from .core.routes import RouteMatch, detect
from .service.planner import Planner, offline_planner
from .service.request import ProxyRequest, RequestOptions

__all__ = ["APIS", "FitResult", "InvalidRequest", "count", "fit"]

APIS: tuple[str, ...] = tuple(DIALECTS)


@dataclass(frozen=True, slots=True)
class FitResult:
    """What fitting one request decided.

    ``tokens_before``/``tokens_after``: input tokens of the whole request (conversation, reply
    priming, tool definitions) as received and as to be sent; ``input_budget_tokens`` what the
    window leaves for input after the output reserve and margin; ``actions`` the
    ``X-Context-Actions`` items (``("dropped_turns=3", "truncated=1")``, empty when unchanged);
    ``plan`` the full decision (``ctxproxy.core.plan.Plan``) for whoever wants the details;
    ``estimates``: the figures a running proxy could decide otherwise (see the module docstring).
    """

    api: str
    model: str
    fits: bool
    changed: bool
    tokens_before: int
    tokens_after: int
    window_tokens: int
    input_budget_tokens: int
    count_kind: str
    actions: tuple[str, ...]
    body: Mapping[str, Any]
    plan: Plan
    estimates: tuple[str, ...] = ()


@functools.lru_cache(maxsize=8)
def _registry(models_file: str | None) -> ModelRegistry:
    from .model_table import load_registry

    return load_registry(operator_file=Path(models_file) if models_file is not None else None)


def _dialect(api: str | None, body: Mapping[str, Any]) -> Dialect:
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body must be a JSON object with a 'model'", param="model")
    if api is None:
        return detect(DIALECTS, body, {})
    if api not in DIALECTS:
        raise ValueError(f"unknown api {api!r}: expected one of {', '.join(DIALECTS)}")
    return DIALECTS[api]


def _planner(models_file: str | Path | None) -> Planner:
    from . import tokenizer

    registry = _registry(str(models_file) if models_file is not None else None)
    # The proxy's default memory (CTXPROXY_MEMORY_INDEX): what a cut forgot is remembered by its
    # index of exact strings, the same bytes the proxy forwards.
    return offline_planner(policy=Policy(index_memory=True), registry=registry, vocabularies=tokenizer)


def _request(
    body: Mapping[str, Any],
    api: str | None,
    options: RequestOptions,
    models_file: str | Path | None,
    *,
    bare: bool = False,
) -> tuple[Planner, ProxyRequest]:
    dialect = _dialect(api, body)
    planner = _planner(models_file)
    return planner, planner.request(body, options, route=RouteMatch.first(dialect), bare=bare)


def fit(
    body: Mapping[str, Any],
    *,
    api: str | None = None,
    window_tokens: int | None = None,
    budget_tokens: int | None = None,
    policy: PolicyMode = "auto",
    keep_turns: int | None = None,
    reserve_tokens: int | None = None,
    models_file: str | Path | None = None,
) -> FitResult:
    """Fit ``body`` (a request of wire API ``api``, detected when None) into its model's window;
    see the module doc.

    ``window_tokens`` and ``budget_tokens`` are the ``X-Context-Window`` and ``X-Context-Budget``
    headers; ``policy``, ``keep_turns`` and ``reserve_tokens`` the proxy's settings of the same
    names.
    """
    if window_tokens is not None and window_tokens <= 0:
        raise ValueError(f"window_tokens must be a positive integer, got {window_tokens}")
    options = RequestOptions(
        budget_tokens=budget_tokens,
        reserve_tokens=reserve_tokens,
        window_tokens=window_tokens,
        mode=policy,
        keep_turns=keep_turns,
    )
    planner, request = _request(body, api, options, models_file)
    decision = planner.dry_run(request)
    plan = decision.plan
    actions = () if not plan.actions else tuple(plan.actions_header().split(","))
    return FitResult(
        api=plan.api,
        model=plan.model,
        fits=plan.fits,
        changed=plan.changed,
        tokens_before=plan.tokens_before,
        tokens_after=plan.tokens_after,
        window_tokens=plan.budget.window_tokens,
        input_budget_tokens=plan.budget.input_budget_tokens,
        count_kind=plan.count_kind,
        actions=actions,
        body=plan.body(body) if plan.changed and plan.fits else body,
        plan=plan,
        estimates=decision.estimates,
    )


def count(body: Mapping[str, Any], *, api: str | None = None, models_file: str | Path | None = None) -> int:
    """Input tokens of ``body`` as its model counts them (conversation, reply priming, tools):
    the ``tokens_before`` of :func:`fit`, without fitting anything (``api`` detected when None)."""
    # A count holds the body to no route's requirements (Anthropic's max_tokens), as counting does.
    _, request = _request(body, api, RequestOptions(mode="off"), models_file, bare=True)
    return request.plan().tokens_before
