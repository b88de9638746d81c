"""The upstream's own count of a conversation's last request, to count its next one exactly.

A growing conversation (a chat, an agent loop) sends its whole history every turn. The upstream's
``usage`` for one request is the exact count of what it received; the next request of the same
conversation is that request plus what was appended, so its count is the upstream's figure plus
the count of the appended messages. Our count of those (a few hundred to a few thousand tokens) is
the only uncertain part, however far our count of the whole history strays from the upstream's.

INTERFACE CONTRACT (``app.service.boundary`` relies on these):

* ``AnchoredCount`` (frozen): ``upstream_tokens`` (what the upstream counted for the remembered
  request), ``appended_tokens`` (our count of what came after it), ``ratio`` (the upstream's count
  over ours, on the remembered part), ``estimate_tokens``, and the bounds ``lower_tokens`` <=
  ``estimate_tokens`` <= ``upper_tokens`` of the upstream's count of the new request.
* ``AnchorMemory(*, max_conversations=256)``:
  ``remember(model, messages, message_tokens, *, tenant, context, counted_tokens, upstream_tokens)``:
  the neutral ``messages`` a request forwarded, our counts of them (per message and of the whole
  request), what else it sent that is prompt (``context``, compared with ``==``: ``context_of``)
  and the upstream's count of it;
  ``count(model, messages, message_tokens, *, tenant, context, exact) -> AnchoredCount | None``:
  the count of a new request that continues a remembered one (the same tenant, model and
  context, every remembered message but at most ``CHANGED_TAIL_MAX`` last ones equal), else None.
* ``context_of(body, items_key) -> tuple``: the body's values besides its history array
  (``items_key``) that can hold prompt text (tools, instructions, a schema...): every value but
  numbers, booleans and null (output caps, ``stream``, sampling settings), in key order. Tools
  are compared as sent, not by our count of them, which moves with an estimate's correction.
  ``message_tokens`` are our counts of ``messages``; ``exact``: our counter is a shipped tokenizer
  (its count of new text is within ``APPENDED_SPREAD_EXACT``; an estimate's within
  ``APPENDED_SPREAD_ESTIMATE``).

Messages are compared as ``==`` but for the opaque mark (``conversation.OPAQUE_KEY``), which a
dialect sets by where a message sits, not by what it holds. Clients touch the end of what they
resend (Claude Code moves its cache marker to the newest message): a remembered message among the
last ``CHANGED_TAIL_MAX`` that the new request carries at the same place with the same role and
the same count by ours is taken as the same message (a marker is not prompt text); any other
differing one counts as removed, and its replacement as appended.

The formula, with ``U`` the upstream's count of the remembered request, ``p`` ours of it then,
``r = U / p`` (bounded to [``RATIO_MIN``, ``RATIO_MAX``]), ``a`` our count of what was appended,
``d`` of what was removed, and ``s`` the spread: ``estimate = U + round((a - d) * r)``,
``upper = U + ceil(a * max(r, 1) * (1 + s)) - floor(d * min(r, 1) * (1 - s)) + SLACK_TOKENS``,
``lower = U + floor(a' * min(r, 1) * (1 - s) + a'' * PRICED_LOWER_RATIO) - ceil(d * max(r, 1) *
(1 + s))`` where ``a''`` is the part of ``a`` in messages that hold a dialect's price (encrypted
reasoning, images: priced by rule, and an upstream may count them far below it) and ``a'`` the
rest. The upper bound never trusts a ratio below 1 for new text (a conversation whose history we
over-count, e.g. encrypted reasoning priced high, may append plain text we count right).

A conversation is recognised by its tenant (``app.core.tenant``: whose it is; another client's
conversation with the same opening neither anchors nor displaces it), its model and its first two
messages (``frozen.anchor_of``); the latest request of each is kept, at most ``max_conversations``,
the least recently used forgotten first. Thread-safe; pure
standard library; the messages are kept by reference and never mutated.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .conversation import OPAQUE_KEY
from .frozen import anchor_of, common_prefix, has_price
from .messages import Message

DEFAULT_MAX_CONVERSATIONS = 256
APPENDED_SPREAD_EXACT = 0.02
APPENDED_SPREAD_ESTIMATE = 0.15
SLACK_TOKENS = 8
RATIO_MIN = 0.25
RATIO_MAX = 4.0
CHANGED_TAIL_MAX = 4
PRICED_LOWER_RATIO = 0.25


@dataclass(frozen=True, slots=True)
class AnchoredCount:
    """The upstream's count of a new request, from its count of the request before (see the module
    docstring for the formula)."""

    upstream_tokens: int
    appended_tokens: int
    ratio: float
    estimate_tokens: int
    upper_tokens: int
    lower_tokens: int


@dataclass(frozen=True, slots=True)
class _Anchor:
    messages: tuple[Message, ...]
    message_tokens: tuple[int, ...]
    context: object
    counted_tokens: int
    upstream_tokens: int


class AnchorMemory:
    """The latest counted request of recent conversations (see the module docstring)."""

    def __init__(self, *, max_conversations: int = DEFAULT_MAX_CONVERSATIONS) -> None:
        self.max_conversations = max(1, max_conversations)
        self._anchors: OrderedDict[tuple[str, str, Any], _Anchor] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._anchors)

    def remember(
        self,
        model: str,
        messages: Sequence[Message],
        message_tokens: Sequence[int],
        *,
        tenant: str,
        context: object,
        counted_tokens: int,
        upstream_tokens: int,
    ) -> None:
        """Keep ``messages`` (as forwarded, with our counts) and the upstream's count of the request."""
        key = _key(tenant, model, messages)
        if key is None or upstream_tokens <= 0 or counted_tokens <= 0 or len(messages) != len(message_tokens):
            return
        anchor = _Anchor(tuple(messages), tuple(message_tokens), context, counted_tokens, upstream_tokens)
        with self._lock:
            self._anchors.pop(key, None)
            self._anchors[key] = anchor
            while len(self._anchors) > self.max_conversations:
                self._anchors.popitem(last=False)

    def count(
        self,
        model: str,
        messages: Sequence[Message],
        message_tokens: Sequence[int],
        *,
        tenant: str,
        context: object,
        exact: bool,
    ) -> AnchoredCount | None:
        """The upstream's count of a request of ``messages`` that continues a remembered one, or None."""
        key = _key(tenant, model, messages)
        if key is None:
            return None
        with self._lock:
            anchor = self._anchors.get(key)
            if anchor is not None:
                self._anchors.move_to_end(key)
        if anchor is None or len(messages) != len(message_tokens) or anchor.context != context:
            return None
        remembered = len(anchor.messages)
        shared = _shared_prefix(messages, anchor.messages)
        if shared < remembered - CHANGED_TAIL_MAX:
            return None
        appended = sum(message_tokens[remembered:])
        new = zip(messages[remembered:], message_tokens[remembered:], strict=True)
        priced = sum(t for m, t in new if has_price(m))
        removed = 0
        for i in range(shared, remembered):
            old_tokens = anchor.message_tokens[i]
            if (
                i < len(messages)
                and message_tokens[i] == old_tokens
                and messages[i].get("role") == anchor.messages[i].get("role")
            ):
                continue  # the same message but for a marker: the same count on both sides
            removed += old_tokens
            if i < len(messages):
                appended += message_tokens[i]
                priced += message_tokens[i] if has_price(messages[i]) else 0
        upstream = anchor.upstream_tokens
        ratio = min(max(upstream / anchor.counted_tokens, RATIO_MIN), RATIO_MAX)
        spread = APPENDED_SPREAD_EXACT if exact else APPENDED_SPREAD_ESTIMATE
        high, low = max(ratio, 1.0), min(ratio, 1.0)
        upper = (
            upstream + math.ceil(appended * high * (1 + spread)) - math.floor(removed * low * (1 - spread))
        )
        plain = appended - priced
        lower = (
            upstream
            + math.floor(plain * low * (1 - spread) + priced * PRICED_LOWER_RATIO)
            - math.ceil(removed * high * (1 + spread))
        )
        return AnchoredCount(
            upstream_tokens=upstream,
            appended_tokens=appended,
            ratio=ratio,
            estimate_tokens=upstream + round((appended - removed) * ratio),
            upper_tokens=upper + SLACK_TOKENS,
            lower_tokens=max(0, lower),
        )


