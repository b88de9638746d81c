"""Values the fit pipeline produces: actions, strategy results and the plan of one request.

INTERFACE CONTRACT (the service, the API and the CLI rely on these names):

* ``Action`` (frozen): ``kind``, ``count``, ``tokens_freed``, ``detail``.
* ``Plan`` (frozen): ``model``, ``spec``, ``budget``, ``count_kind`` (``"exact"``/``"estimate"``),
  ``tokens_before``, ``tokens_after`` (whole-request input tokens: messages, reply priming and
  tool definitions), ``changed`` (False: forward the client's original bytes), ``fits``,
  ``messages`` (what to forward), ``message_tokens`` (per forwarded message), ``actions``;
  ``dropped`` (the spans of the *input* messages that were removed); ``memory`` (the
  ``MemorySpan`` a summary stands for, when summaries are wanted and something was forgotten)
  and ``memory_kind`` (``summary``/``index``/``note``/``none``, the ``X-Context-Memory`` header);
  ``actions_header()`` renders ``pruned=4,dropped_turns=6,truncated=1``; ``dialect`` is the wire
  API's (``api`` its name); ``body(original)`` returns the request body to forward, rendered by
  that dialect; ``warnings`` are ``X-Context-Warning`` values (``history-upstream``); ``broken``
  the structural problems a strategy introduced that the final guard caught and undid (a bug,
  see ``fit.plan_request``; the service logs it); ``output_cap_tokens``: the output cap the body
  is forwarded with when it is lower than the client's own (``budget.Limits``; the dialect writes
  it, ``Dialect.with_output_cap``), else None; ``upstream_tokens``: the upstream's own count of
  the whole request when the plan was decided by it (``app.service.boundary``: an anchor's upper
  bound, or the counting endpoint's answer); ``recall``: what the plan removed that it names by
  a recall id (``app.core.recall.Recallable``), ``recall_tool``: its body offers the
  ``ctx_recall`` tool (``Dialect.recall.with_tool``, after the client's own tools).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .budget import Budget
from .cutting import PendingCuts
from .dialect import Dialect
from .memory import MemorySpan
from .messages import Message
from .recall import Recallable
from .registry import ModelSpec

ActionKind = Literal[
    "pruned",  # old tool results replaced by a placeholder
    "images",  # old image parts replaced by a placeholder
    "truncated",  # one large message cut middle-out
    "dropped_turns",  # whole turns removed from the oldest (count = turns)
    "dropped_messages",  # how many messages those turns held
    "summarized",  # what was forgotten (pruned or dropped) has a summary in its place (count = messages)
    "summary_failed",  # a summary was wanted but none is in place (the index or the note stands in)
    "indexed",  # what was forgotten has its index of exact strings in its place, no summary
    "last_resort",  # newest or pinned messages cut middle-out
    "output_lowered",  # the forwarded output cap lowered so that what must be kept fits
    "rejected",  # policy reject / cannot fit
]


@dataclass(frozen=True, slots=True)
class Action:
    """One thing the pipeline did: ``count`` items affected, ``tokens_freed`` tokens saved."""

    kind: ActionKind
    count: int
    tokens_freed: int = 0
    detail: str = ""


@dataclass(frozen=True, slots=True)
class DroppedSpan:
    """Input messages ``[start, stop)`` that step 4 removed, as consecutive blocks.

    ``block_stops`` are the (exclusive) ends of the blocks the span is made of, in order, the last
    one equal to ``stop``; a summary provider can grow a summary block by block (rolling
    compaction). ``tokens`` is our count of the span.
    """

    start: int
    stop: int
    tokens: int
    block_stops: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StrategyResult:
    """A strategy's output: new messages (the input is never mutated) and what it did.

    ``dropped``: the spans of the strategy's *input* indices it removed (only the drop step sets it).
    ``pending``: cuts it decided but left to be made on what the next step keeps (only middle-out
    sets it, with its messages unchanged: see ``strategies.middle_out``).
    """

    messages: tuple[Message, ...]
    actions: tuple[Action, ...] = ()
    dropped: tuple[DroppedSpan, ...] = ()
    pending: PendingCuts | None = None


def actions_header(actions: Sequence[Action]) -> str:
    """Compact header value: counts summed per kind, in first-seen order; ``none`` if empty."""
    totals: dict[str, int] = {}
    for action in actions:
        totals[action.kind] = totals.get(action.kind, 0) + action.count
    return ",".join(f"{kind}={count}" for kind, count in totals.items()) or "none"


@dataclass(frozen=True, slots=True)
class Plan:
    """The decision for one request, before anything is sent."""

    model: str
    spec: ModelSpec
    budget: Budget
    count_kind: Literal["exact", "estimate", "calibrated"]
    tokens_before: int
    tokens_after: int
    changed: bool
    fits: bool
    messages: tuple[Message, ...]
    message_tokens: tuple[int, ...]
    dialect: Dialect
    actions: tuple[Action, ...] = ()
    dropped: tuple[DroppedSpan, ...] = ()
    warnings: tuple[str, ...] = ()
    # The neutral messages the dialect parsed from the request: ``body`` renders without parsing
    # the request a second time.
    source: tuple[Message, ...] | None = None
    broken: tuple[str, ...] = ()
    output_cap_tokens: int | None = None
    upstream_tokens: int | None = None
    memory: MemorySpan | None = None
    recall: tuple[Recallable, ...] = ()
    recall_tool: bool = False
    next_headroom_tokens: int = 0

    def actions_header(self) -> str:
        return actions_header(self.actions)

    @property
    def memory_kind(self) -> Literal["summary", "index", "note", "none"]:
        """What stands in for what the plan forgot: ``summary`` (a memory message with a summary),
        ``index`` (a memory message with the index of exact strings alone), ``note`` (the drop's
        note and the prune placeholders alone), ``none`` (nothing was forgotten)."""
        kinds = {action.kind for action in self.actions}
        if "summarized" in kinds:
            return "summary"
        if "indexed" in kinds:
            return "index"
        forgot = ("pruned", "images", "dropped_messages")
        return "note" if any(action.kind in forgot for action in self.actions) else "none"

    @property
    def api(self) -> str:
        """The name of the wire API the plan is for (its dialect's)."""
        return self.dialect.name

    def body(self, original: Mapping[str, Any]) -> dict[str, Any]:
        """``original`` with its conversation replaced by ours, through the plan's dialect, the
        recall tool when offered and the output cap it lowered; every other key kept as is."""
        body = self.dialect.render(original, self.messages, source=self.source)
        if self.recall_tool and self.dialect.recall is not None:
            body = self.dialect.recall.with_tool(body)
        if self.output_cap_tokens is not None:
            capped = self.dialect.with_output_cap(body, self.output_cap_tokens)
            if capped is not None:
                body = capped
        return body
