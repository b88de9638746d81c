"""What a cut forgot, and the one message that stands for it: the memory of a fitted request.

INTERFACE CONTRACT (``fit.py`` places the memory; the service summarizes its span):

* ``wants_memory(policy)``: a cut leaves a memory under ``auto`` with ``summarize`` (a summary
  and the index) or with ``index_memory`` (the index alone; ``truncate`` too).
  ``memory_tokens_for(budget, policy) -> int``: the most room a cut leaves for it (0 when none is
  wanted): ``MEMORY_BUDGET_SHARE`` of the input budget, at most ``MEMORY_MAX_TOKENS``, out of the
  protected tail's share (``context``). ``memory_step_tokens(budget, policy)``: the spacing of
  memory stops (below), from that most room (so the stops never move with the memory's size).
* The room a cut keeps follows the memory it will hold (``fit.py`` plans the cut with the most
  room, then again with this one): ``memory_room_tokens(index_tokens, summary_tokens, budget,
  policy)``, the index-only memory's tokens and the summary's size summed and rounded up to a
  step (``ROOM_STEP_SHARE`` of the most room), so a memory that grows a little moves nothing;
  ``summary_tokens_for(span, budget, policy, index_tokens=)``: the size a summary is asked for,
  a quarter of the most room per memory stop the span covers (the previous memory and a bounded
  growth), at most what the index leaves; ``index_max_chars(budget, policy)``: the index's bound.
  All are functions of the conversation and its budget: every replica plans the same cut.
* ``MemorySpan`` (frozen): ``at`` (the input index the memory goes before: where the forgetting
  ends), ``stop`` (the end of what it stands for), ``indices`` (the input messages it stands for,
  ascending), ``tokens`` (the client's count of them), ``earlier`` (the memory stops before
  ``stop``: ``until(stop)`` is the span of an earlier memory, which stands in while the summary
  of this one is not there yet, so a late summary never takes away the memory a request had),
  ``summary_tokens`` (the size of its summary) and ``forgot`` (what its index reads).
* ``memory_stops(messages, tokens, *, step_tokens) -> list[int]`` and ``memory_span(messages,
  tokens, *, forgotten, pinned, step_tokens) -> MemorySpan | None``.
* ``memory_text(count, summary, index="", ref=None) -> str`` and ``MEMORY_HEAD_RE`` (the framing,
  a pure function of the span's size, its summary, its index (with no summary, the index alone)
  and, with recall, the recall id of its messages); ``span_index_text(messages, span, *,
  max_chars)`` (the index of what it forgot, ``app.core.span_index``); ``span_messages(messages,
  span)`` (what a summarizer reads: the messages without the engine's reserved keys, so the same
  history gives the same span whatever the dialect froze or priced this time).
* ``place_memory(messages, tokens, origins, *, span, summary, counter, limit_tokens, note_at=None,
  index="", ref=None) -> Placed | None``: ``messages`` with the memory inserted before the first
  message from input index ``span.at`` on (and the drop's note, which it stands for, removed);
  None when it does not fit ``limit_tokens``.

What is forgotten: every input message a strategy pruned (a placeholder now stands in its place)
or dropped; the forgetting ends after the unit that holds the newest of them (``at``, called F
below). The memory covers the region from the conversation's first turn up to the first *memory
stop* at or after F (``stop``): all of its messages but the pinned ones (the system prompt, the
first task), whether or not they are still shown. Memory stops are unit starts where the client's
tokens, counted from the first turn, cross a multiple of ``memory_step_tokens`` (the level step
``S`` of ``context.step_tokens_for``, and at least four memories' worth). They depend only on the
conversation's own start, so while a cut moves by a unit or a block the memory stays the same,
and it moves on in steps of at least ``S`` tokens: one summary call, folding the previous summary
with the next step's messages, so every forgotten token is summarized about once and the previous
summary sent again is at most a quarter of the call. A cut past the last stop (within a step of
the conversation's end) keeps the summary at the last stop: what it forgot after that stop has
its index alone until the conversation grows past the next stop; before the first stop there is
no summary, the index stands for everything (``indices`` empty, ``forgot`` not). So a summary is
asked for once per memory step, never per cut step (an agent whose every request adds a large
tool result moves its cut every request). The memory of one cut is a function of the
conversation's own messages and of where the cut is, and as a session grows it only moves
forward (``app.compaction`` folds the previous summary).

Where it goes: before the first kept message at or after F, the place where the forgetting ends
(so what it also covers of the messages after it is shown right after it); a prune that moves on
changes the prompt from there anyway. F is always a unit start and never inside a signed tool
loop's kept part (the strategies never forget there, and a drop there ends at a kept unit the
loop's user message comes right before), so every wire API can hold it: a user message in chat,
a text block on the user side in Anthropic Messages (``messages_wire``), a message item in
Responses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .budget import Budget, Policy
from .context import step_tokens_for
from .conversation import strip_reserved
from .messages import Message, group_turns, group_units
from .recall import ref_suffix
from .span_index import span_index
from .tokens import MessageCounter

MEMORY_MAX_TOKENS = 4096
MEMORY_BUDGET_SHARE = 0.15
MEMORY_STEP_FACTOR = 4
# The index's share of the memory's most room, and the characters it may take per token of it
# (identifiers and paths cut into short tokens: about three characters each).
INDEX_SHARE = 0.6
INDEX_CHARS_PER_TOKEN = 3
# A summary may take this share of the most room per memory stop it covers (the first one a
# quarter, the fourth and later all of it): the previous memory and a bounded growth.
SUMMARY_GROWTH_SHARE = 0.25
# The room moves in steps of this share of the most room (and at least ``ROOM_STEP_MIN_TOKENS``),
# so a memory that grows a little leaves the cut, and the prompt before it, where it was.
ROOM_STEP_SHARE = 0.125
ROOM_STEP_MIN_TOKENS = 32
MEMORY_HEAD_RE = re.compile(r"\[ctxproxy: (?:summary|index) of [0-9,]+ earlier messages?[^\]\n]*\]\n")


def memory_step_tokens(budget: Budget, policy: Policy) -> int:
    """The spacing of memory stops: the level step ``S``, and at least ``MEMORY_STEP_FACTOR``
    memories' worth (a fold sends the previous summary again: it is worth a call when the new
    material is several times larger). Reckoned on the budget before tool definitions, whose
    count by estimate moves with calibration: the stops stay where they are."""
    steady = replace(budget, tool_tokens=0)
    return max(step_tokens_for(steady, policy), MEMORY_STEP_FACTOR * memory_tokens_for(steady, policy))


def wants_memory(policy: Policy) -> bool:
    """A cut of ``policy`` leaves a memory: ``auto`` with ``summarize`` (a summary and the index)
    or ``index_memory`` (the index alone: ``auto`` with summaries off, ``truncate``)."""
    if policy.mode == "auto":
        return policy.summarize or policy.index_memory
    return policy.mode == "truncate" and policy.index_memory


def memory_tokens_for(budget: Budget, policy: Policy) -> int:
    """The most room a cut keeps for the memory (0 when the policy wants none): ``MEMORY_BUDGET_SHARE``
    of the input budget, at most ``MEMORY_MAX_TOKENS``. The room a cut keeps is sized to its
    memory within it (``memory_room_tokens``)."""
    if not wants_memory(policy):
        return 0
    return max(0, min(MEMORY_MAX_TOKENS, int(MEMORY_BUDGET_SHARE * budget.input_budget_tokens)))


def index_max_chars(budget: Budget, policy: Policy) -> int:
    """The most characters of the index (``INDEX_SHARE`` of the most room)."""
    return round(INDEX_CHARS_PER_TOKEN * INDEX_SHARE * memory_tokens_for(budget, policy))


def summary_tokens_for(span: MemorySpan, budget: Budget, policy: Policy, *, index_tokens: int) -> int:
    """The tokens the summary of ``span`` may take beside an index-only memory of ``index_tokens``
    (0 without ``summarize``): a ``SUMMARY_GROWTH_SHARE`` of the most room per memory stop the
    span covers, at most what the index leaves of it. A pure function of the span and the budget:
    the room of a cut and the size its summary is asked for (``MemorySpan.summary_tokens``) agree
    on every replica."""
    if not (policy.mode == "auto" and policy.summarize) or not span.indices:
        return 0
    most = memory_tokens_for(budget, policy)
    stops = len(span.earlier) + 1
    return max(0, int(min(most - index_tokens, SUMMARY_GROWTH_SHARE * most * stops)))


def memory_room_tokens(index_tokens: int, summary_tokens: int, budget: Budget, policy: Policy) -> int:
    """The room a cut keeps for a memory of ``index_tokens`` (the index-only memory message, as
    counted) and a summary of ``summary_tokens``: their sum rounded up to a room step, at most the
    most room (``memory_tokens_for``)."""
    most = memory_tokens_for(budget, policy)
    if most <= 0:
        return 0
    step = max(ROOM_STEP_MIN_TOKENS, int(ROOM_STEP_SHARE * most))
    need = max(0, index_tokens) + max(0, summary_tokens)
    return min(most, -(-need // step) * step)


@dataclass(frozen=True, slots=True)
class MemorySpan:
    """The input messages a memory stands for (see the module docstring). ``earlier``: the memory
    stops before ``stop``, newest first: when the summary of this span is not there yet, the one
    of a shorter span (an earlier cut step's) may stand in. ``summary_tokens``: the size its
    summary is asked for (``summary_tokens_for``; 0 when none is wanted). ``forgot``: the input
    messages before ``at`` but the pinned ones (what the cut no longer shows whole, with what lies
    past ``stop``, which has no summary yet): what its index reads."""

    at: int
    stop: int
    indices: tuple[int, ...]
    tokens: int
    earlier: tuple[int, ...] = ()
    summary_tokens: int = 0
    forgot: tuple[int, ...] = ()

    def until(self, stop: int) -> MemorySpan:
        """This span cut at ``stop`` (one of ``earlier``), for the summary of a shorter span."""
        indices = tuple(i for i in self.indices if i < stop)
        tokens = round(self.tokens * len(indices) / max(1, len(self.indices)))
        return MemorySpan(at=self.at, stop=stop, indices=indices, tokens=tokens, forgot=self.forgot)


@dataclass(frozen=True, slots=True)
class Placed:
    """``messages`` with the memory in place (at ``index``), their counts, and the memory's."""

    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    index: int
    memory_tokens: int


def memory_text(count: int, summary: str, index: str = "", ref: str | None = None) -> str:
    """The memory as prompt text: the framing (which the engine recognises as its own, see
    ``strategies.is_ctxproxy_note``; with recall, the recall id of the messages it stands for),
    the summary when there is one, and the index of the exact strings of what it stands for
    (``span_index``). A pure function of its arguments."""
    noun = "message" if count == 1 else "messages"
    summary, index = summary.strip(), index.strip()
    if not summary:
        heading = f"[ctxproxy: index of {count:,} earlier {noun}, removed to fit the context window"
        return f"{heading}{ref_suffix(ref)}]\n{index}"
    text = f"[ctxproxy: summary of {count:,} earlier {noun}{ref_suffix(ref)}]\n{summary}"
    return f"{text}\n[ctxproxy: exact strings from them]\n{index}" if index else text


def span_index_text(messages: Sequence[Message], span: MemorySpan, *, max_chars: int) -> str:
    """The index of what ``span`` forgot (``span.forgot``: the messages after ``at`` are shown),
    rendered (``span_index``)."""
    return span_index((messages[i] for i in span.forgot), max_chars=max_chars).text()


def memory_stops(messages: Sequence[Message], tokens: Sequence[int], *, step_tokens: int) -> list[int]:
    """The unit starts where the client's ``tokens`` from the first turn's start cross a multiple
    of ``step_tokens``, ascending."""
    turns = group_turns(messages)
    if not turns:
        return []
    start = turns[0].start
    step = max(1, step_tokens)
    stops: list[int] = []
    running = level = 0
    for unit in group_units(messages):
        if unit.start < start:
            continue
        if unit.start > start and running // step > level:
            stops.append(unit.start)
            level = running // step
        running += sum(tokens[unit.start : unit.stop])
    return stops


def memory_span(
    messages: Sequence[Message],
    tokens: Sequence[int],
    *,
    forgotten: Iterable[int],
    pinned: frozenset[int],
    step_tokens: int,
) -> MemorySpan | None:
    """The span of input ``messages`` (with the client's per-message ``tokens``) a memory stands
    for, given the input indices a cut ``forgotten``; None when nothing was."""
    last = max(forgotten, default=None)
    if last is None:
        return None
    at = next((unit.stop for unit in group_units(messages) if unit.start <= last < unit.stop), last + 1)
    stops = memory_stops(messages, tokens, step_tokens=step_tokens)
    turns = group_turns(messages)
    start = turns[0].start if turns else at
    # The summary ends at a memory stop, never at the cut itself (one call per memory step, not
    # per cut step): the next stop; past the last one (the conversation has not grown a step past
    # the cut yet), the last one; before the first, none (what lies past it has the index alone).
    stop = next((s for s in stops if s >= at), stops[-1] if stops else start)
    # The newest user message is never forgotten, but it is covered like any shown message: when a
    # newer one arrives it is the same span's prefix, so the chain folds on instead of starting over.
    indices = tuple(i for i in range(start, stop) if i not in pinned)
    forgot = tuple(i for i in range(start, at) if i not in pinned)
    if not indices and not forgot:
        return None
    earlier = tuple(s for s in reversed(stops) if s < stop)
    return MemorySpan(
        at=at,
        stop=stop,
        indices=indices,
        tokens=sum(tokens[i] for i in indices),
        earlier=earlier,
        forgot=forgot,
    )


def span_messages(messages: Sequence[Message], span: MemorySpan) -> list[dict[str, Any]]:
    """The span's messages as a summarizer reads them (reserved keys removed)."""
    return [strip_reserved(messages[i]) for i in span.indices]


def place_memory(
    messages: Sequence[Message],
    tokens: Sequence[int],
    origins: Sequence[int | None],
    *,
    span: MemorySpan,
    summary: str,
    counter: MessageCounter,
    limit_tokens: int,
    note_at: int | None = None,
    index: str = "",
    ref: str | None = None,
) -> Placed | None:
    """``messages`` (the fitted ones; ``origins[j]`` is the input index of message ``j``, None
    for a message the engine made) with the memory of ``span`` (its ``summary``, its ``index``)
    before the first message from input index ``span.at`` on; ``note_at`` (the drop's note) is
    removed; ``ref``: the recall id its heading names. None when the result's tokens would exceed
    ``limit_tokens``."""
    keep = [j for j in range(len(messages)) if j != note_at]
    at = next(
        (k for k, j in enumerate(keep) if (origin := origins[j]) is not None and origin >= span.at),
        len(keep),
    )
    previous = messages[keep[at - 1]].get("role") if at > 0 else None
    memory: dict[str, Any] = {
        "role": "assistant" if previous == "user" else "user",
        "content": memory_text(len(span.indices if summary.strip() else span.forgot), summary, index, ref),
    }
    memory_tokens = counter.count_message(memory)
    out = [messages[j] for j in keep]
    counts = [tokens[j] for j in keep]
    out.insert(at, memory)
    counts.insert(at, memory_tokens)
    if sum(counts) > limit_tokens:
        return None
    return Placed(tuple(out), tuple(counts), at, memory_tokens)
