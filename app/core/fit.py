"""The fit pipeline: least destructive first, stop as soon as the request fits.

INTERFACE CONTRACT (the service relies on this):

``plan_request(body, *, spec, policy, counter, dialect, cap_tokens=None, summaries=None,
conversation=None, limits=None) -> Plan`` parses ``body`` with its ``dialect`` (the caller's to
name: no API is assumed) into the neutral conversation (raises ``InvalidRequest``; pass the
``conversation`` already parsed to skip that), counts, builds the budget
(``budget.request_budget``, the one budget setup; ``limits``: a window, output cap or margin this
request learned, see ``budget.Limits``) and fits the neutral messages. An output cap below the
client's own is the plan's ``output_cap_tokens`` (the plan then always renders its body:
``changed``, and its actions say ``output_lowered``). It never raises ``CannotFit`` itself: a
plan that cannot fit has ``fits=False`` and the numbers. The plan renders its body through the
same dialect (``Plan.body``). A conversation the dialect marks not ``fittable`` (its history
lives upstream) is planned unchanged, with ``fits=True`` and the warning ``history-upstream``:
the proxy cannot know.

``SummaryProvider`` is the seam for LLM summaries: a *synchronous* lookup the pipeline calls for
the span its memory stands for (``memory.py``); ``None`` means "use the deterministic note and
placeholders". Under policy ``auto`` with ``policy.summarize`` a cut leaves room for the memory
(``memory.memory_tokens_for``) whether or not a summary comes, so the cut is the same either way;
the plan's ``memory`` is the span (``MemorySpan``), for the service to summarize.

``plan_request(..., headroom_tokens=N)`` plans as if N more tokens were needed, with the same
blocks and levels (and runs the strategies even when the request fits): with
``next_cut_headroom(plan, policy)`` it is the plan of the conversation's next cut, one that must
forget more than ``plan`` did (ahead-of-time summaries prepare its ``memory``).

Steps (``fits`` means messages + reply priming <= the input budget):

1. fits -> unchanged (the original objects; the service forwards the original bytes). Policy
   ``off`` is always unchanged; ``reject`` is unchanged with ``fits=False`` and ``rejected``.
2. prune old tool results and images, 3. middle-out over-large messages, 4. drop the oldest
   blocks (with a note), 5. last resort middle-out of the newest and pinned messages (see
   ``strategies``). 6. The memory: with a summary for everything steps 2 and 4 forgot, one
   message in its place (``memory.place_memory``: ``summarized``; else ``summary_failed`` when a
   provider was given). 7. Still over: ``fits=False`` with the smallest count reached.
Nothing is done to what is dropped: when middle-out cannot make the request fit on its own, its
cuts wait (``cutting.PendingCuts``), the drop decides what is kept first, and only the messages it
keeps are cut (``strategies``).

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
user's favour instead of corrupting the conversation: the deterministic cut (the same cut without
its memory) when that one passes, else the input unchanged (forwarded when it fits the budget,
refused with the numbers when it does not). The fallback plan lists the problems in ``Plan.broken`` for the
service to log. The guard runs only on changed plans: an unchanged body is forwarded as it came.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from .budget import Budget, Limits, Policy, request_budget
from .context import SummaryProvider, build_context, pinned_indices
from .conversation import Conversation, strip_reserved
from .cutting import PendingCuts
from .dialect import Dialect
from .memory import (
    MemorySpan,
    Placed,
    index_max_chars,
    memory_room_tokens,
    memory_span,
    memory_step_tokens,
    memory_text,
    memory_tokens_for,
    place_memory,
    span_index_text,
    span_messages,
    summary_tokens_for,
)
from .messages import Message
from .plan import Action, DroppedSpan, Plan
from .recall import Recallable, is_compaction, recall_ref, recallables, span_text
from .registry import ModelSpec
from .strategies import STRATEGIES, Strategy
from .tokens import REPLY_PRIMING_TOKENS, MessageCounter

__all__ = [
    "HISTORY_UPSTREAM",
    "StructureGuardWarning",
    "SummaryProvider",
    "cut_tool_tokens",
    "next_cut_headroom",
    "plan_request",
]

HISTORY_UPSTREAM = "history-upstream"  # the plan's warning for a conversation kept upstream


class StructureGuardWarning(RuntimeWarning):
    """A strategy made a body with a structural problem its input did not have (a bug): the plan
    fell back (see the module docstring)."""


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


@dataclass(slots=True)
class _Steps:
    """What ``_run_steps`` did: the messages and counts, the actions, the drop's spans, and for
    the memory: each message's input index (``origins``, None for one the engine made), the
    input indices a step forgot (pruned or dropped) and where the drop's note is."""

    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    actions: list[Action]
    dropped: tuple[DroppedSpan, ...] = ()
    origins: tuple[int | None, ...] = ()
    forgotten: frozenset[int] = frozenset()
    note_at: int | None = None


