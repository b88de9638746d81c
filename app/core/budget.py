"""The input budget of one request, and the policy that shapes fitting.

``input_budget = window - output_reserve - safety_margin - tool_definition_tokens``, capped by the
per-request budget header when one is given. The reserve is the request's own output cap when it
sets one (its dialect reads it: ``Conversation.requested_output_tokens``), else the policy's
reserve, else 15% of the window clamped to [512, 4096] (and never more than the model's max
output, nor more than half the window: a reserve that fills the window would leave no room for
any prompt).

``Limits`` is what one request learned before it is planned again: the window an overflow taught,
an output cap lower than the client's (``app.core.boundary``: no refusal when a fit exists), a
margin measured for this request (the upstream's own count of it). ``budget_for(..., limits=)``
applies it.

``request_budget(body, conversation, ...)`` is the budget of one parsed request, set up once for
every caller: the fit pipeline (``fit.plan_request``, with its exact or estimating counter) and the
tokenizer-free ceiling of the fast path (``ceiling``, with its byte counter): the tool definitions
by the request's dialect's own rule, the output reserve from the conversation's requested output
(none where the dialect's upstream limits the input alone, ``Dialect.output_in_window``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from .registry import ModelSpec

if TYPE_CHECKING:
    from .conversation import Conversation
    from .dialect import Dialect
    from .tokens import MessageCounter

PolicyMode = Literal["auto", "truncate", "reject", "off"]
RecallMode = Literal["off", "ids", "tool"]
DEFAULT_CUT_TARGET = 0.6
"""Share of the input budget a cut brings a request down to (``bench/cache.py`` chose it: the
trade-off between window use, prompt-cache reuse and summary calls is in README)."""
POLICY_MODES: tuple[PolicyMode, ...] = ("auto", "truncate", "reject", "off")


@dataclass(frozen=True, slots=True)
class Policy:
    """How to fit. Built once from settings and per-request headers by the service layer.

    ``auto`` may use every strategy (and, with ``summarize``, LLM summaries); ``truncate`` uses the
    deterministic strategies only; ``reject`` never rewrites and fails when over; ``off``
    forwards everything unchanged without even failing. ``index_memory`` (``auto`` or
    ``truncate``): what a cut forgot is remembered by its index of exact strings
    (``memory.py``, ``span_index.py``) even without a summary.

    ``keep_turns`` newest turns are protected from pruning and dropping, but never more than
    ``protect_max_share`` of the input budget (counted in whole units from the end; the newest unit
    and the newest user message always stay), so one long agent turn can still be fitted.

    ``cut_target`` (0 < t <= 1): when a request is over its budget, the prune boundary and the cut
    move in steps of ``(1 - t)`` of the input budget (``context.step_tokens_for``), so right after
    a cut the request uses about ``t`` of the budget and the next turns fit with the very same
    forwarded prefix (upstream prompt caches keep hitting). ``1.0`` cuts as little as possible.

    ``recall`` (``app.core.recall``): ``off``; ``ids``: what a cut removes is named by its recall id
    in the placeholder, note, marker or memory that stands for it; ``tool``: that, and the
    ``ctx_recall`` tool is offered when the plan names an id and the request allows it.
    """

    mode: PolicyMode = "auto"
    keep_turns: int = 2
    protect_max_share: float = 0.5
    pin_first_user: bool = True
    reserve_tokens: int | None = None
    reserve_ratio: float = 0.15
    reserve_min_tokens: int = 512
    reserve_max_tokens: int = 4096
    margin_exact_ratio: float = 0.01
    margin_estimate_ratio: float = 0.05
    margin_min_tokens: int = 16
    prune_protect_tool_tokens: int = 40_000
    prune_minimum_tokens: int = 20_000
    middle_out_share: float = 0.5
    drop_block_tokens: int | None = None
    summarize: bool = False
    index_memory: bool = False
    cut_target: float = DEFAULT_CUT_TARGET
    lower_output: bool = True
    output_floor_tokens: int = 1024
    recall: RecallMode = "off"

    def refined(
        self,
        *,
        mode: PolicyMode | None = None,
        keep_turns: int | None = None,
        reserve_tokens: int | None = None,
        cut_target: float | None = None,
        lower_output: bool | None = None,
        recall: RecallMode | None = None,
    ) -> Policy:
        """This policy with a request's overrides applied (None leaves a field as it is).

        ``lower_output``: when the client's output cap leaves no room for what must be kept, the
        forwarded cap may be lowered (never below ``output_floor_tokens``) instead of refusing."""
        changes: dict[str, Any] = {}
        if mode is not None:
            changes["mode"] = mode
        if keep_turns is not None:
            changes["keep_turns"] = keep_turns
        if reserve_tokens is not None:
            changes["reserve_tokens"] = reserve_tokens
        if cut_target is not None:
            changes["cut_target"] = cut_target
        if lower_output is not None:
            changes["lower_output"] = lower_output
        if recall is not None:
            changes["recall"] = recall
        return replace(self, **changes) if changes else self


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request knows, before it is (re)planned, beyond its spec and policy; None leaves a
    figure as the spec and the policy say.

    ``window_tokens``: the window to fit to (one an upstream's refusal taught during this request).
    ``output_cap_tokens``: the output reserve, and the output cap to forward when the client asked
    for more (the dialect writes it, ``Dialect.with_output_cap``). ``margin_tokens``: the safety
    margin, measured for this request (it may be negative: our count is above the upstream's own,
    e.g. encrypted reasoning priced high, and the budget is in our counting units).
    """

    window_tokens: int | None = None
    output_cap_tokens: int | None = None
    margin_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    """The numbers of one request's budget; every figure is in tokens but ``cut_target``, the
    policy's share of the input budget a cut aims for (see ``Policy``)."""

    window_tokens: int
    reserve_tokens: int
    margin_tokens: int
    tool_tokens: int
    cap_tokens: int | None = None
    cut_target: float = DEFAULT_CUT_TARGET

    @property
    def input_budget_tokens(self) -> int:
        """Tokens available for the messages (reply priming included), never below zero."""
        room = self.window_tokens - self.reserve_tokens - self.margin_tokens
        if self.cap_tokens is not None:
            room = min(room, self.cap_tokens)
        return max(0, room - self.tool_tokens)

    @property
    def cut_target_tokens(self) -> int:
        """About what a request uses right after a cut: ``cut_target`` of the input budget."""
        return int(self.cut_target * self.input_budget_tokens)


