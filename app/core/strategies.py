"""The fit strategies, least destructive first.

INTERFACE CONTRACT (the pipeline in ``fit.py`` and the tests rely on these names):

* ``Strategy = Callable[[Sequence[Message], FitContext], StrategyResult]``. Every strategy never
  mutates its input (changed messages are new dicts), never increases the token count, is
  idempotent (applying it to its own output with a context built for that output changes
  nothing), never splits a unit, and returns its input unchanged when the messages already fit.
* ``prune_old_results``, ``middle_out``, ``drop_oldest``, ``last_resort``; ``STRATEGIES`` in order.
* Nothing is done to what a later step drops: when cutting cannot make a request fit, middle-out
  leaves its cuts pending (``StrategyResult.pending``) and the drop, right after it, decides what
  is kept on the counts before them (its levels) and on the kept messages' counts once cut (what
  fits); the pipeline then cuts only what the drop kept (``fit``).
* ``is_ctxproxy_note(message)`` (a note, or a memory: ``memory.py``); ``note_text(count, ref)``,
  ``pruned_text(chars, tool_name, ref)``, ``content_chars(content)``: the texts the steps write,
  each a pure function of what it replaces (``ref``: its recall id under ``policy.recall``,
  ``app.core.recall``). A recall's answer (``recall.is_recalled``) is never pruned or cut.

What a strategy may know and the regions it works in (``FitContext``, the pinned messages, the
protected tail, the stable blocks) are in ``context.py``; cutting one message middle-out is in
``cutting.py``.

Scaling of the prune thresholds for small windows (documented rule): the tool tokens protected
from pruning are ``min(policy.prune_protect_tool_tokens, input_budget // 3)``, and no more than
``cut_target * input_budget`` less the protected tail's tokens (room for headroom); the minimum a
prune must free is ``min(policy.prune_minimum_tokens, input_budget // 6)``; at a 128K window they
are the policy's 40K/20K, at an 8K window about 2.2K/1.1K.

Notes left by the pipeline (``[ctxproxy: ...]``) are recognised and never dropped or pruned again.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .context import (
    TOOL_RESULT_ROLES,
    FitContext,
    block_tokens_for,
    droppable_blocks,
    level_starts,
    newest_user_index,
    step_tokens_for,
)
from .conversation import is_opaque
from .cutting import CUT_FLOOR_TOKENS, PendingCuts, truncate_message
from .memory import MEMORY_HEAD_RE
from .messages import INSTRUCTION_ROLES, Message, group_turns, group_units
from .plan import Action, ActionKind, DroppedSpan, StrategyResult
from .recall import REF_PATTERN, content_text, is_recalled, prefix_refs, recall_ref, ref_suffix

IMAGE_PART_TYPES: frozenset[str] = frozenset({"image_url", "input_image", "image"})
# Last resort never cuts a message below this many tokens in total.
LAST_RESORT_FLOOR_TOKENS = 64

# Placeholders, notes and markers are pure functions of what they replace (their sizes are in
# characters of the replaced text, never in tokens: a token count of a model counted by estimate
# changes with calibration, and one changed byte in the prefix is a prompt-cache miss). The
# patterns also recognise the older wordings with token counts, which clients may resend.
_PRUNED_RE = re.compile(
    r"\[ctxproxy: tool result removed to fit the context window "
    r"\((?:[A-Za-z0-9_.:-]{1,64}(?:, )?)?(?:[0-9,]+ (?:tokens|characters))?" + REF_PATTERN + r"\)\]"
)
# Only names of the shape OpenAI allows for functions go into a placeholder (never free text).
_TOOL_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_NOTE_RE = re.compile(
    r"\[ctxproxy: [0-9,]+ earlier messages? (?:\([0-9,]+ tokens\) )?(?:was|were) removed here to fit "
    r"the context window" + REF_PATTERN + r"\]"
)
IMAGE_PLACEHOLDER = "[ctxproxy: image removed to fit the context window]"


Strategy = Callable[[Sequence[Message], FitContext], StrategyResult]


def is_ctxproxy_note(message: Message) -> bool:
    """True for a note or a memory the pipeline left in place of what it cut (any wording it
    ever wrote: clients resend them)."""
    content = message.get("content")
    if not isinstance(content, str) or message.get("role") not in ("user", "assistant"):
        return False
    return bool(_NOTE_RE.fullmatch(content) or MEMORY_HEAD_RE.match(content))


def _unchanged(messages: Sequence[Message]) -> StrategyResult:
    return StrategyResult(tuple(messages))


def _replace(messages: Sequence[Message], changes: dict[int, Message]) -> tuple[Message, ...]:
    return tuple(changes.get(i, m) for i, m in enumerate(messages))


def _has_image(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(
        isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES for part in content
    )


def content_chars(content: object) -> int:
    """Characters of a message's text: string content, or its parts' ``text`` strings."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return 0


