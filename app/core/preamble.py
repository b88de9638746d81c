"""The opening events of a streamed answer, read before anything is passed to the client.

Some APIs report a context overflow *inside* a 200 event stream: OpenAI's Responses API (and the
ChatGPT backend Codex talks to) may open the stream with ``response.created`` and then end it with
``response.failed`` whose error is ``context_length_exceeded``. Headers are not sent to the client
until the first event after the preamble arrives, so such a stream can still be retried smaller.

INTERFACE CONTRACT:

* The event types that may come before the answer proper are a dialect's
  (``Dialect.preamble_events``; empty for APIs that report overflows as error statuses only).
* ``preamble_done(events, kinds) -> bool``: True once ``events`` (the stream's first bytes) holds
  a complete event whose type is not in ``kinds``, or holds ``MAX_PREAMBLE_BYTES`` or more; then
  the driver stops reading and hands the bytes to ``Exchange.answered_stream``.

Pure; never raises on malformed input (a frame it cannot read counts as the answer proper).
"""

from __future__ import annotations

import json

MAX_PREAMBLE_BYTES = 64 * 1024


def _event_type(frame: bytes) -> str | None:
    data: list[bytes] = []
    for line in frame.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
        if line.startswith(b"data:"):
            data.append(line[5:].strip())
    try:
        payload = json.loads(b"\n".join(data)) if data else None
    except (ValueError, RecursionError):
        return None
    kind = payload.get("type") if isinstance(payload, dict) else None
    return kind if isinstance(kind, str) else None


def preamble_done(events: bytes, kinds: frozenset[str]) -> bool:
    if len(events) >= MAX_PREAMBLE_BYTES:
        return True
    frames = events.replace(b"\r\n", b"\n").split(b"\n\n")
    # The last piece is an event still arriving.
    return any(bool(frame.strip()) and _event_type(frame) not in kinds for frame in frames[:-1])
