"""The Anthropic Messages API (``POST /v1/messages``) as a dialect.

``MESSAGES`` implements ``app.core.dialect.Dialect``; ``render`` and ``problems`` live in
``messages_wire.py``. Pure and standard-library only.

Routes: ``POST /v1/messages`` (to ``messages`` under the base URL) and ``POST
/v1/messages/count_tokens`` (the upstream's count first, ours when it has no such endpoint). The
key: ``x-api-key`` (where the operator's key goes), or ``Authorization: Bearer`` (Claude Code with
an auth token). A body is recognised by an ``anthropic-version`` header, a top-level ``system``
or an Anthropic content block (``tool_use``, ``tool_result``, thinking). The ``anthropic-beta``
header refines the model spec (``window_from_beta``).

Parsing (``parse``) maps the body onto neutral messages (``app.core.conversation``):

* ``max_tokens`` (required by ``/v1/messages``, absent from a ``count_tokens`` body) is the output
  reserve when given;
* top-level ``system`` (a string or text blocks) -> one pinned ``system`` message, origin
  ``[[-1]]`` (string) or ``[[-1, k], ...]`` (blocks); a ``role: "system"`` message inside
  ``messages`` (the mid-conversation-system beta) -> a ``system`` message where it sits (pinned, so
  it is never dropped);
* a user message: each ``tool_result`` block -> a neutral ``tool`` message (``tool_call_id`` =
  ``tool_use_id``, origin ``[[i, k]]``), so a results-only message does not start a turn; its
  other blocks -> one neutral ``user`` message (origin = their paths, one per content part, in
  order); string content -> a ``user`` message with origin ``[[i]]``;
* an assistant message -> one neutral ``assistant``: ``tool_use`` blocks become ``tool_calls``
  (arguments = the JSON of ``input``), every other block a content part; its origin lists the paths
  of *all* its blocks. A message with a ``thinking`` or ``redacted_thinking`` block is opaque.
* content parts are the body's own block objects (never copied) unless priced: ``image`` and PDF
  ``document`` blocks are shallow copies carrying ``PRICE_KEY``; a thinking block is shown to the
  counter as its text only (the signature is not prompt text), a redacted one by a price.

Prices (Claude's tokenizer is not public; the counter's estimate counts text, these count media):

* image: Anthropic's rule ``tokens = width * height / 750`` after its resize (long edge at most
  ``IMAGE_MAX_EDGE_PX``, at most ``IMAGE_MAX_TOKENS`` per image); the size is read from a base64
  header (PNG, JPEG, GIF, WebP), a URL or file source (or an unreadable header) is priced at
  ``IMAGE_MAX_TOKENS``, the most any image costs after the resize;
* PDF document (base64): ``DOCUMENT_PAGE_TOKENS`` per page (Anthropic: each page is its text,
  1,500-3,000 tokens for a dense page, plus the page as an image, up to ~1,600), the pages counted
  by their ``/Type /Page`` objects (at least one); a URL or file PDF is priced as one page (the
  upstream's overflow answer and our retry cover larger ones); text and content documents are
  counted as text by the accounting;
* ``redacted_thinking``: a quarter of its base64 length (the encrypted text is about as long as
  the thinking it hides);
* ``tools``: the chat accounting over ``name``/``description``/``input_schema`` plus
  ``TOOL_USE_SYSTEM_PROMPT_TOKENS`` (the system prompt Anthropic adds when tools are present).

The thinking rule (the upstream binds a kept thinking block to the conversation before it): the
*current tool loop* is every message after the newest user message that carries something other
than ``tool_result`` blocks. Every neutral message of that loop up to and including the loop's
newest thinking-bearing assistant message is opaque: no prune, no cut there, so the loop can only
lose whole units (a call with all its results) from its oldest end, and everything between the
earliest kept thinking block and the end of the loop reaches the upstream byte-for-byte. Older
turns' thinking messages are opaque too (kept whole or dropped whole with their unit).

Errors: Anthropic's shape ``{"type": "error", "error": {"type": ..., "message": ...}}``. Our own
cannot-fit speaks Anthropic's two wordings with true numbers (Claude Code parses the second):
``prompt is too long: N tokens > W maximum`` when the prompt alone is over the window ``W``, else
``input length and `max_tokens` exceed context limit: N + K > M, decrease input length or
`max_tokens` and try again`` where ``K`` is the output reserve and ``M`` the input budget plus
``K`` (what the proxy can send; ``M <= W``, and ``N + K > M`` holds whenever the prompt is over
its budget). Upstream errors are never rewritten (the service forwards them).

``window_from_beta(spec, anthropic_beta)``: the 1M-token window the ``context-1m-2025-08-07``
beta header turns on for the models that support it (``LONG_CONTEXT_BETA_KEYS``), else None.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..conversation import PRICE_KEY, Conversation, neutral, priced_view
from ..dialect import ErrorInfo, Headers, SummaryCall, model_from_body
from ..endpoints import AUTHORIZATION, KeySlot, Route, UpstreamTarget
from ..errors import InvalidRequest
from ..media import image_size_from_data_url
from ..messages import Message
from ..overflow import ContextOverflow, classify_overflow
from ..parse_memo import NOTHING, ParseMemo, Recalled, item_shapes
from ..registry import ModelSpec
from ..tokens import MessageCounter
from .chat import positive_count
from .messages_wire import SYSTEM_INDEX, render_messages, wire_problems

IMAGE_PIXELS_PER_TOKEN = 750
IMAGE_MAX_EDGE_PX = 1568
IMAGE_MAX_TOKENS = 1600
DOCUMENT_PAGE_TOKENS = 4600
TOOL_USE_SYSTEM_PROMPT_TOKENS = 346
REDACTED_THINKING_CHARS_PER_TOKEN = 4
# Only this much of a base64 PDF is decoded to count its pages (about 48 MB, beyond the API's
# 32 MB request limit), so a hostile body cannot make parsing unbounded.
DOCUMENT_MAX_DECODED_CHARS = 64 * 1024 * 1024

# Anthropic: ``thinking.budget_tokens`` must be at least 1,024 and less than ``max_tokens``.
THINKING_MIN_BUDGET_TOKENS = 1024
# The body fields ``POST /v1/messages/count_tokens`` takes (Anthropic's reference; the beta ones
# too, so a count of a beta request counts what the request sends).
COUNT_FIELDS: frozenset[str] = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "mcp_servers",
        "context_management",
        "output_config",
        "output_format",
    }
)

ANTHROPIC_VERSION = "2023-06-01"  # the API version a summary call sends when the client sent none
LONG_CONTEXT_BETA = "context-1m-2025-08-07"
LONG_CONTEXT_WINDOW_TOKENS = 1_000_000
# Model-table keys (``ModelSpec.matched``) whose window the beta above raises to 1M tokens
# (Anthropic's context-windows page: Sonnet 4 and Sonnet 4.5; the 4.6 models and later have 1M
# in the table already).
LONG_CONTEXT_BETA_KEYS: frozenset[str] = frozenset(
    {"claude-sonnet-4", "claude-sonnet-4-5", "claude-sonnet-4.5"}
)

ROLES: frozenset[str] = frozenset({"user", "assistant", "system"})
# Content blocks no other API has: a body with one is this API's.
OWN_BLOCK_TYPES: frozenset[str] = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})
THINKING_TYPES: frozenset[str] = frozenset({"thinking", "redacted_thinking"})

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error(error: ErrorInfo) -> dict[str, Any]:
    """One of our errors in Anthropic's shape, a cannot-fit one in Anthropic's own wording."""
    kind = _ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": _message(error)}}


def _message(error: ErrorInfo) -> str:
    tokens, limit, window = error.tokens, error.limit_tokens, error.window_tokens
    reserve = error.reserve_tokens
    if error.code != "context_length_exceeded" or tokens is None or limit is None:
        return error.message
    if window is not None and tokens > window:
        return f"prompt is too long: {tokens} tokens > {window} maximum"
    reserve = reserve or 0
    return (
        f"input length and `max_tokens` exceed context limit: {tokens} + {reserve} > {limit + reserve}, "
        "decrease input length or `max_tokens` and try again"
    )


def window_from_beta(spec: ModelSpec, anthropic_beta: str | None) -> int | None:
    """The window the ``anthropic-beta`` header turns on for ``spec``, or None when it changes
    nothing (no long-context beta, or a model that does not support it)."""
    if not anthropic_beta or spec.matched is None:
        return None
    betas = {item.strip().lower() for item in anthropic_beta.split(",")}
    if LONG_CONTEXT_BETA not in betas or spec.matched.lower() not in LONG_CONTEXT_BETA_KEYS:
        return None
    return max(spec.window_tokens, LONG_CONTEXT_WINDOW_TOKENS)


# -- prices ------------------------------------------------------------------------------------


def image_tokens(width: int, height: int) -> int:
    """Anthropic's image rule: ``w * h / 750`` after scaling the long edge to at most 1568 px,
    at most ``IMAGE_MAX_TOKENS`` (larger images are scaled down until they cost that)."""
    w, h = float(max(1, width)), float(max(1, height))
    if max(w, h) > IMAGE_MAX_EDGE_PX:
        ratio = IMAGE_MAX_EDGE_PX / max(w, h)
        w, h = w * ratio, h * ratio
    return min(IMAGE_MAX_TOKENS, max(1, math.ceil(w * h / IMAGE_PIXELS_PER_TOKEN)))


def _image_price(block: Mapping[str, Any]) -> int:
    source = block.get("source")
    if isinstance(source, Mapping) and source.get("type") == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if isinstance(media_type, str) and isinstance(data, str):
            size = image_size_from_data_url(f"data:{media_type};base64,{data[:200_000]}")
            if size is not None:
                return image_tokens(*size)
    return IMAGE_MAX_TOKENS


def _pdf_pages(data: str) -> int:
    try:
        raw = base64.b64decode(data[:DOCUMENT_MAX_DECODED_CHARS], validate=False)
    except (binascii.Error, ValueError):
        return 1
    pages = raw.count(b"/Type /Page") - raw.count(b"/Type /Pages")
    pages += raw.count(b"/Type/Page") - raw.count(b"/Type/Pages")
    return max(1, pages)


def _document_price(block: Mapping[str, Any]) -> int | None:
    source = block.get("source")
    if not isinstance(source, Mapping):
        return None
    kind = source.get("type")
    if kind == "base64":
        data = source.get("data")
        return DOCUMENT_PAGE_TOKENS * (_pdf_pages(data) if isinstance(data, str) else 1)
    if kind in ("url", "file"):
        return DOCUMENT_PAGE_TOKENS
    return None  # text and content documents: their strings are counted as text


def _part(block: Mapping[str, Any]) -> Mapping[str, Any]:
    """The neutral content part of one block: the block itself unless the dialect prices it."""
    kind = block.get("type")
    if kind == "image":
        return {**block, PRICE_KEY: _image_price(block)}
    if kind == "document":
        price = _document_price(block)
        return block if price is None else {**block, PRICE_KEY: price}
    if kind == "thinking":
        thinking = block.get("thinking")
        return {"type": "thinking", "thinking": thinking if isinstance(thinking, str) else ""}
    if kind == "redacted_thinking":
        data = block.get("data")
        size = len(data) if isinstance(data, str) else 0
        return {"type": "redacted_thinking", PRICE_KEY: -(-size // REDACTED_THINKING_CHARS_PER_TOKEN)}
    return block


def _tool_content(block: Mapping[str, Any]) -> object:
    content = block.get("content")
    if isinstance(content, list):
        return [_part(item) if isinstance(item, Mapping) else item for item in content]
    return content if content is not None else ""


# -- validation --------------------------------------------------------------------------------


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _check_blocks(content: object, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid("Input should be a valid string or a list of content blocks", where)
    for k, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _invalid("Input should be an object with a string 'type'", f"{where}.{k}")
        kind = block["type"]
        named = isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
        if kind == "tool_use" and not named:
            raise _invalid("a tool_use block needs a string 'id' and 'name'", f"{where}.{k}")
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise _invalid("a tool_result block needs a string 'tool_use_id'", f"{where}.{k}")
            inner = block.get("content")
            if inner is not None:
                _check_blocks(inner, f"{where}.{k}.content")


def validate_body(body: Mapping[str, Any], *, recalled: Recalled = NOTHING) -> list[dict[str, Any]]:
    """What planning relies on (raise ``InvalidRequest`` naming the field); returns ``messages``.
    A message ``recalled.reusable`` at its index is not checked again: it is strictly equal to one
    an earlier parse validated at the same index (the checks are pure functions of both)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _invalid("Field required (a model name)", "model")
    max_tokens = body.get("max_tokens")
    # Required by /v1/messages (the upstream says so), absent from a count_tokens body.
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise _invalid("Input should be an integer of at least 1", "max_tokens")
    system = body.get("system")
    if system is not None:
        _check_blocks(system, "system")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _invalid("Field required (an array of messages)", "messages")
    # Every message below ``recalled.limit`` is reusable: the loop starts past them.
    for i in range(recalled.limit, len(messages)):
        if recalled.reusable(i):
            continue
        message = messages[i]
        if not isinstance(message, dict):
            raise _invalid("Input should be an object", f"messages.{i}")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _invalid("Input should be 'user', 'assistant' or 'system'", f"messages.{i}.role")
        if "content" not in message:
            raise _invalid("Field required", f"messages.{i}.content")
        _check_blocks(message["content"], f"messages.{i}.content")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise _invalid("Input should be a list of tool objects", "tools")
    return messages


