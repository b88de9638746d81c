"""The index of a forgotten span: its exact strings, found without a model (issue 28).

INTERFACE CONTRACT (``memory.py`` writes it into the memory, the summarizer's prompt shows it, the
summary checks share ``identifiers``):

* ``span_index(messages, *, max_chars) -> SpanIndex``: the exact strings of the neutral
  ``messages`` (oldest first): identifiers, file paths and names, commands run, URLs, error lines,
  version numbers and other quoted exact strings; verbatim, deduplicated, at most ``max_chars``
  characters of rendered text. A pure function of the messages' text (what the engine's reserved
  keys and the tool-call ids say is never read): byte-stable, so a memory holding it keeps prompt
  caches warm.
* ``SpanIndex`` (frozen): ``entries`` (``(kind, text)``, in the order of ``KINDS`` then first
  seen), ``text()`` (the rendered lines, "" when empty), ``strings()`` (the entries' texts).
* ``identifiers(text) -> list[str]``: the identifier-like tokens of ``text`` (letters and digits
  mixed, ``snake_case``, ``camelCase``, ``CONST_NAME``, dashed codes such as ``AKX-4821``), in order.
  A summary's identifier found nowhere in its source was invented (``app.compaction.checks``).

What goes in (every text a message carries: content, text and thinking parts, a refusal, tool
calls' arguments by value; a tool's name and a call's id are structure, not content):

* ``url``: ``http(s)://...`` (trailing punctuation trimmed);
* ``path``: a token with a ``/`` that names a file or directory (``src/app.py``, ``./run.sh``,
  ``/etc/hosts``, ``~/.bashrc``) or a file name with an extension (``README.md``);
* ``command``: a call's ``command``/``cmd``/``script`` argument, a ``$ ``-prompted line (first
  line, at most ``ITEM_MAX_CHARS``);
* ``error``: a line naming an error (``ValueError: ...``, ``error:``, ``Traceback``, ``FAILED``,
  ``panic:``...), at most ``ITEM_MAX_CHARS``;
* ``version``: ``1.2.3``, ``v2.0``, ``3.11.7-rc1``;
* ``identifier``: see ``identifiers`` (tokens inside a URL or path are not repeated);
* ``string``: a short backticked span (`` `make test` ``).

The bound: when the rendered index would be longer than ``max_chars``, entries are taken in turns,
one of each kind in ``KINDS`` order, each kind's newest first (the end of a forgotten span is the
work just before what is still shown), while they fit; the kept ones are rendered by kind, in the
order they were first seen. So the index of a longer span (the conversation
grown) holds what the shorter one held until the bound binds, and then the newest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from .messages import Message

KINDS: tuple[str, ...] = ("identifier", "path", "error", "command", "url", "version", "string")
LABELS: Mapping[str, str] = {
    "error": "errors",
    "identifier": "identifiers",
    "path": "files",
    "url": "urls",
    "command": "commands",
    "version": "versions",
    "string": "strings",
}
# Kinds whose entries may hold spaces or commas: one per line; the others share a line.
_LINED: frozenset[str] = frozenset({"error", "command", "string"})
ITEM_MAX_CHARS = 160
_COMMAND_KEYS: frozenset[str] = frozenset({"command", "cmd", "script", "commands"})

_URL = re.compile(r"https?://[^\s<>\"'`()\[\]{}]+")
_PATH = re.compile(
    r"(?<![\w/.~-])(?:~|\.{1,2})?/?(?:[\w@+-][\w.@+-]*/)+[\w.@+-]*[\w@+-]"
    r"|(?<![\w/.-])[\w@+-]+(?:\.[\w@+-]+)*\.[A-Za-z][A-Za-z0-9]{0,5}(?![\w/])"
)
_VERSION = re.compile(
    r"(?<![\w.])v?\d+\.\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.]+)?(?![\w])|(?<![\w.])v\d+\.\d+(?![\w.])"
)
_TOKEN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?")
_ERROR = re.compile(
    r"\b(?:[A-Z][A-Za-z]*(?:Error|Exception)\b|Traceback \(most recent call last\)|FAILED\b|FATAL\b"
    r"|fatal:|error(?:\[\w+\])?:|ERROR\b|panic:|Segmentation fault|command not found|No such file"
    r" or directory|Permission denied)"
)
_BACKTICK = re.compile(r"`([^`\n]{2,80})`")
_PROMPTED = re.compile(r"^\s*\$ (\S.*)$")
# A dotted token that is a sentence's last word and the next one's first ("end.The") is no file.
_PROSE_DOT = re.compile(r"^[a-z]+\.[A-Z][a-z]+$")


def _is_identifier(token: str) -> bool:
    if len(token) < 3 or token.isdigit():
        return False
    letters = any(c.isalpha() for c in token)
    digits = any(c.isdigit() for c in token)
    if letters and digits:
        return True
    if not letters:
        return False
    if "_" in token.strip("_"):
        return True  # snake_case, CONST_NAME
    if "-" in token and token.replace("-", "").isupper():
        return True  # a dashed code in capitals: ABC-DEF
    inner = token[1:]
    return any(c.isupper() for c in inner) and any(c.islower() for c in token)  # camelCase, PascalCase


def identifiers(text: str) -> list[str]:
    """The identifier-like tokens of ``text``, in order (repeats kept)."""
    return [t for t in _TOKEN.findall(text) if _is_identifier(t)]


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ITEM_MAX_CHARS else text[: ITEM_MAX_CHARS - 1] + "…"


@lru_cache(maxsize=8192)
def _text_entries(text: str) -> tuple[tuple[str, str], ...]:
    """The entries of one text, in order (memoized: a resent conversation's texts are the same
    objects, whose hash Python keeps)."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if _ERROR.search(line):
            out.append(("error", _clip(line)))
        prompted = _PROMPTED.match(line)
        if prompted:
            out.append(("command", _clip(prompted.group(1))))
        rest = line
        for match in _URL.finditer(line):
            out.append(("url", match.group(0).rstrip(".,;:!?")))
        rest = _URL.sub(" ", rest)
        for match in _BACKTICK.finditer(rest):
            out.append(("string", match.group(1).strip()))
        for match in _VERSION.finditer(rest):
            out.append(("version", match.group(0)))
        rest = _VERSION.sub(" ", rest)
        for match in _PATH.finditer(rest):
            path = match.group(0).rstrip(".")
            if "/" in path or not _PROSE_DOT.match(path):
                out.append(("path", path))
        rest = _PATH.sub(" ", rest)
        out.extend(("identifier", token) for token in identifiers(rest))
    return tuple(out)


