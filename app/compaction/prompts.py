"""The summarizer's prompts, versioned, and the rendering of chat messages to plain text.

``PROMPT_VERSION`` is part of every summary cache key: change any prompt text below and bump it,
so summaries written under the old wording are never mistaken for new ones.

Three requests exist, each a ``system`` + ``user`` message pair, the system prompt asking for at
most ``words_for(reply_tokens)`` words:

* ``summarize_messages(transcript, previous_summary=, reply_tokens=)``: the normal case; one
  handoff summary of the transcript, folding in the summary of everything before it (rolling
  compaction);
* ``chunk_messages(transcript, part=, parts=, reply_tokens=)``: one part of a span too large for
  one request;
* ``merge_messages(summaries, reply_tokens=)``: merges partial summaries (and a previous summary)
  into one.

The summary is asked for in ``SECTIONS`` (the user's requests, files and what each showed,
commands and their outcomes, decisions, errors, open tasks, other facts), most important first,
the last ones shortened or left out first when there is more than the size asked; the exact
strings are not to be listed (the memory's index, ``app.core.span_index``, holds them).
``truncate_sections(summary, cap_tokens=, count_text=)`` enforces that order on a reply over its
size; ``section_of(line)`` reads a heading.

Rendering (``render_message``) turns a wire message into text the summarizer can read: the role,
the text parts, the reasoning (thinking parts, as ``[thinking] ...``: source material), tool calls
with their names and arguments, tool results with the call they answer; images, audio and files
become short markers (``[image]``) so no binary data is ever sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

PROMPT_VERSION = "handoff-v2"
SYSTEM_MARKER = "You write handoff summaries of earlier parts of a conversation"
"""The start of every summary request's system prompt: lets a test upstream recognise one."""

SECTIONS: tuple[str, ...] = (
    "User requests",
    "Files",
    "Commands",
    "Decisions",
    "Errors",
    "Open tasks",
    "Facts",
)
"""The summary's sections, most important first: when a summary is over its size, the last ones
go first (``truncate_sections``). The order follows what agents' own compaction prompts keep
first: Claude Code's (primary request, files and code, errors and fixes, all user messages,
pending tasks), Codex's handoff (progress and decisions, constraints, next steps, critical data)
and gemini-cli's state snapshot (overall goal, key knowledge, file system state, recent actions,
current plan)."""

_SYSTEM = (
    "You write handoff summaries of earlier parts of a conversation between a user and an AI "
    "assistant (possibly with tool calls): the summary replaces those messages, so another "
    "assistant must be able to continue the work from it alone.\n"
    "Write these sections in this order, each a line '## <name>' and short bullet points; leave "
    "out an empty one:\n"
    "## User requests: the user's requests and instructions, in their words when short\n"
    "## Files: each file read or changed, what it showed or what changed\n"
    "## Commands: each command run and its outcome\n"
    "## Decisions: what was decided and why\n"
    "## Errors: errors seen and whether they were fixed\n"
    "## Open tasks: what remains, the next step first\n"
    "## Facts: anything else established\n"
    "Stay under {words} words; with more, shorten or drop the last sections first. The assistant's "
    "reasoning ([thinking] lines) is source material. Exact strings (identifiers, paths, commands, "
    "URLs, versions, error lines) are kept in an index beside the summary: do not list them, name "
    "one only to say what it is. Never invent a name, number or code. No preamble; write only the "
    "summary."
)
_SUMMARIZE = (
    "Summarize the conversation below.{previous_hint}\n\n"
    "{previous}<conversation>\n{transcript}\n</conversation>"
)
_PREVIOUS_HINT = (
    " A summary of what came before it is given first: produce one summary that covers both, "
    "keeping every still-relevant point of the earlier summary."
)

_CHUNK = (
    "Below is part {part} of {parts} of a conversation that is too long to read at once. "
    "Summarize this part only; the parts' summaries will be merged later.\n\n"
    "<conversation_part>\n{transcript}\n</conversation_part>"
)

_MERGE = (
    "Below are {count} summaries of consecutive parts of one conversation, oldest first. Merge "
    "them into a single handoff summary. Later parts override earlier ones where they conflict; "
    "keep every identifier and number verbatim.\n\n{summaries}"
)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


WORDS_PER_TOKEN = 0.6


def words_for(reply_tokens: int) -> int:
    """The words a summary of at most ``reply_tokens`` tokens is asked to stay under (a word is
    about 1.3 tokens of English; a little under, so a model that overshoots still fits)."""
    return max(20, int(reply_tokens * WORDS_PER_TOKEN))


def _system(reply_tokens: int) -> dict[str, Any]:
    return {"role": "system", "content": _SYSTEM.format(words=words_for(reply_tokens))}


def summarize_messages(
    transcript: str, *, previous_summary: str | None = None, reply_tokens: int = 1024
) -> list[dict[str, Any]]:
    """The request that summarizes ``transcript`` (folding in ``previous_summary`` when given) in
    at most ``reply_tokens``."""
    previous = f"<previous_summary>\n{previous_summary}\n</previous_summary>\n\n" if previous_summary else ""
    text = _SUMMARIZE.format(
        previous_hint=_PREVIOUS_HINT if previous_summary else "", previous=previous, transcript=transcript
    )
    return [_system(reply_tokens), _user(text)]


def chunk_messages(
    transcript: str, *, part: int, parts: int, reply_tokens: int = 1024
) -> list[dict[str, Any]]:
    """The request that summarizes part ``part`` (1-based) of ``parts`` of an oversized span."""
    return [_system(reply_tokens), _user(_CHUNK.format(part=part, parts=parts, transcript=transcript))]


