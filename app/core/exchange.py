"""The decisions of one request, as a pure state machine: events in, commands out, no I/O.

INTERFACE CONTRACT (``app.service.driver`` drives it; ``tests/core/test_exchange.py`` scripts it):

An ``Exchange(dialect=..., mode=..., max_retries=MAX_RETRIES)`` lives for one request. The driver
does what each command says and feeds back what happened:

* ``start(plan) -> Send | Fail``: the first plan. ``Fail`` (with the plan and a reason) when it
  does not fit and the policy is not ``off``; else ``Send(plan)``.
* ``start_unplanned() -> Send``: the fast path: send the client's original bytes now
  (``Send(None)``); ``sent(plan)`` hands over the plan of those bytes once it is made, before
  the answer is fed in (the plan of an unchanged body, so it needs no check).
* ``reads_answer(status) -> bool``: whether ``answered`` needs the answer's body (an error status
  that may be retried); the driver reads it only then.
* ``answered(status, body) -> Deliver | Replan``: a success, an answer after the last retry, an
  error that is not a context overflow (``dialect.overflow``) or an overflow whose numbers give no
  smaller cap (``core.retry.retry_cap_tokens``) -> ``Deliver``; else ``Replan(cap_tokens)``.
  A classified overflow rides on the command (``overflow``) so the driver learns from it once.
* ``answered_stream(head) -> Deliver | Replan``: a 200 event stream whose opening events
  (``head``, see ``core.preamble``) were read before passing it on: an overflow reported in them
  (Responses' ``response.failed``) is handled like an overflow status; anything else is delivered
  (the head replayed first).
* ``replanned(plan) -> Send | Deliver``: the plan made under that cap is sent only when it fits,
  changed something and is smaller than what the upstream just refused (else it cannot help, and
  the refused answer is delivered as is).

At most ``max_retries`` retries. Events out of order raise ``ExchangeStateError`` (a driver bug).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .budget import PolicyMode
from .dialect import Dialect
from .overflow import ContextOverflow
from .plan import Plan
from .retry import MAX_RETRIES, retry_cap_tokens

State = Literal["new", "sending", "answered", "replanning", "done"]


class ExchangeStateError(RuntimeError):
    """An event the exchange cannot take in its state (a bug in the driver)."""


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``plan``'s body (its original bytes when it changed nothing); ``None``: the client's
    original bytes, the plan still being made (the fast path)."""

    plan: Plan | None


@dataclass(frozen=True, slots=True)
class Replan:
    """Plan the request again with the input capped at ``cap_tokens``, then call ``replanned``."""

    cap_tokens: int
    overflow: ContextOverflow


@dataclass(frozen=True, slots=True)
class Deliver:
    """Give the last answer to the client; ``overflow``: it was a context overflow not retried."""

    overflow: ContextOverflow | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The request cannot be made to fit: answer with our own error (``reason`` says why)."""

    plan: Plan
    reason: str


Command = Send | Replan | Deliver | Fail


class Exchange:
    """One request's send/classify/retry decisions (see the module docstring)."""

    __slots__ = ("dialect", "max_retries", "mode", "plan", "retries", "state")

    def __init__(self, *, dialect: Dialect, mode: PolicyMode, max_retries: int = MAX_RETRIES) -> None:
        self.dialect = dialect
        self.mode = mode
        self.max_retries = max_retries
        self.retries = 0
        self.plan: Plan | None = None  # the plan of what was sent last
        self.state: State = "new"

    def _expect(self, *states: State) -> None:
        if self.state not in states:
            raise ExchangeStateError(f"unexpected event in state {self.state!r}")

    def start(self, plan: Plan) -> Send | Fail:
        self._expect("new")
        if not plan.fits and self.mode != "off":
            self.state = "done"
            return Fail(plan, reason=self._reason(plan))
        self.plan, self.state = plan, "sending"
        return Send(plan)

    def start_unplanned(self) -> Send:
        self._expect("new")
        self.state = "sending"
        return Send(None)

    def sent(self, plan: Plan) -> None:
        self._expect("sending")
        if self.plan is not None:
            raise ExchangeStateError("the plan of what was sent is known already")
        self.plan = plan

    def reads_answer(self, status: int) -> bool:
        return status >= 400 and self.retries < self.max_retries

    def answered(self, status: int, body: bytes | None) -> Deliver | Replan:
        self._expect("sending")
        if self.plan is None:
            raise ExchangeStateError("an answer before the plan of what was sent")
        self.state = "answered"
        if not self.reads_answer(status):
            return self._deliver()
        return self._classify(status, body)

    def peeks(self) -> bool:
        """Whether a streamed success is worth peeking at: a retry is still allowed."""
        return self.retries < self.max_retries

    def answered_stream(self, head: bytes) -> Deliver | Replan:
        self._expect("sending")
        if self.plan is None:
            raise ExchangeStateError("an answer before the plan of what was sent")
        self.state = "answered"
        if not self.peeks():
            return self._deliver()
        # The stream's own status is 200; the failure it reports is a refused request.
        return self._classify(400, head)

    def _classify(self, status: int, body: bytes | None) -> Deliver | Replan:
        assert self.plan is not None
        overflow = self.dialect.overflow(status, body)
        if overflow is None:
            return self._deliver()
        cap = retry_cap_tokens(overflow=overflow, sent_tokens=self.plan.tokens_after, budget=self.plan.budget)
        if cap is None:
            return self._deliver(overflow)
        self.state = "replanning"
        return Replan(cap, overflow)

    def replanned(self, plan: Plan) -> Send | Deliver:
        self._expect("replanning")
        assert self.plan is not None
        # A retry that is not smaller than what the upstream just refused cannot help.
        if not plan.fits or not plan.changed or plan.tokens_after >= self.plan.tokens_after:
            return self._deliver()
        self.retries += 1
        self.plan, self.state = plan, "sending"
        return Send(plan)

    def _deliver(self, overflow: ContextOverflow | None = None) -> Deliver:
        self.state = "done"
        return Deliver(overflow)

    def _reason(self, plan: Plan) -> str:
        budget = plan.budget
        if budget.tool_tokens > 0 and budget.input_budget_tokens == 0:
            # No cut of the conversation can help: say what is too big.
            room = budget.window_tokens - budget.reserve_tokens - budget.margin_tokens
            if budget.cap_tokens is not None:
                room = min(room, budget.cap_tokens)
            too_big = "exceed" if budget.tool_tokens > room else "use up"
            return (
                f"the tool definitions alone ({budget.tool_tokens} tokens) {too_big} the input budget, "
                "so shortening the conversation cannot help: send fewer or shorter tool definitions, "
                "or use a model with a larger context window"
            )
        if self.mode == "reject":
            return "the context policy is 'reject', so the proxy does not shorten conversations"
        return "shortening the conversation as far as the policy allows does not bring it under"