def _strings(value: object) -> Iterator[tuple[str | None, str]]:
    """Every string value inside a JSON value, with the key it sits under (None at the top)."""
    stack: list[tuple[str | None, object]] = [(None, value)]
    while stack:
        key, item = stack.pop()
        if isinstance(item, str):
            yield key, item
        elif isinstance(item, Mapping):
            stack.extend((str(k), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend((key, v) for v in reversed(item))


def _call_entries(arguments: object) -> list[tuple[str, str]]:
    """The entries of a tool call's arguments: a command argument is a command; every string
    value is read as text (never the keys)."""
    if isinstance(arguments, str):
        try:
            value: object = json.loads(arguments)
        except ValueError:
            value = arguments
    else:
        value = arguments
    out: list[tuple[str, str]] = []
    for key, text in _strings(value):
        if key is not None and key.lower() in _COMMAND_KEYS and text.strip():
            out.append(("command", _clip(text.strip().splitlines()[0])))
        else:
            out.extend(_text_entries(text))
    return out


def _content_texts(content: object) -> Iterator[str]:
    if isinstance(content, str):
        yield content
        return
    if not isinstance(content, list):
        return
    for part in content:
        if not isinstance(part, Mapping):
            continue
        for key in ("text", "thinking", "refusal"):
            text = part.get(key)
            if isinstance(text, str):
                yield text


def message_entries(message: Message) -> list[tuple[str, str]]:
    """The entries of one neutral message, in order."""
    out: list[tuple[str, str]] = []
    for text in _content_texts(message.get("content")):
        out.extend(_text_entries(text))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                out.extend(_call_entries(function.get("arguments")))
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        out.extend(_call_entries(legacy.get("arguments")))
    return out


@dataclass(frozen=True, slots=True)
class SpanIndex:
    """The exact strings of a span (see the module docstring), ``(kind, text)`` in render order."""

    entries: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.entries)

    def strings(self) -> tuple[str, ...]:
        return tuple(text for _, text in self.entries)

    def text(self) -> str:
        """One line per kind (``files: a.py, b.py``), or one line per entry for kinds whose
        entries hold spaces (``- ValueError: ...``); "" when empty."""
        return _render(self.entries)


def _render(entries: Sequence[tuple[str, str]]) -> str:
    lines: list[str] = []
    for kind in KINDS:
        texts = [text for k, text in entries if k == kind]
        if not texts:
            continue
        if kind in _LINED:
            lines.append(f"{LABELS[kind]}:")
            lines.extend(f"- {text}" for text in texts)
        else:
            lines.append(f"{LABELS[kind]}: {', '.join(texts)}")
    return "\n".join(lines)


def _rendered_chars(kind: str, text: str) -> int:
    return len(text) + (3 if kind in _LINED else 2)


def span_index(messages: Iterable[Message], *, max_chars: int) -> SpanIndex:
    """The index of ``messages`` (see the module docstring), at most ``max_chars`` rendered."""
    first_seen: dict[tuple[str, str], int] = {}
    last_seen: dict[tuple[str, str], int] = {}
    position = 0
    for message in messages:
        for entry in message_entries(message):
            if entry[1]:
                first_seen.setdefault(entry, position)
                last_seen[entry] = position
                position += 1
    if not first_seen or max_chars <= 0:
        return SpanIndex()
    # Round robin over the kinds (``KINDS`` order), each kind's entries newest first: a bound
    # that binds leaves every kind some room and the newest of each.
    queues = {
        kind: sorted((e for e in first_seen if e[0] == kind), key=last_seen.__getitem__) for kind in KINDS
    }
    kept: list[tuple[str, str]] = []
    labelled: set[str] = set()
    used = 0
    while any(queues.values()):
        for kind in KINDS:
            queue = queues[kind]
            while queue:
                entry = queue.pop()  # the newest left
                # A label line per kind, paid by its first entry.
                cost = _rendered_chars(kind, entry[1]) + (0 if kind in labelled else len(LABELS[kind]) + 2)
                if used + cost <= max_chars:
                    kept.append(entry)
                    labelled.add(kind)
                    used += cost
                    break
    rank = {kind: n for n, kind in enumerate(KINDS)}
    kept.sort(key=lambda e: (rank[e[0]], first_seen[e]))
    return SpanIndex(tuple(kept))


__all__ = ["KINDS", "SpanIndex", "identifiers", "message_entries", "span_index"]
