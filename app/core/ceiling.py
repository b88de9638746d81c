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
* ``token_ceiling(body) -> RequestCeiling``: ``message_tokens`` >= the sum of
  ``MessageCounter(c).count_messages(messages)`` and ``tool_tokens`` >= ``count_tools(body)``, for
  every exact counter ``c`` whose ``count_text`` never exceeds the UTF-8 length (every byte-level
  BPE; the tool constants used are cl100k's, which are >= o200k's).
* ``surely_fits(body, *, spec, policy, cap_tokens=None) -> bool``: True only when
  ``plan_request(body, spec=spec, policy=policy, counter=MessageCounter(c), cap_tokens=cap_tokens)``
  with such an exact ``c`` would return ``fits=True, changed=False`` (any policy mode). It
  validates the messages as ``plan_request`` does (raises ``InvalidRequest``). False means "count
  to know", not "does not fit". Not valid for the estimate (``exact is False``).
* ``conversation_surely_fits(body, conversation, *, dialect, spec, policy, cap_tokens=None)``: the
  same promise for any dialect's parsed conversation (``plan_request(..., dialect=dialect,
  conversation=conversation)``): its neutral messages through the ceiling counter, its tools by the
  dialect's own rule run on the ceiling counter (a dialect counts through the counter's methods,
  so its rule keeps the bound).

Cost: one walk over the messages; an ASCII string's length is free, other strings are encoded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .budget import Policy, budget_for
from .conversation import Conversation
from .dialect import Dialect
from .messages import validate_messages
from .registry import ModelSpec
from .tokens import REPLY_PRIMING_TOKENS, MessageCounter

__all__ = ["RequestCeiling", "Utf8ByteCounter", "conversation_surely_fits", "surely_fits", "token_ceiling"]


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
class RequestCeiling:
    """Upper bounds, in tokens, of a request's messages (overheads included) and tool definitions."""

    message_tokens: int
    tool_tokens: int

    @property
    def total_tokens(self) -> int:
        """The whole request's ceiling, as ``MessageCounter.count_request`` would count it."""
        return self.message_tokens + REPLY_PRIMING_TOKENS + self.tool_tokens


# Uncached: the ceiling is a single cheap walk, and a cache key would cost as much as the walk.
_CEILING = MessageCounter(Utf8ByteCounter(), cache_size=0)


def token_ceiling(body: Mapping[str, Any]) -> RequestCeiling:
    """The ceiling of ``body``'s messages and tools (messages are not validated here)."""
    messages = body.get("messages")
    if not isinstance(messages, list | tuple):
        messages = []
    return RequestCeiling(sum(_CEILING.count_messages(messages)), _CEILING.count_tools(body))


def surely_fits(
    body: Mapping[str, Any], *, spec: ModelSpec, policy: Policy, cap_tokens: int | None = None
) -> bool:
    """True when the exact plan is certain to fit unchanged (see the module docstring)."""
    messages = validate_messages(body.get("messages"))
    if policy.mode == "off":  # forwarded unchanged whatever it counts
        return True
    tool_tokens = _CEILING.count_tools(body)
    # A larger tool count only lowers the input budget, so budgeting with the tools' ceiling
    # gives an input budget no larger than the exact one.
    budget = budget_for(spec, body, policy, tool_tokens=tool_tokens, exact=True, cap_tokens=cap_tokens)
    room = budget.input_budget_tokens - REPLY_PRIMING_TOKENS
    count = _CEILING.count_message
    for message in messages:  # stop at the first message that goes over: "not sure" is enough
        room -= count(message)
        if room < 0:
            return False
    return True


def conversation_surely_fits(
    body: Mapping[str, Any],
    conversation: Conversation,
    *,
    dialect: Dialect,
    spec: ModelSpec,
    policy: Policy,
    cap_tokens: int | None = None,
) -> bool:
    """True when the exact plan of a parsed conversation is certain to fit unchanged (see the
    module docstring)."""
    if policy.mode == "off" or not conversation.fittable:  # forwarded unchanged whatever it counts
        return True
    tool_tokens = dialect.tool_tokens(body, _CEILING)
    requested = conversation.requested_output_tokens
    caps: Mapping[str, Any] = {"max_tokens": requested} if requested is not None else {}
    budget = budget_for(spec, caps, policy, tool_tokens=tool_tokens, exact=True, cap_tokens=cap_tokens)
    room = budget.input_budget_tokens - REPLY_PRIMING_TOKENS
    count = _CEILING.count_message
    for message in conversation.messages:
        room -= count(message)
        if room < 0:
            return False
    return True