def _run_steps(
    messages: Sequence[Message],
    per_message: tuple[int, ...],
    steps: Sequence[tuple[str, Strategy]],
    *,
    budget: Budget,
    policy: Policy,
    counter: MessageCounter,
    memory_tokens: int = 0,
    headroom_tokens: int = 0,
) -> _Steps:
    """Run ``steps`` in order until the messages fit, leaving ``memory_tokens`` of room for the
    memory (out of the protected tail's share) and ``headroom_tokens`` more. A step's pending
    cuts (middle-out's) go to the next step's context and are made on what that step keeps."""
    current: tuple[Message, ...] = tuple(messages)
    tokens: tuple[int, ...] = per_message
    actions: list[Action] = []
    dropped: tuple[DroppedSpan, ...] = ()
    origins: tuple[int | None, ...] = tuple(range(len(messages)))
    forgotten: set[int] = set()
    note_at: int | None = None
    aligned = True  # indices still equal the input's (no message removed or inserted yet)
    pending: PendingCuts | None = None  # middle-out's cuts, made on what the step after it keeps
    for _name, strategy in steps:
        ctx = build_context(
            current,
            budget=budget,
            policy=policy,
            counter=counter,
            tokens=tokens,
            input_messages=messages if aligned else None,
            input_tokens=per_message if aligned else None,
            memory_tokens=memory_tokens,
            headroom_tokens=headroom_tokens,
            pending=pending,
        )
        if pending is None and ctx.fits(sum(tokens)):
            break
        result = strategy(current, ctx)
        if result.pending is not None:
            # Cutting alone cannot make it fit: the next step decides what is kept first.
            pending = result.pending
            continue
        if len(result.messages) == len(current) and all(
            a is b for a, b in zip(result.messages, current, strict=True)
        ):
            if pending is not None:
                current, tokens, made = _cut_kept(current, tokens, pending)
                actions.extend(made)
                pending = None
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
            # Only the drop changes the length: it keeps the very objects it keeps, and the one it
            # makes (the note) is new.
            origin_of = {id(m): o for m, o in zip(current, origins, strict=True)}
            kept = {id(m) for m in result.messages}
            forgotten.update(
                o for m, o in zip(current, origins, strict=True) if id(m) not in kept and o is not None
            )
            origins = tuple(origin_of.get(id(m)) for m in result.messages)
            note_at = next((j for j, m in enumerate(result.messages) if id(m) not in origin_of), None)
            aligned = False
        elif _name == "prune":
            forgotten.update(
                o
                for a, b, o in zip(result.messages, current, origins, strict=True)
                if a is not b and o is not None
            )
        current, tokens = result.messages, new_tokens
        if pending is not None:  # the cuts of what this step kept, before what it did
            current, tokens, made = _cut_kept(current, tokens, pending)
            actions.extend(made)
            pending = None
        actions.extend(result.actions)
    if pending is not None:
        current, tokens, made = _cut_kept(current, tokens, pending)
        actions.extend(made)
    return _Steps(current, tokens, actions, dropped, origins, frozenset(forgotten), note_at)


