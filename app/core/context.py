"""What a strategy may know, and the regions of a conversation it may work in.

INTERFACE CONTRACT (``strategies.py``, ``fit.py`` and ``app/summaries.py`` rely on these names):

* ``FitContext`` (frozen) and ``build_context(messages, *, budget, policy, counter, ...)``;
  ``SummaryProvider`` (re-exported by ``fit.py``).
* ``pinned_indices(...)``, ``protected_start(messages, *, keep_turns, tokens=None, max_tokens=None)``,
  ``protect_tokens_for(budget, policy)``, ``newest_user_index(messages)``,
  ``block_tokens_for(budget, policy)``, ``droppable_blocks(...)``, ``step_tokens_for(budget, policy)``,
  ``level_starts(blocks, tokens, *, step_tokens)``; ``TOOL_RESULT_ROLES``.

All pure: values in, values out; the messages are never mutated.

The protected region (never pruned, never dropped; only middle-out and the last resort may cut in
it) is a tail of whole units: the newest ``policy.keep_turns`` turns (at least the newest one), but
no more than ``protect_max_share`` of the input budget (``protect_tokens_for``): walking units back
from the end, a unit joins the tail while the tail stays within that share; the newest unit always
joins. The share is counted with the client's own per-message counts. Outside the tail, the
pinned messages and the newest user message are never pruned or dropped either. So a coding agent's
single turn (one user message, then hundreds of tool calls and results) keeps its task, its newest
tool exchanges and the pinned messages, while its older tool results can be pruned and its older
tool exchanges dropped, each as a whole (a call with all its results), in stable blocks. When the
newest user message sits outside the tail the cut may take its turn's older units around it; once a
newer user message makes it history it still stays with its turn (the drop takes a user message
only with the part that holds its turn's last message: ``strategies._drop_levels``), so that cut
stays put.

Stable cuts: the old part of a conversation is cut into *blocks* whose boundaries depend only on the
conversation's own start. Walking from message 0 with the input's per-message counts, a new block
starts at the first candidate position after the running total crosses a multiple of the block size
``B`` (``policy.drop_block_tokens``, default ``max(256, input_budget // 8)``). Candidate positions
are turn starts, and unit starts inside a turn that is itself larger than ``B`` (so one huge old
turn can still be dropped in parts, never inside a unit). Resending the history plus one turn
leaves every existing boundary where it was, so dropping (and the prune boundary, which is rounded
down to a block boundary) moves only in whole blocks and upstream prompt caches keep hitting. The
drop frees at least about ``B // 2`` tokens at a time (see ``drop_oldest``), so cheap (pruned) old
blocks do not move the cut on every resend of a growing agent session.

Cuts with headroom: the prune boundary and the cut do not move block by block but in *levels*,
steps of ``S = step_tokens_for(budget, policy)`` (``1 - cut_target`` of the input budget, at least
``B // 2``), counted from the region's start: the prune boundary is the newest block start where
the client's tokens from the start cross a multiple of ``S`` (``level_starts``), the cut the
first block end where the tokens it frees cross one (``drop_oldest``). A request over its budget
is cut at the smallest level that fits, so right after a cut it uses about ``cut_target`` of the
budget and the cut stays put for the next turns; both are functions of the conversation's own
messages, so the same history gives the same forwarded bytes on any replica. One more exception to
stability: inside the last block (the one the protected tail ends) every turn start is a stop, so a
cut that reaches into it stays put while the next turns fit; once the history grows past a block
boundary that block is complete, keeps only its level stops, and a cut that ended inside it (or
dropped all that was droppable) is chosen again: one upstream cache miss then, in conversations
whose droppable history is about one block (a large protected tail).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from .budget import Budget, Policy
from .cutting import PendingCuts
from .messages import INSTRUCTION_ROLES, Message, group_turns, group_units
from .tokens import REPLY_PRIMING_TOKENS, MessageCounter

TOOL_RESULT_ROLES: frozenset[str] = frozenset({"tool", "function"})
MIN_BLOCK_TOKENS = 256


class SummaryProvider(Protocol):
    """Returns a summary text for exactly ``span`` (the messages a memory stands for, as
    ``memory.span_messages`` gives them), or None."""

    def summary_for(self, span: Sequence[Message], /) -> str | None: ...


@dataclass(frozen=True, slots=True)
class FitContext:
    """What a strategy may know besides the messages; indices refer to the messages it is given.

    ``tokens`` are the per-message counts of those messages (strategies never recount unchanged
    messages). ``input_messages``/``input_tokens`` are the client's original messages and counts at
    the same indices (the pipeline keeps indices aligned until turns are dropped); block boundaries
    and notes use them so cuts stay stable.
    ``protected_from`` is where the protected tail starts; ``newest_user`` is the newest user
    message's index (``build_context`` sets it; prune and drop never touch it, see ``untouchable``).
    ``memory_tokens``: room the strategies leave for the memory of what they forget
    (``memory.py``; the pipeline sets it when summaries are wanted): it comes out of the protected
    tail's share, so the region a cut works in keeps its size (and the cut its levels).
    ``headroom_tokens``: more room, for planning the next cut (``fit.next_cut_headroom``).
    ``pending``: middle-out's cuts decided but not made (``cutting.PendingCuts``): ``tokens`` are
    then the counts before them, and the drop keeps what fits once they are made.
    """

    budget: Budget
    policy: Policy
    counter: MessageCounter
    pinned: frozenset[int]
    protected_from: int
    tokens: tuple[int, ...]
    input_messages: tuple[Message, ...] | None = None
    input_tokens: tuple[int, ...] | None = None
    newest_user: int | None = None
    memory_tokens: int = 0
    headroom_tokens: int = 0
    pending: PendingCuts | None = None

    def untouchable(self, index: int) -> bool:
        """Pinned, or the newest user message: prune and drop never touch it, wherever it is."""
        return index in self.pinned or index == self.newest_user

    @property
    def target_tokens(self) -> int:
        """The most message tokens a strategy aims for: the input budget less the reply priming
        and the room kept for the memory (``memory_tokens``, 0 without summaries) and the next cut
        (``headroom_tokens``)."""
        return (
            self.budget.input_budget_tokens - REPLY_PRIMING_TOKENS - self.memory_tokens - self.headroom_tokens
        )

    def fits(self, total_message_tokens: int) -> bool:
        return total_message_tokens <= self.target_tokens


def pinned_indices(messages: Sequence[Message], *, pin_first_user: bool) -> frozenset[int]:
    """``messages.is_pinned_by_default`` for every index in one O(n) pass."""
    pinned: set[int] = set()
    seen_user = False
    for i, message in enumerate(messages):
        role = message.get("role")
        if role in INSTRUCTION_ROLES:
            pinned.add(i)
        elif role == "user":
            if pin_first_user and not seen_user:
                pinned.add(i)
            seen_user = True
    return frozenset(pinned)


def protected_start(
    messages: Sequence[Message],
    *,
    keep_turns: int,
    tokens: Sequence[int] | None = None,
    max_tokens: int | None = None,
) -> int:
    """Where the protected tail starts (always a unit start).

    Without ``tokens``/``max_tokens``: the start of the newest ``keep_turns`` turns (at least the
    newest turn). With them: no earlier than that, and the tail holds at most ``max_tokens`` of
    ``tokens`` (per-message counts), taken in whole units from the end; the newest unit is always
    in the tail, whatever its size. Without a user message nothing is protected by this rule.
    """
    turns = group_turns(messages)
    if not turns:
        return len(messages)
    start = turns[max(0, len(turns) - max(1, keep_turns))].start
    if tokens is None or max_tokens is None:
        return start
    bound = len(messages)
    tail = 0
    for unit_start, unit_stop in _units_from_the_end(messages, start):
        size = sum(tokens[unit_start:unit_stop])
        if bound < len(messages) and tail + size > max_tokens:
            break
        tail += size
        bound = unit_start
    return max(start, bound)


def _units_from_the_end(messages: Sequence[Message], start: int) -> Iterator[tuple[int, int]]:
    """The units of ``messages[start:]`` newest first, grouping only as far back as asked.

    ``start`` must be a unit start. Any message that is not a tool result starts a unit, so the
    units of ``messages[head:stop]`` from such a ``head`` are exactly those of the whole list.
    """
    stop = len(messages)
    while stop > start:
        head = stop - 1
        while head > start and messages[head].get("role") in TOOL_RESULT_ROLES:
            head -= 1
        for unit in reversed(group_units(messages[head:stop])):
            yield head + unit.start, head + unit.stop
        stop = head


def protect_tokens_for(budget: Budget, policy: Policy) -> int:
    """The most tokens the protected tail may hold: ``protect_max_share`` of the input budget."""
    return max(0, int(policy.protect_max_share * budget.input_budget_tokens))


def newest_user_index(messages: Sequence[Message]) -> int | None:
    """The index of the newest user message, or None."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return None


