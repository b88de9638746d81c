"""The neutral conversation: what every wire API's body becomes before the engine fits it.

INTERFACE CONTRACT (the dialects in ``app/core/dialects/`` produce it, ``fit.py`` and the strategies
consume it, ``Dialect.render`` turns it back into the same API's JSON):

The engine reasons about a flat list of **neutral messages**: chat-shaped dicts (the shape of
Chat Completions, which the engine was built on), so one set of strategies serves every API:

* ``role``: ``system`` / ``developer`` (pinned instructions), ``user``, ``assistant``, ``tool``;
* ``content``: a string, or a list of parts: ``{"type": "text", "text": ...}``, image parts
  (``{"type": "image_url", ...}``), or any other part the dialect keeps (priced with ``PRICE_KEY``);
* ``tool_calls`` on an assistant message: ``[{"id": call_id, "type": "function", "function":
  {"name": ..., "arguments": <string>}}]``; every call of one neutral assistant message is
  answered by ``tool`` messages (``tool_call_id``) right after it. A call and all its results are
  one **unit** (``messages.group_units``): kept or dropped together, never split;
* a **turn** starts at a ``user`` message (``messages.group_turns``): a dialect maps a user message
  that only carries tool results to ``tool`` messages, so it does not start a turn.

Three reserved keys carry what the engine needs and the wire JSON must not lose. Their values are
never strings, so the chat accounting ignores the first two; the third is a price:

* ``ORIGIN_KEY``: where the message came from, as a list of *paths* into the wire body (each path a
  list of ints, dialect-defined: ``[[3], [4]]`` = items 3 and 4 of a Responses ``input``;
  ``[[2, 0]]`` = block 0 of Anthropic ``messages[2]``). Strategies build changed messages as
  ``{**message, ...}``, so a changed message keeps its origin and ``render`` knows what it replaces.
  A message without an origin was made by the engine (a note, a summary) and is built fresh.
* ``OPAQUE_KEY``: ``True`` when the message holds something the upstream signs or encrypts
  (Anthropic ``thinking``/``redacted_thinking``, Responses ``reasoning`` with ``encrypted_content``,
  ``compaction`` items) or that must stay byte-identical for another reason. The engine keeps such a
  message unchanged or drops its whole unit; it never prunes, cuts or re-prices it.
* ``PRICE_KEY``: an int on a message or on a content part: tokens the dialect priced by its own
  rule (encrypted reasoning, an Anthropic image by its pixel rule, a document). The accounting
  adds it as fixed tokens; on a part it replaces the accounting's own rule for that part.

Chat Completions is the identity dialect: its messages are already neutral and carry none of the
reserved keys, so chat bodies are fitted exactly as before.

``Conversation`` is one parsed request: the neutral messages plus what budgeting needs. Pure values;
nothing here does I/O or mutates its input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Message

ORIGIN_KEY = "ctxproxy_origin"
OPAQUE_KEY = "ctxproxy_opaque"
PRICE_KEY = "ctxproxy_tokens"
RESERVED_KEYS: frozenset[str] = frozenset({ORIGIN_KEY, OPAQUE_KEY, PRICE_KEY})

Path = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    """One request as the engine sees it.

    ``messages`` are neutral (see the module docstring), in wire order. ``tool_tokens`` are the
    tokens of everything the request sends besides its messages (tool definitions, output schema)
    by the dialect's rules. ``requested_output_tokens`` is the body's own output cap
    (``max_completion_tokens``/``max_tokens``/``max_output_tokens``), the output reserve when set.
    ``fittable`` is False when the proxy cannot see the whole conversation (a Responses
    ``previous_response_id``/``conversation``: the history lives upstream); such a request is
    forwarded unchanged and ``unfittable_reason`` says why (a response header shows it).
    """

    model: str
    messages: tuple[Message, ...]
    tool_tokens: int = 0
    requested_output_tokens: int | None = None
    stream: bool = False
    fittable: bool = True
    unfittable_reason: str = ""


def origin_of(message: Message) -> tuple[Path, ...]:
    """The wire paths a neutral message came from; ``()`` for a message the engine made."""
    raw = message.get(ORIGIN_KEY)
    if not isinstance(raw, list | tuple):
        return ()
    return tuple(tuple(int(i) for i in path) for path in raw if isinstance(path, list | tuple))


def is_opaque(message: Message) -> bool:
    """True when the message must be forwarded byte-for-byte or dropped whole (never edited)."""
    return message.get(OPAQUE_KEY) is True


def strip_reserved(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` without the reserved keys (for showing a neutral message, e.g. to a summarizer)."""
    return {k: v for k, v in message.items() if k not in RESERVED_KEYS}


def neutral(
    role: str,
    content: object,
    *,
    origin: Sequence[Path] = (),
    opaque: bool = False,
    price_tokens: int | None = None,
    **extra: object,
) -> dict[str, Any]:
    """Build a neutral message (for dialect parsers): reserved keys only when they say something."""
    message: dict[str, Any] = {"role": role, "content": content, **extra}
    if origin:
        message[ORIGIN_KEY] = [list(path) for path in origin]
    if opaque:
        message[OPAQUE_KEY] = True
    if price_tokens is not None:
        message[PRICE_KEY] = price_tokens
    return message


def priced_view(messages: Sequence[Message], tool_tokens: int) -> dict[str, Any]:
    """The neutral ``messages`` as a body the chat accounting counts
    (``MessageCounter.request_parts``), the tool definitions' ``tool_tokens`` (priced by the
    dialect's own rule) joining them as one priced message: the ``Dialect.accounting_view`` of an
    API whose bodies are not that accounting's own shape."""
    if tool_tokens <= 0:
        return {"messages": messages}
    return {"messages": (*messages, {"role": "system", "content": None, PRICE_KEY: tool_tokens})}
