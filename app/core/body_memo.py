"""Reuse of a resent body's JSON parse: only the bytes appended to its history are parsed.

Agents resend the whole conversation every turn, with a few new items at the end of one array
(chat's and Anthropic's ``messages``, the Responses ``input``): most of a 500 KB body is the bytes
of the turn before. When a new body is a remembered body's bytes with values inserted right after
the last element of that array, it parses to the remembered body with the array extended by those
values, and only they are parsed. Everything else in the body is byte-for-byte the same, so it
parses to equal values (of the same types): they are taken from the remembered parse.

INTERFACE CONTRACT (the service owns one per app and parses every request body through it):

* ``BodyMemo(max_entries=..., min_bytes=...)``: a thread-safe LRU of remembered bodies.
* ``parse(raw, key=..., loads=...)`` returns what ``loads(raw)`` returns for a JSON object body
  (a dict equal to it, with values of the same types, key order included), or raises what
  ``loads`` raises. ``loads`` parses JSON bytes (the service's: orjson, then the standard
  library); it is called on ``raw`` when nothing remembered fits, else only on ``[`` + the
  appended values + ``]``. A body of at least ``min_bytes`` whose ``key`` is a non-empty array is
  remembered for the next request.
* The dicts and lists returned are shared with the remembered parse and the next requests' parses
  (the array's elements and every other value): callers never mutate a parsed body (the project
  rule: request bodies are read, rewritten bodies are new objects).

Why a hit is exact. A remembered body ``R`` is split at the end of the array's last element:
``R = head + tail``, found by a scan of its structure (``array_end``), where the scan accepts only
an unambiguous body (the key once at the top level, spelled without escapes). ``tail`` starts with
optional whitespace and the ``]`` that closes the array. A new body ``N = head + X + tail`` where
``X`` is optional whitespace, a comma and ``V``, and ``[V]`` is a JSON array of at least one value:
then ``N`` is ``R`` with those values appended to that array (JSON's grammar is context-free, and
the lexer is between tokens at the split), and its next split is ``head + X`` / ``tail``. ``N ==
R`` parses to ``R``'s parse. Anything else is parsed whole.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MIN_BYTES = 32 * 1024
_WHITESPACE = b" \t\r\n"
# Strings (an unrolled loop: no backtracking) and brackets; everything else between them is
# numbers, literals, whitespace, commas and colons, which do not change the nesting.
_TOKEN = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[\[\]{}]', re.S)
_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")


def array_end(raw: bytes, key: str) -> int | None:
    """Where the top-level ``key``'s array ends in ``raw`` (a valid JSON object): the offset just
    after its last element. None when the array is empty, ``key`` is not an array, appears more
    than once at the top level, or any top-level key is written with escapes (then which one a
    parser keeps is not plain from the bytes)."""
    wanted = b'"' + key.encode() + b'"'
    depth = 0
    opened = closed = -1  # where the array's [ and ] are
    for match in _TOKEN.finditer(raw):
        start = match.start()
        first = raw[start]
        if first == 0x22:  # a string: a key when it is at the top level and a colon follows
            if depth != 1:
                continue
            colon = _COLON.match(raw, match.end())
            if colon is None:
                continue
            token = match.group()
            if b"\\" in token:
                return None
            if token == wanted:
                if opened >= 0 or raw[colon.end() : colon.end() + 1] != b"[":
                    return None
                opened = colon.end()
            continue
        if first == 0x7B or first == 0x5B:  # { [
            depth += 1
            continue
        depth -= 1
        if depth == 1 and opened >= 0 and closed < 0:  # the first close back at the top: its ]
            closed = start
    if opened < 0 or closed < 0:
        return None
    last = len(raw[opened + 1 : closed].rstrip(_WHITESPACE))
    return None if last == 0 else opened + 1 + last


@dataclass(frozen=True, slots=True)
class _Entry:
    """A remembered body: its bytes, its parse, whose array it may be extended at, and where that
    array's elements end (``split``): None until first needed, -1 when it has none."""

    key: str
    raw: bytes
    body: dict[str, Any]
    split: int | None = None


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


def common_suffix(a: bytes, b: bytes) -> int:
    """How many trailing bytes ``a`` and ``b`` share."""
    view = memoryview(a)
    la, lb = len(a), len(b)
    low, high = 0, min(la, lb)
    while low < high:
        mid = (low + high + 1) // 2
        if b.startswith(view[la - mid : la - low], lb - mid):
            low = mid
        else:
            high = mid - 1
    return low


class BodyMemo:
    """The remembered bodies of recent requests (an LRU of ``max_entries`` holding at most
    ``max_bytes`` of bodies); thread-safe."""

    def __init__(
        self, *, max_entries: int = 16, max_bytes: int = 64 * 1024 * 1024, min_bytes: int = MIN_BYTES
    ) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._min_bytes = min_bytes
        self._entries: list[_Entry] = []  # most recent first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def parse(self, raw: bytes, *, key: str, loads: Callable[[bytes], Any]) -> Any:
        """``loads(raw)``, from a remembered parse when ``raw`` extends one (module docstring).

        A body is remembered unscanned; the first later body that could extend it (it shares the
        remembered bytes but for one insertion: a common prefix and suffix that cover them) has it
        scanned once (``array_end``, a few ms on 500 KB), and each body made from it by a hit
        inherits its split. So a conversation seen once costs nothing, and a client that changes
        its history every turn (a moved cache marker) costs two binary searches, never a scan."""
        if len(raw) < self._min_bytes:
            return loads(raw)
        with self._lock:
            entries = [e for e in self._entries if e.key == key and len(e.raw) <= len(raw)]
        for entry in entries:
            body = self._extend(entry, raw, loads)
            if body is not None:
                return body
        body = loads(raw)
        if isinstance(body, dict) and isinstance(body.get(key), list) and body[key]:
            self._keep(_Entry(key, raw, body), replacing=None)
        return body

    def _extend(self, entry: _Entry, raw: bytes, loads: Callable[[bytes], Any]) -> dict[str, Any] | None:
        old = entry.raw
        split = entry.split
        if split is None:
            if old[:64] != raw[:64] or common_prefix(old, raw) + common_suffix(old, raw) < len(old):
                return None
            split = array_end(old, entry.key)
            entry = _Entry(entry.key, old, entry.body, -1 if split is None else split)
            self._keep(entry, replacing=None)  # scanned once, whatever comes of it
            if split is None:
                return None
        if split < 0:
            return None
        view = memoryview(old)
        if not raw.startswith(view[:split]) or not raw.endswith(view[split:]):
            return None
        tail = len(old) - split
        new_split = len(raw) - tail
        if new_split == split:  # the same bytes
            self._keep(entry, replacing=entry)
            return dict(entry.body)
        added = raw[split:new_split].lstrip(_WHITESPACE)
        if not added.startswith(b","):
            return None
        try:
            values = loads(b"[" + added[1:] + b"]")
        except Exception:  # whatever ``loads`` refuses, the parse of the whole body says
            return None
        if not isinstance(values, list) or not values:
            return None
        body = dict(entry.body)
        body[entry.key] = [*entry.body[entry.key], *values]
        self._keep(_Entry(entry.key, raw, body, new_split), replacing=entry)
        return body

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