# -- parsing -----------------------------------------------------------------------------------


def _has_thinking(message: Mapping[str, Any]) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(b.get("type") in THINKING_TYPES for b in content)


def _loop_span(messages: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """``(start, stop)``: the wire messages of the current tool loop that must stay unchanged (up to
    and including its newest thinking-bearing assistant message); empty when it has none."""
    start = 0
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if not isinstance(content, list) or any(b.get("type") != "tool_result" for b in content):
            start = i + 1
            break
    for j in range(len(messages) - 1, start - 1, -1):
        if messages[j].get("role") == "assistant" and _has_thinking(messages[j]):
            return start, j + 1
    return start, start


@dataclass(frozen=True, slots=True)
class _Remembered:
    """What a parse leaves in a ``ParseMemo``: the loop span ``[start, stop)`` (its messages are
    frozen), the neutral messages built from each wire message (``built[i]``, a pure function of
    ``(i, message, frozen)``), all of them in order (``made``) and how many after each wire
    message (``ends``). A reusable message frozen alike in both parses takes ``built[i]``."""

    start: int
    stop: int
    built: tuple[list[dict[str, Any]], ...]
    ends: tuple[int, ...]
    made: tuple[dict[str, Any], ...]


def _first_difference(span: tuple[int, int], other: tuple[int, int]) -> int:
    """The first index inside exactly one of two half-open spans (a large number when none is)."""
    first = 1 << 62
    for (a, b), (c, d) in ((span, other), (other, span)):
        if a < b:
            if a < c or a >= d:
                first = min(first, a)
            elif d < b:
                first = min(first, d)
    return first


def _system_message(content: object, index: int) -> dict[str, Any]:
    if isinstance(content, str):
        return neutral("system", content, origin=[(index,)])
    blocks = content if isinstance(content, list) else []
    return neutral("system", [_part(b) for b in blocks], origin=[(index, k) for k in range(len(blocks))])


def _neutral_messages(index: int, message: Mapping[str, Any], *, frozen: bool) -> list[dict[str, Any]]:
    role = message["role"]
    content = message["content"]
    paths: list[tuple[int, ...]]
    if role == "system":
        return [_system_message(content, index)]
    if isinstance(content, str):
        return [neutral(role, content, origin=[(index,)], opaque=frozen)]
    if role == "user":
        out = [
            neutral(
                "tool",
                _tool_content(block),
                origin=[(index, k)],
                opaque=frozen,
                tool_call_id=block["tool_use_id"],
            )
            for k, block in enumerate(content)
            if block["type"] == "tool_result"
        ]
        rest = [(k, block) for k, block in enumerate(content) if block["type"] != "tool_result"]
        if rest or not out:
            paths = [(index, k) for k, _ in rest] or [(index,)]
            out.append(neutral("user", [_part(b) for _, b in rest], origin=paths, opaque=frozen))
        return out
    parts = [_part(b) for b in content if b["type"] != "tool_use"]
    calls = [
        {
            "id": b["id"],
            "type": "function",
            "function": {"name": b["name"], "arguments": _json(b.get("input"))},
        }
        for b in content
        if b["type"] == "tool_use"
    ]
    paths = [(index, k) for k in range(len(content))] or [(index,)]
    opaque = frozen or _has_thinking(message)
    if calls:
        return [neutral("assistant", parts, origin=paths, opaque=opaque, tool_calls=calls)]
    return [neutral("assistant", parts, origin=paths, opaque=opaque)]


def _json(value: object) -> str:
    return json.dumps(value if value is not None else {}, ensure_ascii=False, separators=(",", ":"))


def _usage_input(usage: object) -> int | None:
    if not isinstance(usage, Mapping):
        return None
    total = 0
    seen = False
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = usage.get(key)
        if type(value) is int and value >= 0:
            total += value
            seen = seen or key == "input_tokens"
    return total if seen else None


def _sse_data(body: bytes | str) -> str | None:
    """The ``data:`` payload of an ``event: error`` SSE event, or None when ``body`` is not one."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    if not text.lstrip().startswith("event:"):
        return None
    lines = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return "\n".join(lines) if lines else None


@dataclass(frozen=True, slots=True)
class MessagesDialect:
    """``POST /v1/messages`` (see the module docstring)."""

    name: str = "messages"
    routes: tuple[Route, ...] = (
        Route("/v1/messages", upstream="messages"),
        Route(
            "/v1/messages/count_tokens", kind="count", upstream="messages/count_tokens", upstream_first=True
        ),
    )
    key_slots: tuple[KeySlot, ...] = (KeySlot("x-api-key"), AUTHORIZATION)
    items_key: str = "messages"
    output_in_window: bool = True
    preamble_events: frozenset[str] = frozenset()
    usage_needles: tuple[bytes, ...] = (b'"usage"',)

    def recognition(self, body: Mapping[str, Any], headers: Mapping[str, str], /) -> int:
        """2 with an ``anthropic-version`` header, a top-level ``system`` or one of this API's own
        content blocks; 1 for any other body with a ``messages`` array."""
        messages = body.get("messages")
        if "anthropic-version" in headers or "system" in body:
            return 2
        if not isinstance(messages, list):
            return 0
        for message in messages:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list) and any(
                isinstance(block, Mapping)
                and (block.get("type") in OWN_BLOCK_TYPES or "cache_control" in block)
                for block in content
            ):
                return 2
        return 1

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str:
        return model_from_body(body)

    def refine_spec(self, spec: ModelSpec, headers: Headers, /) -> ModelSpec:
        """The long-context beta header opens the 1M window of the models that have it."""
        values = [value for name, value in headers if name.lower() == "anthropic-beta"]
        wider = window_from_beta(spec, ",".join(values)) if values else None
        return spec if wider is None else replace(spec, window_tokens=wider)

    def upstream_count(self, answer: Mapping[str, Any], /) -> int | None:
        """``{"input_tokens": N}``."""
        return positive_count(answer, "input_tokens")

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation:
        """With ``memo``, the neutral messages of a strictly equal leading run of wire messages are
        reused from a remembered parse (``app.core.parse_memo``): those of wire message ``i`` are a
        pure function of ``(i, message, frozen)``, so they are reused under that descriptor."""
        wire = body.get("messages") if isinstance(body, Mapping) else None
        if memo is not None and not (isinstance(wire, list) and memo.remembers(wire)):
            memo = None  # too short to be remembered: nothing to recall or keep
        recalled = memo.recall(self.name, wire) if memo is not None and isinstance(wire, list) else NOTHING
        previous = recalled.state if isinstance(recalled.state, _Remembered) else None
        if previous is None:
            recalled = NOTHING
        messages = validate_body(body, recalled=recalled)
        out: list[dict[str, Any]] = []
        system = body.get("system")
        if system is not None and system != "" and system != []:
            out.append(_system_message(system, SYSTEM_INDEX))
        start, stop = _loop_span(messages)
        built: list[list[dict[str, Any]]] = []
        ends: list[int] = []
        made: list[dict[str, Any]] = []
        if previous is not None:
            # The leading reusable messages frozen alike in both parses: taken at once.
            taken = min(recalled.limit, _first_difference((start, stop), (previous.start, previous.stop)))
            if taken:
                built = list(previous.built[:taken])
                ends = list(previous.ends[:taken])
                made = list(previous.made[: ends[-1]])
        for i in range(len(built), len(messages)):
            frozen = start <= i < stop
            reuse = (
                previous is not None
                and recalled.reusable(i)
                and (previous.start <= i < previous.stop) == frozen
            )
            group = previous.built[i] if reuse and previous is not None else None
            if group is None:
                group = _neutral_messages(i, messages[i], frozen=frozen)
            built.append(group)
            made.extend(group)
            ends.append(len(made))
        out.extend(made)
        if memo is not None:
            shapes = item_shapes(messages, recalled)
            state = _Remembered(start, stop, tuple(built), tuple(ends), tuple(made))
            memo.keep(self.name, messages, shapes, state, replacing=recalled.entry)
        return Conversation(
            model=body["model"],
            messages=tuple(out),
            requested_output_tokens=body.get("max_tokens"),
            stream=body.get("stream") is True,
        )

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int:
        tools = body.get("tools")
        if not isinstance(tools, list) or not tools:
            return 0
        shaped = [
            {"name": t.get("name"), "description": t.get("description"), "parameters": t["input_schema"]}
            if isinstance(t.get("input_schema"), Mapping)
            else {"type": "custom", "custom": t}
            for t in tools
            if isinstance(t, Mapping)
        ]
        return counter.count_tools({"tools": shaped}) + TOOL_USE_SYSTEM_PROMPT_TOKENS


    def accounting_view(
        self, body: Mapping[str, Any], messages: Sequence[Message], tool_tokens: int, /
    ) -> Mapping[str, Any]:
        return priced_view(messages, tool_tokens)

    def render(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        /,
        *,
        source: Sequence[Message] | None = None,
    ) -> dict[str, Any]:
        return render_messages(body, messages)

    def problems(self, body: Mapping[str, Any], /) -> list[str]:
        return wire_problems(body)

    def error_body(self, error: ErrorInfo, /) -> dict[str, Any]:
        return anthropic_error(error)

    def overflow(
        self, status: int, body: bytes | str | Mapping[str, object] | None, /
    ) -> ContextOverflow | None:
        if isinstance(body, bytes | str):
            data = _sse_data(body)
            if data is not None:
                return classify_overflow(status if status >= 400 else 400, data)
        return classify_overflow(status, body)

    def input_tokens_used(self, answer: Mapping[str, Any], /) -> int | None:
        if answer.get("type") == "message_start":
            message = answer.get("message")
            return _usage_input(message.get("usage")) if isinstance(message, Mapping) else None
        return _usage_input(answer.get("usage"))

    def count_answer(self, input_tokens: int, /) -> dict[str, Any]:
        return {"input_tokens": input_tokens}

    def json_stream_error(self, error: ErrorInfo, /, *, started: bool) -> bytes | None:
        return None  # every answer of this API streams as server-sent events

    def stream_error(self, error: ErrorInfo, /) -> bytes:
        payload = json.dumps(anthropic_error(error), ensure_ascii=False, separators=(",", ":"))
        return b"event: error\ndata: " + payload.encode("utf-8") + b"\n\n"

    def count_request(
        self, body: Mapping[str, Any], path: str, /
    ) -> tuple[UpstreamTarget, dict[str, Any]] | None:
        """``POST messages/count_tokens`` with the fields it takes (``COUNT_FIELDS``: the prompt's;
        ``max_tokens``, ``stream``, ``metadata``... are refused there as extra inputs)."""
        fields = {k: v for k, v in body.items() if k in COUNT_FIELDS}
        return UpstreamTarget("messages/count_tokens"), fields

    def with_output_cap(self, body: Mapping[str, Any], tokens: int, /) -> dict[str, Any] | None:
        """``max_tokens`` lowered to ``tokens``; an enabled thinking budget must stay below it (and
        at least ``THINKING_MIN_BUDGET_TOKENS``), so it is lowered too, or None when it cannot."""
        cap = body.get("max_tokens")
        if type(cap) is not int or cap <= tokens:
            return dict(body)
        capped = {**body, "max_tokens": tokens}
        thinking = body.get("thinking")
        if isinstance(thinking, Mapping) and thinking.get("type") == "enabled":
            budget = thinking.get("budget_tokens")
            if type(budget) is int and budget >= tokens:
                if tokens - 1 < THINKING_MIN_BUDGET_TOKENS:
                    return None
                capped["thinking"] = {**thinking, "budget_tokens": tokens - 1}
        return capped

    def summary_request(
        self, prompt: Sequence[Mapping[str, Any]], /, *, model: str, max_tokens: int
    ) -> SummaryCall:
        """The system message as ``system``, the rest as messages; the client's key
        (``x-api-key`` or ``Authorization``) and ``anthropic-version`` repeated (the version the
        API requires is sent when the client sent none)."""
        system = [str(m.get("content", "")) for m in prompt if m.get("role") == "system"]
        rest = [
            {"role": str(m.get("role")), "content": m.get("content")}
            for m in prompt
            if m.get("role") != "system"
        ]
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "messages": rest, "stream": False}
        if system:
            body["system"] = "\n\n".join(system)
        return SummaryCall(
            self.routes[0].upstream,
            body,
            carry=("x-api-key", "authorization", "anthropic-version"),
            defaults=(("anthropic-version", ANTHROPIC_VERSION),),
        )

    def summary_text(self, answer: Mapping[str, Any], /) -> str | None:
        """The answer's ``text`` blocks, joined."""
        content = answer.get("content")
        texts = [
            block["text"]
            for block in (content if isinstance(content, list) else [])
            if isinstance(block, Mapping)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        ]
        return "".join(texts) if texts else None


MESSAGES = MessagesDialect()

__all__ = [
    "MESSAGES",
    "MessagesDialect",
    "anthropic_error",
    "image_tokens",
    "validate_body",
    "window_from_beta",
]
