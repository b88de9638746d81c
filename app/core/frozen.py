"""Chat messages as exact, hashable keys, and the prefix match of remembered conversations.

INTERFACE CONTRACT (``tokens.py`` relies on these):

* ``freeze(item) -> (key, chars) | None``: ``item`` as nested tuples usable as an exact dict key
  (strings held by reference, dict key order ignored, ``1``/``1.0``/``True`` apart) and the
  characters its strings hold; None when it is not JSON-shaped. May raise ``RecursionError`` on
  values nested deeper than Python recurses (the caller counts those without caching).
* ``freeze_counted(message) -> (key, chars) | None``: ``freeze``, except that the top-level
  reserved keys that never change a count (``ORIGIN_KEY``, ``OPAQUE_KEY``) are left out when
  their value is not a string (the chat accounting counts an unknown top-level value only when it
  is a string): the key of a message *as counted*, equal for two messages that count alike
  for that reason. A dialect's neutral messages carry an origin (a list of index lists), which
  would otherwise take the nested walk on every request.
* ``is_plain(value) -> bool``: True for values ``==`` compares exactly (strings, null, lists and
  string-keyed dicts of those); a number or a boolean is not plain.
* ``is_plain_message(message) -> bool``: ``is_plain``, except that the dialects' reserved keys
  (``conversation.RESERVED_KEYS``) may hold the values a dialect writes there: an origin (lists
  of ints), ``True`` for opaque, an int price on the message or on a content part. The first two
  never change a count, so ``==`` with a look-alike (``1`` for ``True``) is still exact for
  counting; a price does, so a remembered list that holds prices checks them by type
  (``prices_exact``) where ``==`` matched.
* ``has_price(message)`` / ``prices_exact(message)``: the message holds a price (message level or a
  content part) / every such price is an ``int`` (not ``True``, not ``1.0``).
* ``anchor_of(messages)``: the key a conversation is remembered under (its first two messages,
  ``freeze_counted``; what is remembered under it is matched with ``==``), or None; ``messages``
  must hold at least two.
* ``common_prefix(messages, remembered, priced=()) -> int``: how many leading messages equal the
  remembered; ``priced`` (ascending indices of remembered messages with prices) are also checked
  with ``prices_exact``.

Pure functions; they never mutate what they are given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .conversation import OPAQUE_KEY, ORIGIN_KEY, PRICE_KEY
from .messages import Message

# Values nested deeper than this are not plain (never remembered): the walk stays far from Python's
# recursion limit, and no real message nests this deep.
PLAIN_MAX_DEPTH = 32


def anchor_of(messages: Sequence[Message]) -> Any:
    """The key a conversation is remembered under: its first two messages, frozen as counted (or
    None)."""
    first = freeze_counted(messages[0]) if type(messages[0]) is dict else None
    second = freeze_counted(messages[1]) if type(messages[1]) is dict else None
    if first is None or second is None:
        return None
    return first[0], second[0]


def common_prefix(
    messages: Sequence[Message], remembered: tuple[Any, ...], priced: Sequence[int] = ()
) -> int:
    """How many leading messages equal the remembered ones (one C-level compare when all do);
    the remembered messages at ``priced`` count as equal only when their prices are exact ints."""
    n = min(len(messages), len(remembered))
    if tuple(messages[:n]) == remembered[:n]:
        i = n
    else:
        i = 0
        while i < n and messages[i] == remembered[i]:
            i += 1
    for index in priced:
        if index >= i:
            break
        if not prices_exact(messages[index]):
            return index
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


def is_plain_message(message: Any) -> bool:
    """``is_plain``, with the dialects' reserved values allowed where they are written (see the
    module docstring)."""
    if type(message) is not dict:
        return False
    for key, value in message.items():
        if type(key) is not str:
            return False
        if key == ORIGIN_KEY:
            if not (type(value) is list and all(_int_path(path) for path in value)):
                return False
        elif key == OPAQUE_KEY:
            if value is not True:
                return False
        elif key == PRICE_KEY:
            if type(value) is not int:
                return False
        elif key == "content" and type(value) is list:
            for part in value:
                if type(part) is dict and PRICE_KEY in part:
                    if type(part[PRICE_KEY]) is not int:
                        return False
                    if not all(
                        type(k) is str and (k == PRICE_KEY or is_plain(v, 3)) for k, v in part.items()
                    ):
                        return False
                elif not is_plain(part, 2):
                    return False
        elif not is_plain(value, 1):
            return False
    return True


def _int_path(path: Any) -> bool:
    return type(path) is list and all(type(i) is int for i in path)


def has_price(message: Any) -> bool:
    """True when ``message`` holds a price the accounting reads (message level or a content part)."""
    if type(message) is not dict:
        return False
    if PRICE_KEY in message:
        return True
    content = message.get("content")
    return type(content) is list and any(type(part) is dict and PRICE_KEY in part for part in content)


def prices_exact(message: Any) -> bool:
    """True when every price the accounting reads in ``message`` is an ``int`` (``==`` takes
    ``True`` and ``1.0`` for ``1``; the accounting does not)."""
    if type(message) is not dict:
        return False
    if PRICE_KEY in message and type(message[PRICE_KEY]) is not int:
        return False
    content = message.get("content")
    if type(content) is list:
        for part in content:
            if type(part) is dict and PRICE_KEY in part and type(part[PRICE_KEY]) is not int:
                return False
    return True


_COUNT_BLIND = frozenset({ORIGIN_KEY, OPAQUE_KEY})


def freeze_counted(message: Any) -> tuple[Any, int] | None:
    """``freeze(message)`` without the reserved values that never change a count (see the module
    docstring)."""
    if type(message) is not dict:
        return freeze(message)
    chars = 0
    blind = False
    for key, value in message.items():
        if type(key) is not str:
            return None
        if type(value) is str:
            chars += len(key) + len(value)
        elif key in _COUNT_BLIND:
            blind = True
        else:
            return _freeze_dict(message, blind=True)
    if blind:
        return ("s", *sorted(kv for kv in message.items() if type(kv[1]) is str)), chars
    return ("s", *sorted(message.items())), chars


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
        for key, value in item.items():
            if type(key) is not str:
                return None
            if type(value) is str:
                chars += len(key) + len(value)
            else:
                return _freeze_dict(item)
        # The common message: a flat dict of strings (keys are unique, so the sort never
        # compares values).
        return ("s", *sorted(item.items())), chars
    if kind is list or kind is tuple:
        return _freeze_list(item)
    if item is None or kind is bool or kind is int:
        return (kind.__name__, item), 1
    if kind is float:
        return ("float", repr(item)), 1
    return None


# The container walks write strings and ints in line and walk a nested list directly: a call per
# value would cost more than the walk (a neutral message with a dialect's origin, a list of index
# lists, is frozen on every request, twice).
def _freeze_dict(item: dict[Any, Any], *, blind: bool = False) -> tuple[Any, int] | None:
    parts: list[Any] = ["d"]
    chars = 0
    for key, value in sorted(item.items()):  # keys are unique: values are never compared
        if type(key) is not str:
            return None
        kind = type(value)
        if blind and kind is not str and key in _COUNT_BLIND:
            continue
        if kind is str:
            parts += (key, value)
            chars += len(key) + len(value)
            continue
        if value is None or kind is bool or kind is int:
            parts += (key, (kind.__name__, value))
            chars += len(key) + 1
            continue
        frozen = _freeze_list(value) if kind is list else freeze(value)
        if frozen is None:
            return None
        parts += (key, frozen[0])
        chars += len(key) + frozen[1]
    return tuple(parts), chars


def _freeze_list(item: list[Any] | tuple[Any, ...]) -> tuple[Any, int] | None:
    parts: list[Any] = ["l"]
    chars = 0
    for value in item:
        kind = type(value)
        if kind is str:
            parts.append(value)
            chars += len(value)
            continue
        if value is None or kind is bool or kind is int:
            parts.append((kind.__name__, value))
            chars += 1
            continue
        frozen = _freeze_list(value) if kind is list else freeze(value)
        if frozen is None:
            return None
        parts.append(frozen[0])
        chars += frozen[1]
    return tuple(parts), chars