def requested_output_tokens(body: Mapping[str, Any]) -> int | None:
    """The output size the request asks for, if it asks (``max_completion_tokens`` wins)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def default_reserve_tokens(spec: ModelSpec, policy: Policy, *, window_tokens: int | None = None) -> int:
    """15% of the window (by default), clamped, never more than the model can output nor more
    than half the window (``window_tokens``, when given, stands for the spec's)."""
    window = spec.window_tokens if window_tokens is None else window_tokens
    share = round(window * policy.reserve_ratio)
    reserve = min(max(share, policy.reserve_min_tokens), policy.reserve_max_tokens)
    return max(0, min(reserve, spec.max_output_tokens, window // 2))


def margin_tokens_for(window_tokens: int, policy: Policy, *, exact: bool) -> int:
    """The policy's safety margin for a window: its share of it, at least ``margin_min_tokens``."""
    ratio = policy.margin_exact_ratio if exact else policy.margin_estimate_ratio
    return max(policy.margin_min_tokens, round(window_tokens * ratio))


def budget_for(
    spec: ModelSpec,
    policy: Policy,
    *,
    requested_tokens: int | None = None,
    tool_tokens: int,
    exact: bool,
    cap_tokens: int | None = None,
    limits: Limits | None = None,
    output_in_window: bool = True,
) -> Budget:
    """The budget of a request asking for ``requested_tokens`` of output (None: it sets no cap)
    against ``spec`` under ``policy``, with ``limits`` applied; no output reserve when the output
    is not ``output_in_window`` (the upstream limits the input alone)."""
    window = spec.window_tokens
    if limits is not None and limits.window_tokens is not None:
        window = limits.window_tokens
    reserve = requested_tokens if output_in_window else 0
    if reserve is None:
        reserve = (
            policy.reserve_tokens
            if policy.reserve_tokens is not None
            else default_reserve_tokens(spec, policy, window_tokens=window)
        )
    if limits is not None and limits.output_cap_tokens is not None:
        reserve = min(reserve, limits.output_cap_tokens)
    if limits is not None and limits.margin_tokens is not None:
        margin = limits.margin_tokens
    else:
        margin = margin_tokens_for(window, policy, exact=exact)
    return Budget(
        window_tokens=window,
        reserve_tokens=reserve,
        margin_tokens=margin,
        tool_tokens=tool_tokens,
        cap_tokens=cap_tokens,
        cut_target=policy.cut_target,
    )


def request_budget(
    body: Mapping[str, Any],
    conversation: Conversation,
    *,
    dialect: Dialect,
    spec: ModelSpec,
    policy: Policy,
    counter: MessageCounter,
    exact: bool,
    cap_tokens: int | None = None,
    limits: Limits | None = None,
) -> Budget:
    """The budget of ``body`` (parsed by ``dialect`` into ``conversation``): its tool definitions
    counted by the dialect's rule on ``counter``, its output reserve the conversation's requested
    output (see ``budget_for``); ``exact``: the margin of an exact count (the ceiling passes True
    with a counter that bounds an exact one)."""
    return budget_for(
        spec,
        policy,
        requested_tokens=conversation.requested_output_tokens,
        tool_tokens=dialect.tool_tokens(body, counter),
        exact=exact,
        cap_tokens=cap_tokens,
        limits=limits,
        output_in_window=dialect.output_in_window,
    )
