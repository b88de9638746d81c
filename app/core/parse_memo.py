"""Reuse of the previous parse of a resent conversation: a small memo of recent item lists.

Agents resend the whole history every turn with a few new items at the end. A dialect's parse
builds each neutral message from a few items at known indices, as a pure function of those items
and indices; when the leading items of a new request are *strictly* equal to those of a
remembered parse, what was built from them is reused instead of being built again. A dialect
that uses the memo decides its grouping afresh on every request; only the building is reused.

INTERFACE CONTRACT (``app/core/dialects/responses_items.py`` and ``messages.py`` use it, the
service owns one per app):

* ``equal_prefix(items, remembered, shapes) -> (prefix, strict)``: how many leading ``items``
  are ``==`` to ``remembered`` (one C-level compare), and for each of those whether it is
  *strictly* equal: ``==`` is exact on strings, null, lists and string-keyed dicts, so only
  where the remembered item holds numbers and booleans (its shape: ``scalar_paths``, computed
  once when the item is first seen) are the two values compared by type (and a float by
  ``repr``): ``1``/``True``/``1.0``/``-0.0`` never pass for each other. Key order is not
  compared, by the project's one rule for exact keys (``frozen.freeze``; JSON objects are
  unordered): nothing downstream of a parse depends on it (the accounting sums over keys, the
  renderers compare with ``==`` and write the *current* body's objects, summaries dump with
  ``sort_keys``). Only strictly equal items are reused (their validation and what was built
  from them). An item ``==`` to another has its numbers and booleans at the same paths, so
  shapes are only ever computed for new items (``item_shapes``).
* ``ParseMemo(max_entries=...)``: a thread-safe LRU of ``Remembered`` parses, per dialect name.
  ``recall(dialect, items) -> Recalled`` finds the remembered parse sharing the longest equal
  prefix with ``items`` (``prefix`` 0 and ``state`` None when none does); ``Recalled.reusable(i)``
  says whether item ``i`` is strictly equal to the remembered one, and every item below
  ``Recalled.limit`` is (a dialect takes what it built from that run wholesale).
  ``remembers(items)`` says whether a list that long is remembered at all.
  ``keep(dialect, items, shapes, state, replacing=...)`` remembers a successful parse
  (``state`` is the dialect's own value: what it built, by descriptor), replacing the entry it
  came from. Lists shorter than
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

from .frozen import PLAIN_MAX_DEPTH

MIN_ITEMS = 16
# Where an item holds numbers and booleans (``scalar_paths``); None: never reused.
Shape = tuple[tuple[str | int, ...], ...] | None


@dataclass(frozen=True, slots=True)
class Remembered:
    """One remembered parse: its items (never mutated: request bodies are not), where each holds
    numbers and booleans (``scalar_paths``), and the dialect's state (what it built from them)."""

    dialect: str
    items: tuple[Any, ...]
    shapes: tuple[Shape, ...]
    state: object


@dataclass(frozen=True, slots=True)
class Recalled:
    """What a new parse may reuse: ``state`` built from items of which the first ``prefix`` are
    ``==`` to the new ones, ``strict[i]`` True where item ``i`` is strictly equal."""

    prefix: int = 0
    state: object = None
    shapes: tuple[Shape, ...] = ()
    strict: tuple[bool, ...] = ()
    entry: Remembered | None = None
    # Every item below ``limit`` is reusable (the first item that is not, or ``prefix``).
    limit: int = 0

    def reusable(self, index: int) -> bool:
        """True when what was built from item ``index`` (and its validation) may be reused."""
        return index < self.prefix and self.strict[index]


NOTHING = Recalled()


def scalar_paths(item: Any) -> Shape:
    """Where ``item`` holds numbers and booleans: the path (keys and indices) to each; ``()`` for a
    plain item (strings, null, lists and string-keyed dicts of those, where ``==`` is exact);
    None when it is not JSON-shaped or nests deeper than ``PLAIN_MAX_DEPTH`` (never reused)."""
    paths: list[tuple[str | int, ...]] = []
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(item, ())]
    while stack:
        value, path = stack.pop()
        kind = type(value)
        if kind is str or value is None:
            continue
        if len(path) > PLAIN_MAX_DEPTH:
            return None
        if kind is dict:
            for key, inner in value.items():
                if type(key) is not str:
                    return None
                if type(inner) is not str:
                    stack.append((inner, (*path, key)))
        elif kind is list:
            stack.extend((inner, (*path, k)) for k, inner in enumerate(value) if type(inner) is not str)
        elif kind is int or kind is bool or kind is float:
            paths.append(path)
        else:
            return None
    return tuple(paths)


