"""The framing every recall stream editor shares: server-sent events in, frames out.

INTERFACE CONTRACT (the dialects' ``RecallStream`` editors subclass ``SseEditor``):

* ``SseEditor``: ``feed(data) -> bytes`` cuts the upstream's bytes into whole events (a frame ends
  with a blank line: ``\\n\\n`` or ``\\r\\n\\r\\n``; the unfinished tail waits for the rest), keeps
  this round's frames (``frames``, for the subclass's ``answer``) and returns what the
  subclass's ``edit(frame) -> bytes`` makes of each: the frame itself (untouched bytes), a
  rewritten one, or nothing. ``round`` counts the continuations (0: the first upstream answer);
  ``next_round()`` starts the next one (``_next_round`` resets the per-round state: ``seen``, a
  recall call was seen; ``held``, the frames held back; a subclass extends it); ``release()``
  gives what was held back. A frame of the first round that does not name the tool (``NEEDLE``) while
  nothing needs rewriting is passed by the subclasses without being parsed: the cost of an
  answer that never calls the tool is the framing.
* ``frame_event(frame) -> (event name | None, data text | None)``, ``frame_json(frame)`` (its data
  as a JSON object, else None) and ``reframe(frame, data) -> bytes`` (the frame with its data
  replaced, its ``event:`` line and line endings kept).
"""

from __future__ import annotations

import json
from typing import Any

from .recall import RECALL_TOOL

NEEDLE = RECALL_TOOL.encode("ascii")


def _frame_end(buffer: bytes | bytearray, start: int) -> int:
    """The end (exclusive) of the first whole frame at or after ``start``, or -1."""
    lf = buffer.find(b"\n\n", start)
    crlf = buffer.find(b"\r\n\r\n", start)
    if lf < 0 and crlf < 0:
        return -1
    if crlf < 0 or (0 <= lf < crlf):
        return lf + 2
    return crlf + 4


def frame_event(frame: bytes) -> tuple[str | None, str | None]:
    """The ``event:`` name and the ``data:`` text (lines joined by newlines) of one frame."""
    event: str | None = None
    data: list[str] = []
    for line in frame.decode("utf-8", errors="replace").splitlines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    return event, ("\n".join(data) if data else None)


def frame_json(frame: bytes) -> dict[str, Any] | None:
    """The frame's data as a JSON object, or None (``[DONE]``, a comment, not JSON)."""
    _event, data = frame_event(frame)
    if data is None or not data.startswith("{"):
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def reframe(frame: bytes, data: Any) -> bytes:
    """``frame`` with its data replaced by ``data`` as compact JSON (its ``event:`` line and its
    line endings kept)."""
    newline = b"\r\n" if frame.endswith(b"\r\n\r\n") else b"\n"
    event, _ = frame_event(frame)
    head = b"event: " + event.encode("utf-8") + newline if event is not None else b""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return head + b"data: " + body + newline + newline


class SseEditor:
    """The shared part of a streamed answer's recall editor (see the module docstring)."""

    def __init__(self) -> None:
        self.round = 0
        self.frames: list[bytes] = []
        self._rest = bytearray()
        self._next_round()

    def feed(self, data: bytes, /) -> bytes:
        if not data:
            return b""
        self._rest += data
        out: list[bytes] = []
        start = 0
        while True:
            end = _frame_end(self._rest, start)
            if end < 0:
                break
            frame = bytes(self._rest[start:end])
            start = end
            self.frames.append(frame)
            edited = self.edit(frame)
            if edited:
                out.append(edited)
        del self._rest[:start]
        return b"".join(out)

    def edit(self, frame: bytes, /) -> bytes:
        """What the client gets of one whole frame (the subclass's rules)."""
        raise NotImplementedError

    def unfinished(self) -> bytes:
        """The bytes after the last whole frame (an upstream that ended without a blank line)."""
        rest = bytes(self._rest)
        self._rest.clear()
        return rest

    def next_round(self) -> None:
        """The next upstream answer continues this one."""
        self.round += 1
        self.frames = []
        self._rest.clear()
        self._next_round()

    def _next_round(self) -> None:
        """The per-round state, reset: ``seen`` (a recall call was seen this round) and ``held``
        (the frames held back until the round's end), ``ours``; subclasses extend it."""
        self.seen = False
        self.held: list[bytes] = []
        self.ours: set[int] = set()  # this round's recall calls, by the API's index of them

    def untouched(self, frame: bytes) -> bool:
        """True for a frame of the first round that does not name the tool while nothing needs
        rewriting: it goes to the client as it came, unparsed."""
        return self.round == 0 and not self.seen and NEEDLE not in frame

    def release(self) -> bytes:
        """The frames held back, as they are (subclasses rewrite what names a removed call)."""
        held, self.held = self.held, []
        return b"".join(held)
