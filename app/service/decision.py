"""The one decision behind every door: what the proxy forwards for a request, or that it refuses.

Every door decides through :func:`decision`, with the same input (the request value,
``ProxyRequest``, made by ``Planner.request`` the same way for all): the live routes
(``Service.run``), the dry run (``POST /v1/context/plan``, ``ctxproxy plan``), the public engine
(``ctxproxy.fit``) and the gateway engine (``/v1/compress``, ``/v1/context/compact/...``). It is
a generator of effects and does no I/O itself:

1. the first plan (``PlanWanted``: ``ProxyRequest.plan``);
2. the boundary's steps (``app.service.boundary.Boundary.steps``: the learned margin, the
   upstream's own count near the budget, ``CountWanted``; an output cap lowered when it leaves no
   room for what must be kept);
3. the memory (``Remember``: the LLM summary in place of the note when summaries are on).

Two drivers answer the effects:

* :func:`decide` (async): the live routes and the gateway engine. Plans of a large body are made
  in a worker thread (``fastpath.run_plan``), the counting endpoint is asked when the effect says
  so (``Boundary.ask``), summaries are made or looked up (``Summaries.refine``).
* :func:`dry_run` (sync, no I/O): the dry run and the public engine. What it cannot know is
  answered as the live route answers it when the upstream says nothing (no count, no summary:
  the note), and named in ``Decision.estimates`` (``ESTIMATES``: the name of each figure that is
  an estimate and why), so the dry run never says silently something else than the proxy does:

  - ``upstream_count``: near the budget the proxy settles the request with the upstream's own
    count of it: the counting endpoint's (when the request's API has one and the proxy asks it),
    or, for a door outside the proxy's process (``offline``), the anchor of the conversation's
    previous answer or a margin learned from the upstream's counts, which it cannot see;
  - ``memory``: a cut with summaries on: the proxy puts the summary of what was cut in place of
    the note when one is ready (or made in time);
  - ``window``: a window the proxy discovers or learns from the upstream (the model table's,
    unless the caller gave the window): for a door outside the proxy's process, or a model the
    proxy's discovery has not settled yet (the live route waits for it; the dry run asks nothing).

The fast path of the live route (send first, plan meanwhile) is this decision too: it is taken
only when the ceiling proves that the plan is unchanged and that the boundary keeps it
(``Boundary.keeps``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.plan import Plan
from .boundary import Boundary, CountWanted, PlanWanted, replan
from .fastpath import run_plan
from .request import ProxyRequest

if TYPE_CHECKING:
    from .summaries import Summaries

ESTIMATES: dict[str, str] = {
    "upstream_count": (
        "near the budget the proxy settles this request with the upstream's own count of it (the "
        "counting endpoint, the previous answer's usage, a margin learned from its counts); this "
        "plan uses ours: the proxy may forward it whole where this cuts, or cut where this does not"
    ),
    "memory": (
        "summaries are on: the proxy puts the summary of what was cut in place of the note when "
        "one is ready, so the body it forwards may hold a summary where this one has the note"
    ),
    "window": (
        "the model table's window; the proxy may discover or learn another from the upstream "
        "(ctxproxy models --proxy URL shows what a running proxy knows)"
    ),
}


@dataclass(frozen=True, slots=True)
class Remember:
    """An effect: ``plan`` with the summary of what it forgot in place, when summaries are on
    (send back the plan to use)."""

    request: ProxyRequest
    plan: Plan


Effect = PlanWanted | CountWanted | Remember


@dataclass(frozen=True, slots=True)
class Decision:
    """What a door decided: ``request`` (with the limits its plan was made under), ``plan``, and
    ``estimates``: the names (``ESTIMATES``) of what this door could not know."""

    request: ProxyRequest
    plan: Plan
    estimates: tuple[str, ...] = ()

    @property
    def explained(self) -> dict[str, str]:
        """Each estimate's name with why it is one (``ESTIMATES``), for the dry run's report."""
        return {name: ESTIMATES[name] for name in self.estimates}


def decision(
    request: ProxyRequest, *, boundary: Boundary
) -> Generator[Effect, Any, tuple[ProxyRequest, Plan]]:
    """The decision for ``request`` (see the module docstring): yields effects, returns the
    request with its limits and the plan to forward (``fits`` False: the proxy refuses it)."""
    plan = yield from replan(request)
    request, plan = yield from boundary.steps(request, plan)
    remembered = yield Remember(request, plan)
    assert isinstance(remembered, Plan)
    return request, remembered


async def decide(
    request: ProxyRequest, *, boundary: Boundary, summaries: Summaries | None, size_bytes: int
) -> tuple[ProxyRequest, Plan]:
    """The decision with the proxy's I/O (see the module docstring); ``size_bytes``: what a plan
    of the request may cost (``fastpath.run_plan`` offloads a large one)."""
    steps = decision(request, boundary=boundary)
    answer: Any = None
    while True:
        try:
            effect = steps.send(answer)
        except StopIteration as done:
            result: tuple[ProxyRequest, Plan] = done.value
            return result
        if isinstance(effect, PlanWanted):
            answer = await run_plan(effect.request.plan, size_bytes=size_bytes)
        elif isinstance(effect, CountWanted):
            answer = await boundary.ask(effect.request) if effect.ask else None
        elif summaries is None:
            answer = effect.plan
        else:
            answer = await summaries.refine(effect.request, effect.plan)


def dry_run(request: ProxyRequest, *, boundary: Boundary, offline: bool, window_known: bool) -> Decision:
    """The decision without I/O (see the module docstring); ``offline``: a door outside the
    proxy's process (it sees none of what the proxy learned: anchors, margins); ``window_known``:
    the request's window is the one the proxy would plan with (the caller's, or nothing left to
    discover)."""
    steps = decision(request, boundary=boundary)
    estimates: set[str] = set() if window_known else {"window"}
    answer: Any = None
    while True:
        try:
            effect = steps.send(answer)
        except StopIteration as done:
            decided, plan = done.value
            named = tuple(name for name in ESTIMATES if name in estimates)
            return Decision(decided, plan, named)
        if isinstance(effect, PlanWanted):
            answer = effect.request.plan()
        elif isinstance(effect, CountWanted):
            if offline or (effect.ask and boundary.asks(effect.request)):
                estimates.add("upstream_count")
            answer = None
        else:
            if effect.plan.memory is not None and effect.request.policy.summarize:
                estimates.add("memory")
            answer = effect.plan
