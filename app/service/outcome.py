"""The values the service answers with: the outcome of a request, our cannot-fit error carrying its
plan, and readiness.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core.errors import CannotFit
from ..core.plan import Plan
from ..core.reuse import PrefixReuse
from ..upstream.client import UpstreamResponse
from .report import request_budget_tokens


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to one request: the final plan, the upstream's response, the retries.

    ``response`` is open (body unread for a streamed success, already read otherwise) and
    must be closed by the caller. ``warnings`` are ``X-Context-Warning`` values
    (``upstream-truncated``, see ``app.service.learning``; ``history-upstream``, the plan's).
    ``prefix_reuse``: what an upstream prompt cache could reuse of it (``app.core.reuse``).
    ``rendered``: the caller's ``render(plan, prefix_reuse)`` made while the upstream worked
    (``Service.handle``), when the answered plan is that one with nothing added (no retry, no
    warning); else None. ``recalls``: the rounds the proxy answered ``ctx_recall`` in before
    the client's answer (``app.service.recall``), when the plan offered the tool and the answer
    was read whole (a stream's are known at its end only); else None.
    """

    plan: Plan
    response: UpstreamResponse
    retries: int
    stream: bool
    warnings: tuple[str, ...] = ()
    prefix_reuse: PrefixReuse | None = None
    rendered: object | None = None
    recalls: int | None = None


# What a caller of ``Service.handle`` makes of a plan and its prefix reuse (its response headers).
Render = Callable[[Plan, PrefixReuse], object]


@dataclass(frozen=True, slots=True)
class Ahead:
    """The fast path's plan with what was made of it while the upstream worked."""

    plan: Plan
    prefix_reuse: PrefixReuse
    rendered: object | None


@dataclass(frozen=True, slots=True)
class Readiness:
    """``ready`` when every required vocabulary is loaded and every upstream gave an HTTP answer."""

    vocabularies: tuple[str, ...]
    vocabularies_ready: bool
    upstreams: Mapping[str, int | None]

    @property
    def ready(self) -> bool:
        return self.vocabularies_ready and all(status is not None for status in self.upstreams.values())


class PlanCannotFit(CannotFit):
    """``CannotFit`` raised by the service, carrying the plan (the API adds its X-Context-* headers)."""

    def __init__(self, plan: Plan, *, reason: str) -> None:
        self.plan = plan
        super().__init__(
            tokens=plan.tokens_after,
            budget_tokens=request_budget_tokens(plan.budget),
            window_tokens=plan.budget.window_tokens,
            reserve_tokens=plan.budget.reserve_tokens,
            reason=reason,
        )
