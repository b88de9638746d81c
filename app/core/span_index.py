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
* ``identifier``: see ``identifiers`` (tokens inside a URL or path are not repeated; not from a
  call's arguments, the model's own choices);
* ``string``: a short backticked span (`` `make test` ``).

It reads the messages from the newest back, ``INDEX_SCAN_CHARS`` characters of their text at most
(older ones could only fill room the newer ones left). An identifier found as a whole word inside a
longer identifier, a path or a URL the index holds is left out. The bound: when the rendered index
would be longer than ``max_chars``, the kind that has used the fewest characters takes its newest
entry next (the end of a forgotten span is the work just before what is still shown), while they
fit; the kept ones are rendered by kind, oldest first (the order they were last seen in). So the
index of a longer span (the conversation grown) holds what the shorter one held until the bound
binds, and then the newest.
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
INDEX_SCAN_CHARS = 262_144
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
# The words that name an error: a line holding one (after a word boundary; ``XError`` and
# ``XException`` with a capital before) is an error line.
_ERROR_WORDS = (
    r"Traceback \(most recent call last\)|FAILED\b|FATAL\b|fatal:|error(?:\[\w+\])?:|ERROR\b|panic:"
    r"|Segmentation fault|command not found|No such file or directory|Permission denied"
)
_ERROR = re.compile(rf"\b(?:[A-Z][A-Za-z]*(?:Error|Exception)\b|{_ERROR_WORDS})")
# What every ``_ERROR`` match holds (without the boundary and the capital before it): the lines
# that hold one are the only ones ``_ERROR`` is run on.
_ERROR_KEYS = re.compile(rf"(?:Error|Exception)\b|{_ERROR_WORDS}")
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


@lru_cache(maxsize=16384)
def _word_entries(word: str) -> tuple[tuple[str, str], ...]:
    """The entries of one white-space-delimited word (memoized: names recur across texts)."""
    if word.startswith(("http://", "https://")):
        return (("url", word.rstrip(".,;:!?'\")]>")),)
    core = word.strip(_PUNCTUATION)
    if _VERSION.fullmatch(core):
        return (("version", core),)
    if _PATH.fullmatch(core) and ("/" in core or not _PROSE_DOT.match(core)):
        return (("path", core),)
    return tuple(("identifier", token) for token in _TOKEN.findall(core) if _is_identifier(token))


@lru_cache(maxsize=8192)
def _text_entries(text: str) -> tuple[tuple[str, str], ...]:
    """The entries of one text (memoized: a resent conversation's texts are the same objects,
    whose hash Python keeps): its error lines, prompted commands and backticked strings, in order,
    then what its words hold, each word once, in the order of its last occurrence."""
    out: list[tuple[str, str]] = []
    seen_lines: set[int] = set()
    # The lines holding an ``_ERROR`` match, in order (a match never spans lines).
    for match in _ERROR_KEYS.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        if start in seen_lines:
            continue
        seen_lines.add(start)
        end = text.find("\n", match.end())
        end = end if end >= 0 else len(text)
        if _ERROR.search(text, start, end):
            out.append(("error", _clip(text[start:end])))
    if "$ " in text:
        out += [("command", _clip(m.group(1))) for m in _PROMPTED.finditer(text)]
    if "`" in text:
        out += [("string", m.group(1).strip()) for m in _BACKTICK.finditer(text)]
    # The words, each once, in the order of their last occurrence (the index keeps the newest
    # of each entry: an earlier occurrence of a word tells it nothing more).
    for word in reversed(tuple(dict.fromkeys(reversed(text.split())))):
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


def _call_entries(arguments: object) -> tuple[tuple[str, str], ...]:
    """The entries of a tool call's arguments: a command argument is a command; every other
    string value is read as text (never the keys) for the files, URLs, versions and strings it
    names. Its identifiers are not taken: they are the model's own choices (a query, a call's
    handle), while the identifiers worth keeping are in what was read and said."""
    if isinstance(arguments, str):
        return _arguments_entries(arguments)
    return _value_entries(arguments)


@lru_cache(maxsize=8192)
def _arguments_entries(arguments: str) -> tuple[tuple[str, str], ...]:
    try:
        value: object = json.loads(arguments)
    except ValueError:
        value = arguments
    return _value_entries(value)


def _value_entries(value: object) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for key, text in _strings(value):
        if key is not None and key.lower() in _COMMAND_KEYS and text.strip():
            out.append(("command", _clip(text.strip().splitlines()[0])))
        else:
            out.extend(entry for entry in _text_entries(text) if entry[0] != "identifier")
    return tuple(out)


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


