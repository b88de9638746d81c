"""Fit to the last token: find the upstream's exact count near the boundary, lower an output cap
that leaves no room, and remember what the upstream counted (the work around ``app.core.boundary``).

``Boundary(*, learner, counts=None, exact=True, lower_output=True, asking=None)`` (one per
``Service``; an offline door makes its own: no ``counts``, and ``asking`` whether the proxy's
settings ask the counting endpoints, default: ``counts`` given):

* ``policy_for(policy) -> Policy``: the request's policy, lowering off when the setting is (a
  request's ``X-Context-Lower-Output: on`` does not turn on what the operator turned off).
* ``steps(request, plan)``: after the first plan and before it is sent, a generator of effects
  (``app.service.decision`` drives it; it does no I/O itself): it yields ``PlanWanted(request)`` for a
  plan of ``request`` (sent back: the ``Plan``; a driver may make it in a worker thread) and
  ``CountWanted(request, ask)`` where the upstream's own count of the whole request would settle
  it (sent back: the counting endpoint's answer, or None), and returns ``(request, plan)``:

  1. a plan that fits unchanged and that the boundary ``keeps`` (under ``FAR_SHARE`` of the
     window, then not ``core.boundary.may_be_over``) is returned as it is, at no cost;
  2. a plan that cuts or does not fit is first planned whole under the model's learned margin
     (``core.boundary.margin_ratio``: it shrinks as the upstream's counts confirm ours; cuts keep
     the policy's margin, their levels being a function of the budget); when that lets it through,
     it is sent whole;
  3. near the boundary (a fitting plan that may be over the room; a plan that cuts or does not fit
     unless it is far over, ``ANCHOR_LOWEST_RATIO``), the upstream's own count of the whole
     request is found: first from the conversation's previous request (``core.anchors``: its usage
     plus our count of what was appended: a comparison, no I/O), then, when that does not settle it,
     ``CountWanted``: ``ask`` when the request lies in the uncertainty zone (``may_be_over``,
     ``may_fit``); the live driver then asks the dialect's counting endpoint (``ask(request)``:
     when there is one, ``counts``, on unless the setting or ``X-Context-Upstream-Count: off`` turns
     it off; bounded in time, cached; its answer also calibrates the model);
  4. a request the upstream takes whole is planned unchanged (the client's bytes are forwarded),
     under the margin that count implies; one it would refuse is cut as before (under the
     policy's margin: the cut levels stay those of the requests around it). A request that fits
     by our count but not by the upstream's upper bound is cut under the margin that bound implies
     (``core.boundary.margin_for_count``: the ratio of its count to ours);
  5. when the client's output cap leaves no room for what must be kept
     (``core.boundary.lowered_output_tokens``), the request is planned again with the output cap
     lowered (the dialect writes it: ``Dialect.with_output_cap``), unless ``lower_output`` is off
     or the request says ``X-Context-Lower-Output: off``. A plan that still does not fit is
     refused by the exchange with its numbers, as before.

  The returned request carries the limits the final plan was made under (``ProxyRequest.limits``),
  so summaries and retries plan under them too.
* ``keeps(request, tokens, budget) -> bool``: step 1's test, for a request of at most ``tokens``
  (the whole request) that fits ``budget``: the fast path's proof uses it with the ceiling
  (``app.core.ceiling``), so a request sent before its plan is one the steps would keep as it is.
* ``asks(request) -> bool``: whether the proxy asks the counting endpoint for ``request`` (a dry
  run says so: its figure is then an estimate).
* ``on_usage(request, plan) -> Callable[[int], None] | None``: what to call with the upstream's
  count of the forwarded plan (``Learner.observe``'s ``on_usage``) so that the conversation's next
  request is anchored; None for a request far below its window (``ANCHOR_MIN_SHARE``: nothing is
  kept for it, so small requests pay nothing).
* ``stats``: how many requests each step settled (``learned``, ``anchored``, ``counted``,
  ``whole``, ``cut``, ``lowered``), for tests and benchmarks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from ..core.anchors import AnchorMemory, context_of
from ..core.boundary import (
    lowered_output_tokens,
    margin_for_count,
    margin_ratio,
    may_be_over,
    may_fit,
    room_tokens,
    uncertainty,
)
from ..core.budget import Budget, Limits, Policy
from ..core.messages import Message
from ..core.plan import Plan
from ..settings import Settings
from ..upstream.client import UpstreamClient
from .learning import Learner
from .request import Forwarded, ProxyRequest
from .upstream_counts import UpstreamCounts

ANCHOR_MIN_SHARE = 0.5
# A fitting request (with its reserve) under this share of its window is left alone, at no cost:
# an upstream counting even 1.9 times ours would still take it.
FAR_SHARE = 0.5
# A request over its budget by our count is anchored only when an upstream counting this share of
# ours could take it (the anchors' own bound on the ratio is ``core.anchors.RATIO_MIN``).
ANCHOR_LOWEST_RATIO = 0.5
LOWER_STEPS = 3


@dataclass(frozen=True, slots=True)
class PlanWanted:
    """An effect: plan ``request`` (``ProxyRequest.plan``) and send the plan back."""

    request: ProxyRequest


@dataclass(frozen=True, slots=True)
class CountWanted:
    """An effect: the upstream's own count of ``request``'s whole input would settle it (the
    anchor did not); ``ask``: it lies in the uncertainty zone, where the counting endpoint may be
    asked. Send back its count, or None."""

    request: ProxyRequest
    ask: bool


Steps = Generator[PlanWanted | CountWanted, Any, tuple[ProxyRequest, Plan]]


def replan(request: ProxyRequest) -> Generator[PlanWanted, Any, Plan]:
    """The plan of ``request``, as an effect."""
    plan = yield PlanWanted(request)
    assert isinstance(plan, Plan)
    return plan


@dataclass(frozen=True, slots=True)
class UpstreamCount:
    """The upstream's count of the whole request, as bounds (equal when it counted it itself)."""

    lower_tokens: int
    upper_tokens: int
    source: str  # "anchor" or "upstream"


