"""Reuse of the previous parse of a resent conversation: a small memo of recent item lists.

Agents resend the whole history every turn with a few new items at the end. A dialect's parse
builds each neutral message from a few items at known indices, as a pure function of those items
and indices; when the leading items of a new request are *strictly* equal to those of a
remembered parse, what was built from them is reused instead of being built again. A dialect
that uses the memo decides its grouping afresh on every request; only the building is reused.

INTERFACE CONTRACT (``app/core/dialects/responses_items.py`` and ``messages.py`` use it, the
service owns one per app):

* ``equal_prefix(items, remembered, plain) -> (prefix, strict)``: how many leading ``items`` are
  ``==`` to ``remembered`` (one C-level compare), and for each of those whether it is *strictly*
  equal: the remembered item is plain (``frozen.is_plain``: strings, null, lists and string-keyed
  dicts of those, where ``==`` is exact), or ``same_scalars`` finds every value of the same type
  (and every float of the same ``repr``), so ``==`` did not take ``1`` for ``True`` or ``1.0``.
  Key order is not compared, by the project's one rule for exact keys (``frozen.freeze``; JSON
  objects are unordered): nothing downstream of a parse depends on it (the accounting sums over
  keys, the renderers compare with ``==`` and write the *current* body's objects, summaries dump
  with ``sort_keys``). Only strictly equal items are reused (their validation and what was built
  from them). An item ``==`` to a plain item is plain (and one ``==`` to a non-plain item is
  not), so ``plain`` is only ever computed for new items; a non-plain item is walked on every
  request that resends it (cheaper than building its message again).
* ``ParseMemo(max_entries=...)``: a thread-safe LRU of ``Remembered`` parses, per dialect name.
  ``recall(dialect, items) -> Recalled`` finds the remembered parse sharing the longest equal
  prefix with ``items`` (``prefix`` 0 and ``state`` None when none does); ``Recalled.reusable(i)``
  says whether item ``i`` is strictly equal to the remembered one. ``keep(dialect, items, plain,
  state, replacing=...)`` remembers a successful parse (``state`` is the dialect's own value:
  what it built, by descriptor), replacing the entry it came from. Lists shorter than
  ``min_items`` (default ``MIN_ITEMS``) are not remembered (their parse is cheaper than a look-up).
* ``state`` values are never mutated after ``keep``: a dialect builds a new state per parse and
  the engine never mutates neutral messages (strategies build changed messages as copies), so a
  neutral message may be shared by the conversations of two requests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .frozen import PLAIN_MAX_DEPTH, is_plain

MIN_ITEMS = 16


@dataclass(frozen=True, slots=True)
class Remembered:
    """One remembered parse: its items (never mutated: request bodies are not), which of them are
    plain, and the dialect's state (what it built from them)."""

    dialect: str
    items: tuple[Any, ...]
    plain: tuple[bool, ...]
    state: object


@dataclass(frozen=True, slots=True)
class Recalled:
    """What a new parse may reuse: ``state`` built from items of which the first ``prefix`` are
    ``==`` to the new ones, ``strict[i]`` True where item ``i`` is strictly equal."""

    prefix: int = 0
    state: object = None
    plain: tuple[bool, ...] = ()
    strict: tuple[bool, ...] = ()
    entry: Remembered | None = None

    def reusable(self, index: int) -> bool:
        """True when what was built from item ``index`` (and its validation) may be reused."""
        return index < self.prefix and self.strict[index]


NOTHING = Recalled()


def same_scalars(a: Any, b: Any) -> bool:
    """For ``a == b``: True when every value has the same type in both, and every float the same
    ``repr`` (``0.0 == -0.0``), so ``==`` did not take ``1`` for ``True`` or ``1.0``. Values that
    are not JSON-shaped (or nest deeper than ``PLAIN_MAX_DEPTH``) are never called the same."""
    stack = [(a, b, 0)]
    while stack:
        x, y, depth = stack.pop()
        kind = type(x)
        if kind is not type(y) or depth > PLAIN_MAX_DEPTH:
            return False
        if kind is dict:
            for key, value in x.items():
                if type(key) is not str:
                    return False
                stack.append((value, y[key], depth + 1))
        elif kind is list:
            stack.extend((value, other, depth + 1) for value, other in zip(x, y, strict=True))
        elif kind is float:
            if repr(x) != repr(y):
                return False
        elif not (kind is str or kind is int or kind is bool or x is None):
            return False
    return True


def equal_prefix(
    items: Sequence[Any], remembered: tuple[Any, ...], plain: Sequence[bool]
) -> tuple[int, tuple[bool, ...]]:
    """``(prefix, strict)``: how many leading ``items`` are ``==`` to ``remembered``, and which of
    those are strictly equal (see the module docstring)."""
    n = min(len(items), len(remembered), len(plain))
    if tuple(items[:n]) == remembered[:n]:
        equal = n
    else:
        equal = 0
        while equal < n and items[equal] == remembered[equal]:
            equal += 1
    return equal, tuple(plain[i] or same_scalars(items[i], remembered[i]) for i in range(equal))


def plain_flags(items: Sequence[Any], recalled: Recalled) -> tuple[bool, ...]:
    """``is_plain`` of every item, taken from ``recalled`` for its equal prefix."""
    head = recalled.plain[: recalled.prefix]
    return (*head, *(is_plain(item) for item in items[recalled.prefix :]))


class ParseMemo:
    """The remembered parses of recent requests (an LRU of ``max_entries``); thread-safe."""

    def __init__(self, *, max_entries: int = 16, min_items: int = MIN_ITEMS) -> None:
        self._max_entries = max_entries
        self._min_items = max(1, min_items)
        self._entries: list[Remembered] = []  # most recent first
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def recall(self, dialect: str, items: Sequence[Any]) -> Recalled:
        """The remembered parse of ``dialect`` sharing the longest strict prefix with ``items``."""
        if len(items) < self._min_items:
            return NOTHING
        with self._lock:
            entries = [e for e in self._entries if e.dialect == dialect and e.items[0] == items[0]]
        best = NOTHING
        for entry in entries:
            prefix, strict = equal_prefix(items, entry.items, entry.plain)
            if prefix > best.prefix:
                best = Recalled(prefix, entry.state, entry.plain, strict, entry)
        return best

    def keep(
        self,
        dialect: str,
        items: Sequence[Any],
        plain: tuple[bool, ...],
        state: object,
        *,
        replacing: Remembered | None = None,
    ) -> None:
        """Remember a successful parse of ``items`` (most recent first), in place of ``replacing``."""
        if len(items) < self._min_items:
            return
        entry = Remembered(dialect, tuple(items), plain, state)
        with self._lock:
            kept = [e for e in self._entries if e is not replacing]
            self._entries = [entry, *kept][: self._max_entries]