def build_context(
    messages: Sequence[Message],
    *,
    budget: Budget,
    policy: Policy,
    counter: MessageCounter,
    tokens: Sequence[int] | None = None,
    input_messages: Sequence[Message] | None = None,
    input_tokens: Sequence[int] | None = None,
    memory_tokens: int = 0,
    headroom_tokens: int = 0,
    pending: PendingCuts | None = None,
) -> FitContext:
    """A context for ``messages`` (counting them when ``tokens`` is not given).

    The protected tail is bounded with ``input_tokens`` when given (the client's counts at the same
    indices), else with the counts of ``messages``.
    """
    counts = tuple(tokens) if tokens is not None else counter.count_messages(messages)
    base = tuple(input_tokens) if input_tokens is not None else None
    return FitContext(
        budget=budget,
        policy=policy,
        counter=counter,
        pinned=pinned_indices(messages, pin_first_user=policy.pin_first_user),
        protected_from=protected_start(
            messages,
            keep_turns=policy.keep_turns,
            tokens=base if base is not None else counts,
            max_tokens=max(0, protect_tokens_for(budget, policy) - max(0, memory_tokens)),
        ),
        tokens=counts,
        input_messages=tuple(input_messages) if input_messages is not None else None,
        input_tokens=base,
        newest_user=newest_user_index(messages),
        memory_tokens=max(0, memory_tokens),
        headroom_tokens=max(0, headroom_tokens),
        pending=pending,
    )


