"""What a cut forgot, and the one message that stands for it: the memory of a fitted request.

INTERFACE CONTRACT (``fit.py`` places the memory; the service summarizes its span):

* ``memory_tokens_for(budget, policy) -> int``: the room a cut leaves for the memory when the
  policy wants one (``auto`` with ``summarize``), else 0: ``MEMORY_BUDGET_SHARE`` of the input
  budget, at most ``MEMORY_MAX_TOKENS``. A summary is asked for with this many tokens at most.
* ``MemorySpan`` (frozen): ``stop`` (the input index the memory goes before), ``indices`` (the
  input messages it stands for, ascending) and ``tokens`` (the client's count of them).
* ``memory_span(messages, tokens, *, forgotten, pinned, newest_user) -> MemorySpan | None``.
* ``memory_text(count, summary) -> str`` and ``MEMORY_HEAD_RE`` (the framing, a pure function of
  the span's size and its summary); ``span_messages(messages, span)`` (what a summarizer reads:
  the messages without the engine's reserved keys, so the same history gives the same span
  whatever the dialect froze or priced this time).
* ``place_memory(messages, tokens, origins, *, span, summary, counter, limit_tokens) ->
  Placed | None``: ``messages`` with the memory inserted before the first message from input
  index ``span.stop`` on (and the drop's note, which it stands for, removed); None when it does
  not fit ``limit_tokens``.

What is forgotten: every input message a strategy pruned (a placeholder now stands in its place)
or dropped. The memory covers the region from the conversation's first turn up to the end of the
unit that holds the newest forgotten message (``stop``, called F below): all of its messages
but the ones never forgotten anywhere (pinned messages, the newest user message), whether or
not they are still shown. So the memory of one cut is a function of the conversation's own
messages and of where the cut is, and as a session grows F only moves forward: the summary of
a longer span folds the previous one (``app.compaction``), and every forgotten token is
summarized about once.

Where it goes: before the first kept message at or after F, the place where the forgetting
ends; a prune that moves on changes the prompt from there anyway, so the memory's new text costs
no extra prompt-cache miss. F is always a unit start and never inside a signed tool loop's kept
part (the strategies never forget there), so every wire API can hold it: a user message in chat,
a text block on the user side in Anthropic Messages (``messages_wire``), a message item in
Responses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .budget import Budget, Policy
from .conversation import strip_reserved
from .messages import Message, group_turns, group_units
from .tokens import MessageCounter

MEMORY_MAX_TOKENS = 2048
MEMORY_BUDGET_SHARE = 0.1
MEMORY_HEAD_RE = re.compile(r"\[ctxproxy: summary of [0-9,]+ earlier messages?\]\n")


def memory_tokens_for(budget: Budget, policy: Policy) -> int:
    """The room a cut keeps for the memory (0 unless ``auto`` with ``summarize``)."""
    if policy.mode != "auto" or not policy.summarize:
        return 0
    return max(0, min(MEMORY_MAX_TOKENS, int(MEMORY_BUDGET_SHARE * budget.input_budget_tokens)))


@dataclass(frozen=True, slots=True)
class MemorySpan:
    """The input messages a memory stands for (see the module docstring)."""

    stop: int
    indices: tuple[int, ...]
    tokens: int


@dataclass(frozen=True, slots=True)
class Placed:
    """``messages`` with the memory in place (at ``index``), their counts, and the memory's."""

    messages: tuple[Message, ...]
    tokens: tuple[int, ...]
    index: int
    memory_tokens: int


def memory_text(count: int, summary: str) -> str:
    """The memory as prompt text: the framing (which the engine recognises as its own, see
    ``strategies.is_ctxproxy_note``) and the summary."""
    noun = "message" if count == 1 else "messages"
    return f"[ctxproxy: summary of {count:,} earlier {noun}]\n{summary.strip()}"


def memory_span(
    messages: Sequence[Message],
    tokens: Sequence[int],
    *,
    forgotten: Iterable[int],
    pinned: frozenset[int],
    newest_user: int | None,
) -> MemorySpan | None:
    """The span of input ``messages`` (with the client's per-message ``tokens``) a memory stands
    for, given the input indices a cut ``forgotten``; None when nothing was."""
    last = max(forgotten, default=None)
    if last is None:
        return None
    stop = next((unit.stop for unit in group_units(messages) if unit.start <= last < unit.stop), last + 1)
    turns = group_turns(messages)
    start = turns[0].start if turns else stop
    indices = tuple(i for i in range(start, stop) if i not in pinned and i != newest_user)
    if not indices:
        return None
    return MemorySpan(stop=stop, indices=indices, tokens=sum(tokens[i] for i in indices))


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
) -> Placed | None:
    """``messages`` (the fitted ones; ``origins[j]`` is the input index of message ``j``, None
    for a message the engine made) with the memory of ``span`` before the first message from
    input index ``span.stop`` on; ``note_at`` (the drop's note) is removed. None when the result's
    tokens would exceed ``limit_tokens``."""
    keep = [j for j in range(len(messages)) if j != note_at]
    at = next(
        (k for k, j in enumerate(keep) if (origin := origins[j]) is not None and origin >= span.stop),
        len(keep),
    )
    previous = messages[keep[at - 1]].get("role") if at > 0 else None
    memory: dict[str, Any] = {
        "role": "assistant" if previous == "user" else "user",
        "content": memory_text(len(span.indices), summary),
    }
    memory_tokens = counter.count_message(memory)
    out = [messages[j] for j in keep]
    counts = [tokens[j] for j in keep]
    out.insert(at, memory)
    counts.insert(at, memory_tokens)
    if sum(counts) > limit_tokens:
        return None
    return Placed(tuple(out), tuple(counts), at, memory_tokens)