def _cut_kept(
    messages: tuple[Message, ...], tokens: tuple[int, ...], pending: PendingCuts
) -> tuple[tuple[Message, ...], tuple[int, ...], tuple[Action, ...]]:
    """``messages`` with the pending cuts of those still there made (middle-out's ``truncated``
    action for them, if any)."""
    where = {id(pending.messages[i]): i for i in pending.indices}
    out, counts = list(messages), list(tokens)
    made = freed = 0
    for j, message in enumerate(messages):
        index = where.get(id(message))
        found = pending.cut(index) if index is not None else None
        if found is None:
            continue
        out[j], counts[j] = found
        made += 1
        freed += tokens[j] - found[1]
    return tuple(out), tuple(counts), (Action("truncated", made, freed),) if made else ()


def plan_request(
    body: Mapping[str, Any],
    *,
    spec: ModelSpec,
    policy: Policy,
    counter: MessageCounter,
    cap_tokens: int | None = None,
    summaries: SummaryProvider | None = None,
    dialect: Dialect,
    conversation: Conversation | None = None,
    limits: Limits | None = None,
    headroom_tokens: int = 0,
) -> Plan:
    """Plan one request: unchanged when it fits, else the least destructive rewrite that fits.

    ``headroom_tokens``: plan as if the request needed that many tokens more room (the budget, its
    blocks and levels unchanged): the plan of this conversation's next cut, whose memory span
    ahead-of-time summaries prepare.
    """
    parsed = dialect.parse(body) if conversation is None else conversation
    messages = parsed.messages
    per_message = counter.count_messages(messages)
    # The budget of this body, or (the recall tool offered by a cut) of it with the tool.
    budget_of = partial(
        request_budget,
        conversation=parsed,
        dialect=dialect,
        spec=spec,
        policy=policy,
        counter=counter,
        exact=counter.exact,
        cap_tokens=cap_tokens,
        limits=limits,
    )
    budget = body_budget = budget_of(body)
    tool_tokens = budget.tool_tokens
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
    limit = budget.input_budget_tokens
    fits = sum(per_message) + REPLY_PRIMING_TOKENS <= limit
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
        memory: MemorySpan | None = None,
        broken: tuple[str, ...] = (),
        recall: tuple[Recallable, ...] = (),
        next_headroom: int = 0,
    ) -> Plan:
        # The tool's tokens count only in a plan that offers it (one that names no id leaves the
        # body's own budget: its output cap is not lowered for a tool it does not carry).
        tool_offered = offered and bool(recall)
        planned = budget if tool_offered else body_budget
        return Plan(
            model=parsed.model or str(body.get("model", "")),
            spec=spec,
            budget=planned,
            count_kind=count_kind,
            tokens_before=before,
            tokens_after=sum(tokens) + REPLY_PRIMING_TOKENS + planned.tool_tokens,
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
            memory=memory,
            broken=broken,
            recall=recall,
            recall_tool=tool_offered,
            next_headroom_tokens=next_headroom,
        )

    offered = False
    if not parsed.fittable:
        return plan(messages, per_message, changed=False, fits=True, warnings=(HISTORY_UPSTREAM,))
    if policy.mode == "off" or (fits and headroom_tokens <= 0):
        return plan(messages, per_message, changed=False, fits=True)
    if policy.mode == "reject":
        over = sum(per_message) + REPLY_PRIMING_TOKENS - limit
        rejected = Action("rejected", 1, 0, f"over the input budget by {over} tokens (policy reject)")
        return plan(messages, per_message, changed=False, fits=False, actions=(rejected,))

    offered = policy.recall == "tool" and offers_recall(body, parsed, dialect)
    if offered and dialect.recall is not None:
        # A plan that cuts may offer the recall tool: its definition is in the budget from here on.
        budget = budget_of(dialect.recall.with_tool(body))
        tool_tokens = budget.tool_tokens
        limit = budget.input_budget_tokens
    most = memory_tokens_for(budget, policy)
    pinned = pinned_indices(messages, pin_first_user=policy.pin_first_user) if most else frozenset()
    # Memory stops from counts calibration never moves (a model counted by estimate keeps the
    # same stops, so the same spans, as its correction is learned).
    stop_counts = per_message if counter.exact or not most else counter.uncorrected_counts(messages)

    def run(room: int) -> tuple[_Steps, MemorySpan | None]:
        steps = _run_steps(
            messages,
            per_message,
            STRATEGIES,
            budget=budget,
            policy=policy,
            counter=counter,
            memory_tokens=room,
            headroom_tokens=max(0, headroom_tokens),
        )
        if not room:
            return steps, None
        span = memory_span(
            messages,
            stop_counts,
            forgotten=steps.forgotten,
            pinned=pinned,
            step_tokens=memory_step_tokens(budget, policy),
        )
        return steps, span

    # The room follows the memory: planned with the most room first, the cut is planned again
    # with the room its memory needs (its index and its summary's size), which is less. A
    # smaller room forgets no more, so the memory of the second cut fits the room.
    steps, span = run(most)
    room = most
    index_chars = index_max_chars(budget, policy)
    indexes: dict[tuple[int, ...], tuple[str, int]] = {}

    def index_of(span: MemorySpan) -> tuple[str, int]:
        """The span's index and its index-only memory's tokens (0 when empty), once a plan."""
        found = indexes.get(span.forgot)
        if found is None:
            text = span_index_text(messages, span, max_chars=index_chars)
            memory = {"role": "user", "content": memory_text(len(span.forgot), "", text)}
            found = indexes[span.forgot] = (text, counter.count_message(memory) if text else 0)
        return found

    if span is not None:
        sized = memory_room_tokens(
            index_of(span)[1], summary_tokens_for(span, budget, policy, index_tokens=0), budget, policy
        )
        if sized < most:
            steps, span = run(sized)
            room = sized
    current, tokens, actions = steps.messages, steps.tokens, steps.actions
    if span is not None:
        index, index_tokens = index_of(span)
        span = replace(
            span, summary_tokens=summary_tokens_for(span, budget, policy, index_tokens=index_tokens)
        )
    remembered_ref: list[Recallable] = []
    if span is not None:
        current, tokens = _remember(
            current,
            tokens,
            steps,
            span,
            summaries if policy.mode == "auto" and policy.summarize else None,
            messages=messages,
            counter=counter,
            limit=limit,
            index=index,
            recall=remembered_ref if policy.recall != "off" else None,
        )

    broken = tuple(new_problems(body, current, dialect=dialect, source=parsed.messages))
    if broken:
        warnings.warn(
            f"the fit pipeline broke the {dialect.name} structure: {list(broken)}; falling back",
            StructureGuardWarning,
            stacklevel=2,
        )
        remembered = current is not steps.messages
        if remembered:  # the deterministic cut: the same steps, without the memory
            current, tokens, span = steps.messages, steps.tokens, None
            actions = [a for a in actions if a.kind not in ("summarized", "indexed")]
            remembered_ref.clear()
        if not remembered or new_problems(body, current, dialect=dialect, source=parsed.messages):
            return plan(messages, per_message, changed=False, fits=fits, broken=broken)
    recall: tuple[Recallable, ...] = ()
    if policy.recall != "off":
        found = recallables(
            messages, steps.messages, steps.origins, note_at=steps.note_at, known=remembered_ref
        )
        recall = (*found, *(r for r in remembered_ref if r.ref not in {f.ref for f in found}))
    fitted = sum(tokens) + REPLY_PRIMING_TOKENS <= limit
    if not fitted:
        over = sum(tokens) + REPLY_PRIMING_TOKENS - limit
        actions.append(Action("rejected", 1, 0, f"still over the input budget by {over} tokens"))
    return plan(
        current,
        tokens,
        changed=True,
        fits=fitted,
        actions=actions,
        dropped=steps.dropped,
        memory=span,
        broken=broken,
        recall=recall,
        # What this cut kept, the note in place of the memory: the next cut keeps less.
        next_headroom=max(1, limit - REPLY_PRIMING_TOKENS - room - (sum(steps.tokens) - 1)) if most else 0,
    )