def block_tokens_for(budget: Budget, policy: Policy) -> int:
    """The block size ``B``: the policy's, else ``max(256, input_budget // 8)``."""
    if policy.drop_block_tokens is not None and policy.drop_block_tokens > 0:
        return policy.drop_block_tokens
    return max(MIN_BLOCK_TOKENS, budget.input_budget_tokens // 8)


def step_tokens_for(budget: Budget, policy: Policy) -> int:
    """The level step ``S``: ``1 - cut_target`` of the input budget, at least ``B // 2``."""
    share = min(1.0, max(0.0, 1.0 - policy.cut_target))
    return max(1, block_tokens_for(budget, policy) // 2, int(share * budget.input_budget_tokens))


def level_starts(blocks: Sequence[tuple[int, int]], tokens: Sequence[int], *, step_tokens: int) -> list[int]:
    """The block starts where the running total of ``tokens`` from the first block's start crosses
    a multiple of ``step_tokens`` (the first block's start is always one), oldest first."""
    if not blocks:
        return []
    step = max(1, step_tokens)
    starts = [blocks[0][0]]
    running = level = 0
    for start, stop in blocks:
        if start > starts[0] and running // step > level:
            starts.append(start)
            level = running // step
        running += sum(tokens[start:stop])
    return starts


def droppable_blocks(
    messages: Sequence[Message], tokens: Sequence[int], *, region_stop: int, block_tokens: int
) -> list[tuple[int, int]]:
    """Blocks ``[start, stop)`` covering ``[first user message, region_stop)``, oldest first.

    ``tokens`` must be the client's own per-message counts (the boundaries must depend only on the
    conversation's start). The preamble before the first user message is never in a block.
    """
    turns = group_turns(messages)
    if not turns or turns[0].start >= region_stop:
        return []
    region_start = turns[0].start
    turn_starts = {t.start for t in turns}
    big_turn = [False] * len(messages)
    for turn in turns:
        if sum(tokens[turn.start : turn.stop]) > block_tokens:
            big_turn[turn.start : turn.stop] = [True] * (turn.stop - turn.start)
    prefix = [0]
    for count in tokens[:region_stop]:
        prefix.append(prefix[-1] + count)
    starts = [region_start]
    last_block = prefix[region_start] // block_tokens
    for unit in group_units(messages):
        if unit.start >= region_stop:
            break
        if unit.start > region_start and (unit.start in turn_starts or big_turn[unit.start]):
            block = prefix[unit.start] // block_tokens
            if block > last_block:
                starts.append(unit.start)
                last_block = block
    stops = [*starts[1:], region_stop]
    return list(zip(starts, stops, strict=True))