def context_of(body: Mapping[str, Any], items_key: str) -> tuple[tuple[str, Any], ...]:
    """What ``body`` sends besides its history that can hold prompt text (module docstring)."""
    return tuple(
        (key, value)
        for key, value in sorted(body.items())
        if key != items_key and value is not None and not isinstance(value, int | float)
    )


def _shared_prefix(messages: Sequence[Message], remembered: tuple[Message, ...]) -> int:
    """How many leading messages equal the remembered ones, the opaque mark aside: a dialect marks
    a message opaque by where it sits (Anthropic's current tool loop), which is no prompt text, and
    a new turn moves the mark."""
    shared = common_prefix(messages, remembered)
    limit = min(len(messages), len(remembered))
    while shared < limit and _unmarked(messages[shared]) == _unmarked(remembered[shared]):
        shared += 1
    return shared


def _unmarked(message: Message) -> Message:
    return {k: v for k, v in message.items() if k != OPAQUE_KEY} if OPAQUE_KEY in message else message


def _key(tenant: str, model: str, messages: Sequence[Message]) -> tuple[str, str, Any] | None:
    if len(messages) < 2:
        return None
    try:
        anchor = anchor_of(messages)
    except RecursionError:
        return None
    return None if anchor is None else (tenant, model, anchor)
