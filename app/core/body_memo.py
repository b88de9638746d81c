"""Reuse of a resent body's JSON parse: only the bytes that changed at the end of its history are parsed.

Agents resend the whole conversation every turn, with a few new items at the end of one array
(chat's and Anthropic's ``messages``, the Responses ``input``): most of a 500 KB body is the bytes
of the turn before. Real clients also touch the end of what they resend: Claude Code moves its
``cache_control`` marker from the last message to the new last one, Codex sends fields after
``input`` that change every turn. So a new body is matched against a remembered one as: the same
bytes up to the end of one of the remembered array's last elements, then anything. The elements
before that point, and the top-level values before the array, are taken from the remembered parse
(the same objects); only the elements after it and the top-level values after the array are
parsed (the latter only when their bytes changed).

INTERFACE CONTRACT (the service owns one per app and parses every request body through it):

* ``BodyMemo(max_entries=..., max_bytes=..., min_bytes=..., min_reuse_bytes=...)``: a
  thread-safe LRU of remembered bodies; one is looked at for a new body sharing at least
  ``min_reuse_bytes`` of its leading bytes.
* ``parse(raw, key=..., loads=...)`` returns what ``loads(raw)`` returns for a JSON object body
  (a dict equal to it, with values of the same types, key order included), or raises what
  ``loads`` raises. ``loads`` parses JSON bytes (the service's: orjson, then the standard
  library); it is called on ``raw`` when nothing remembered fits, else only on the changed
  elements (``[`` + their bytes + ``]``) and, when they changed, the values after the array
  (``{`` + their bytes). A body of at least ``min_bytes`` whose ``key`` is a non-empty array is
  remembered for the next request.
* The dicts and lists returned are shared with the remembered parse and the next requests' parses
  (the array's elements and every other value): callers never mutate a parsed body (the project
  rule: request bodies are read, rewritten bodies are new objects).

Why a hit is exact. A remembered body ``R`` has a ``Layout``: where its array opens and closes,
and where each of its last ``KEEP_ENDS`` elements ends, found by a scan of its structure (strings,
brackets, commas) that accepts only an unambiguous body (every top-level key once, spelled
without escapes). A new body ``N`` that has ``R``'s bytes up to such an end ``b`` is, at ``b``,
inside that array right after a complete element, the lexer between tokens (JSON's grammar is
context-free; an element that ``N`` continues, a number ``12`` that is ``123`` in ``N``, leaves
bytes other than a comma or the close after ``b`` and is refused below). A scan of ``N`` from
``b`` finds where the array closes; ``N`` is then ``R[:b] + M + "]" + T``, and it is taken only
when ``M`` is whitespace or a comma and values (``[`` + them + ``]`` parses, to as many values as
the scan counted) and ``T`` is the rest of the object (``{`` + it parses, with no key of the head
or the array's key; or it is ``R``'s own tail, or ``}``). Then ``N`` is a valid object whose parse
is the head's values, the array's first elements and the parsed ones, and the tail's values, in
that order. Anything else is parsed whole.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

MIN_BYTES = 32 * 1024
# A remembered body is scanned only for a new one sharing at least this much of its bytes.
MIN_REUSE_BYTES = 4 * 1024
# The newest elements whose ends are remembered: how far back from the end a change may start.
KEEP_ENDS = 8
_WHITESPACE = b" \t\r\n"
# What shapes a JSON text: a whole string without escapes (one step of the regular expression),
# else a quote (a string with escapes: skipped with ``bytes.find``, at memchr speed; a regular
# expression that walks escapes costs ~8 us per KB of file contents), brackets and commas. Between
# them are numbers, literals, whitespace and colons.
_STRUCTURE = re.compile(rb'"[^"\\]*+"|["\[\]{},]')
# Inside an element (below the array's own level) commas do not matter: runs of anything but
# brackets and quotes, and strings without escapes, are skipped in one step; it stops at a bracket
# or at the quote of a string with escapes.
_DEEP = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+")*+[\[\]{}"]')
_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
_OPEN = (0x7B, 0x5B)  # { [


@dataclass(frozen=True, slots=True)
class Layout:
    """Where a body's history array sits in its bytes (offsets into the body)."""

    opened: int  # just after the array's [
    closed: int  # the array's ]
    count: int  # its elements
    ends: tuple[int, ...]  # just after each of its last min(count, KEEP_ENDS) elements
    head_keys: tuple[str, ...]  # the top-level keys before the array, in order
    keys: int  # top-level keys in all (each once)


