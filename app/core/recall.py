"""Recall: what a cut removed, named by a stable id and fetched back by the model (pure rules).

INTERFACE CONTRACT (the strategies, ``fit.py``, the dialects' recall shapes and ``app.service.recall``
rely on these names):

* ``RECALL_TOOL`` (``"ctx_recall"``), ``TOOL_DESCRIPTION`` and ``TOOL_PARAMETERS`` (a JSON schema:
  ``id``, a string, and ``page``, an integer from 1): the tool every dialect declares in its own
  shape, the same bytes on every request.
* ``recall_ref(text) -> str``: the id of a removed text, ``REF_HEX`` hex digits of its SHA-256: a
  pure function of the content (the same id for the same content, on any replica, so the prompt
  bytes stay stable). ``ref_suffix(ref)`` is what a placeholder, note, marker or memory heading
  adds (``"; recall id 3f9a0c12b4e5"``, empty for None); ``REF_PATTERN`` recognises it (group 1:
  the id).
* What an id stands for, as text (``message_text``, ``span_text``): a pruned tool result is its
  text (text parts joined by newlines; an image or another part as ``[type]``); a cut message
  is the whole text of the part that was cut; dropped messages and the messages a memory stands
  for are a transcript (``[role]`` then the text, tool calls as ``[calls NAME(ARGUMENTS)]``).
* ``Recallable`` (frozen): ``ref`` and ``text``, one removed thing of a plan;
  ``recallables(source, messages, origins, *, note_at, known)``: every one the fitted ``messages`` name
  (``origins[j]``: the input index of message ``j``, None for one the engine made; ``note_at``:
  the drop's note), found from the placeholders themselves and the input messages they replaced.
* ``page_chars_for(input_budget_tokens, share)``, ``page_of(text, page, *, page_chars)`` and
  ``recall_answer(ref, text, page, *, max_chars, page_chars)``: what the tool answers, paged:
  pages of ``page_chars`` characters at fixed offsets (a size that depends on the model's budget
  alone: the same page for the same content on every request), one page cut further to
  ``max_chars`` when the room in the window is smaller (it says so); an unknown id, a page past
  the last and no room at all each have their answer.
  Every answer starts with ``RECALLED_HEAD``: ``is_recalled(message)`` recognises it, and the
  strategies never prune or cut such a message (recalled content is never cut into a new
  placeholder of itself).
* ``parse_arguments(arguments) -> (ref | None, page)``: a call's arguments (a JSON string or an
  object), forgiving: a missing or bad page is page 1.
* ``is_compaction(messages) -> bool``: the newest user message is a client's own request to
  summarize the conversation (Claude Code, Codex, gemini-cli: ``COMPACTION_MARKERS``), where no
  tool is offered.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .messages import Message

RECALL_TOOL = "ctx_recall"
REF_HEX = 12
REF_PATTERN = rf"(?:; recall id ([0-9a-f]{{{REF_HEX}}}))?"
PAGE_CHARS = 24_000
# Characters a page holds per token of its room (text and code run 3-4 characters a token; a page
# of denser text is cut to the room, and says so).
CHARS_PER_TOKEN = 3
RECALLED_HEAD = "[ctxproxy: recalled "
# Below this, a page cut to the room would be mostly heading: the answer says there is no room.
MIN_PAGE_CHARS = 200

TOOL_DESCRIPTION = (
    "Fetch back content that ctxproxy removed from this conversation to fit the context window: a "
    "tool result, earlier messages, or the middle of a long message. Where the content was, the "
    "conversation says 'recall id' followed by the id to pass here. Long content comes in pages "
    "(page 1 first). Call it only when you need the exact removed content to continue."
)
TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The recall id written where the content was removed."},
        "page": {"type": "integer", "minimum": 1, "description": "Page of a long content (default 1)."},
    },
    "required": ["id"],
}

# The clients' own requests to summarize their conversation (no tool is offered there), found in
# their newest user message: Claude Code's compact prompt (its binary, 2.1.x: "CRITICAL: Respond
# with TEXT ONLY..." then "Your task is to create a detailed summary of ..."), Codex's local
# compaction prompt (codex-rs core/templates/compact/prompt.md) and gemini-cli's compression turn
# (chatCompressionService: its system instruction "... distilling chat history into a structured
# XML <state_snapshot>", its turn "... generate the <state_snapshot>.", its check "Critically
# evaluate the <state_snapshot> ..."; the snapshot it leaves in the history matches none).
# Codex's remote compaction (POST /v1/responses/compact) is not a fitted route: it passes through.
COMPACTION_MARKERS: tuple[str, ...] = (
    "Your task is to create a detailed summary of",
    "CRITICAL: Respond with TEXT ONLY",
    "You are performing a CONTEXT CHECKPOINT COMPACTION",
    "generate the <state_snapshot>",
    "generate the updated <state_snapshot>",
    "Critically evaluate the <state_snapshot>",
    "chat history into a structured XML <state_snapshot>",
)
_MARKER_SCAN_CHARS = 4_000
_IMAGE_TYPES = frozenset({"image_url", "input_image", "image"})
_REF_ANYWHERE = re.compile(rf"; recall id ([0-9a-f]{{{REF_HEX}}})")


def recall_ref(text: str) -> str:
    """The id of ``text``: the first ``REF_HEX`` hex digits of its SHA-256 (UTF-8, lone
    surrogates kept)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:REF_HEX]