def offers_recall(body: Mapping[str, Any], conversation: Conversation, dialect: Dialect) -> bool:
    """True when a plan of this request that names a recall id may offer the ``ctx_recall`` tool:
    its API has one (``Dialect.recall``), the body allows it (no forced tool choice, ...) and it is
    not a client's own compaction request (``recall.is_compaction``)."""
    shape = dialect.recall
    return (
        shape is not None
        and conversation.fittable
        and shape.offered(body)
        and not is_compaction(conversation.messages)
    )


def next_cut_headroom(plan: Plan, policy: Policy, *, cut_tool_tokens: int | None = None) -> int:
    """The ``headroom_tokens`` whose plan forgets more than ``plan`` (a plan of the same request
    without a summary provider): its strategies aim one token below what ``plan`` kept, with the
    memory's room, so they reach the next level (a cut plan knows it: ``Plan.next_headroom_tokens``,
    what it kept before its memory took the note's place). ``cut_tool_tokens``: the tool
    definitions' tokens of a cut of this request (``cut_tool_tokens``: with the recall tool when a
    cut offers it), when ``plan`` did not cut: the budget of the next cut is smaller by the
    difference."""
    if plan.next_headroom_tokens:
        return plan.next_headroom_tokens
    room = memory_tokens_for(plan.budget, policy)
    extra = max(0, cut_tool_tokens - plan.budget.tool_tokens) if cut_tool_tokens is not None else 0
    target = plan.budget.input_budget_tokens - REPLY_PRIMING_TOKENS - room - extra
    return max(1, target - (sum(plan.message_tokens) - 1))