def same_scalars(a: Any, b: Any, paths: tuple[tuple[str | int, ...], ...]) -> bool:
    """For ``a == b`` where ``a`` holds numbers or booleans at ``paths``: True when each has the
    same type in ``b`` (and a float the same ``repr``: ``0.0 == -0.0``)."""
    for path in paths:
        x, y = a, b
        for step in path:
            x, y = x[step], y[step]
        if type(x) is not type(y) or (type(x) is float and repr(x) != repr(y)):
            return False
    return True


def equal_prefix(
    items: Sequence[Any], remembered: tuple[Any, ...], shapes: Sequence[Shape]
) -> tuple[int, tuple[bool, ...]]:
    """``(prefix, strict)``: how many leading ``items`` are ``==`` to ``remembered``, and which of
    those are strictly equal (see the module docstring)."""
    n = min(len(items), len(remembered), len(shapes))
    if tuple(items[:n]) == remembered[:n]:
        equal = n
    else:
        equal = 0
        while equal < n and items[equal] == remembered[equal]:
            equal += 1
    # Most items are plain (shape ``()``): only the others are looked at one by one.
    strict = [True] * equal
    head = shapes[:equal]
    if head.count(()) != equal:
        for i, shape in enumerate(head):
            if shape != ():
                strict[i] = shape is not None and same_scalars(items[i], remembered[i], shape)
    return equal, tuple(strict)


def item_shapes(items: Sequence[Any], recalled: Recalled) -> tuple[Shape, ...]:
    """``scalar_paths`` of every item, taken from ``recalled`` for its equal prefix (an item
    ``==`` to another has its numbers and booleans at the same paths)."""
    head = recalled.shapes[: recalled.prefix]
    return (*head, *(scalar_paths(item) for item in items[recalled.prefix :]))


class ParseMemo:
    """The remembered parses of recent requests (an LRU of ``max_entries``); thread-safe."""

    def __init__(self, *, max_entries: int = 16, min_items: int = MIN_ITEMS) -> None:
        self._max_entries = max_entries
        self._min_items = max(1, min_items)
        # Most recent first, at most max_entries (the oldest out). Shared by every client: a reused
        # parse equals a fresh one (the contract, tested), so it cannot change another's result.
        self._entries: list[Remembered] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def remembers(self, items: Sequence[Any]) -> bool:
        """Whether a parse of ``items`` would be remembered (``keep``) or looked up (``recall``):
        a dialect skips building the state of a shorter list (it would be thrown away)."""
        return len(items) >= self._min_items

    def recall(self, dialect: str, items: Sequence[Any]) -> Recalled:
        """The remembered parse of ``dialect`` sharing the longest strict prefix with ``items``."""
        if len(items) < self._min_items:
            return NOTHING
        with self._lock:
            entries = [e for e in self._entries if e.dialect == dialect and e.items[0] == items[0]]
        best = NOTHING
        for entry in entries:
            prefix, strict = equal_prefix(items, entry.items, entry.shapes)
            if prefix > best.prefix:
                limit = strict.index(False) if False in strict else prefix
                best = Recalled(prefix, entry.state, entry.shapes, strict, entry, limit)
        return best

    def keep(
        self,
        dialect: str,
        items: Sequence[Any],
        shapes: tuple[Shape, ...],
        state: object,
        *,
        replacing: Remembered | None = None,
    ) -> None:
        """Remember a successful parse of ``items`` (most recent first), in place of ``replacing``."""
        if len(items) < self._min_items:
            return
        entry = Remembered(dialect, tuple(items), shapes, state)
        with self._lock:
            kept = [e for e in self._entries if e is not replacing]
            self._entries = [entry, *kept][: self._max_entries]
