"""The engine in-process: fit or count a request body with no HTTP, as the proxy would.

Public API (re-exported lazily by the package: ``ctxproxy.fit``, ``ctxproxy.count``,
``ctxproxy.FitResult``, ``ctxproxy.InvalidRequest``, ``ctxproxy.APIS``)::

    result = ctxproxy.fit(body, api="chat", window_tokens=8192)
    result.fits, result.tokens_before, result.tokens_after, result.actions, result.body

* ``api`` names a wire API the proxy fits (``APIS``: ``chat`` today; ``responses`` and
  ``messages`` as their dialects join ``app.core.dialects.DIALECTS``).
* Counts are exact and offline for models with a public tokenizer (the shipped tiktoken
  vocabularies), a labelled estimate for the others (``count_kind``), exactly as the proxy counts.
* The model's window comes from ``window_tokens`` when given, else the built-in model table merged
  with ``models_file`` (the same TOML as ``CTXPROXY_MODELS_FILE``). Nothing reads the environment:
  the policy is the engine's default, refined by the keyword options.
* The input body is never mutated. ``result.body`` is the body to send: the input object itself
  when nothing had to change (``changed`` False), else a new dict in which only the conversation
  was replaced. A body that cannot be made to fit has ``fits`` False and ``body`` is the input.
* Bad input raises ``InvalidRequest`` (``message``, ``param``), an unknown ``api`` ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.budget import Policy, PolicyMode
from .core.dialect import Dialect
from .core.dialects import DEFAULT_DIALECT, DIALECTS
from .core.errors import InvalidRequest
from .core.fit import plan_request
from .core.plan import Plan
from .core.registry import ModelRegistry, ModelSpec
from .core.tokens import MessageCounter

__all__ = ["APIS", "FitResult", "InvalidRequest", "count", "fit"]

APIS: tuple[str, ...] = tuple(DIALECTS)


@dataclass(frozen=True, slots=True)
class FitResult:
    """What fitting one request decided.

    ``tokens_before``/``tokens_after``: input tokens of the whole request (conversation, reply
    priming, tool definitions) as received and as to be sent; ``input_budget_tokens`` what the
    window leaves for input after the output reserve and margin; ``actions`` the
    ``X-Context-Actions`` items (``("dropped_turns=3", "truncated=1")``, empty when unchanged);
    ``plan`` the full decision (``ctxproxy.core.plan.Plan``) for whoever wants the details.
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


@functools.lru_cache(maxsize=8)
def _registry(models_file: str | None) -> ModelRegistry:
    from .model_table import load_registry

    return load_registry(operator_file=Path(models_file) if models_file is not None else None)


def _dialect(api: str) -> Dialect:
    if api not in DIALECTS:
        raise ValueError(f"unknown api {api!r}: expected one of {', '.join(DIALECTS)}")
    return DIALECTS[api]


def _spec(
    body: Mapping[str, Any], dialect: Dialect, *, window_tokens: int | None, models_file: str | Path | None
) -> ModelSpec:
    if not isinstance(body, Mapping):
        raise InvalidRequest("the request body needs a 'model' (a non-empty string)", param="model")
    model = dialect.model_of(body, {})
    spec = _registry(str(models_file) if models_file is not None else None).resolve(model)
    if window_tokens is not None:
        if window_tokens <= 0:
            raise ValueError(f"window_tokens must be a positive integer, got {window_tokens}")
        spec = dataclasses.replace(spec, window_tokens=window_tokens, source="caller")
    return spec


def _counter(spec: ModelSpec) -> MessageCounter:
    from .tokenizer import counter_for

    return MessageCounter(counter_for(spec.encoding))


def fit(
    body: Mapping[str, Any],
    *,
    api: str = DEFAULT_DIALECT.name,
    window_tokens: int | None = None,
    budget_tokens: int | None = None,
    policy: PolicyMode = "auto",
    keep_turns: int | None = None,
    reserve_tokens: int | None = None,
    models_file: str | Path | None = None,
) -> FitResult:
    """Fit ``body`` (a request of wire API ``api``) into its model's window; see the module doc.

    ``budget_tokens`` caps the input like the ``X-Context-Budget`` header; ``policy``,
    ``keep_turns`` and ``reserve_tokens`` are the proxy's settings of the same names.
    """
    dialect = _dialect(api)
    spec = _spec(body, dialect, window_tokens=window_tokens, models_file=models_file)
    rules = Policy().refined(mode=policy, keep_turns=keep_turns, reserve_tokens=reserve_tokens)
    plan = plan_request(
        body, spec=spec, policy=rules, counter=_counter(spec), cap_tokens=budget_tokens, dialect=dialect
    )
    actions = () if not plan.actions else tuple(plan.actions_header().split(","))
    return FitResult(
        api=api,
        model=plan.model,
        fits=plan.fits,
        changed=plan.changed,
        tokens_before=plan.tokens_before,
        tokens_after=plan.tokens_after,
        window_tokens=spec.window_tokens,
        input_budget_tokens=plan.budget.input_budget_tokens,
        count_kind=plan.count_kind,
        actions=actions,
        body=plan.body(body) if plan.changed and plan.fits else body,
        plan=plan,
    )


def count(
    body: Mapping[str, Any], *, api: str = DEFAULT_DIALECT.name, models_file: str | Path | None = None
) -> int:
    """Input tokens of ``body`` as its model counts them (conversation, reply priming, tools):
    the ``tokens_before`` of :func:`fit`, without fitting anything."""
    dialect = _dialect(api)
    spec = _spec(body, dialect, window_tokens=None, models_file=models_file)
    plan = plan_request(body, spec=spec, policy=Policy(mode="off"), counter=_counter(spec), dialect=dialect)
    return plan.tokens_before
