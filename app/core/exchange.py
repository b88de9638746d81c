"""The decisions of one request, as a pure state machine: events in, commands out, no I/O.

INTERFACE CONTRACT (``app.service.driver`` drives it; ``tests/core/test_exchange.py`` scripts it):

An ``Exchange(dialect=..., mode=..., max_retries=MAX_RETRIES, policy=None,
requested_output_tokens=None)`` lives for one request (``policy``: the request's, for the output
rules of a retry, default ``Policy(mode=mode)``; ``requested_output_tokens``: the client's own output
cap). The driver does what each command says and feeds back what happened:

* ``start(plan) -> Send | Fail``: the first plan. ``Fail`` (with the plan and a reason,
  ``refusal_reason(plan, mode=)``: the words of every door's refusal) when it does not fit and
  the policy is not ``off``; else ``Send(plan)``.
* ``start_unplanned() -> Send``: the fast path: send the client's original bytes now
  (``Send(None)``); ``sent(plan)`` hands over the plan of those bytes once it is made, before
  the answer is fed in (the plan of an unchanged body, so it needs no check).
* ``reads_answer(status) -> bool``: whether ``answered`` needs the answer's body (an error status
  that may be retried); the driver reads it only then.
* ``answered(status, body) -> Deliver | Replan``: a success, an answer after the last retry, an
  error that is not a context overflow (``dialect.overflow``) or an overflow no retry can help
  (``core.retry.retry_size``) -> ``Deliver``; else ``Replan(cap_tokens, overflow, limits)``: plan
  again under that cap and those ``limits`` (the window the refusal taught, an output reserve
  lowered when it left no room). A classified overflow rides on the command (``overflow``) so the
  driver learns from it once.
* ``answered_stream(head) -> Deliver | Replan``: a 200 event stream whose opening events
  (``head``, see ``core.preamble``) were read before passing it on: an overflow reported in them
  (Responses' ``response.failed``) is handled like an overflow status; anything else is delivered
  (the head replayed first).
* a success delivered after a refusal that stated no window carries ``proven_window_tokens``: the
  window in which a plan of the same shape keeps its input to what the upstream just took
  (``ceil(sent * window / budget)`` of the plan that succeeded). A geometric guess can be above the
  real window; this one is not, so learning it, the next requests of the model do not fail.
* ``replanned(plan) -> Send | Deliver``: the plan made under that cap is sent only when it fits,
  changed something and is smaller than what the upstream just refused: fewer input tokens, or
  the same with a lower output cap in the body (else it cannot help, and the refused answer is
  delivered as is).

At most ``max_retries`` retries, one more once a refusal stated no numbers (each such retry halves
the window it fits to: a table off by more than eight times needs a third step, and a refusal
delivered to the client is worse than one more upstream call). Events out of order raise
``ExchangeStateError`` (a driver bug).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .budget import Limits, Policy, PolicyMode
from .dialect import Dialect
from .overflow import ContextOverflow
from .plan import Plan
from .retry import MAX_RETRIES, retry_size

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
    """Plan the request again with the input capped at ``cap_tokens`` and ``limits`` applied
    (the window the refusal taught, a lowered output reserve), then call ``replanned``."""

    cap_tokens: int
    overflow: ContextOverflow
    limits: Limits | None = None


@dataclass(frozen=True, slots=True)
class Deliver:
    """Give the last answer to the client; ``overflow``: it was a context overflow not retried;
    ``proven_window_tokens``: a success after a refusal that stated no window, and the window that
    success proves enough for what it carried (see ``Exchange``), to be learned."""

    overflow: ContextOverflow | None = None
    proven_window_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The request cannot be made to fit: answer with our own error (``reason`` says why)."""

    plan: Plan
    reason: str


Command = Send | Replan | Deliver | Fail


