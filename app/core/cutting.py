"""Middle-out cutting of one message's text: the tool of ``middle_out`` and ``last_resort``.

INTERFACE CONTRACT (``strategies.py`` relies on it):

* ``truncate_message(message, *, current_tokens, target_tokens, counter, recall=False) -> (message,
  tokens) | None``:
  the message cut to at most ``target_tokens`` (best effort) as a new dict, with its count, always
  smaller than ``current_tokens``; None when it cannot shrink. The input is never mutated.
* ``PendingCuts``: cuts decided but made only for the messages a later step keeps (``cut(i)``,
  once each; ``tokens_of(i)``, ``known(i)``); ``CUT_FLOOR_TOKENS``: no message, cut or not,
  counts less (the per-message overhead).

Only text is cut (string content or ``text`` parts, largest first), each to its head and tail around
one marker ``[ctxproxy: N characters removed from the middle of this message]`` (with ``recall``:
``...; recall id ID]``, the id of the whole text, ``app.core.recall``); cutting a cut text
again keeps the one marker and adds up ``N``. ``N`` counts characters of the removed text, a pure
function of the cut (a token count of a model counted by estimate would change with calibration).
The older wording (``N tokens removed``, which clients may resend) is recognised; cut again, its
text says how many characters were removed from the text as it was received. Images, other parts
and tool-call arguments are never touched.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import Any

from .accounting import TOKENS_PER_MESSAGE
from .conversation import is_opaque
from .messages import Message
from .recall import REF_PATTERN, is_recalled, recall_ref, ref_suffix
from .tokens import MessageCounter

# Every message counts at least its overhead, however much of its text a cut removes.
CUT_FLOOR_TOKENS = TOKENS_PER_MESSAGE

# A cut text keeps at least this many tokens of its own; below that a cut would mostly be marker.
MIN_KEEP_TOKENS = 16

_MARKER_RE = re.compile(
    r"\n\n\[ctxproxy: ([0-9][0-9,]*) (tokens|characters) removed from the middle of this message"
    + REF_PATTERN
    + r"\]\n\n"
)
_LONGEST_MARKER = (
    "\n\n[ctxproxy: 100,000,000 characters removed from the middle of this message; recall id "
    "f0e1d2c3b4a5]\n\n"
)


def marker(removed_chars: int, ref: str | None = None) -> str:
    """The marker that stands for ``removed_chars`` characters cut from the middle of a text (with
    recall, the recall id of the whole text it was cut from)."""
    return (
        f"\n\n[ctxproxy: {removed_chars:,} characters removed from the middle of this message"
        f"{ref_suffix(ref)}]\n\n"
    )


def _cut_text(
    text: str, *, keep_tokens: int, counter: MessageCounter, total_tokens: int, ref: str | None = None
) -> str | None:
    """``text`` (of ``total_tokens``) with only its head and tail (``keep_tokens`` in all) and a
    marker; None if no gain.

    A text already cut keeps one marker: its head and tail are cut further and the count adds up
    (and its recall id stays: it names the text as it was first cut); a first cut names the whole
    text by ``ref``, its recall id, when given.
    """
    tc = counter.counter
    count = counter.text_tokens
    keep = max(0, keep_tokens)
    found = _MARKER_RE.search(text)
    if found is None:
        total = total_tokens
        if keep >= total:
            return None
        head_n = keep // 2
        head, tail = tc.head_tail(text, head_tokens=head_n, tail_tokens=keep - head_n)
        removed = len(text) - len(head) - len(tail)
    else:
        old_head, old_tail = text[: found.start()], text[found.end() :]
        before = int(found.group(1).replace(",", "")) if found.group(2) == "characters" else 0
        ref = found.group(3)
        head_total, tail_total = count(old_head), count(old_tail)
        if keep >= head_total + tail_total:
            return None
        tail_n = min(tail_total, keep - keep // 2)
        head_n = min(head_total, keep - tail_n)
        tail_n = min(tail_total, keep - head_n)
        head = tc.head_tail(old_head, head_tokens=head_n, tail_tokens=0)[0]
        tail = tc.head_tail(old_tail, head_tokens=0, tail_tokens=tail_n)[1]
        removed = before + len(old_head) + len(old_tail) - len(head) - len(tail)
    if removed <= 0:
        return None
    return f"{head}{marker(removed, ref)}{tail}"


def _text_slots(message: Message) -> list[int | None]:
    """Where the cuttable text of a message is: ``None`` for string content, else part indices."""
    content = message.get("content")
    if isinstance(content, str):
        return [None] if content else []
    if isinstance(content, list):
        return [
            k
            for k, part in enumerate(content)
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        ]
    return []


def _slot_text(message: Message, slot: int | None) -> str:
    content = message["content"]
    return str(content) if slot is None else str(content[slot]["text"])


def _with_texts(message: Message, texts: dict[int | None, str]) -> dict[str, Any]:
    content = message["content"]
    if None in texts:
        return {**message, "content": texts[None]}
    parts = list(content)
    for slot, text in texts.items():
        assert slot is not None
        parts[slot] = {**parts[slot], "text": text}
    return {**message, "content": parts}


def truncate_message(
    message: Message,
    *,
    current_tokens: int,
    target_tokens: int,
    counter: MessageCounter,
    recall: bool = False,
) -> tuple[dict[str, Any], int] | None:
    """Middle-out ``message`` to at most ``target_tokens`` (best effort); None when it cannot shrink.

    Only text is cut (string content or ``text`` parts, largest first); images, other parts and
    tool-call arguments are never touched, nor anything in an
    opaque message (``conversation``) or a recall's answer. Returns the new message and its
    count, always smaller. ``recall``: the marker names the cut text by its recall id.
    """
    if is_opaque(message) or is_recalled(message):  # signed content, or recalled: never cut
        return None
    slots = _text_slots(message)
    if not slots or current_tokens <= target_tokens:
        return None
    # Through the counter's text cache: a long text counted in its message is not encoded again.
    sizes = {slot: counter.text_tokens(_slot_text(message, slot)) for slot in slots}
    refs = {slot: recall_ref(_slot_text(message, slot)) for slot in slots} if recall else {}
    marker_tokens = counter.text_tokens(_LONGEST_MARKER)
    best: tuple[dict[str, Any], int] | None = None
    excess = current_tokens - target_tokens
    for _ in range(4):
        texts: dict[int | None, str] = {}
        remaining = excess
        for slot in sorted(slots, key=lambda s: -sizes[s]):
            if remaining <= 0:
                break
            room = sizes[slot] - MIN_KEEP_TOKENS - marker_tokens
            if room <= 0:
                continue
            cut = min(remaining, room)
            new_text = _cut_text(
                _slot_text(message, slot),
                keep_tokens=sizes[slot] - cut - marker_tokens,
                counter=counter,
                total_tokens=sizes[slot],
                ref=refs.get(slot),
            )
            if new_text is not None:
                texts[slot] = new_text
                remaining -= cut
        if not texts:
            break
        candidate = _with_texts(message, texts)
        tokens = counter.count_message(candidate)
        if tokens < current_tokens and (best is None or tokens < best[1]):
            best = (candidate, tokens)
        if tokens <= target_tokens:
            break
        excess += tokens - target_tokens
    return best


class PendingCuts:
    """Middle-out cuts decided but not made: each message of ``indices`` (positions in
    ``messages``, whose counts are ``tokens``) is to be cut to ``target_tokens``
    (``truncate_message``, ``recall``: its marker names the text by its recall id); a cut is made
    when asked, once.

    ``cut(i)``: message ``i`` cut, with its count, or None when it cannot shrink. ``tokens_of(i)``:
    the count message ``i`` has once the cuts are made. ``known(i)``: that count when its cut is
    already made, else None. Made with ``strategies.middle_out`` when cutting alone cannot make a
    request fit: the drop decides what is kept first, and only what it keeps is cut.
    """

    __slots__ = ("_made", "counter", "indices", "messages", "recall", "target_tokens", "tokens")

    def __init__(
        self,
        messages: Sequence[Message],
        tokens: Sequence[int],
        indices: Collection[int],
        *,
        target_tokens: int,
        counter: MessageCounter,
        recall: bool = False,
    ) -> None:
        self.messages = messages
        self.recall = recall
        self.tokens = tokens
        self.indices = frozenset(indices)
        self.target_tokens = target_tokens
        self.counter = counter
        self._made: dict[int, tuple[dict[str, Any], int] | None] = {}

    def cut(self, index: int) -> tuple[dict[str, Any], int] | None:
        if index not in self._made:
            self._made[index] = truncate_message(
                self.messages[index],
                current_tokens=self.tokens[index],
                target_tokens=self.target_tokens,
                counter=self.counter,
                recall=self.recall,
            )
        return self._made[index]

    def tokens_of(self, index: int) -> int:
        found = self.cut(index) if index in self.indices else None
        return self.tokens[index] if found is None else found[1]

    def known(self, index: int) -> int | None:
        if index not in self.indices:
            return self.tokens[index]
        if index not in self._made:
            return None
        found = self._made[index]
        return self.tokens[index] if found is None else found[1]
