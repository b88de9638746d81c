"""Fitting to the last token: the pure rules for a request whose count lies near its budget.

Our count of a request is exact (a shipped tokenizer) or an estimate; the upstream's own count can
be more (its tokenizer, hidden formatting) or less (encrypted reasoning we price high). The budget
keeps a margin for the first; the second cuts requests the upstream would take whole. Near the
boundary the service finds the upstream's own count (``app.core.anchors``: its usage of the
conversation's previous request; or its counting endpoint) and these rules turn it into a plan.

INTERFACE CONTRACT (``app.service.boundary`` drives them):

* ``Uncertainty`` (frozen): ``under`` / ``over``, how much more / less than ours the upstream may
  count, as shares of our count. ``uncertainty(precision, *, policy, exact)``: from the model's
  record (``knowledge.Precision``: how far its counts strayed from ours, once it has samples) plus
  ``UNCERTAINTY_BASE``; without a record ``UNCALIBRATED_ESTIMATE`` both ways for an estimate, and
  for an exact count the policy's exact margin above and ``UNCALIBRATED_EXACT_OVER`` below.
* ``margin_ratio(precision, *, policy, exact) -> float``: the share of the window a model's margin
  takes: the policy's (1% exact, 5% estimate) until its record shows the upstream counting closer
  to ours (``2 * under + UNCERTAINTY_BASE``, at least ``MARGIN_FLOOR_RATIO``): as the upstream's
  counts confirm ours, the margin shrinks; it never grows past the policy's.
* ``safety_tokens(window_tokens, policy) -> int``: what an exact count keeps free of the window
  (``SAFETY_RATIO`` of it, at least ``policy.margin_min_tokens``).
* ``room_tokens(budget, policy) -> int``: the most input the upstream takes next to the request's
  output reserve: window - reserve - safety.
* ``may_be_over(tokens, budget, policy, u)`` / ``may_fit(tokens, budget, policy, u)``: a request of
  ``tokens`` (our count of the whole input) that fits its budget could still be over the room, or
  one over its budget could still fit it, given ``u``: only then is an exact count worth having.
* ``margin_for_count(budget, policy, *, counted_tokens, upstream_tokens) -> int``: the margin, in
  our units, under which a plan fits exactly what the upstream's count ``upstream_tokens`` of a
  request we count ``counted_tokens`` lets through: ``window - reserve - room * counted /
  upstream`` (negative when we count more than the upstream).
* ``keep_tokens(plan) -> int``: what the plan keeps and must keep: its input after the cuts,
  before the last resort cut into the newest and pinned messages (``Plan.tokens_after`` plus what
  ``last_resort`` freed).
* ``lowered_output_tokens(plan, *, requested_output_tokens, policy) -> int | None``: when the
  client's output cap leaves no room for what must be kept (the plan does not fit, or it fits only
  by the last resort), the largest output cap with which what must be kept fits whole: ``window -
  margin - keep_tokens(plan)`` (below the client's own), less the room a cut keeps for its memory
  at the lowered budget when summaries are on (``memory_room_beside``: else the memory's room,
  which grows with the budget, pushes what must be kept into the last resort again at every
  lowered cap), when that is at least
  ``policy.output_floor_tokens``; else, for a plan that does not fit, the floor when the smallest
  the plan reached fits next to it (the last resort then cuts what it must); else None (nothing to
  lower, lowering is off, the input cap binds, or even the floor leaves no room).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .budget import Budget, Policy
from .knowledge import Precision
from .memory import MEMORY_BUDGET_SHARE, MEMORY_MAX_TOKENS, memory_tokens_for
from .plan import Plan

UNCERTAINTY_BASE = 0.005
UNCALIBRATED_ESTIMATE = 0.25
UNCALIBRATED_EXACT_OVER = 0.03
MARGIN_FLOOR_RATIO = 0.005
SAFETY_RATIO = 0.002


@dataclass(frozen=True, slots=True)
class Uncertainty:
    """How much more (``under``) or less (``over``) than ours the upstream may count, as shares."""

    under: float
    over: float


def uncertainty(precision: Precision | None, *, policy: Policy, exact: bool) -> Uncertainty:
    """The uncertainty of our count of a model's requests (see the module docstring)."""
    if precision is not None:
        return Uncertainty(precision.under + UNCERTAINTY_BASE, precision.over + UNCERTAINTY_BASE)
    if exact:
        return Uncertainty(policy.margin_exact_ratio, UNCALIBRATED_EXACT_OVER)
    return Uncertainty(UNCALIBRATED_ESTIMATE, UNCALIBRATED_ESTIMATE)