def ref_suffix(ref: str | None) -> str:
    """What a placeholder adds to name what it stands for (empty without an id)."""
    return f"; recall id {ref}" if ref else ""


def refs_in(text: str) -> list[str]:
    """Every id named in ``text``, in order."""
    return _REF_ANYWHERE.findall(text)


def _part_text(part: object) -> str:
    if not isinstance(part, Mapping):
        return ""
    text = part.get("text")
    if isinstance(text, str) and part.get("type", "text") == "text":
        return text
    kind = part.get("type")
    if kind in _IMAGE_TYPES:
        return "[image]"
    return f"[{kind}]" if isinstance(kind, str) else "[part]"


def content_text(content: object) -> str:
    """The text of a message's content: a string as it is, parts joined by newlines (a text part's
    text; any other part as ``[type]``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(part) for part in content)
    return ""


def message_text(message: Mapping[str, Any]) -> str:
    """A neutral message as text: its content, then each tool call as ``[calls NAME(ARGUMENTS)]``
    (a ``ctx_recall`` call is not the conversation's: left out)."""
    lines = [content_text(message.get("content"))]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and function.get("name") != RECALL_TOOL:
            lines.append(f"[calls {function.get('name')}({function.get('arguments')})]")
    return "\n".join(line for line in lines if line)


def span_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Several neutral messages as a transcript: ``[role]`` and the message's text, each; a
    recall's turns (a ``ctx_recall`` call and its answer, which only the proxy's rounds hold) are
    left out, so recalled content never stands in a new placeholder of itself."""
    return "\n\n".join(entry for entry in map(_transcript_entry, messages) if entry is not None)


def _transcript_entry(message: Mapping[str, Any]) -> str | None:
    """One message's entry in a transcript (``span_text``, ``prefix_refs``), None for a recall's
    turn (left out)."""
    if is_recalled(message) or _calls_recall(message):
        return None
    return f"[{message.get('role')}]\n{message_text(message)}"


def prefix_refs(groups: Sequence[Sequence[tuple[int, Mapping[str, Any]]]]) -> list[str]:
    """``[recall_ref(span_text(the first k groups' messages in position order)) for k in
    0..len(groups)]`` (``groups``: (position, message) pairs), in one pass: the transcript of the
    first ``k`` groups begins that of the first ``k + 1``, so one SHA-256 carried along names every
    prefix (a giant drop's levels are not each hashed again). A message placed before one already
    hashed (a user message that goes with its turn's last part: ``strategies._drop_levels``)
    rewinds to the last group end before it, and what follows is hashed again."""
    digest = hashlib.sha256()
    first = True
    fed: list[tuple[int, Mapping[str, Any]]] = []
    marks = [(0, digest.copy(), True)]  # (len(fed), digest, first) at each group end before any rewind
    refs = [digest.hexdigest()[:REF_HEX]]
    for group in groups:
        pending = sorted(group, key=_position)
        if pending and fed and pending[0][0] < fed[-1][0]:
            while marks[-1][0] and fed[marks[-1][0] - 1][0] > pending[0][0]:
                marks.pop()
            at, saved, first = marks[-1]
            digest = saved.copy()
            pending = sorted([*fed[at:], *pending], key=_position)
            del fed[at:]
        for item in pending:
            fed.append(item)
            entry = _transcript_entry(item[1])
            if entry is None:
                continue
            digest.update((entry if first else "\n\n" + entry).encode("utf-8", "surrogatepass"))
            first = False
        marks.append((len(fed), digest.copy(), first))
        refs.append(digest.hexdigest()[:REF_HEX])
    return refs


def _position(item: tuple[int, Mapping[str, Any]]) -> int:
    return item[0]


def _calls_recall(message: Mapping[str, Any]) -> bool:
    calls = message.get("tool_calls")
    return isinstance(calls, list) and any(
        isinstance(c, Mapping)
        and isinstance(c.get("function"), Mapping)
        and c["function"].get("name") == RECALL_TOOL
        for c in calls
    )


@dataclass(frozen=True, slots=True)
class Recallable:
    """One thing a plan removed: its id and its text."""

    ref: str
    text: str


def _slot_texts(message: Mapping[str, Any]) -> dict[int | None, str]:
    content = message.get("content")
    if isinstance(content, str):
        return {None: content}
    if isinstance(content, list):
        return {
            k: part["text"]
            for k, part in enumerate(content)
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        }
    return {}


def recallables(
    source: Sequence[Message],
    messages: Sequence[Message],
    origins: Sequence[int | None],
    *,
    note_at: int | None = None,
    known: Sequence[Recallable] = (),
) -> tuple[Recallable, ...]:
    """Every id the fitted ``messages`` name, with the text it stands for, from the input
    ``source``: an id in a changed message's text (that its input did not name) stands for the
    input's whole content (a pruned tool result) or for the input text of the same part (a
    cut); the drop's note stands for the input messages no fitted message comes from. Each id
    once, in order; an id whose text is not found (the client's own words) is left out.
    ``known``: removed things whose texts are already made (the memory's transcript): an id of
    the note found there takes that text (the same id is the same text) instead of the
    transcript being made and hashed again."""
    found: dict[str, str] = {}
    for j, message in enumerate(messages):
        origin = origins[j] if j < len(origins) else None
        if origin is None or message is source[origin]:
            continue
        original = source[origin]
        before = _slot_texts(original)
        for slot, text in _slot_texts(message).items():
            old = before.get(slot)
            if old == text:
                continue
            candidates = [content_text(original.get("content")), *([old] if old is not None else [])]
            for ref in refs_in(text):
                if ref in found or (old is not None and ref in old):
                    continue
                match = next((c for c in candidates if recall_ref(c) == ref), None)
                if match is not None:
                    found[ref] = match
    if note_at is not None and note_at < len(messages):
        note = messages[note_at].get("content")
        made = {r.ref: r.text for r in known}
        transcript: str | None = None
        for ref in refs_in(note) if isinstance(note, str) else []:
            if ref not in made and transcript is None:
                kept = {o for o in origins if o is not None}
                transcript = span_text([source[i] for i in range(len(source)) if i not in kept])
                made[recall_ref(transcript)] = transcript
            if ref in made:
                found.setdefault(ref, made[ref])
    return tuple(Recallable(ref, text) for ref, text in found.items())


@dataclass(frozen=True, slots=True)
class Page:
    """Page ``number`` (from 1) of ``pages``: characters ``[start, stop)`` of the whole."""

    number: int
    pages: int
    start: int
    stop: int


def page_of(text: str, page: int, *, page_chars: int = PAGE_CHARS) -> Page | None:
    """Page ``page`` of ``text`` (fixed offsets), None past the last one."""
    pages = max(1, -(-len(text) // page_chars))
    if page < 1 or page > pages:
        return None
    start = (page - 1) * page_chars
    return Page(page, pages, start, min(len(text), start + page_chars))


def page_chars_for(input_budget_tokens: int, share: float) -> int:
    """The page size of a model's recalls: ``share`` of its input budget at ``CHARS_PER_TOKEN``,
    between ``MIN_PAGE_CHARS`` and ``PAGE_CHARS`` (a function of the budget alone, so the pages
    of one content are numbered the same on every request of a conversation)."""
    return max(MIN_PAGE_CHARS, min(PAGE_CHARS, int(input_budget_tokens * share * CHARS_PER_TOKEN)))


def recall_answer(
    ref: str | None, text: str | None, page: int, *, max_chars: int, page_chars: int = PAGE_CHARS
) -> tuple[str, bool]:
    """What ``ctx_recall`` answers for ``ref`` (``text``: what it stands for, None when unknown),
    and whether it is a miss: page ``page`` of ``page_chars`` characters, cut to ``max_chars``
    characters when the room is smaller than a page (the answer says so)."""
    shown = ref if ref else "(none)"
    if text is None:
        return (
            f"{RECALLED_HEAD}nothing for recall id {shown}: it is not known here (it may have "
            "expired). Continue with what the conversation shows.]",
            True,
        )
    found = page_of(text, page, page_chars=page_chars)
    if found is None:
        pages = page_of(text, 1, page_chars=page_chars)
        total = pages.pages if pages is not None else 1
        return (f"{RECALLED_HEAD}recall id {shown} has {total} page(s); page {page} does not exist.]", True)
    if max_chars < MIN_PAGE_CHARS:
        return (
            f"{RECALLED_HEAD}recall id {shown} holds {len(text):,} characters; none of it fits in the "
            "context window now. Continue with what the conversation shows.]",
            True,
        )
    stop = min(found.stop, found.start + max_chars)
    head = (
        f"{RECALLED_HEAD}recall id {shown}, page {found.number} of {found.pages}, characters "
        f"{found.start + 1:,}-{stop:,} of {len(text):,}"
    )
    if stop < found.stop:
        head += "; the rest of this page does not fit in the context window now"
    elif found.number < found.pages:
        head += f"; page {found.number + 1} holds the next"
    return f"{head}]\n{text[found.start : stop]}", False


def is_recalled(message: Mapping[str, Any]) -> bool:
    """True for a tool result that is a recall's answer (never pruned or cut again)."""
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        content = content[0].get("text")
    return isinstance(content, str) and content.startswith(RECALLED_HEAD)


def parse_arguments(arguments: object) -> tuple[str | None, int]:
    """``(id, page)`` of a call's arguments (a JSON object or its text); page 1 when absent."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None, 1
    if not isinstance(arguments, Mapping):
        return None, 1
    ref = arguments.get("id")
    page = arguments.get("page", 1)
    if isinstance(page, str) and page.strip().isdigit():
        page = int(page)
    if type(page) is not int or page < 1:
        page = 1
    return (ref.strip().lower() if isinstance(ref, str) and ref.strip() else None), page


def is_compaction(messages: Sequence[Mapping[str, Any]]) -> bool:
    """True when the newest user message, or the system prompt (gemini-cli's), asks for a summary
    of the conversation in a client's own words (``COMPACTION_MARKERS``)."""
    newest = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    first = messages[0] if messages and messages[0].get("role") in ("system", "developer") else None
    for message in (newest, first):
        if message is not None:
            text = content_text(message.get("content"))[:_MARKER_SCAN_CHARS]
            if any(marker in text for marker in COMPACTION_MARKERS):
                return True
    return False