def _texts_key(message: Message) -> tuple[str | None, tuple[object, ...]] | None:
    """What a message's entries depend on, hashable (its strings: Python keeps their hashes), or
    None when it is not that simple (parts, a legacy function call)."""
    content = message.get("content")
    if (content is not None and not isinstance(content, str)) or "function_call" in message:
        return None
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return (content, ())
    arguments = [c.get("function") if isinstance(c, Mapping) else None for c in calls]
    return (content, tuple(f.get("arguments") if isinstance(f, Mapping) else None for f in arguments))


def _key_entries(key: tuple[str | None, tuple[object, ...]]) -> list[tuple[str, str]]:
    content, arguments = key
    out = list(_text_entries(content)) if content else []
    for argument in arguments:
        out.extend(_call_entries(argument))
    return out


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
    keys = [_texts_key(m) for m in window[start:]]
    if all(key is not None for key in keys):
        return _indexed(tuple(keys), max_chars)
    return _select([message_entries(m) for m in window[start:]], max_chars)


@lru_cache(maxsize=64)
def _indexed(keys: tuple[tuple[str | None, tuple[object, ...]], ...], max_chars: int) -> SpanIndex:
    """``span_index`` of messages known by their texts, memoized (content-addressed: a resent
    conversation's index is read again, not made again; the same texts give the same index to
    anyone)."""
    return _select([_key_entries(key) for key in keys], max_chars)


def _select(entries: Sequence[Sequence[tuple[str, str]]], max_chars: int) -> SpanIndex:
    """The index of the messages whose ``entries`` (each message's, oldest message first) it
    reads."""
    # Each kind's entries, newest first, deduplicated; a kind stops collecting once it holds the
    # whole bound (no fair share could take more of it).
    queues: dict[str, list[tuple[str, str]]] = {kind: [] for kind in KINDS}
    collected = dict.fromkeys(KINDS, 0)
    seen: set[tuple[str, str]] = set()
    for found in reversed(entries):
        for entry in reversed(found):
            kind = entry[0]
            if collected[kind] >= max_chars or entry in seen or not entry[1]:
                continue
            seen.add(entry)
            queues[kind].append(entry)
            collected[kind] += len(entry[1]) + 2
    # Fair shares: the kind that has used the fewest characters takes its newest entry left that
    # fits (``KINDS`` order among equals), so a bound that binds leaves every kind about the same
    # room and the newest of each. An identifier that a longer identifier, path or URL kept holds
    # as a whole word already says nothing more ("module_5" of "src/module_5.py"); one that is
    # only part of a word there is another string ("FACT-c5" of "FACT-c5a") and is kept.
    kept: list[tuple[str, str]] = []
    names = ""
    used_by = dict.fromkeys(KINDS, 0)
    used = 0
    rank = {kind: n for n, kind in enumerate(KINDS)}
    heads = dict.fromkeys(KINDS, 0)
    active = [kind for kind in KINDS if queues[kind]]
    while active and used + _SMALLEST <= max_chars:
        kind = min(active, key=lambda k: (used_by[k], rank[k]))
        queue = queues[kind]
        while heads[kind] < len(queue):
            entry = queue[heads[kind]]  # the newest left
            heads[kind] += 1
            if kind == "identifier" and _said_in(entry[1], names):
                continue
            # A label line per kind, paid by its first entry.
            cost = _rendered_chars(kind, entry[1]) + (0 if used_by[kind] else _LABEL_CHARS[kind])
            if used + cost <= max_chars:
                kept.append(entry)
                if kind in ("identifier", "path", "url"):
                    names += "\0" + entry[1]
                used_by[kind] += cost
                used += cost
                break
        if heads[kind] >= len(queue):
            active.remove(kind)
    # Rendered by kind, oldest first (the order they were last seen in).
    order = {entry: n for n, entry in enumerate(e for queue in queues.values() for e in queue)}
    kept.sort(key=lambda e: (rank[e[0]], -order[e]))
    return SpanIndex(tuple(kept))


def _said_in(identifier: str, names: str) -> bool:
    """True when ``names`` (kept identifiers, paths and URLs) holds ``identifier`` as a whole word
    (no letter, digit or underscore either side of it)."""
    start = names.find(identifier)
    while start >= 0:
        end = start + len(identifier)
        before = names[start - 1] if start else "\0"
        after = names[end] if end < len(names) else "\0"
        if not (before.isalnum() or before == "_" or after.isalnum() or after == "_"):
            return True
        start = names.find(identifier, start + 1)
    return False


__all__ = ["KINDS", "SpanIndex", "identifiers", "message_entries", "span_index"]
