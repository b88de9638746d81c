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

It reads the messages from the newest back, ``INDEX_SCAN_CHARS`` characters of their text at most
(older ones could only fill room the newer ones left). The bound: when
the rendered index would be longer than ``max_chars``, entries are taken in turns,
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
INDEX_SCAN_CHARS = 65_536
_COMMAND_KEYS: frozenset[str] = frozenset({"command", "cmd", "script", "commands"})

# A text is read word by word (split on white space, in C); most words of prose are plain words
# (lowercase, or capitalized), skipped at once; the others are classified by the first of these
# that matches the word without its surrounding punctuation.
_PUNCTUATION = ".,;:!?'\"()[]{}<>*"
_VERSION = re.compile(r"v?\d+\.\d+(?:\.\d+)+(?:[-+][0-9A-Za-z.]+)?|v\d+\.\d+")
_PATH = re.compile(
    r"(?:~|\.{1,2})?/?(?:[\w@+-][\w.@+-]*/)+[\w.@+-]*[\w@+-]|[\w@+-]+(?:\.[\w@+-]+)*\.[A-Za-z][A-Za-z0-9]{0,5}"
)
_TOKEN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?")
_BACKTICK = re.compile(r"`([^`\n]{2,80})`")
_ERROR = re.compile(
    r"\b(?:[A-Z][A-Za-z]*(?:Error|Exception)\b|Traceback \(most recent call last\)|FAILED\b|FATAL\b"
    r"|fatal:|error(?:\[\w+\])?:|ERROR\b|panic:|Segmentation fault|command not found|No such file"
    r" or directory|Permission denied)"
)
_PROMPTED = re.compile(r"^[ \t]*\$ (\S.*)$", re.MULTILINE)
# A dotted token that is a sentence's last word and the next one's first ("end.The") is no file.
_PROSE_DOT = re.compile(r"^[a-z]+\.[A-Z][a-z]+$")


_DIGIT = re.compile(r"[0-9]").search
_LETTER = re.compile(r"[A-Za-z]").search
_CAMEL = re.compile(r"[a-z][A-Z]").search


def _is_identifier(token: str) -> bool:
    if len(token) < 3:
        return False
    if token.isalpha():  # camelCase, PascalCase, iPhone (not a word, NAME or Title)
        return not (token.islower() or token.isupper() or token.istitle())
    if token.isalnum():  # letters and digits
        return not token.isdigit()
    if not _LETTER(token):
        return False
    if _DIGIT(token) or "_" in token.strip("_"):
        return True  # FACT-t12, snake_case, CONST_NAME
    return token.replace("-", "").isupper() or bool(_CAMEL(token))  # ABC-DEF, get-userName


def identifiers(text: str) -> list[str]:
    """The identifier-like tokens of ``text``, in order (repeats kept)."""
    return [t for t in _TOKEN.findall(text) if _is_identifier(t)]


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ITEM_MAX_CHARS else text[: ITEM_MAX_CHARS - 1] + "…"


def _word_entries(word: str) -> list[tuple[str, str]]:
    """The entries of one white-space-delimited word."""
    if word.startswith(("http://", "https://")):
        return [("url", word.rstrip(".,;:!?'\")]>"))]
    core = word.strip(_PUNCTUATION)
    if _VERSION.fullmatch(core):
        return [("version", core)]
    if _PATH.fullmatch(core) and ("/" in core or not _PROSE_DOT.match(core)):
        return [("path", core)]
    return [("identifier", token) for token in _TOKEN.findall(core) if _is_identifier(token)]


@lru_cache(maxsize=8192)
def _text_entries(text: str) -> tuple[tuple[str, str], ...]:
    """The entries of one text (memoized: a resent conversation's texts are the same objects,
    whose hash Python keeps): its error lines, prompted commands and backticked strings, then
    what its words hold, in order."""
    out: list[tuple[str, str]] = []
    seen_lines: set[int] = set()
    for match in _ERROR.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        if start not in seen_lines:
            seen_lines.add(start)
            end = text.find("\n", match.end())
            out.append(("error", _clip(text[start : end if end >= 0 else len(text)])))
    out += [("command", _clip(m.group(1))) for m in _PROMPTED.finditer(text)]
    if "`" in text:
        out += [("string", m.group(1).strip()) for m in _BACKTICK.finditer(text)]
    for word in text.split():
        core = word.strip(_PUNCTUATION)
        if len(core) < 3 or (core.isalpha() and (core.islower() or core.istitle())):
            continue  # a plain word
        out += _word_entries(word)
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


_LABEL_CHARS = {kind: len(label) + 2 for kind, label in LABELS.items()}
_SMALLEST = 3  # the fewest characters an entry takes (a short one and its separator)


def _rendered_chars(kind: str, text: str) -> int:
    return len(text) + (3 if kind in _LINED else 2)


def _message_chars(message: Message) -> int:
    chars = sum(len(text) for text in _content_texts(message.get("content")))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            arguments = function.get("arguments") if isinstance(function, Mapping) else None
            chars += len(arguments) if isinstance(arguments, str) else 0
    return chars


def span_index(messages: Iterable[Message], *, max_chars: int) -> SpanIndex:
    """The index of ``messages`` (see the module docstring), at most ``max_chars`` rendered."""
    if max_chars <= 0:
        return SpanIndex()
    window = list(messages)
    # The newest messages back, ``INDEX_SCAN_CHARS`` of text at most: the older ones could only
    # fill room the newer ones left (and reading all of a long agent session would cost more than
    # its counting).
    start, scanned = len(window), 0
    while start > 0 and scanned < INDEX_SCAN_CHARS:
        start -= 1
        scanned += _message_chars(window[start])
    first_seen: dict[tuple[str, str], int] = {}
    last_seen: dict[tuple[str, str], int] = {}
    position = 0
    for message in window[start:]:
        for entry in message_entries(message):
            if entry not in first_seen:
                first_seen[entry] = position
            last_seen[entry] = position
            position += 1
    if not first_seen:
        return SpanIndex()
    # Round robin over the kinds (``KINDS`` order), each kind's entries newest first: a bound
    # that binds leaves every kind some room and the newest of each.
    queues: dict[str, list[tuple[str, str]]] = {kind: [] for kind in KINDS}
    for entry in sorted(last_seen, key=last_seen.__getitem__):
        queues[entry[0]].append(entry)
    kept: list[tuple[str, str]] = []
    taken: set[str] = set()
    used = 0
    active = [kind for kind in KINDS if queues[kind]]
    while active and used + _SMALLEST <= max_chars:
        for kind in tuple(active):
            queue = queues[kind]
            while queue:
                entry = queue.pop()  # the newest left
                # A label line per kind, paid by its first entry.
                cost = _rendered_chars(kind, entry[1]) + (_LABEL_CHARS[kind] if kind not in taken else 0)
                if used + cost <= max_chars:
                    kept.append(entry)
                    taken.add(kind)
                    used += cost
                    break
            if not queue:
                active.remove(kind)
    rank = {kind: n for n, kind in enumerate(KINDS)}
    kept.sort(key=lambda e: (rank[e[0]], first_seen[e]))
    return SpanIndex(tuple(kept))


__all__ = ["KINDS", "SpanIndex", "identifiers", "message_entries", "span_index"]
