"""What a cut forgot, and the one message that stands for it: the memory of a fitted request.

INTERFACE CONTRACT (``fit.py`` places the memory; the service summarizes its span):

* ``memory_tokens_for(budget, policy) -> int``: the room a cut leaves for the memory when the
  policy wants one (``auto`` with ``summarize``), else 0: ``MEMORY_BUDGET_SHARE`` of the input
  budget, at most ``MEMORY_MAX_TOKENS``, out of the protected tail's share (``context``). A
  summary is asked for with this many tokens at most.
  ``memory_step_tokens(budget, policy)``: the spacing of memory stops (below).
* ``MemorySpan`` (frozen): ``at`` (the input index the memory goes before: where the forgetting
  ends), ``stop`` (the end of what it stands for), ``indices`` (the input messages it stands for,
  ascending), ``tokens`` (the client's count of them) and ``earlier`` (the memory stops before
  ``stop``: ``until(stop)`` is the span of an earlier memory, which stands in while the summary
  of this one is not there yet, so a late summary never takes away the memory a request had).
* ``memory_stops(messages, tokens, *, step_tokens) -> list[int]`` and ``memory_span(messages,
  tokens, *, forgotten, pinned, step_tokens, gap_tokens=0) -> MemorySpan | None``.
* ``memory_text(count, summary, ref=None) -> str`` and ``MEMORY_HEAD_RE`` (the framing, a pure
  function of the span's size, its summary and, with recall, the recall id of its messages);
  ``span_messages(messages, span)`` (what a summarizer reads: the messages without the engine's
  reserved keys, so the same history gives the same span whatever the dialect froze or priced
  this time).
* ``place_memory(messages, tokens, origins, *, span, summary, counter, limit_tokens) ->
  Placed | None``: ``messages`` with the memory inserted before the first message from input
  index ``span.at`` on (and the drop's note, which it stands for, removed); None when it does
  not fit ``limit_tokens``.

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
the conversation's end) keeps the memory at the last stop while what it forgot after that stop
is less than two memories' worth (``MEMORY_GAP_FACTOR``): that gap has no summary (the note and
placeholders stand for it) until the conversation grows past the next stop, a request or two
later, which costs less than a summary call for a few messages at every cut step; a larger gap is
summarized up to the cut itself (the next stop's summary folds on from there). So the memory of
one cut is a function of the conversation's own messages and of where the cut is, and as a
session grows it only moves forward (``app.compaction`` folds the previous summary).

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
from .recall import REF_PATTERN, ref_suffix
from .tokens import MessageCounter

MEMORY_MAX_TOKENS = 4096
MEMORY_BUDGET_SHARE = 0.15
MEMORY_STEP_FACTOR = 4
MEMORY_GAP_FACTOR = 2
MEMORY_HEAD_RE = re.compile(r"\[ctxproxy: summary of [0-9,]+ earlier messages?" + REF_PATTERN + r"\]\n")


def memory_step_tokens(budget: Budget, policy: Policy) -> int:
    """The spacing of memory stops: the level step ``S``, and at least ``MEMORY_STEP_FACTOR``
    memories' worth (a fold sends the previous summary again: it is worth a call when the new
    material is several times larger). Reckoned on the budget before tool definitions, whose
    count by estimate moves with calibration: the stops stay where they are."""
    steady = replace(budget, tool_tokens=0)
    return max(step_tokens_for(steady, policy), MEMORY_STEP_FACTOR * memory_tokens_for(steady, policy))


def memory_tokens_for(budget: Budget, policy: Policy) -> int:
    """The room a cut keeps for the memory (0 unless ``auto`` with ``summarize``)."""
    if policy.mode != "auto" or not policy.summarize:
        return 0
    return max(0, min(MEMORY_MAX_TOKENS, int(MEMORY_BUDGET_SHARE * budget.input_budget_tokens)))


@dataclass(frozen=True, slots=True)
class MemorySpan:
    """The input messages a memory stands for (see the module docstring). ``earlier``: the memory
    stops before ``stop``, newest first: when the summary of this span is not there yet, the one
    of a shorter span (an earlier cut step's) may stand in."""

    at: int
    stop: int
    indices: tuple[int, ...]
    tokens: int
    earlier: tuple[int, ...] = ()

    def until(self, stop: int) -> MemorySpan:
        """This span cut at ``stop`` (one of ``earlier``), for the summary of a shorter span."""
        indices = tuple(i for i in self.indices if i < stop)
        tokens = round(self.tokens * len(indices) / max(1, len(self.indices)))
        return MemorySpan(at=self.at, stop=stop, indices=indices, tokens=tokens)


@dataclass(frozen=True, slots=True)
class Placed:
    """``messages`` with the memory in place (at ``index``), their counts, and the memory's."""

    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    index: int
    memory_tokens: int


def memory_text(count: int, summary: str, ref: str | None = None) -> str:
    """The memory as prompt text: the framing (which the engine recognises as its own, see
    ``strategies.is_ctxproxy_note``; with recall, the recall id of the messages it stands for)
    and the summary."""
    noun = "message" if count == 1 else "messages"
    return f"[ctxproxy: summary of {count:,} earlier {noun}{ref_suffix(ref)}]\n{summary.strip()}"


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
    gap_tokens: int = 0,
) -> MemorySpan | None:
    """The span of input ``messages`` (with the client's per-message ``tokens``) a memory stands
    for, given the input indices a cut ``forgotten``; None when nothing was."""
    last = max(forgotten, default=None)
    if last is None:
        return None
    at = next((unit.stop for unit in group_units(messages) if unit.start <= last < unit.stop), last + 1)
    stops = memory_stops(messages, tokens, step_tokens=step_tokens)
    # The next stop; past the last one (the conversation has not grown a step past the cut yet),
    # the last one when what lies between it and the cut is less than ``gap_tokens`` (it has no
    # summary until the next stop exists; the note and placeholders stand for it), rather than a
    # summary call for a few messages; else the cut itself.
    stop = next((s for s in stops if s >= at), None)
    if stop is None:
        last_stop = stops[-1] if stops else None
        gap = sum(tokens[last_stop:at]) if last_stop is not None else gap_tokens
        stop = last_stop if last_stop is not None and gap < gap_tokens else at
    turns = group_turns(messages)
    start = turns[0].start if turns else at
    # The newest user message is never forgotten, but it is covered like any shown message: when a
    # newer one arrives it is the same span's prefix, so the chain folds on instead of starting over.
    indices = tuple(i for i in range(start, stop) if i not in pinned)
    if not indices:
        return None
    earlier = tuple(s for s in reversed(stops) if s < stop)
    return MemorySpan(
        at=at, stop=stop, indices=indices, tokens=sum(tokens[i] for i in indices), earlier=earlier
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
    ref: str | None = None,
) -> Placed | None:
    """``messages`` (the fitted ones; ``origins[j]`` is the input index of message ``j``, None
    for a message the engine made) with the memory of ``span`` before the first message from
    input index ``span.at`` on; ``note_at`` (the drop's note) is removed; ``ref``: the recall id
    its heading names. None when the result's tokens would exceed ``limit_tokens``."""
    keep = [j for j in range(len(messages)) if j != note_at]
    at = next(
        (k for k, j in enumerate(keep) if (origin := origins[j]) is not None and origin >= span.at),
        len(keep),
    )
    previous = messages[keep[at - 1]].get("role") if at > 0 else None
    memory: dict[str, Any] = {
        "role": "assistant" if previous == "user" else "user",
        "content": memory_text(len(span.indices), summary, ref),
    }
    memory_tokens = counter.count_message(memory)
    out = [messages[j] for j in keep]
    counts = [tokens[j] for j in keep]
    out.insert(at, memory)
    counts.insert(at, memory_tokens)
    if sum(counts) > limit_tokens:
        return None
    return Placed(tuple(out), tuple(counts), at, memory_tokens)