def pruned_text(chars: int, tool_name: str | None, ref: str | None = None) -> str:
    """The placeholder of a pruned tool result: a pure function of the result (its tool's name,
    the characters of its text and, with recall, its recall id)."""
    what = f"{tool_name}, " if tool_name else ""
    return (
        f"[ctxproxy: tool result removed to fit the context window ({what}{chars:,} characters"
        f"{ref_suffix(ref)})]"
    )


def _tool_names(messages: Sequence[Message]) -> dict[str, str]:
    """``tool_call_id -> function name`` over every assistant call, so a placeholder can say which
    tool's output it replaced (the model can call it again if it needs the output back)."""
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not isinstance(calls, list):
            continue
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and _TOOL_NAME_RE.fullmatch(name) and call.get("id") is not None:
                names[str(call["id"])] = name
    return names


def _result_tool_name(message: Message, names: Mapping[str, str]) -> str | None:
    if message.get("role") == "function":  # legacy results carry their function's name
        name = message.get("name")
        return name if isinstance(name, str) and _TOOL_NAME_RE.fullmatch(name) else None
    return names.get(str(message.get("tool_call_id")))


def prune_old_results(messages: Sequence[Message], ctx: FitContext) -> StrategyResult:
    """Step 2: placeholders for old tool results and old images, when that frees enough.

    Old means before the prune boundary: walking back from the protected tail, the newest
    ``protect`` tokens of tool results and image-bearing messages stay; the boundary is then rounded
    down to a level start (``context.level_starts``: a block start, moving in steps of
    ``1 - cut_target`` of the budget). The boundary is the oldest such level whose prune fits the
    budget, else that newest one: so a pruned result stays pruned with the same placeholder and
    the boundary moves only when the budget is reached again, in the same large steps as the cut.
    Pinned messages and the newest user message are never touched. Acts only if it frees more
    than the (scaled) minimum. The protected tool tokens are a preference: when pruning what lies
    before them does not fit, the levels after them (up to the tail) come before any drop.
    """
    if ctx.fits(sum(ctx.tokens)):
        return _unchanged(messages)
    return _prune(messages, ctx, newest=False)