def merge_messages(summaries: Sequence[str], *, reply_tokens: int = 1024) -> list[dict[str, Any]]:
    """The request that merges ``summaries`` (oldest first) into one."""
    body = "\n\n".join(
        f'<summary part="{i}">\n{text}\n</summary>' for i, text in enumerate(summaries, start=1)
    )
    return [_system(reply_tokens), _user(_MERGE.format(count=len(summaries), summaries=body))]


_HEADING = re.compile(r"^\s*(?:#{1,6}\s*|\*\*)?([A-Za-z][A-Za-z ]{1,40}?)(?:\*\*)?\s*:?\s*(?:\*\*)?\s*$")


def section_of(line: str) -> int | None:
    """The index in ``SECTIONS`` of a heading line (``## Files``, ``**Files:**``, ``Files:``), or
    None for any other line."""
    match = _HEADING.match(line)
    if match is None:
        return None
    name = match.group(1).strip().lower()
    for n, section in enumerate(SECTIONS):
        if name == section.lower():
            return n
    return None


def truncate_sections(summary: str, *, cap_tokens: int, count_text: Callable[[str], int]) -> str:
    """``summary`` within ``cap_tokens``: unchanged when it fits; else its lowest-priority sections
    (the last of ``SECTIONS``) dropped first, then, in the lowest section left, its last lines; when
    not even the first of them fits, that line cut at a word. Text before the first heading counts
    as the first section's."""
    if count_text(summary) <= cap_tokens:
        return summary
    blocks: list[tuple[int, list[str]]] = []
    for line in summary.splitlines():
        section = section_of(line)
        if section is not None or not blocks:
            blocks.append((section if section is not None else 0, [line]))
        else:
            blocks[-1][1].append(line)
    order = sorted(range(len(blocks)), key=lambda b: (blocks[b][0], b))

    def text(kept: list[int], last_lines: int | None = None) -> str:
        out: list[str] = []
        for b in sorted(kept):
            lines = blocks[b][1]
            if last_lines is not None and b == kept[-1]:
                lines = lines[:last_lines]
            out.extend(lines)
        return "\n".join(out).strip()

    kept: list[int] = []
    for b in order:
        if count_text(text([*kept, b])) > cap_tokens:
            least = 2 if section_of(blocks[b][1][0]) is not None else 1  # a heading needs a line
            for n in range(len(blocks[b][1]) - 1, least - 1, -1):
                candidate = text([*kept, b], last_lines=n)
                if count_text(candidate) <= cap_tokens:
                    return candidate
            if not kept:  # not even the first line: the most of it that fits, at a word
                return _cut_at_word(text([b], last_lines=least), cap_tokens, count_text)
            break
        kept.append(b)
    return text(kept)


def _cut_at_word(text: str, cap_tokens: int, count_text: Callable[[str], int]) -> str:
    words = text.split(" ")
    low, high = 0, len(words)
    while low < high:  # the most words that fit
        mid = (low + high + 1) // 2
        if count_text(" ".join(words[:mid])) <= cap_tokens:
            low = mid
        else:
            high = mid - 1
    return " ".join(words[:low]).strip()


_PART_MARKERS = {
    "image_url": "[image]",
    "input_image": "[image]",
    "image": "[image]",
    "input_audio": "[audio]",
    "audio": "[audio]",
    "file": "[file]",
    "input_file": "[file]",
}


def render_content(content: object) -> str:
    """A message's content as text: strings as is, text parts joined, media as markers."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return str(content)
    pieces: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        kind = str(part.get("type", ""))
        if isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif isinstance(part.get("thinking"), str):
            if part["thinking"].strip():
                pieces.append(f"[thinking] {part['thinking']}")
        elif isinstance(part.get("refusal"), str):
            pieces.append(f"[refusal] {part['refusal']}")
        elif kind in _PART_MARKERS:
            marker = _PART_MARKERS[kind]
            name = part.get("file", {}).get("filename") if isinstance(part.get("file"), Mapping) else None
            pieces.append(f"[file: {name}]" if name and marker == "[file]" else marker)
        else:
            pieces.append(f"[{kind or 'part'}]")
    return "\n".join(pieces)


def _call_text(function: object) -> str:
    if not isinstance(function, Mapping):
        return "?()"
    name = function.get("name", "?")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
    return f"{name}({arguments})"


def render_message(message: Mapping[str, Any], *, call_names: Mapping[str, str] | None = None) -> str:
    """One message as text; ``call_names`` maps tool-call ids to function names for tool results."""
    role = str(message.get("role", "unknown"))
    label = role
    if isinstance(message.get("name"), str) and message["name"]:
        label = f"{role} ({message['name']})"
    lines: list[str] = []
    if role == "tool":
        call_id = str(message.get("tool_call_id", "?"))
        name = (call_names or {}).get(call_id)
        label = f"tool result for {name} [{call_id}]" if name else f"tool result [{call_id}]"
    text = render_content(message.get("content"))
    lines.append(f"[{label}]: {text}" if text else f"[{label}]")
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, Mapping):
                lines.append(f"  -> tool call {_call_text(call.get('function'))} [{call.get('id', '?')}]")
    if isinstance(message.get("function_call"), Mapping):
        lines.append(f"  -> function call {_call_text(message['function_call'])}")
    return "\n".join(lines)


def render_messages(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each message rendered on its own (tool results named after the calls they answer)."""
    call_names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
                    call_names[str(call.get("id"))] = str(call["function"].get("name", "?"))
    return [render_message(m, call_names=call_names) for m in messages]