def margin_ratio(precision: Precision | None, *, policy: Policy, exact: bool) -> float:
    """The share of the window the model's margin takes (see the module docstring)."""
    default = policy.margin_exact_ratio if exact else policy.margin_estimate_ratio
    if precision is None:
        return default
    return min(default, max(MARGIN_FLOOR_RATIO, 2 * precision.under + UNCERTAINTY_BASE))


def safety_tokens(window_tokens: int, policy: Policy) -> int:
    return max(policy.margin_min_tokens, math.ceil(window_tokens * SAFETY_RATIO))


def room_tokens(budget: Budget, policy: Policy) -> int:
    """The most input the upstream takes next to the reserve, less the exact count's safety."""
    room = budget.window_tokens - budget.reserve_tokens - safety_tokens(budget.window_tokens, policy)
    if budget.cap_tokens is not None:
        room = min(room, budget.cap_tokens)
    return room


def may_be_over(tokens: int, budget: Budget, policy: Policy, u: Uncertainty) -> bool:
    """A request we count ``tokens`` (fitting its budget) might still be over the upstream's room."""
    return math.ceil(tokens * (1 + u.under)) > room_tokens(budget, policy)


def may_fit(tokens: int, budget: Budget, policy: Policy, u: Uncertainty) -> bool:
    """A request we count ``tokens`` (over its budget) might still fit the upstream's room."""
    return math.floor(tokens * max(0.0, 1 - u.over)) <= room_tokens(budget, policy)


def margin_for_count(budget: Budget, policy: Policy, *, counted_tokens: int, upstream_tokens: int) -> int:
    """The margin (our units) under which a plan fits what the upstream's count lets through."""
    room = room_tokens(budget, policy)
    if upstream_tokens <= 0 or counted_tokens <= 0:
        return budget.window_tokens - budget.reserve_tokens - room
    ours = math.floor(room * counted_tokens / upstream_tokens)
    return budget.window_tokens - budget.reserve_tokens - ours


def keep_tokens(plan: Plan) -> int:
    """The plan's input before the last resort cut into what must be kept (our units)."""
    return plan.tokens_after + sum(a.tokens_freed for a in plan.actions if a.kind == "last_resort")


def memory_room_beside(kept_tokens: int) -> int:
    """The memory's room in the smallest input budget that holds ``kept_tokens`` of messages
    beside it (``memory.memory_tokens_for``: ``MEMORY_BUDGET_SHARE`` of the input budget, at most
    ``MEMORY_MAX_TOKENS``): the budget ``B`` with ``B - room(B) >= kept_tokens``, rounded up."""
    share = MEMORY_BUDGET_SHARE
    return min(MEMORY_MAX_TOKENS, math.ceil(kept_tokens * share / (1 - share)) + 1)


def lowered_output_tokens(plan: Plan, *, requested_output_tokens: int | None, policy: Policy) -> int | None:
    """The output cap to forward instead of the client's (see the module docstring), or None."""
    if not policy.lower_output or requested_output_tokens is None or policy.mode in ("off", "reject"):
        return None
    if plan.fits and not any(a.kind == "last_resort" for a in plan.actions):
        return None
    budget = plan.budget
    keep = keep_tokens(plan)
    if budget.cap_tokens is not None and keep > budget.cap_tokens:
        return None  # the input cap binds, not the output: a lower output cap cannot help
    most = min(requested_output_tokens, budget.reserve_tokens) - 1
    room = budget.window_tokens - budget.margin_tokens - keep
    if memory_tokens_for(budget, policy) > 0:
        room -= memory_room_beside(max(0, keep - budget.tool_tokens))
    if room >= policy.output_floor_tokens:
        return min(room, most)
    # Even the floor does not keep it whole: with the floor, the last resort cuts what it must.
    smallest = budget.window_tokens - budget.margin_tokens - plan.tokens_after
    if not plan.fits and smallest >= policy.output_floor_tokens and policy.output_floor_tokens <= most:
        return policy.output_floor_tokens
    return None