class Exchange:
    """One request's send/classify/retry decisions (see the module docstring)."""

    __slots__ = (
        "bounded",
        "dialect",
        "max_retries",
        "mode",
        "plan",
        "policy",
        "requested_output_tokens",
        "retries",
        "state",
    )

    def __init__(
        self,
        *,
        dialect: Dialect,
        mode: PolicyMode,
        max_retries: int = MAX_RETRIES,
        policy: Policy | None = None,
        requested_output_tokens: int | None = None,
    ) -> None:
        self.dialect = dialect
        self.mode = mode
        self.max_retries = max_retries
        self.policy = policy if policy is not None else Policy(mode=mode)
        self.requested_output_tokens = requested_output_tokens
        self.bounded = False  # a refusal without numbers was retried
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
            return Fail(plan, reason=refusal_reason(plan, mode=self.mode))
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
        return status >= 400 and self.retries < self._retry_limit()

    def _retry_limit(self) -> int:
        return self.max_retries + 1 if self.bounded else self.max_retries

    def answered(self, status: int, body: bytes | None) -> Deliver | Replan:
        self._expect("sending")
        if self.plan is None:
            raise ExchangeStateError("an answer before the plan of what was sent")
        self.state = "answered"
        if status < 400:
            return self._delivered_success()
        if not self.reads_answer(status):
            return self._deliver()
        return self._classify(status, body)

    def peeks(self) -> bool:
        """Whether a streamed success is worth peeking at: a retry is still allowed."""
        return self.retries < self._retry_limit()

    def answered_stream(self, head: bytes) -> Deliver | Replan:
        self._expect("sending")
        if self.plan is None:
            raise ExchangeStateError("an answer before the plan of what was sent")
        self.state = "answered"
        if not self.peeks():
            return self._delivered_success()
        # The stream's own status is 200; the failure it reports is a refused request.
        command = self._classify(400, head)
        if isinstance(command, Deliver) and command.overflow is None:
            return self._delivered_success()
        return command

    def _classify(self, status: int, body: bytes | None) -> Deliver | Replan:
        assert self.plan is not None
        overflow = self.dialect.overflow(status, body)
        if overflow is None:
            return self._deliver()
        sent = self.plan
        size = retry_size(
            overflow=overflow,
            sent_tokens=sent.tokens_after,
            budget=sent.budget,
            spec=sent.spec,
            policy=self.policy,
            requested_output_tokens=self.requested_output_tokens,
            sent_output_tokens=sent.output_cap_tokens,
        )
        if size is None:
            return self._deliver(overflow)
        if overflow.limit_tokens is None:
            self.bounded = True
        self.state = "replanning"
        # An output cap lowered before (no room for what must be kept) stays lowered.
        output = size.output_cap_tokens if size.output_cap_tokens is not None else sent.output_cap_tokens
        limits = Limits(
            window_tokens=size.window_tokens, output_cap_tokens=output, margin_tokens=size.margin_tokens
        )
        return Replan(size.cap_tokens, overflow, limits)

    def replanned(self, plan: Plan) -> Send | Deliver:
        self._expect("replanning")
        assert self.plan is not None
        # A retry that is not smaller than what the upstream just refused cannot help.
        if not plan.fits or not plan.changed or not _smaller(plan, self.plan):
            return self._deliver()
        self.retries += 1
        self.plan, self.state = plan, "sending"
        return Send(plan)

    def _delivered_success(self) -> Deliver:
        self.state = "done"
        plan = self.plan
        if not self.bounded or plan is None:
            return Deliver()
        budget = plan.budget
        room = budget.window_tokens - budget.reserve_tokens - budget.margin_tokens
        if budget.cap_tokens is not None:
            room = min(room, budget.cap_tokens)
        if room <= 0 or plan.tokens_after <= 0:
            return Deliver()
        proven = math.ceil(min(plan.tokens_after, room) * budget.window_tokens / room)
        return Deliver(proven_window_tokens=min(proven, budget.window_tokens))

    def _deliver(self, overflow: ContextOverflow | None = None) -> Deliver:
        self.state = "done"
        return Deliver(overflow)

def refusal_reason(plan: Plan, *, mode: str) -> str:
    """Why a plan that does not fit is refused, in words (the error's message says it, at every
    door: the live routes' ``Fail``, the gateway engine's refusals)."""
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
    if mode == "reject":
        return "the context policy is 'reject', so the proxy does not shorten conversations"
    return "shortening the conversation as far as the policy allows does not bring it under"


def _smaller(plan: Plan, sent: Plan) -> bool:
    """``plan`` asks the upstream for less than ``sent``: fewer input tokens, or as many with a
    lower output cap written into the body."""
    if plan.tokens_after < sent.tokens_after:
        return True
    lowered = plan.output_cap_tokens
    if lowered is None or plan.tokens_after > sent.tokens_after:
        return False
    return sent.output_cap_tokens is None or lowered < sent.output_cap_tokens