def _prune(messages: Sequence[Message], ctx: FitContext, *, newest: bool) -> StrategyResult:
    """``prune_old_results`` without its early return; ``newest`` prunes up to the newest level
    (what prune will have done by the time a cut is needed), whether or not less would fit."""
    tokens = ctx.tokens
    total = sum(tokens)
    input_budget = ctx.budget.input_budget_tokens
    minimum = min(ctx.policy.prune_minimum_tokens, input_budget // 6)
    base_tokens = ctx.input_tokens if ctx.input_tokens is not None else tokens
    # The protected tail and these newest tool tokens stay whole: together they must leave room
    # for the headroom (an agent's tail alone may hold half the budget), or prune could never bring
    # a request under the cut target and the cut would move on every other turn.
    headroom_room = int(ctx.policy.cut_target * input_budget) - sum(base_tokens[ctx.protected_from :])
    protect = min(ctx.policy.prune_protect_tool_tokens, input_budget // 3, max(0, headroom_room))
    base_messages = ctx.input_messages if ctx.input_messages is not None else messages
    raw = ctx.protected_from
    seen = 0
    for i in range(ctx.protected_from - 1, -1, -1):
        if messages[i].get("role") in TOOL_RESULT_ROLES or _has_image(messages[i]):
            seen += base_tokens[i]
            if seen > protect:
                break
        raw = i
    blocks = droppable_blocks(
        base_messages,
        base_tokens,
        region_stop=ctx.protected_from,
        block_tokens=block_tokens_for(ctx.budget, ctx.policy),
    )
    levels = level_starts(blocks, base_tokens, step_tokens=step_tokens_for(ctx.budget, ctx.policy))
    boundary = max((start for start in levels if start <= raw), default=0)
    region_start = blocks[0][0] if blocks else boundary
    boundary = max(levels, default=boundary)  # beyond the protected tool tokens before any drop
    changes: dict[int, Message] = {}
    new_tokens: dict[int, int] = {}
    image_counts: dict[int, int] = {}
    names = _tool_names(messages) if region_start < boundary else {}
    recall = ctx.policy.recall != "off"
    for i in range(region_start, boundary):
        message = messages[i]
        if ctx.untouchable(i) or is_opaque(message) or is_recalled(message):
            continue
        candidate: dict[str, Any] | None = None
        images = 0
        if message.get("role") in TOOL_RESULT_ROLES:
            content = message.get("content")
            if not (isinstance(content, str) and _PRUNED_RE.fullmatch(content)):
                ref = recall_ref(content_text(content)) if recall else None
                candidate = {
                    **message,
                    "content": pruned_text(content_chars(content), _result_tool_name(message, names), ref),
                }
        else:
            content = message.get("content")
            if isinstance(content, list):
                parts = list(content)
                for k, part in enumerate(parts):
                    if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                        parts[k] = {"type": "text", "text": IMAGE_PLACEHOLDER}
                        images += 1
                if images:
                    candidate = {**message, "content": parts}
        if candidate is None:
            continue
        count = ctx.counter.count_message(candidate)
        if count < tokens[i]:
            changes[i] = candidate
            new_tokens[i] = count
            image_counts[i] = images
    # The smallest level that fits (and frees more than the minimum), else the newest: a boundary
    # that moves only when the budget is reached again, by a level. Levels past the protected tool
    # tokens come before any drop (a dropped result is lost; a pruned one can be fetched again).
    chosen = boundary
    pruned = iter(changes)  # ascending, as made
    at = next(pruned, None)
    freed_here = 0
    for start in (s for s in levels if region_start < s <= boundary and not newest):
        while at is not None and at < start:
            freed_here += tokens[at] - new_tokens[at]
            at = next(pruned, None)
        if freed_here > minimum and ctx.fits(total - freed_here):
            chosen = start
            break
    changes = {i: m for i, m in changes.items() if i < chosen}
    freed = sum(tokens[i] - new_tokens[i] for i in changes)
    if not changes or freed <= minimum:
        return _unchanged(messages)
    actions: list[Action] = []
    tool_freed = sum(
        tokens[i] - new_tokens[i] for i in changes if messages[i].get("role") in TOOL_RESULT_ROLES
    )
    tool_count = sum(1 for i in changes if not image_counts[i])
    image_count = sum(image_counts[i] for i in changes)
    if tool_count:
        actions.append(Action("pruned", tool_count, tool_freed))
    if image_count:
        actions.append(Action("images", image_count, freed - tool_freed))
    return StrategyResult(_replace(messages, changes), tuple(actions))


def middle_out(messages: Sequence[Message], ctx: FitContext) -> StrategyResult:
    """Step 3: every message over ``middle_out_share`` of the budget, largest first, is cut to that
    share (a fixed target, so the cut is the same on every resend) until it fits.

    Pinned messages and the newest user message are left to the last resort; a huge tool result
    or reply in the newest turns is cut here (cheaper than dropping history for it).

    When cutting cannot make the request fit, nothing is cut here: every candidate's cut is left
    pending (``StrategyResult.pending``, the messages unchanged), the drop decides what is kept on
    the counts before the cuts, and only the kept messages are cut (``fit``: nothing is done to
    what is dropped). That is known before cutting everything: once the other messages, the cuts
    made and every candidate left at ``CUT_FLOOR_TOKENS`` are over the target, no cut can help.
    """
    tokens = ctx.tokens
    total = sum(tokens)
    if ctx.fits(total):
        return _unchanged(messages)
    limit = int(ctx.policy.middle_out_share * ctx.budget.input_budget_tokens)
    newest_user = newest_user_index(messages)
    order = sorted(
        (i for i in range(len(messages)) if i not in ctx.pinned and i != newest_user and tokens[i] > limit),
        key=lambda i: (-tokens[i], i),
    )
    if not order:
        return _unchanged(messages)
    cuts = PendingCuts(
        messages, tokens, order, target_tokens=limit, counter=ctx.counter, recall=ctx.policy.recall != "off"
    )
    floor = total - sum(tokens[i] - min(tokens[i], CUT_FLOOR_TOKENS) for i in order)
    changes: dict[int, Message] = {}
    freed = 0
    for i in order:
        if ctx.fits(total):
            break
        if not ctx.fits(floor):
            return StrategyResult(tuple(messages), pending=cuts)
        cut = cuts.cut(i)
        after = tokens[i] if cut is None else cut[1]
        floor += after - min(tokens[i], CUT_FLOOR_TOKENS)
        if cut is None:
            continue
        changes[i] = cut[0]
        freed += tokens[i] - after
        total -= tokens[i] - after
    if not ctx.fits(total):
        return StrategyResult(tuple(messages), pending=cuts)
    if not changes:
        return _unchanged(messages)
    return StrategyResult(_replace(messages, changes), (Action("truncated", len(changes), freed),))


def _cut_until_fits(
    messages: Sequence[Message],
    ctx: FitContext,
    order: Iterable[int],
    *,
    target_for: Callable[[int, int], int],
    kind: ActionKind,
) -> StrategyResult:
    """Cut messages middle-out in ``order``, message ``i`` to ``target_for(i, tokens_over)``
    tokens, until the request fits; one ``kind`` action for all the cuts."""
    tokens = ctx.tokens
    total = sum(tokens)
    changes: dict[int, Message] = {}
    freed = 0
    for i in order:
        over = total - ctx.target_tokens
        if over <= 0:
            break
        cut = truncate_message(
            messages[i],
            current_tokens=tokens[i],
            target_tokens=target_for(i, over),
            counter=ctx.counter,
            recall=ctx.policy.recall != "off",
        )
        if cut is None:
            continue
        changes[i] = cut[0]
        freed += tokens[i] - cut[1]
        total -= tokens[i] - cut[1]
    if not changes:
        return _unchanged(messages)
    return StrategyResult(_replace(messages, changes), (Action(kind, len(changes), freed),))


def note_text(count: int, ref: str | None = None) -> str:
    """The note that stands for ``count`` dropped messages (a pure function of the span: no token
    count, which for a model counted by estimate would change with calibration; with recall, the
    recall id of their transcript)."""
    noun = "message" if count == 1 else "messages"
    verb = "was" if count == 1 else "were"
    return (
        f"[ctxproxy: {count:,} earlier {noun} {verb} removed here to fit the context window{ref_suffix(ref)}]"
    )


def _spans(
    dropped: Sequence[int], block_ends: Sequence[int], base_tokens: Sequence[int]
) -> tuple[DroppedSpan, ...]:
    runs: list[tuple[int, int]] = []
    for i in dropped:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    spans = []
    for start, stop in runs:
        stops = sorted({end for end in block_ends if start < end <= stop} | {stop})
        spans.append(DroppedSpan(start, stop, sum(base_tokens[start:stop]), tuple(stops)))
    return tuple(spans)


def _drop_levels(messages: Sequence[Message], ctx: FitContext) -> tuple[list[list[int]], list[int], int]:
    """The droppable members of each block, oldest first, and the *stops*: the block counts ``k``
    a cut may end after, ascending. ``k`` is a stop where the tokens the first ``k`` blocks hold
    (current counts, summed from the oldest block; before middle-out's pending cuts, which are made
    only on what the drop keeps) cross a multiple of the level step ``S``
    (``context.step_tokens_for``), and inside the last (still growing) block every turn start is
    one. The stops depend only on the conversation's start (and on what prune left there, which
    moves in the same steps). With a memory (``ctx.memory_tokens``), the protected tail's units but
    its newest follow, each a stop. A user message is a member of the part that holds its turn's
    last message (of none when that is past the last part): it goes only with the rest of its turn,
    as while it was the newest. Third: how many of the member blocks come before the growing
    one."""
    base_tokens = ctx.input_tokens if ctx.input_tokens is not None else ctx.tokens
    base_messages = ctx.input_messages if ctx.input_messages is not None else tuple(messages)
    blocks = droppable_blocks(
        base_messages,
        base_tokens,
        region_stop=ctx.protected_from,
        block_tokens=block_tokens_for(ctx.budget, ctx.policy),
    )
    block_tokens = block_tokens_for(ctx.budget, ctx.policy)
    parts: list[tuple[int, int, bool]] = [(start, stop, False) for start, stop in blocks[:-1]]
    if blocks:
        # The last block ends where the protected tail starts, which moves every turn: inside it
        # every turn start (and unit start in a turn larger than a block) is a stop, so a cut that
        # reaches into it stays where it was while the next turns still fit.
        start, stop = blocks[-1]
        parts += [
            (a, b, True) for a, b in _split_last_block(base_messages, base_tokens, start, stop, block_tokens)
        ]
    if ctx.memory_tokens > 0:
        # With a memory, the protected tail's older units may go too (each a stop, after every
        # block): a summary stands for them, where the last resort would cut the newest messages'
        # middles with none. The newest unit always stays.
        tail = group_units(base_messages[ctx.protected_from :])
        parts += [(ctx.protected_from + u.start, ctx.protected_from + u.stop, True) for u in tail[:-1]]
    # A user message goes with the part that holds its turn's last message (none: it stays): it is
    # kept while any of its turn is, as it was while it was the newest one (``untouchable``), so a
    # cut into its turn made then stays put once a newer user message makes it history.
    owned = _turn_owners(base_messages, parts)
    block_members: list[list[int]] = []
    in_last: list[bool] = []
    for p, (start, stop, last) in enumerate(parts):
        candidates = [i for i in range(start, stop) if base_messages[i].get("role") != "user"]
        members = sorted(
            i
            for i in (*candidates, *owned.get(p, ()))
            if not ctx.untouchable(i) and not is_ctxproxy_note(messages[i])
        )
        if members:
            block_members.append(members)
            in_last.append(last)
    step = step_tokens_for(ctx.budget, ctx.policy)
    stops: list[int] = []
    freed = level = 0
    for k, members in enumerate(block_members, start=1):
        freed += sum(ctx.tokens[i] for i in members)
        if freed // step > level or in_last[k - 1]:
            stops.append(k)
            level = max(level, freed // step)
    return block_members, stops, in_last.count(False)


def _turn_owners(messages: Sequence[Message], parts: Sequence[tuple[int, int, bool]]) -> dict[int, list[int]]:
    """The user messages inside ``parts`` (contiguous, ascending) by the part that holds their
    turn's last message; a turn that ends past the last part leaves its user message in none."""
    starts = [start for start, _stop, _last in parts]
    owned: dict[int, list[int]] = {}
    if not parts:
        return owned
    for turn in group_turns(messages):
        if starts[0] <= turn.start < parts[-1][1] and turn.stop <= parts[-1][1]:
            owned.setdefault(bisect_right(starts, turn.stop - 1) - 1, []).append(turn.start)
    return owned


def _split_last_block(
    messages: Sequence[Message], tokens: Sequence[int], start: int, stop: int, block_tokens: int
) -> list[tuple[int, int]]:
    """``[start, stop)`` cut at its turn starts, and at unit starts inside a turn over a block."""
    cuts = [start]
    turn_start, turn_big = start, False
    for unit in group_units(messages[start:stop]):
        at = start + unit.start
        if messages[at].get("role") == "user":
            turn_start = at
            turn_stop = next((j for j in range(at + 1, stop) if messages[j].get("role") == "user"), stop)
            turn_big = sum(tokens[at:turn_stop]) > block_tokens
            if at > start:
                cuts.append(at)
        elif turn_big and at > turn_start:
            cuts.append(at)
    return list(zip(cuts, [*cuts[1:], stop], strict=True))


def drop_oldest(messages: Sequence[Message], ctx: FitContext) -> StrategyResult:
    """Step 4: drop whole blocks from the oldest, up to the smallest *level* that fits; one note
    in their place (the pipeline's memory may stand in for it: ``memory.py``).

    The cut may end only at a stop of ``_drop_levels``: where the tokens it frees cross a multiple
    of ``S = (1 - cut_target) * budget`` (at least ``B // 2``), or after the last droppable block.
    So a request over its budget comes down to about ``cut_target`` of it, the next turns fit with
    the very same cut (and forwarded prefix), and the cut moves again only when the budget is
    reached again, by another level. Where old blocks are cheap (an agent's pruned tool
    exchanges) a level holds many of them.

    Never drops a pinned message, the newest user message, a note, the protected tail (with a
    memory: the tail's newest unit; its older units come last, after every block, rather than the
    last resort's cuts), part of a unit, or a user message while the rest of its turn is kept. The
    note's role keeps alternation where possible: ``assistant`` when the message before it is a user
    message, else ``user``.

    With middle-out's cuts pending (``ctx.pending``), what is left counts as it will be sent, the
    kept messages cut (``_smallest_fitting_stop``), while the levels and the tokens freed are
    counted before the cuts: a message the drop removes is never cut.

    Actions: ``dropped_turns`` (user messages dropped; absent when none was) and
    ``dropped_messages`` (with the tokens freed). ``StrategyResult.dropped`` holds one span per
    contiguous run (a pinned message or the newest user message inside the region splits it; the
    single note sits where the first dropped message was); its ``block_stops`` are the level ends.
    """
    tokens = ctx.tokens
    total = sum(tokens)
    if ctx.fits(total):
        return _unchanged(messages)
    base_tokens = ctx.input_tokens if ctx.input_tokens is not None else tokens
    block_members, stops, _complete = _drop_levels(messages, ctx)
    if not block_members:
        return _unchanged(messages)
    first = block_members[0][0]
    previous = messages[first - 1].get("role") if first > 0 else None
    role = "assistant" if previous == "user" else "user"
    # How many members, and the tokens they hold, the first k blocks have: the note of a cut of k
    # blocks and what it frees (before any pending cut).
    held = [0]
    freed_by = [0]
    for block in block_members:
        held.append(held[-1] + len(block))
        freed_by.append(freed_by[-1] + sum(tokens[i] for i in block))
    notes: dict[int, int] = {}

    base_messages = ctx.input_messages if ctx.input_messages is not None else messages

    refs: list[str] = []

    def note_for(blocks: int) -> str:
        # With recall, the note names the transcript of the input messages it stands for.
        if ctx.policy.recall == "off":
            return note_text(held[blocks])
        if not refs:  # every level's id, in one pass
            refs.extend(prefix_refs([[(i, base_messages[i]) for i in block] for block in block_members]))
        return note_text(held[blocks], refs[blocks])

    def note_tokens(blocks: int) -> int:
        # Without recall a note depends only on how many messages it stands for.
        key = held[blocks] if ctx.policy.recall == "off" else blocks
        if key not in notes:
            notes[key] = ctx.counter.count_message({"role": role, "content": note_for(blocks)})
        return notes[key]

    k = _smallest_fitting_stop(messages, ctx, block_members, stops, note_tokens)
    if k is None:
        k = len(block_members)
        if freed_by[k] <= note_tokens(k):
            return _unchanged(messages)
    freed, note_tokens_k = freed_by[k], note_tokens(k)
    dropped = sorted(i for block in block_members[:k] for i in block)
    block_ends = [block_members[s - 1][-1] + 1 for s in stops if s <= k]
    replacement: dict[str, Any] = {"role": role, "content": note_for(k)}
    drop_set = set(dropped)
    out: list[Message] = []
    for i, message in enumerate(messages):
        if i == dropped[0]:
            out.append(replacement)
        if i not in drop_set:
            out.append(message)
    turns = sum(1 for i in dropped if messages[i].get("role") == "user")
    # One drop, two counts: the tokens are freed once (on dropped_messages), and no turn was
    # dropped when only replies of a kept user message went (the pinned task's agent turn).
    actions = [
        *([Action("dropped_turns", turns)] if turns else []),
        Action("dropped_messages", len(dropped), freed - note_tokens_k),
    ]
    return StrategyResult(tuple(out), tuple(actions), _spans(dropped, block_ends, base_tokens))


def _smallest_fitting_stop(
    messages: Sequence[Message],
    ctx: FitContext,
    block_members: Sequence[Sequence[int]],
    stops: Sequence[int],
    note_tokens: Callable[[int], int],
) -> int | None:
    """The smallest stop ``k`` whose cut fits: what the first ``k`` blocks leave, with the note,
    within the target; None when none does.

    What is left is counted as it will be sent: a message with a pending middle-out cut
    (``ctx.pending``) at its count once cut. Those cuts are made only where a sound lower bound
    cannot settle the question (a pending cut counts at least ``CUT_FLOOR_TOKENS``, or its count
    when made): every stop is settled, from the newest, by its bound when the bound is over, else
    by its exact count, so the answer is the ascending search's. The cuts made are those of what
    is kept and, where a bound could not settle a stop, those of the blocks between the chosen
    stop and the next one down (usually one message, in a giant request).
    """
    tokens = ctx.tokens
    pending = ctx.pending
    target = ctx.target_tokens

    def low(i: int) -> int:
        known = pending.known(i) if pending is not None else tokens[i]
        return min(tokens[i], CUT_FLOOR_TOKENS) if known is None else known

    def exact(i: int) -> int:
        return pending.tokens_of(i) if pending is not None else tokens[i]

    members = {i for block in block_members for i in block}
    bound = sum(exact(i) for i in range(len(messages)) if i not in members)  # always kept
    block_low = [sum(low(i) for i in block) for block in block_members]
    counted = exact_from = len(block_members)  # blocks [counted:) in ``bound``, [exact_from:) exactly
    chosen: int | None = None
    for k in reversed(stops):
        while counted > k:
            counted -= 1
            bound += block_low[counted]
        if bound > target or bound + note_tokens(k) > target:
            continue
        while exact_from > k:
            exact_from -= 1
            bound += sum(exact(i) for i in block_members[exact_from]) - block_low[exact_from]
        if bound + note_tokens(k) <= target:
            chosen = k
    return chosen


def last_resort(messages: Sequence[Message], ctx: FitContext) -> StrategyResult:
    """Step 5: middle-out the newest (non-pinned) messages largest first, then pinned ones, the
    system/developer prompt last, each only as far as needed and never below a small floor."""
    tokens = list(ctx.tokens)
    total = sum(tokens)
    if ctx.fits(total):
        return _unchanged(messages)

    def rank(i: int) -> tuple[int, int, int]:
        if i not in ctx.pinned:
            group = 0
        elif messages[i].get("role") not in INSTRUCTION_ROLES:
            group = 1
        else:
            group = 2
        return (group, -tokens[i], -i)

    return _cut_until_fits(
        messages,
        ctx,
        sorted(range(len(messages)), key=rank),
        target_for=lambda i, over: max(min(tokens[i], LAST_RESORT_FLOOR_TOKENS), tokens[i] - over),
        kind="last_resort",
    )


STRATEGIES: tuple[tuple[str, Strategy], ...] = (
    ("prune", prune_old_results),
    ("middle_out", middle_out),
    ("drop", drop_oldest),
    ("last_resort", last_resort),
)
