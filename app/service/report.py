"""The plan as numbers for people: the dry run's JSON and the whole-request budget.

``plan_report(plan, original, *, retries=0, estimates=None) -> dict`` is the answer of
``POST /v1/context/plan`` and of ``ctxproxy plan``; ``request_budget_tokens(budget)`` is the figure
``X-Context-Budget`` caps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.budget import Budget
from ..core.plan import Plan


def request_budget_tokens(budget: Budget) -> int:
    """The whole-request input budget (messages, priming and tool definitions), as compared to
    ``Plan.tokens_after`` and as the ``X-Context-Budget`` request header caps it."""
    room = budget.window_tokens - budget.reserve_tokens - budget.margin_tokens
    if budget.cap_tokens is not None:
        room = min(room, budget.cap_tokens)
    return max(0, room)


def forwarded_body(plan: Plan, original: Mapping[str, Any]) -> Mapping[str, Any]:
    """The request body ``plan`` sends for ``original``, in the request's own API shape: the
    client's own body when the plan changed nothing (forwarded byte for byte), else the body the
    plan's dialect renders (exactly what the proxy forwards, ``Forwarded.of``)."""
    return plan.body(original) if plan.changed else original


def plan_report(
    plan: Plan,
    original: Mapping[str, Any],
    *,
    retries: int = 0,
    estimates: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The plan of the request body ``original`` as JSON-ready data (the dry run's answer, and
    ``ctxproxy plan``'s output).

    ``body`` is the request the proxy would forward, in the request's own API shape
    (:func:`forwarded_body`); when ``fits`` is false the proxy refuses the request instead (policy
    ``off`` aside), and ``body`` shows how far the policy got. ``output_lowered``: the output cap
    the body is forwarded with when it was lowered below the client's (the live route's
    ``X-Context-Output-Lowered``), else null; ``upstream_tokens``: the upstream's own count of the
    whole request when it decided the plan, else null. ``estimates``: what the door that made the
    plan could not know, each figure's name with why (``app.service.decision.ESTIMATES``; empty:
    the proxy decides exactly this). ``message_tokens`` and ``dropped``
    index the conversation as the engine counts it (one entry per message; for Chat Completions
    these are the body's ``messages``; another API's items map to messages as its dialect says)."""
    spec, budget = plan.spec, plan.budget
    return {
        "api": plan.api,
        "model": plan.model,
        "spec": {
            "name": spec.name,
            "window_tokens": spec.window_tokens,
            "max_output_tokens": spec.max_output_tokens,
            "encoding": spec.encoding,
            "source": spec.source,
            "matched": spec.matched,
            "guessed": spec.guessed,
            "sources": dict(spec.sources),
            "correction": spec.correction,
        },
        "budget": {
            "window_tokens": budget.window_tokens,
            "reserve_tokens": budget.reserve_tokens,
            "margin_tokens": budget.margin_tokens,
            "tool_tokens": budget.tool_tokens,
            "cap_tokens": budget.cap_tokens,
            "input_budget_tokens": budget.input_budget_tokens,
            "request_budget_tokens": request_budget_tokens(budget),
            "cut_target": budget.cut_target,
            "cut_target_tokens": budget.cut_target_tokens,
        },
        "count": plan.count_kind,
        "tokens_before": plan.tokens_before,
        "tokens_after": plan.tokens_after,
        "fits": plan.fits,
        "changed": plan.changed,
        "output_lowered": plan.output_cap_tokens,
        "upstream_tokens": plan.upstream_tokens,
        "estimates": dict(estimates or {}),
        "retries": retries,
        "actions": [
            {"kind": a.kind, "count": a.count, "tokens_freed": a.tokens_freed, "detail": a.detail}
            for a in plan.actions
        ],
        "actions_header": plan.actions_header(),
        "warnings": list(plan.warnings),
        "dropped": [
            {"start": d.start, "stop": d.stop, "tokens": d.tokens, "block_stops": list(d.block_stops)}
            for d in plan.dropped
        ],
        "message_tokens": list(plan.message_tokens),
        "body": forwarded_body(plan, original),
    }
