"""How much of a forwarded request an upstream prompt cache could reuse.

INTERFACE CONTRACT (the service and the API rely on these):

* ``PrefixReuse`` (frozen): ``reused_tokens``, ``total_tokens``, ``share`` (0..1).
* ``PrefixMemory(*, max_conversations=256)``: ``observe(messages, tokens, *, model, api,
  tenant) -> PrefixReuse`` compares the forwarded ``messages`` (with their per-message ``tokens``) with the
  previous forwarded request of the same conversation and remembers them as its latest.
  ``reused_tokens`` are the tokens of the leading messages equal to the previous request's (a
  prefix it already sent, which a prompt cache holds); ``share = reused / total``, 0 (``0.000``
  in ``X-Context-Prefix-Reuse``) for a conversation seen the first time: nothing of it is cached.

A conversation is recognised by its tenant (``app.core.tenant``: the figure never tells one client
how much of another's request it repeated), its model, its wire API (``chat``, ``responses``, ...)
and its first two forwarded messages (the system prompt and the first user message stay the same
while the proxy cuts: they are pinned). Prompt caches are per model, so the same opening sent to
another model, or through another API, is another conversation. Bounded: ``max_conversations``,
the least recently seen conversations forgotten first. Thread-safe; pure standard library; the
messages are never mutated (the memory keeps references to them).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from .frozen import freeze_counted
from .messages import Message

DEFAULT_MAX_CONVERSATIONS = 256


@dataclass(frozen=True, slots=True)
class PrefixReuse:
    """The forwarded tokens a prompt cache could reuse from the previous request of a conversation."""

    reused_tokens: int
    total_tokens: int

    @property
    def share(self) -> float:
        return self.reused_tokens / self.total_tokens if self.total_tokens > 0 else 0.0


def _anchor(messages: Sequence[Message], *, model: str, api: str, tenant: str) -> Hashable | None:
    """The conversation's key: tenant, model, API and its first two messages, exactly (``frozen``: keys
    in any order, ``1``/``1.0``/``True`` apart; ``freeze_counted``: a dialect's origin left out,
    the same for the same opening); a message that does not freeze (not JSON-shaped)
    is written as JSON instead, values of other types by their ``repr``."""
    opening = []
    for message in messages[:2]:
        try:
            frozen = freeze_counted(message) if type(message) is dict else None
        except RecursionError:  # deeper than Python recurses: json.dumps gives up as well
            return None
        if frozen is None:
            try:
                text = json.dumps(message, sort_keys=True, ensure_ascii=False, default=repr)
            except (TypeError, ValueError, RecursionError):
                return None
            opening.append(("json", text))
        else:
            opening.append(frozen[0])
    return (tenant, model, api, *opening)


def _shared(messages: Sequence[Message], previous: tuple[Message, ...]) -> int:
    n = min(len(messages), len(previous))
    if tuple(messages[:n]) == previous[:n]:
        return n
    i = 0
    while i < n and messages[i] == previous[i]:
        i += 1
    return i


class PrefixMemory:
    """The latest forwarded messages of recent conversations (see the module docstring)."""

    def __init__(self, *, max_conversations: int = DEFAULT_MAX_CONVERSATIONS) -> None:
        self.max_conversations = max(1, max_conversations)
        self._latest: OrderedDict[Hashable, tuple[Message, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def observe(
        self, messages: Sequence[Message], tokens: Sequence[int], *, model: str, api: str, tenant: str
    ) -> PrefixReuse:
        total = sum(tokens)
        anchor = _anchor(messages, model=model, api=api, tenant=tenant) if messages else None
        if anchor is None:
            return PrefixReuse(0, total)
        with self._lock:
            previous = self._latest.pop(anchor, None)
            self._latest[anchor] = tuple(messages)
            while len(self._latest) > self.max_conversations:
                self._latest.popitem(last=False)
        if previous is None:
            return PrefixReuse(0, total)
        return PrefixReuse(sum(tokens[: _shared(messages, previous)]), total)