def cut_tool_tokens(
    body: Mapping[str, Any],
    conversation: Conversation,
    *,
    dialect: Dialect,
    policy: Policy,
    counter: MessageCounter,
) -> int:
    """The tool definitions' tokens in the budget of a plan of this request that cuts: with the
    recall tool when such a plan offers it (``offers_recall``)."""
    offered = policy.recall == "tool" and offers_recall(body, conversation, dialect)
    shape = dialect.recall
    return dialect.tool_tokens(shape.with_tool(body) if offered and shape is not None else body, counter)


def _remember(
    current: tuple[Message, ...],
    tokens: tuple[int, ...],
    steps: _Steps,
    span: MemorySpan,
    summaries: SummaryProvider | None,
    *,
    messages: Sequence[Message],
    counter: MessageCounter,
    limit: int,
    index: str,
    recall: list[Recallable] | None = None,
) -> tuple[tuple[Message, ...], tuple[int, ...]]:
    """The fitted messages with the memory of ``span`` in place: its summary when the provider
    has it (or, else, the summary of one of its ``earlier`` spans) and ``index``, what it forgot
    (``summarized``, counting the messages the summary stands for); without a summary, the index
    alone (``indexed``; ``summary_failed`` too when a provider was given for a span that has one to
    give, with why); unchanged (the note and placeholders) when the memory is empty or does not
    fit. With ``recall`` (a list), the memory names the transcript of everything it forgot by its
    recall id (the drop's note it replaces named it too), added there."""
    count = len(span.indices)
    summary: str | None = None
    chosen = span
    if summaries is not None and span.indices:  # before the first memory stop: the index alone
        for candidate in (span, *(span.until(stop) for stop in span.earlier)):
            found = summaries.summary_for(span_messages(messages, candidate))
            if isinstance(found, str) and found.strip():
                summary, chosen = found, candidate
                break
        if summary is None:
            steps.actions.append(Action("summary_failed", count, detail="no summary available"))
    transcript = span_text([strip_reserved(messages[i]) for i in span.forgot]) if recall is not None else ""
    ref = recall_ref(transcript) if recall is not None and transcript else None

    def place(text: str, covered: MemorySpan) -> Placed | None:
        placed = place_memory(
            current,
            tokens,
            steps.origins,
            span=covered,
            summary=text,
            counter=counter,
            limit_tokens=limit - REPLY_PRIMING_TOKENS,
            note_at=steps.note_at,
            index=index,
            ref=ref,
        )
        if placed is not None and recall is not None and ref is not None:
            recall.append(Recallable(ref, transcript))
        return placed

    placed = place(summary, chosen) if summary is not None else None
    if placed is not None:
        steps.actions.append(Action("summarized", len(chosen.indices)))
        return placed.messages, placed.tokens
    if summary is not None:
        steps.actions.append(Action("summary_failed", count, detail="summary too large to fit"))
    placed = place("", span) if index else None
    if placed is None:
        return current, tokens
    steps.actions.append(Action("indexed", len(span.forgot)))
    return placed.messages, placed.tokens
