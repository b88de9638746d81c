"""The fit pipeline: least destructive first, stop as soon as the request fits.

INTERFACE CONTRACT (the service relies on this):

``plan_request(body, *, spec, policy, counter, cap_tokens=None, summaries=None,
dialect=DEFAULT_DIALECT, conversation=None, limits=None) -> Plan`` parses ``body`` with its
``dialect`` into the neutral conversation (raises ``InvalidRequest``; pass the ``conversation``
already parsed to skip that),
counts, builds the budget (``limits``: a window, output cap or margin this request learned, see
``budget.Limits``) and fits the neutral messages. An output cap below the client's own is the
plan's ``output_cap_tokens`` (the plan then always renders its body: ``changed``, and its actions
say ``output_lowered``). It never raises ``CannotFit`` itself: a plan that cannot fit has
``fits=False`` and the numbers. The plan renders its body through the same dialect
(``Plan.body``). A conversation the dialect marks not ``fittable`` (its history lives upstream) is
planned unchanged, with ``fits=True`` and the warning ``history-upstream``: the proxy cannot know.

``SummaryProvider`` is the seam for LLM summaries (a later issue): a *synchronous* lookup the
pipeline may call for a span it is about to drop; ``None`` means "use the deterministic note".
It is consulted only under policy ``auto`` with ``policy.summarize``.

``preview_next_cut(body, *, spec, policy, counter, cap_tokens=None) -> tuple[DroppedSpan, ...]``:
the spans the next cut of this conversation will drop (for summarizing ahead of time), ``()`` when
no complete level is left to cut.

Steps (``fits`` means messages + reply priming <= the input budget):

1. fits -> unchanged (the original objects; the service forwards the original bytes). Policy
   ``off`` is always unchanged; ``reject`` is unchanged with ``fits=False`` and ``rejected``.
2. prune old tool results and images, 3. middle-out over-large messages, 4. drop the oldest
   blocks (with a note or a summary), 5. last resort middle-out of the newest and pinned messages
   (see ``strategies``). 6. Still over: ``fits=False`` with the smallest count reached.

Steps 2 and 4 never touch the protected tail (the newest ``keep_turns`` turns, bounded to
``protect_max_share`` of the input budget in whole units), the pinned messages or the newest user
message; so one long single-turn agent session is fitted like a long chat (see ``context``).

A dialect whose upstream does not count the output against the window
(``Dialect.output_in_window`` False: Gemini's ``inputTokenLimit``) gets a budget with no output
reserve.

The final guard: a changed plan's body, rendered by its dialect, must have no structural problem
(``Dialect.problems``: pairing, signatures, role order) that the input body did not have. One
would be a bug in a strategy. It is reported as a ``StructureGuardWarning`` (an error under the
test suite's ``-W error``, so a test that meets it fails loudly), and the plan falls back in the
user's favour instead of corrupting the conversation: the deterministic cut (no summaries) when
that one passes, else the input unchanged (forwarded when it fits the budget, refused with the
numbers when it does not). The fallback plan lists the problems in ``Plan.broken`` for the
service to log. The guard runs only on changed plans: an unchanged body is forwarded as it came.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from .budget import Budget, Limits, Policy, budget_for
from .context import SummaryProvider, build_context, protect_tokens_for, protected_start
from .conversation import Conversation
from .dialect import Dialect
from .dialects import DEFAULT_DIALECT
from .messages import Message
from .plan import Action, DroppedSpan, Plan
from .registry import ModelSpec
from .strategies import STRATEGIES, Strategy, next_cut
from .tokens import REPLY_PRIMING_TOKENS, MessageCounter

__all__ = ["HISTORY_UPSTREAM", "StructureGuardWarning", "SummaryProvider", "plan_request", "preview_next_cut"]

HISTORY_UPSTREAM = "history-upstream"  # the plan's warning for a conversation kept upstream
_NO_OUTPUT_CAP: Mapping[str, Any] = {}


class StructureGuardWarning(RuntimeWarning):
    """A strategy made a body with a structural problem its input did not have (a bug): the plan
    fell back (see the module docstring)."""


def _prepare(
    body: Mapping[str, Any],
    conversation: Conversation,
    *,
    dialect: Dialect,
    spec: ModelSpec,
    policy: Policy,
    counter: MessageCounter,
    cap_tokens: int | None,
    limits: Limits | None = None,
) -> tuple[tuple[Message, ...], tuple[int, ...], int, Budget]:
    messages = conversation.messages
    per_message = counter.count_messages(messages)
    tool_tokens = dialect.tool_tokens(body, counter)
    # The budget reads the output cap from a chat-shaped mapping; every dialect states its own
    # cap on the conversation, so the budget is the same whatever the wire key was called.
    requested = conversation.requested_output_tokens
    caps = {"max_tokens": requested} if requested is not None else _NO_OUTPUT_CAP
    budget = budget_for(
        spec, caps, policy, tool_tokens=tool_tokens, exact=counter.exact, cap_tokens=cap_tokens, limits=limits
    )
    if not dialect.output_in_window:
        # The upstream limits the input alone (Gemini's inputTokenLimit): no output reserve.
        budget = replace(budget, reserve_tokens=0)
    return messages, per_message, tool_tokens, budget


def new_problems(
    body: Mapping[str, Any], messages: Sequence[Message], *, dialect: Dialect, source: Sequence[Message]
) -> list[str]:
    """The structural problems of ``messages`` rendered into ``body`` that ``body`` itself does
    not have (the input's are computed only when the output has any)."""
    out = dialect.problems(dialect.render(body, messages, source=source))
    if not out:
        return []
    known = set(dialect.problems(body))
    return sorted(set(out) - known)


def _run_steps(
    messages: Sequence[Message],
    per_message: tuple[int, ...],
    steps: Sequence[tuple[str, Strategy]],
    *,
    budget: Budget,
    policy: Policy,
    counter: MessageCounter,
    summaries: SummaryProvider | None,
) -> tuple[tuple[Message, ...], tuple[int, ...], list[Action], tuple[DroppedSpan, ...]]:
    """Run ``steps`` in order until the messages fit: (messages, counts, actions, dropped spans)."""
    current: tuple[Message, ...] = tuple(messages)
    tokens: tuple[int, ...] = per_message
    actions: list[Action] = []
    dropped: tuple[DroppedSpan, ...] = ()
    aligned = True  # indices still equal the input's (no message removed or inserted yet)
    for _name, strategy in steps:
        ctx = build_context(
            current,
            budget=budget,
            policy=policy,
            counter=counter,
            tokens=tokens,
            summaries=summaries,
            input_messages=messages if aligned else None,
            input_tokens=per_message if aligned else None,
        )
        if ctx.fits(sum(tokens)):
            break
        result = strategy(current, ctx)
        if len(result.messages) == len(current) and all(
            a is b for a, b in zip(result.messages, current, strict=True)
        ):
            continue
        known = {id(m): t for m, t in zip(current, tokens, strict=True)}
        new_tokens = tuple(
            known[id(m)] if id(m) in known else counter.count_message(m) for m in result.messages
        )
        if sum(new_tokens) > sum(tokens):
            raise AssertionError(f"strategy {_name} increased the token count")
        if result.dropped:
            dropped = result.dropped
        if len(result.messages) != len(current):
            aligned = False
        current, tokens = result.messages, new_tokens
        actions.extend(result.actions)
    return current, tokens, actions, dropped


def plan_request(
    body: Mapping[str, Any],
    *,
    spec: ModelSpec,
    policy: Policy,
    counter: MessageCounter,
    cap_tokens: int | None = None,
    summaries: SummaryProvider | None = None,
    dialect: Dialect = DEFAULT_DIALECT,
    conversation: Conversation | None = None,
    limits: Limits | None = None,
) -> Plan:
    """Plan one request: unchanged when it fits, else the least destructive rewrite that fits."""
    parsed = dialect.parse(body) if conversation is None else conversation
    messages, per_message, tool_tokens, budget = _prepare(
        body,
        parsed,
        dialect=dialect,
        spec=spec,
        policy=policy,
        counter=counter,
        cap_tokens=cap_tokens,
        limits=limits,
    )
    requested = parsed.requested_output_tokens
    output_cap = limits.output_cap_tokens if limits is not None else None
    lowered = (
        output_cap if output_cap is not None and requested is not None and requested > output_cap else None
    )
    lowered_action: tuple[Action, ...] = ()
    if lowered is not None and requested is not None:
        detail = f"output cap lowered from {requested} to {lowered} tokens"
        lowered_action = (Action("output_lowered", 1, 0, detail),)
    before = sum(per_message) + REPLY_PRIMING_TOKENS + tool_tokens
    fits = sum(per_message) + REPLY_PRIMING_TOKENS <= budget.input_budget_tokens
    count_kind: Any = "exact" if counter.exact else "estimate"

    def plan(
        out: Sequence[Message],
        tokens: Sequence[int],
        *,
        changed: bool,
        fits: bool,
        actions: Sequence[Action] = (),
        dropped: Sequence[DroppedSpan] = (),
        warnings: tuple[str, ...] = (),
        broken: tuple[str, ...] = (),
    ) -> Plan:
        return Plan(
            model=parsed.model or str(body.get("model", "")),
            spec=spec,
            budget=budget,
            count_kind=count_kind,
            tokens_before=before,
            tokens_after=sum(tokens) + REPLY_PRIMING_TOKENS + tool_tokens,
            changed=changed or (lowered is not None and fits),
            fits=fits,
            output_cap_tokens=lowered if fits else None,
            messages=tuple(out),
            message_tokens=tuple(tokens),
            actions=(*actions, *lowered_action) if fits else tuple(actions),
            dropped=tuple(dropped),
            dialect=dialect,
            warnings=warnings,
            source=parsed.messages,
            broken=broken,
        )

    if not parsed.fittable:
        return plan(messages, per_message, changed=False, fits=True, warnings=(HISTORY_UPSTREAM,))
    if policy.mode == "off" or fits:
        return plan(messages, per_message, changed=False, fits=True)
    if policy.mode == "reject":
        over = sum(per_message) + REPLY_PRIMING_TOKENS - budget.input_budget_tokens
        rejected = Action("rejected", 1, 0, f"over the input budget by {over} tokens (policy reject)")
        return plan(messages, per_message, changed=False, fits=False, actions=(rejected,))

    wanted = summaries if policy.mode == "auto" and policy.summarize else None
    current, tokens, actions, dropped = _run_steps(
        messages, per_message, STRATEGIES, budget=budget, policy=policy, counter=counter, summaries=wanted
    )
    broken = tuple(new_problems(body, current, dialect=dialect, source=parsed.messages))
    if broken:
        warnings.warn(
            f"the fit pipeline broke the {dialect.name} structure: {list(broken)}; falling back",
            StructureGuardWarning,
            stacklevel=2,
        )
        if wanted is not None:
            current, tokens, actions, dropped = _run_steps(
                messages,
                per_message,
                STRATEGIES,
                budget=budget,
                policy=policy,
                counter=counter,
                summaries=None,
            )
        if wanted is None or new_problems(body, current, dialect=dialect, source=parsed.messages):
            return plan(messages, per_message, changed=False, fits=fits, broken=broken)
    fitted = sum(tokens) + REPLY_PRIMING_TOKENS <= budget.input_budget_tokens
    if not fitted:
        over = sum(tokens) + REPLY_PRIMING_TOKENS - budget.input_budget_tokens
        actions.append(Action("rejected", 1, 0, f"still over the input budget by {over} tokens"))
    return plan(current, tokens, changed=True, fits=fitted, actions=actions, dropped=dropped, broken=broken)


def preview_next_cut(
    body: Mapping[str, Any],
    *,
    spec: ModelSpec,
    policy: Policy,
    counter: MessageCounter,
    cap_tokens: int | None = None,
    dialect: Dialect = DEFAULT_DIALECT,
) -> tuple[DroppedSpan, ...]:
    """The spans the next cut of this conversation will drop, all of it from the oldest (``()``
    when no complete level is left), as ``Plan.dropped`` would report them: ``block_stops`` are the
    level ends, so a summary made ahead of time for them is the one the next cut looks up.

    One rule with the pipeline (``strategies.next_cut``): this body is pruned and cut middle-out
    as ``plan_request`` would, and the next cut is the level after the one it needs (the first
    level when it fits). The span is in this body's message indices.
    """
    messages, per_message, _tools, budget = _prepare(
        body,
        dialect.parse(body),
        dialect=dialect,
        spec=spec,
        policy=policy,
        counter=counter,
        cap_tokens=cap_tokens,
    )
    current, tokens, _actions, _dropped = _run_steps(
        messages, per_message, STRATEGIES[:2], budget=budget, policy=policy, counter=counter, summaries=None
    )
    ctx = build_context(
        current,
        budget=budget,
        policy=policy,
        counter=counter,
        tokens=tokens,
        input_messages=messages,
        input_tokens=per_message,
    )
    # The next request carries one more turn: its protected tail starts where this body's newest
    # ``keep_turns - 1`` turns do (bounded to the share the same way), at least at the newest turn.
    next_tail = protected_start(
        messages,
        keep_turns=max(1, policy.keep_turns - 1),
        tokens=per_message,
        max_tokens=protect_tokens_for(budget, policy),
    )
    return next_cut(current, replace(ctx, protected_from=max(ctx.protected_from, next_tail)))