def _end_before(raw: bytes, start: int, stop: int) -> int:
    """The offset after the last non-whitespace byte of ``raw[start:stop]`` (``start`` if none)."""
    while stop > start and raw[stop - 1] in _WHITESPACE:
        stop -= 1
    return stop


def _string_end(raw: bytes, quote: int) -> int:
    """The offset just after the string whose opening quote is at ``quote`` (-1: unterminated).
    A quote ends it unless an odd number of backslashes is right before it."""
    position = quote + 1
    while True:
        close = raw.find(b'"', position)
        if close < 0:
            return -1
        before = close - 1
        while raw[before] == 0x5C:  # stops at the opening quote at the latest
            before -= 1
        if (close - 1 - before) % 2 == 0:
            return close + 1
        position = close + 1


def _token(raw: bytes, position: int, *, deep: bool) -> tuple[int, int]:
    """The next structural token at or after ``position``: ``(where, where the scan goes on)``,
    past the whole string for a quote; ``(-1, -1)`` at the end or in an unterminated string.
    ``deep``: below the array's own level, where commas do not matter (``_DEEP``)."""
    if deep:
        match = _DEEP.match(raw, position)
        at = -1 if match is None else match.end() - 1
    else:
        match = _STRUCTURE.search(raw, position)
        at = -1 if match is None else match.start()
    if match is None:
        return -1, -1
    if raw[at] != 0x22:
        return at, at + 1
    if match.end() - at > 1:  # a whole string without escapes
        return at, match.end()
    end = _string_end(raw, at)
    return (at, end) if end >= 0 else (-1, -1)


def _elements(raw: bytes, start: int, *, after_element: bool) -> tuple[int, list[int]] | None:
    """Scan ``raw`` from ``start``, inside an array at the top level's depth 2: where the array
    closes and the end of every element that ends on the way. ``after_element``: ``start`` is just
    after a complete element (else just after the ``[``). None on what valid JSON cannot be."""
    depth = 2
    ends: list[int] = []
    boundary = -1 if after_element else start  # where the current element began (-1: none open)
    position = start
    while True:
        at, position = _token(raw, position, deep=depth > 2)
        if at < 0:
            return None
        first = raw[at]
        if first == 0x22:
            continue
        if first in _OPEN:
            depth += 1
            continue
        if first == 0x2C:  # ,
            if depth == 2:
                if boundary >= 0:
                    end = _end_before(raw, boundary, at)
                    if end == boundary:
                        return None  # an empty element
                    ends.append(end)
                boundary = at + 1
            continue
        depth -= 1
        if depth == 1:
            if first != 0x5D:
                return None
            if boundary >= 0:
                end = _end_before(raw, boundary, at)
                if end == boundary:
                    if ends or after_element:
                        return None  # a trailing comma
                else:
                    ends.append(end)
            return at, ends


