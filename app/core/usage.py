"""Find the upstream's count of the prompt in a response as it passes (pure, no I/O).

INTERFACE CONTRACT:

* ``prompt_tokens_from_json(body: bytes, *, loads=json.loads) -> int | None``: a non-streaming
  chat response body.
* ``input_tokens_from_json(body, extract, *, loads=json.loads) -> int | None``: any API's
  non-streaming answer, read by ``extract`` (a dialect's ``input_tokens_used``) when it has a
  key that starts with ``usage`` (``"usage"``; Gemini's ``"usageMetadata"``). ``loads`` parses
  JSON bytes, raising ``ValueError`` (the service passes a faster one than the standard
  library's).
* ``SseUsageScanner(extract=None, *, needles=..., max_line_bytes=MAX_LINE_BYTES)``: ``feed(chunk)``
  with the raw bytes of a streamed (SSE) response as they pass, in order; ``prompt_tokens`` is the
  last count seen in a ``data:`` event: chat's ``usage.prompt_tokens`` (OpenAI's final usage chunk
  with ``stream_options.include_usage``; vLLM's continuous usage too) by default, or what
  ``extract`` finds in each event (Responses ``response.completed``, Anthropic
  ``message_start``/``message_delta``). It never changes or keeps the chunks: only the unfinished
  last line is held, and a line longer than ``max_line_bytes`` is skipped. Lines without every one
  of ``needles`` (default ``"usage"`` and ``"prompt_tokens"``) are not parsed at all.
* ``JsonArrayUsageScanner(extract=None, *, needles=..., max_element_bytes=MAX_LINE_BYTES)``: the
  same for a stream that is one JSON array sent element by element (Gemini's
  ``streamGenerateContent`` without ``alt=sse``: pretty-printed objects over many lines, so no
  line holds an event): each top-level object of the body, found by its braces outside strings
  (a lone object, a non-streamed answer, counts too), is parsed when it holds every one of
  ``needles``; the last count wins. Only the unfinished element is held, and one longer than
  ``max_element_bytes`` is skipped.

Never raises on malformed input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

Extract = Callable[[Mapping[str, Any]], int | None]
CHAT_NEEDLES: tuple[bytes, ...] = (b'"usage"', b'"prompt_tokens"')
# Every API's usage key starts so ("usage", "usageMetadata"): an answer without it is not parsed.
USAGE_KEY_START = b'"usage'

MAX_LINE_BYTES = 64 * 1024
# The bytes that move a JSON scanner's state: braces, quotes and escapes (everything else is skipped).
_JSON_SYNTAX = re.compile(rb'[{}"\\]')
MAX_JSON_BYTES = 8 * 1024 * 1024


def _prompt_tokens(payload: Any) -> int | None:
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    value = usage.get("prompt_tokens")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def prompt_tokens_from_json(body: bytes, *, loads: Callable[[bytes], Any] = json.loads) -> int | None:
    if not body or len(body) > MAX_JSON_BYTES or b'"prompt_tokens"' not in body:
        return None
    return _usage_of(body, None, loads=loads)


def input_tokens_from_json(
    body: bytes, extract: Extract, *, loads: Callable[[bytes], Any] = json.loads
) -> int | None:
    if not body or len(body) > MAX_JSON_BYTES or USAGE_KEY_START not in body:
        return None
    return _usage_of(body, extract, loads=loads)


def _usage_of(
    raw: bytes, extract: Extract | None, *, loads: Callable[[bytes], Any] = json.loads
) -> int | None:
    """The prompt tokens of one JSON payload (a whole answer, an SSE line's data, an array
    element): ``extract``'s, else chat's ``usage.prompt_tokens``; None when there are none."""
    try:
        payload = loads(raw)
    except (ValueError, RecursionError):
        return None
    if extract is None:
        return _prompt_tokens(payload)
    return extract(payload) if isinstance(payload, dict) else None


class SseUsageScanner:
    """Watches an SSE byte stream for usage (see the module contract)."""

    __slots__ = ("_extract", "_max_line_bytes", "_needles", "_pending", "_skipping", "prompt_tokens")

    def __init__(
        self,
        extract: Extract | None = None,
        *,
        needles: tuple[bytes, ...] = CHAT_NEEDLES,
        max_line_bytes: int = 0,
    ) -> None:
        self._extract = extract
        self._needles = needles
        self._max_line_bytes = max_line_bytes or MAX_LINE_BYTES
        self._pending = b""
        self._skipping = False
        self.prompt_tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            line = chunk[start:end]
            if self._pending:
                line, self._pending = self._pending + line, b""
            if self._skipping:
                self._skipping = False
            else:
                self._line(line)
            start = end + 1
        rest = chunk[start:]
        if rest and not self._skipping:
            if len(self._pending) + len(rest) > self._max_line_bytes:
                self._pending, self._skipping = b"", True
            else:
                self._pending += rest

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:") or any(needle not in line for needle in self._needles):
            return
        tokens = _usage_of(line[5:].strip(), self._extract)
        if tokens is not None:
            self.prompt_tokens = tokens


class JsonArrayUsageScanner:
    """Watches a JSON-array byte stream for usage (see the module contract)."""

    __slots__ = (
        "_depth",
        "_escaped",
        "_extract",
        "_held",
        "_in_string",
        "_max_element_bytes",
        "_needles",
        "_skipping",
        "prompt_tokens",
    )

    def __init__(
        self,
        extract: Extract | None = None,
        *,
        needles: tuple[bytes, ...] = CHAT_NEEDLES,
        max_element_bytes: int = 0,
    ) -> None:
        self._extract = extract
        self._needles = needles
        self._max_element_bytes = max_element_bytes or MAX_LINE_BYTES
        self._depth = 0
        self._in_string = False
        self._escaped = False  # the chunk's first byte is escaped (a backslash ended the last one)
        self._held = bytearray()  # the unfinished element's bytes from earlier chunks
        self._skipping = False  # the unfinished element is over the bound: not kept
        self.prompt_tokens: int | None = None

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        start = 0 if self._depth else None  # where the element under way starts in this chunk
        skip_at = 0 if self._escaped else -1
        self._escaped = False
        for match in _JSON_SYNTAX.finditer(chunk):
            at = match.start()
            if at == skip_at:
                continue
            byte = chunk[at]
            if byte == 0x5C:  # backslash: escapes the next byte (only inside a string)
                if self._in_string:
                    skip_at = at + 1
                    if skip_at == len(chunk):
                        self._escaped = True
            elif byte == 0x22:  # quote
                self._in_string = not self._in_string
            elif self._in_string:
                continue
            elif byte == 0x7B:  # {
                if self._depth == 0:
                    start, self._held, self._skipping = at, bytearray(), False
                self._depth += 1
            elif self._depth:  # }
                self._depth -= 1
                if self._depth == 0 and start is not None:
                    self._element(chunk[start : at + 1])
                    start = None
        if self._depth and start is not None and not self._skipping:
            if len(self._held) + len(chunk) - start > self._max_element_bytes:
                self._held, self._skipping = bytearray(), True
            else:
                self._held += chunk[start:]

    def _element(self, tail: bytes) -> None:
        if self._skipping:
            self._skipping = False
            return
        element = bytes(self._held) + tail if self._held else tail
        self._held = bytearray()
        if len(element) > self._max_element_bytes or any(n not in element for n in self._needles):
            return
        tokens = _usage_of(element, self._extract)
        if tokens is not None:
            self.prompt_tokens = tokens