class Boundary:
    """See the module docstring."""

    def __init__(
        self,
        *,
        learner: Learner,
        counts: UpstreamCounts | None = None,
        exact: bool = True,
        lower_output: bool = True,
        anchors: AnchorMemory | None = None,
        asking: bool | None = None,
    ) -> None:
        self.learner = learner
        self.counts = counts
        self.exact = exact
        self.lower_output = lower_output
        # Whether the proxy asks counting endpoints (an offline door has no ``counts`` of its own
        # but says what the proxy would do).
        self.asking = counts is not None if asking is None else asking
        self.anchors = anchors if anchors is not None else AnchorMemory()
        self.stats: Counter[str] = Counter()

    def policy_for(self, policy: Policy) -> Policy:
        if not self.lower_output and policy.lower_output:
            return replace(policy, lower_output=False)
        return policy

    def steps(self, request: ProxyRequest, plan: Plan) -> Steps:
        """Refine the first ``plan`` of ``request`` (see the module docstring)."""
        policy = request.policy
        if policy.mode == "off" or not request.conversation.fittable:
            return request, plan
        unchanged = plan.fits and not plan.changed
        if unchanged and self.keeps(request, plan.tokens_before, plan.budget):
            return request, plan  # far below the room: nothing to find out, nothing to lower
        if self.exact:
            request, plan = yield from self._exact(request, plan, unchanged=unchanged)
        if plan.fits and not plan.changed:
            return request, plan
        return (yield from self._lower(request, plan))

    def keeps(self, request: ProxyRequest, tokens: int, budget: Budget) -> bool:
        """True when a fitting, unchanged plan of at most ``tokens`` is kept as it is (step 1)."""
        if tokens + budget.reserve_tokens < FAR_SHARE * budget.window_tokens or not self.exact:
            return True
        exact, policy = request.counter.exact, request.policy
        precision = self.learner.knowledge.precision(request.model, exact=exact)
        return not may_be_over(tokens, budget, policy, uncertainty(precision, policy=policy, exact=exact))

    def asks(self, request: ProxyRequest) -> bool:
        """Whether the proxy asks the counting endpoint of ``request``'s API for its count."""
        return (
            self.asking
            and request.options.upstream_count is not False
            and request.dialect.count_request(request.body, request.route.path) is not None
        )

    def on_usage(self, request: ProxyRequest, plan: Plan) -> Callable[[int], None] | None:
        if not self.exact or not request.conversation.fittable:
            return None
        budget = plan.budget
        if plan.tokens_after + budget.reserve_tokens < ANCHOR_MIN_SHARE * budget.window_tokens:
            return None
        # The client's own context (a lowered output cap or thinking budget is not prompt): what
        # its next request will be compared with.
        return partial(
            self._remember,
            request.model,
            plan.messages,
            plan.message_tokens,
            context_of(request.body, request.dialect.items_key),
            plan.tokens_after,
        )

    # -- the steps ----------------------------------------------------------------------------

    def _exact(self, request: ProxyRequest, plan: Plan, *, unchanged: bool) -> Steps:
        policy, budget = request.policy, plan.budget
        exact = request.counter.exact
        u = uncertainty(
            self.learner.knowledge.precision(request.model, exact=exact), policy=policy, exact=exact
        )
        tokens = plan.tokens_before
        room = room_tokens(budget, policy)
        if not unchanged:
            whole = yield from self._learned(request, plan, exact=exact)
            if whole is not None:
                return whole
        if unchanged:
            ask = True  # kept as it is otherwise (``keeps``): it may be over the room
        else:
            if tokens * ANCHOR_LOWEST_RATIO > room:
                return request, plan  # far over: no upstream counts that much less than we do
            # The anchor costs a comparison; the counting endpoint a call: only inside the zone.
            ask = may_fit(tokens, budget, policy, u)
        count = yield from self._count(request, plan, ask=ask)
        if count is None:
            return request, plan
        if count.upper_tokens <= room:
            self.stats["whole"] += 1
            if unchanged:
                return request, replace(plan, upstream_tokens=count.upper_tokens)
            # The upstream takes it whole: the margin under which our count of it fits exactly.
            margin = budget.window_tokens - budget.reserve_tokens - tokens
        else:
            self.stats["cut"] += 1
            if not unchanged:
                # Over the upstream's room too: cut as before, under the policy's margin, so the cut
                # levels stay those of the requests around it (a cut lands at the cut target, far
                # below the room, whatever the ratio of the upstream's count to ours).
                return request, replace(plan, upstream_tokens=count.upper_tokens)
            # Our count fits and the upstream's may not: cut to what its upper bound allows.
            margin = margin_for_count(
                budget, policy, counted_tokens=tokens, upstream_tokens=count.upper_tokens
            )
        refined = request.limited(Limits(margin_tokens=margin))
        replanned = yield from replan(refined)
        return refined, replace(replanned, upstream_tokens=count.upper_tokens)

    def _learned(
        self, request: ProxyRequest, plan: Plan, *, exact: bool
    ) -> Generator[PlanWanted, Any, tuple[ProxyRequest, Plan] | None]:
        """The request planned whole under the model's learned margin, when that is smaller than
        the policy's and lets it through (``core.boundary.margin_ratio``); else None. Cuts keep the
        policy's margin: their levels (``context.level_starts``) are a function of the budget, and
        the requests around a cut must see the same ones."""
        budget, policy = plan.budget, request.policy
        precision = self.learner.knowledge.precision(request.model, exact=exact)
        if precision is None:
            return None
        ratio = margin_ratio(precision, policy=policy, exact=exact)
        margin = max(policy.margin_min_tokens, round(budget.window_tokens * ratio))
        if margin >= budget.margin_tokens:
            return None
        room = budget.window_tokens - budget.reserve_tokens - margin
        if budget.cap_tokens is not None:
            room = min(room, budget.cap_tokens)
        if plan.tokens_before > room:
            return None
        refined = request.limited(replace(request.limits or Limits(), margin_tokens=margin))
        whole = yield from replan(refined)
        if not whole.fits or whole.changed:
            return None
        self.stats["learned"] += 1
        return refined, whole

    def _count(
        self, request: ProxyRequest, plan: Plan, *, ask: bool
    ) -> Generator[CountWanted, Any, UpstreamCount | None]:
        """The upstream's count of the whole request: anchored, else wanted (``CountWanted``;
        the counting endpoint when ``ask``) when the anchor does not settle it (see the module
        docstring)."""
        messages = request.conversation.messages
        message_tokens = plan.message_tokens if not plan.changed else request.counter.count_messages(messages)
        room = room_tokens(plan.budget, request.policy)
        anchored = self.anchors.count(
            request.model,
            messages,
            message_tokens,
            context=context_of(request.body, request.dialect.items_key),
            exact=request.counter.exact,
        )
        if anchored is not None:
            self.stats["anchored"] += 1
            if anchored.upper_tokens <= room or anchored.lower_tokens > room:
                return UpstreamCount(anchored.lower_tokens, anchored.upper_tokens, "anchor")
        counted = yield CountWanted(request, ask)
        if isinstance(counted, int):
            return UpstreamCount(counted, counted, "upstream")
        if anchored is not None:
            return UpstreamCount(anchored.lower_tokens, anchored.upper_tokens, "anchor")
        return None

    async def ask(self, request: ProxyRequest) -> int | None:
        """The counting endpoint's count of ``request`` (None: not asked, or no answer); it also
        calibrates the model."""
        if self.counts is None or not self.asks(request):
            return None
        tokens = await self.counts.count(request)
        if tokens is None:
            return None
        self.stats["counted"] += 1
        self.learner.learn_from_count(
            request.model, tokens, counter=request.counter, counted=Forwarded.of(request, None).counted
        )
        return tokens

    def _lower(self, request: ProxyRequest, plan: Plan) -> Steps:
        """Lower the output cap while what must be kept does not fit next to it (at most
        ``LOWER_STEPS`` plans: a larger input budget protects a longer tail, which may need a
        little more room than the first plan showed)."""
        policy = request.policy
        requested = request.conversation.requested_output_tokens
        best: tuple[ProxyRequest, Plan] | None = None
        current = plan
        for _ in range(LOWER_STEPS):
            cap = lowered_output_tokens(current, requested_output_tokens=requested, policy=policy)
            if cap is None or request.dialect.with_output_cap(request.body, cap) is None:
                break
            limits = replace(
                request.limits or Limits(), output_cap_tokens=cap, margin_tokens=plan.budget.margin_tokens
            )
            lowered_request = request.limited(limits)
            lowered = yield from replan(lowered_request)
            if not lowered.fits:
                break
            best, current = (lowered_request, lowered), lowered
            if not any(a.kind == "last_resort" for a in lowered.actions):
                break
        if best is None:
            return request, plan
        self.stats["lowered"] += 1
        return best[0], replace(best[1], upstream_tokens=plan.upstream_tokens)

    def _remember(
        self,
        model: str,
        messages: tuple[Message, ...],
        message_tokens: tuple[int, ...],
        context: object,
        counted_tokens: int,
        upstream_tokens: int,
    ) -> None:
        self.anchors.remember(
            model,
            messages,
            message_tokens,
            context=context,
            counted_tokens=counted_tokens,
            upstream_tokens=upstream_tokens,
        )


def build_boundary(settings: Settings, *, learner: Learner, upstream: UpstreamClient) -> Boundary:
    """The boundary work as the settings say (``boundary_exact``, ``upstream_count``,
    ``upstream_count_timeout_s``, ``lower_output``)."""
    counts = (
        UpstreamCounts(upstream, timeout_s=settings.upstream_count_timeout_s)
        if settings.boundary_exact and settings.upstream_count
        else None
    )
    return Boundary(
        learner=learner, counts=counts, exact=settings.boundary_exact, lower_output=settings.lower_output
    )