def layout(raw: bytes, key: str) -> Layout | None:
    """The ``Layout`` of the top-level ``key``'s array in ``raw`` (a valid JSON object). None when
    the array is empty, ``key`` is not an array, any top-level key appears twice or is written
    with escapes (then which value a parser keeps is not plain from the bytes), or the body is not
    UTF-8 (a NUL byte: UTF-16 or -32)."""
    if b"\x00" in raw[:8]:
        return None
    wanted = b'"' + key.encode() + b'"'
    seen: set[bytes] = set()
    head: list[str] = []
    found: Layout | None = None
    depth = 0
    position = 0
    while True:
        at, position = _token(raw, position, deep=depth > 1)  # keys are at depth 1 only
        if at < 0:
            break
        first = raw[at]
        if first == 0x22:
            if depth != 1:
                continue
            colon = _COLON.match(raw, position)
            if colon is None:
                continue  # a value
            token = raw[at:position]
            if b"\\" in token or token in seen:
                return None
            seen.add(token)
            if token != wanted:
                if found is None:
                    try:
                        head.append(token[1:-1].decode())
                    except UnicodeDecodeError:
                        return None
                continue
            if raw[colon.end() : colon.end() + 1] != b"[":
                return None
            opened = colon.end() + 1
            scanned = _elements(raw, opened, after_element=False)
            if scanned is None or not scanned[1]:
                return None
            closed, ends = scanned
            found = Layout(opened, closed, len(ends), tuple(ends[-KEEP_ENDS:]), tuple(head), 0)
            position = closed + 1
            continue
        if first in _OPEN:
            depth += 1
        elif first != 0x2C:
            depth -= 1
    return None if found is None else replace(found, keys=len(seen))


