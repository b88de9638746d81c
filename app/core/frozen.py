"""Chat messages as exact, hashable keys, and the prefix match of remembered conversations.

INTERFACE CONTRACT (``tokens.py`` relies on these):

* ``freeze(item) -> (key, chars) | None``: ``item`` as nested tuples usable as an exact dict key
  (strings held by reference, dict key order ignored, ``1``/``1.0``/``True`` apart) and the
  characters its strings hold; None when it is not JSON-shaped. May raise ``RecursionError`` on
  values nested deeper than Python recurses (the caller counts those without caching).
* ``is_plain(value) -> bool``: True for values ``==`` compares exactly (strings, null, lists and
  string-keyed dicts of those); a number or a boolean is not plain.
* ``anchor_of(messages)``: the key a conversation is remembered under (its first two messages,
  frozen), or None; ``messages`` must hold at least two.
* ``common_prefix(messages, remembered) -> int``: how many leading messages equal the remembered.

Pure functions; they never mutate what they are given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .messages import Message

# Values nested deeper than this are not plain (never remembered): the walk stays far from Python's
# recursion limit, and no real message nests this deep.
PLAIN_MAX_DEPTH = 32


def anchor_of(messages: Sequence[Message]) -> Any:
    """The key a conversation is remembered under: its first two messages, frozen (or None)."""
    first = freeze(messages[0]) if type(messages[0]) is dict else None
    second = freeze(messages[1]) if type(messages[1]) is dict else None
    if first is None or second is None:
        return None
    return first[0], second[0]


def common_prefix(messages: Sequence[Message], remembered: tuple[Any, ...]) -> int:
    """How many leading messages equal the remembered ones (one C-level compare when all do)."""
    n = min(len(messages), len(remembered))
    if tuple(messages[:n]) == remembered[:n]:
        return n
    i = 0
    while i < n and messages[i] == remembered[i]:
        i += 1
    return i


def is_plain(value: Any, depth: int = 0) -> bool:
    """Strings, null, lists and string-keyed dicts of those: values ``==`` compares exactly."""
    kind = type(value)
    if kind is str or value is None:
        return True
    if depth >= PLAIN_MAX_DEPTH:
        return False
    if kind is dict:
        return all(type(k) is str and is_plain(v, depth + 1) for k, v in value.items())
    if kind is list:
        return all(is_plain(v, depth + 1) for v in value)
    return False


def freeze(item: Any) -> tuple[Any, int] | None:
    """``(key, chars)``: ``item`` as nested tuples usable as an exact dict key, and the number of
    characters its strings hold; None when it is not JSON-shaped (then it is not cached).

    Strings are kept by reference (their hash is computed once, in C, and cached on the string);
    dicts become their items sorted by key, so key order does not matter. Every form carries a
    marker, so two different JSON values never freeze to equal keys (``1``, ``1.0`` and ``True``
    compare equal in Python but freeze apart).
    """
    kind = type(item)
    if kind is str:
        return item, len(item)
    if kind is dict:
        chars = 0
        strings = True
        for key, value in item.items():
            if type(key) is not str:
                return None
            if type(value) is str:
                chars += len(key) + len(value)
            else:
                strings = False
                break
        if strings:
            # The common message: a flat dict of strings (keys are unique, so the sort never
            # compares values).
            return ("s", *sorted(item.items())), chars
        parts: list[Any] = ["d"]
        chars = 0
        for key in sorted(item):
            if type(key) is not str:
                return None
            frozen = freeze(item[key])
            if frozen is None:
                return None
            parts.append(key)
            parts.append(frozen[0])
            chars += len(key) + frozen[1]
        return tuple(parts), chars
    if kind is list or kind is tuple:
        parts = ["l"]
        chars = 0
        for value in item:
            frozen = freeze(value)
            if frozen is None:
                return None
            parts.append(frozen[0])
            chars += frozen[1]
        return tuple(parts), chars
    if item is None or kind is bool or kind is int:
        return (kind.__name__, item), 1
    if kind is float:
        return ("float", repr(item)), 1
    return None
