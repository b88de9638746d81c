"""A ceiling on a request's exact token count that needs no tokenizer: the fast path's rule.

A byte-level BPE token (tiktoken's ``o200k_base`` and ``cl100k_base``) stands for at least one
byte of the UTF-8 text, so a text of ``n`` bytes is at most ``n`` tokens. Running the chat
accounting of :class:`~app.core.tokens.MessageCounter` with every text counted as its UTF-8
length (fixed overheads unchanged, images by their rule and audio/files by their flat rules, never
their base64 as text) therefore gives a number that is never below the exact count. When that
ceiling already fits the budget, the exact count cannot change the decision: the request is
forwarded at once, unchanged, and the exact count is finished while the upstream works.

INTERFACE CONTRACT (the service relies on it):

* ``Utf8ByteCounter``: a :class:`~app.core.tokens.TokenCounter` whose ``count_text`` is the text's
  UTF-8 length (a lone surrogate as 3 bytes: tiktoken replaces it with U+FFFD, 3 bytes too).
* ``fitting_ceiling(body, conversation, *, dialect, spec, policy, cap_tokens=None, limits=None)
  -> Ceiling | None``: for a conversation ``dialect`` parsed from ``body``, the ceiling of the whole
  request (``Ceiling.tokens``: its neutral messages through the ceiling counter, the reply priming
  and its tools by the dialect's own rule run on the ceiling counter: a dialect counts through the
  counter's methods, so its rule keeps the bound) and its budget (``budget.request_budget``, the
  budget setup of ``plan_request`` itself, with the tools at their ceiling: a larger tool count
  only lowers the input budget) when they prove that ``plan_request(body, ..., dialect=dialect,
  conversation=conversation, cap_tokens=cap_tokens, limits=limits)`` with an exact counter ``c``
  whose ``count_text`` never exceeds the UTF-8 length (every byte-level BPE) returns ``fits=True,
  changed=False``; None means "count to know", not "does not fit". ``Ceiling.tokens`` is at least
  that plan's ``tokens_before`` and ``Ceiling.budget`` has its window, reserve, margin and cap.
  Policy ``off`` and a conversation that is not ``fittable`` are planned unchanged whatever they
  count: the caller need not ask. Not valid for the estimate (``exact is False``).

Cost: one walk over the messages, stopped at the first one over the budget; an ASCII string's
length is free, other strings are encoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .budget import Budget, Limits, Policy, request_budget
from .conversation import Conversation
from .dialect import Dialect
from .registry import ModelSpec
from .tokens import REPLY_PRIMING_TOKENS, MessageCounter

__all__ = ["Ceiling", "Utf8ByteCounter", "fitting_ceiling"]


class Utf8ByteCounter:
    """Counts a text as its UTF-8 length: no byte-level BPE ever gives more tokens."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return "utf8-bytes"

    @property
    def exact(self) -> bool:
        return False

    def count_text(self, text: str, /) -> int:
        if text.isascii():  # O(1) in CPython: the string knows it is ASCII
            return len(text)
        return len(text.encode("utf-8", "surrogatepass"))

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        data = text.encode("utf-8", "surrogatepass")
        head = data[: max(0, head_tokens)].decode("utf-8", "ignore")
        tail = data[len(data) - max(0, tail_tokens) :].decode("utf-8", "ignore") if tail_tokens > 0 else ""
        return head, tail


@dataclass(frozen=True, slots=True)
class Ceiling:
    """A request's ceiling that fits its budget: ``tokens`` (messages, reply priming and tool
    definitions, never below the exact count) and ``budget`` (see the module docstring)."""

    tokens: int
    budget: Budget


# Uncached: the ceiling is a single cheap walk, and a cache key would cost as much as the walk.
_CEILING = MessageCounter(Utf8ByteCounter(), cache_size=0)


def fitting_ceiling(
    body: Mapping[str, Any],
    conversation: Conversation,
    *,
    dialect: Dialect,
    spec: ModelSpec,
    policy: Policy,
    cap_tokens: int | None = None,
    limits: Limits | None = None,
) -> Ceiling | None:
    """The ceiling of a parsed request when it proves the exact plan fits unchanged, else None
    (see the module docstring)."""
    budget = request_budget(
        body,
        conversation,
        dialect=dialect,
        spec=spec,
        policy=policy,
        counter=_CEILING,
        exact=True,
        cap_tokens=cap_tokens,
        limits=limits,
    )
    room = budget.input_budget_tokens - REPLY_PRIMING_TOKENS
    used = 0
    count = _CEILING.count_message
    for message in conversation.messages:  # stop at the first message that goes over: "not sure" is enough
        used += count(message)
        if used > room:
            return None
    return Ceiling(used + REPLY_PRIMING_TOKENS + budget.tool_tokens, budget)