@dataclass(frozen=True, slots=True)
class _Entry:
    """A remembered body: its bytes, its parse, whose array it may be reused at, its layout (None
    until first needed; ``scanned`` says whether it was looked for) and the values after the
    array."""

    key: str
    raw: bytes
    body: dict[str, Any]
    layout: Layout | None = None
    scanned: bool = False
    tail: dict[str, Any] | None = None


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading bytes ``a`` and ``b`` share (a binary search of C compares: each byte is
    compared about once)."""
    view = memoryview(a)
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if b.startswith(view[low:mid], low):
            low = mid
        else:
            high = mid - 1
    return low


class BodyMemo:
    """The remembered bodies of recent requests (an LRU of ``max_entries`` holding at most
    ``max_bytes`` of bodies); thread-safe."""

    def __init__(
        self,
        *,
        max_entries: int = 16,
        max_bytes: int = 32 * 1024 * 1024,
        min_bytes: int = MIN_BYTES,
        min_reuse_bytes: int = MIN_REUSE_BYTES,
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._min_bytes = min_bytes
        self._min_reuse_bytes = min_reuse_bytes
        # Most recent first, at most max_entries and max_bytes (the oldest out). Shared by every
        # client: a reused parse equals a fresh one (the contract), so it cannot change another's.
        self._entries: list[_Entry] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def parse(self, raw: bytes, *, key: str, loads: Callable[[bytes], Any]) -> Any:
        """``loads(raw)``, from a remembered parse where ``raw`` shares it (module docstring).

        A body is remembered unscanned; the first later body sharing at least
        ``min_reuse_bytes`` of its leading bytes has it scanned once (``layout``: a few ms on
        500 KB of short strings), and each body made from it inherits a layout (only its new
        elements are scanned). So a conversation seen once costs nothing, and a body that shares
        nothing costs one binary search of C compares."""
        if len(raw) < self._min_bytes:
            return loads(raw)
        with self._lock:
            entries = [e for e in self._entries if e.key == key]
        for entry in entries:
            body = self._reuse(entry, raw, loads)
            if body is not None:
                return body
        body = loads(raw)
        if isinstance(body, dict) and isinstance(body.get(key), list) and body[key]:
            self._keep(_Entry(key, raw, body), replacing=None)
        return body

    def _scanned(self, entry: _Entry) -> _Entry:
        """``entry`` with its layout looked for (once: the result replaces it in the memo)."""
        found = layout(entry.raw, entry.key)
        body = entry.body
        if found is not None and (
            found.keys != len(body)
            or found.count != len(body[entry.key])
            or any(k not in body for k in found.head_keys)
        ):
            found = None  # the scan and the parse disagree: never reuse this body
        tail = None
        if found is not None:
            skip = {*found.head_keys, entry.key}
            tail = {k: v for k, v in entry.body.items() if k not in skip}
        scanned = _Entry(entry.key, entry.raw, entry.body, found, True, tail)
        self._keep(scanned, replacing=entry)
        return scanned

    def _reuse(self, entry: _Entry, raw: bytes, loads: Callable[[bytes], Any]) -> dict[str, Any] | None:
        old = entry.raw
        shared = common_prefix(old, raw)
        if shared < self._min_reuse_bytes:
            return None
        if not entry.scanned:
            entry = self._scanned(entry)
        found = entry.layout
        if found is None or entry.tail is None:
            return None
        # The newest remembered element end within the shared bytes: everything before it is
        # the same bytes, so the same values.
        index = len(found.ends) - 1
        while index >= 0 and found.ends[index] > shared:
            index -= 1
        if index < 0:
            return None
        start = found.ends[index]
        kept = found.count - len(found.ends) + index + 1
        scanned = _elements(raw, start, after_element=True)
        if scanned is None:
            return None
        closed, new_ends = scanned
        if raw[closed] != 0x5D:
            return None
        middle = raw[start:closed].lstrip(_WHITESPACE)
        values: list[Any] = []
        if middle:
            if not middle.startswith(b","):
                return None
            try:
                values = loads(b"[" + middle[1:] + b"]")
            except Exception:  # whatever ``loads`` refuses, the parse of the whole body says
                return None
            if not isinstance(values, list):
                return None
        if len(values) != len(new_ends):
            return None
        tail = self._tail(entry, found, raw, closed, loads)
        if tail is None:
            return None
        items = entry.body[entry.key]
        body = {k: entry.body[k] for k in found.head_keys}
        body[entry.key] = items if kept == len(items) and not values else [*items[:kept], *values]
        body.update(tail)
        ends = (*found.ends[: index + 1], *new_ends)[-KEEP_ENDS:]
        grown = Layout(found.opened, closed, kept + len(values), ends, found.head_keys, len(body))
        self._keep(_Entry(entry.key, raw, body, grown, True, tail), replacing=entry)
        return body

    @staticmethod
    def _tail(
        entry: _Entry, found: Layout, raw: bytes, closed: int, loads: Callable[[bytes], Any]
    ) -> dict[str, Any] | None:
        """The values after the array in ``raw`` (closed at ``closed``): the remembered ones when
        the bytes are the same, else parsed; None when they are not the rest of the object or
        name a key that is before the array or is the array's."""
        assert entry.tail is not None
        old_tail = len(entry.raw) - found.closed - 1
        if len(raw) - closed - 1 == old_tail and raw.endswith(memoryview(entry.raw)[found.closed + 1 :]):
            return entry.tail
        rest = raw[closed + 1 :].lstrip(_WHITESPACE)
        if rest.startswith(b"}"):
            return {} if rest.rstrip(_WHITESPACE) == b"}" else None
        if not rest.startswith(b","):
            return None
        try:
            tail = loads(b"{" + rest[1:])
        except Exception:  # whatever ``loads`` refuses, the parse of the whole body says
            return None
        if not isinstance(tail, dict) or not tail:  # a comma then nothing: not JSON
            return None
        if entry.key in tail or any(k in tail for k in found.head_keys):
            return None
        return tail

    def _keep(self, entry: _Entry, *, replacing: _Entry | None) -> None:
        with self._lock:
            kept = [
                e for e in self._entries if e is not replacing and e is not entry and e.raw is not entry.raw
            ]
            entries = [entry]
            size = len(entry.raw)
            for e in kept[: self._max_entries - 1]:
                size += len(e.raw)
                if size > self._max_bytes:
                    break
                entries.append(e)
            self._entries = entries
