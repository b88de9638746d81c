"""Anthropic Messages bodies back from neutral messages, and the structural rules they must keep.

INTERFACE CONTRACT (``messages.py`` wraps these as ``MESSAGES.render`` / ``MESSAGES.problems``):

* ``render_messages(body, messages) -> dict``: ``body`` with ``messages`` (and ``system`` when it
  changed) rebuilt from the fitted neutral messages that ``messages.MessagesDialect.parse`` made of
  it. Every other key is kept as is.
* ``wire_problems(body) -> list[str]``: the rules below that ``body`` breaks, sorted, each once,
  worded without positions.
* ``SYSTEM_INDEX``: the origin index of the top-level ``system`` (``[[-1]]`` or ``[[-1, k]]``).

Rendering rules:

* A kept block is the body's own object (its JSON untouched); a wire message whose blocks are all
  kept, in order, is the body's own message object. A changed block (text cut, image or tool
  result replaced by a placeholder) keeps the ``cache_control`` of the block it replaces.
* An opaque assistant message (thinking) is written as the body's own message, never merged with
  another or edited (not even a cache marker).
* Adjacent messages of one role are merged (Anthropic alternates roles): in a user message the
  ``tool_result`` blocks come first, in their order, then the other blocks. Two adjacent
  assistant messages of which one is opaque get a short user separator between them instead.
* A note or summary of the engine becomes a text block on the user side: in the user message
  before it, or the one after it (after that message's results), or as its own user message
  between two assistant messages; so roles alternate and the first message stays a user message
  (when the output would open with an assistant message and the input did not, a separator user
  message is put first).
* ``cache_control``: the engine keeps every marker of a kept block. A marked block that was
  dropped hands its marker to the last kept block before it (in wire order: the note that stands
  for the dropped span, or the newest kept block before that span), unless that block already has
  a marker, sits in an opaque message, is a thinking block, or the body would then carry more
  than ``MAX_CACHE_BREAKPOINTS``. So caching keeps covering the prefix that stays.

Structural rules (``wire_problems``): the first non-system message is a user message; no two
adjacent user (or assistant) messages; a ``role: "system"`` message after a user message (with
only system messages between);
every ``tool_use`` answered by its ``tool_result`` in the very next message, which is a user
message; no ``tool_result`` without its ``tool_use`` in the message just before; the
``tool_result`` blocks first in their message; at most ``MAX_CACHE_BREAKPOINTS`` markers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..conversation import RESERVED_KEYS, is_opaque, origin_of
from ..messages import Message

SYSTEM_INDEX = -1
MAX_CACHE_BREAKPOINTS = 4
SEPARATOR_TEXT = "[ctxproxy: earlier messages were removed here to fit the context window]"
_UNMARKABLE: frozenset[str] = frozenset({"thinking", "redacted_thinking"})

Block = Any  # a content block (a dict), or a plain string in a string-content message
Key = tuple[int, int, int]


@dataclass(slots=True)
class _Wire:
    """One output message under construction; ``keys`` give each block's original position."""

    role: str
    blocks: list[Block] | str
    keys: list[Key] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    frozen: bool = False


def _strip(part: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in part.items() if k not in RESERVED_KEYS}


def _back_block(part: Any, orig: Any) -> Any:
    """A neutral part as a wire block: the original object when unchanged."""
    if orig is not None and part is orig:
        return orig
    if not isinstance(part, Mapping):
        return part
    new = _strip(part)
    if isinstance(orig, Mapping):
        if new == orig:
            return orig
        if "cache_control" in orig and "cache_control" not in new:
            new["cache_control"] = orig["cache_control"]
    return new


def _text_of(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _back_parts(
    message: Message, orig_content: object, paths: Sequence[tuple[int, ...]]
) -> tuple[list[Block] | str, list[Key]]:
    """The blocks of a user/system neutral message whose parts map one-to-one onto ``paths``."""
    content = message.get("content")
    if len(paths) == 1 and len(paths[0]) == 1:  # the whole message: string content (or empty)
        index = paths[0][0]
        if isinstance(content, str):
            return content, [(index, 0, 0)]
        parts = list(content or [])
        return [_back_block(p, None) for p in parts], [(index, k, 0) for k in range(len(parts))]
    originals = orig_content if isinstance(orig_content, list) else []
    if isinstance(content, str):  # never made by the strategies; kept valid anyway
        return [{"type": "text", "text": content}], [(*paths[0][:2], 0)]  # type: ignore[list-item]
    blocks: list[Block] = []
    keys: list[Key] = []
    for j, part in enumerate(content or []):
        path = paths[j] if j < len(paths) else paths[-1]
        orig = originals[path[1]] if len(path) > 1 and path[1] < len(originals) else None
        blocks.append(_back_block(part, orig))
        keys.append((path[0], path[1] if len(path) > 1 else 0, 0))
    return blocks, keys


def _back_tool(message: Message, orig_block: Mapping[str, Any]) -> Block:
    content = message.get("content")
    inner = orig_block.get("content")
    if isinstance(content, str):
        if content == inner or (inner is None and content == ""):
            return orig_block
        return {**orig_block, "content": content}
    if not isinstance(content, list):
        return orig_block
    originals = inner if isinstance(inner, list) else []
    back = [_back_block(p, originals[j] if j < len(originals) else None) for j, p in enumerate(content)]
    if len(back) == len(originals) and all(a is b for a, b in zip(back, originals, strict=True)):
        return orig_block
    return {**orig_block, "content": back}


def _back_assistant(
    message: Message, orig_content: list[Any], paths: Sequence[tuple[int, ...]]
) -> tuple[list[Block], list[Key]]:
    calls = message.get("tool_calls")
    call_ids = {str(c.get("id")) for c in calls or [] if isinstance(c, Mapping)}
    parts = list(message.get("content") or [])
    blocks: list[Block] = []
    keys: list[Key] = []
    j = 0
    for path in paths:
        if len(path) < 2 or path[1] >= len(orig_content):
            continue
        orig = orig_content[path[1]]
        if isinstance(orig, Mapping) and orig.get("type") == "tool_use":
            if str(orig.get("id")) in call_ids:
                blocks.append(orig)
                keys.append((path[0], path[1], 0))
            continue
        if j < len(parts):
            blocks.append(_back_block(parts[j], orig))
            keys.append((path[0], path[1], 0))
            j += 1
    return blocks, keys


def _segments(body: Mapping[str, Any], messages: Sequence[Message]) -> tuple[list[_Wire], object]:
    """One ``_Wire`` per neutral message (not merged yet), and the ``system`` to send."""
    originals: list[Any] = body.get("messages") or []
    system: object = body.get("system")
    out: list[_Wire] = []
    last_key: Key = (SYSTEM_INDEX - 1, 0, 0)
    for message in messages:
        origin = origin_of(message)
        if not origin:
            out.append(_Wire("user", [{"type": "text", "text": _text_of(message)}], [(*last_key[:2], 1)]))
            continue
        index = origin[0][0]
        role = message.get("role")
        if index == SYSTEM_INDEX:
            if not (isinstance(system, str) and message.get("content") == system):
                system, _ = _back_parts(message, system, origin)
            continue
        if not 0 <= index < len(originals):
            continue
        orig_message = originals[index]
        orig_content = orig_message.get("content")
        if role == "assistant" and is_opaque(message):
            count = len(orig_content) if isinstance(orig_content, list) else 1
            keys = [(index, k, 0) for k in range(count)]
            out.append(_Wire("assistant", orig_content, keys, [index], frozen=True))
        elif role == "assistant" and isinstance(orig_content, list) and len(origin[0]) > 1:
            blocks, keys = _back_assistant(message, orig_content, origin)
            out.append(_Wire("assistant", blocks, keys, [index]))
        elif role == "tool":
            k = origin[0][1] if len(origin[0]) > 1 else 0
            block = _back_tool(message, orig_content[k])
            out.append(_Wire("user", [block], [(index, k, 0)], [index]))
        else:
            wire_role = "system" if role == "system" else "assistant" if role == "assistant" else "user"
            content, keys = _back_parts(message, orig_content, origin)
            out.append(_Wire(wire_role, content, keys, [index]))
        if out[-1].keys:
            last_key = max(out[-1].keys)
    return out, system


def _as_blocks(blocks: list[Block] | str) -> list[Block]:
    return [{"type": "text", "text": blocks}] if isinstance(blocks, str) else list(blocks)


def _merge_user(a: _Wire, b: _Wire) -> _Wire:
    pairs = list(zip(_as_blocks(a.blocks), a.keys or [(0, 0, 0)], strict=False))
    pairs += list(zip(_as_blocks(b.blocks), b.keys or [(0, 0, 0)], strict=False))
    results = [p for p in pairs if _is_result(p[0])]
    others = [p for p in pairs if not _is_result(p[0])]
    ordered = results + others
    return _Wire("user", [p[0] for p in ordered], [p[1] for p in ordered], a.sources + b.sources)


def _is_result(block: Block) -> bool:
    return isinstance(block, Mapping) and block.get("type") == "tool_result"


def _separator(key: Key) -> _Wire:
    return _Wire("user", [{"type": "text", "text": SEPARATOR_TEXT}], [key])


def _merge(segments: list[_Wire], *, input_opens_with_assistant: bool) -> list[_Wire]:
    out: list[_Wire] = []
    for seg in segments:
        prev = out[-1] if out else None
        if prev is None or seg.role == "system" or prev.role != seg.role:
            out.append(seg)
        elif seg.role == "user":
            out[-1] = _merge_user(prev, seg)
        elif prev.frozen or seg.frozen:
            out.append(_separator((*(prev.keys[-1] if prev.keys else (0, 0, 0))[:2], 1)))
            out.append(seg)
        else:
            keys = prev.keys + seg.keys
            blocks = _as_blocks(prev.blocks) + _as_blocks(seg.blocks)
            out[-1] = _Wire("assistant", blocks, keys, prev.sources + seg.sources)
    first = next((w for w in out if w.role != "system"), None)
    if first is not None and first.role == "assistant" and not input_opens_with_assistant:
        out.insert(0, _separator((SYSTEM_INDEX, 0, 1)))
    return out


def _markers(body: Mapping[str, Any], wires: Sequence[_Wire], system: object) -> int:
    count = sum(1 for t in body.get("tools") or [] if isinstance(t, Mapping) and "cache_control" in t)
    if isinstance(system, list):
        count += sum(1 for b in system if isinstance(b, Mapping) and "cache_control" in b)
    for wire in wires:
        count += _block_markers(wire.blocks)
    return count


def _block_markers(blocks: object) -> int:
    count = 0
    if isinstance(blocks, list):
        for block in blocks:
            if isinstance(block, Mapping):
                count += "cache_control" in block
                if block.get("type") == "tool_result":
                    count += _block_markers(block.get("content"))
    return count


def _move_markers(body: Mapping[str, Any], wires: list[_Wire], system: object) -> None:
    """Hand each dropped block's ``cache_control`` to the last kept block before it (in place on
    ``wires``, whose block lists are ours; blocks themselves are replaced, never mutated)."""
    kept = {key[:2] for wire in wires for key in wire.keys if key[2] == 0}
    dropped: list[tuple[Key, Any]] = []
    for i, message in enumerate(body.get("messages") or []):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for k, block in enumerate(content):
                if isinstance(block, Mapping) and "cache_control" in block and (i, k) not in kept:
                    dropped.append(((i, k, 0), block["cache_control"]))
    for key, marker in dropped:
        best: tuple[Key, int, int] | None = None
        for w, wire in enumerate(wires):
            if wire.frozen or isinstance(wire.blocks, str):
                continue
            for b, (block, block_key) in enumerate(zip(wire.blocks, wire.keys, strict=False)):
                eligible = isinstance(block, Mapping) and block.get("type") not in _UNMARKABLE
                if eligible and block_key < key and (best is None or block_key > best[0]):
                    best = (block_key, w, b)
        if best is None:
            continue
        _, w, b = best
        blocks = wires[w].blocks
        assert isinstance(blocks, list)
        target = blocks[b]
        if "cache_control" in target or _markers(body, wires, system) >= MAX_CACHE_BREAKPOINTS:
            continue
        blocks[b] = {**target, "cache_control": marker}


def _emit(wire: _Wire, originals: Sequence[Any]) -> dict[str, Any]:
    if len(set(wire.sources)) == 1:
        orig = originals[wire.sources[0]]
        content = orig.get("content")
        if wire.blocks is content or (isinstance(wire.blocks, str) and wire.blocks == content):
            return dict(orig) if not isinstance(orig, dict) else orig
        if (
            isinstance(content, list)
            and isinstance(wire.blocks, list)
            and len(content) == len(wire.blocks)
            and all(a is b for a, b in zip(content, wire.blocks, strict=True))
        ):
            return orig  # type: ignore[no-any-return]
        if orig.get("role") == wire.role:
            return {**orig, "content": wire.blocks}
    return {"role": wire.role, "content": wire.blocks}


def render_messages(body: Mapping[str, Any], messages: Sequence[Message]) -> dict[str, Any]:
    """``body`` with its conversation replaced by the fitted neutral ``messages``."""
    originals: list[Any] = body.get("messages") or []
    segments, system = _segments(body, messages)
    opens = next((m.get("role") for m in originals if m.get("role") != "system"), None) == "assistant"
    wires = _merge(segments, input_opens_with_assistant=opens)
    for wire in wires:
        if isinstance(wire.blocks, list) and not wire.frozen:
            wire.blocks = list(wire.blocks)
    _move_markers(body, wires, system)
    out = {**body, "messages": [_emit(w, originals) for w in wires]}
    if "system" in body:
        out["system"] = system
    return out


def _blocks_of(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _result_ids(message: Mapping[str, Any]) -> set[str]:
    return {str(b.get("tool_use_id")) for b in _blocks_of(message) if b.get("type") == "tool_result"}


def wire_problems(body: Mapping[str, Any]) -> list[str]:
    """The structural rules ``body`` breaks (see the module docstring), position-free."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ["messages is not a list"]
    problems: set[str] = set()
    roles = [m.get("role") if isinstance(m, Mapping) else None for m in messages]
    first = next((r for r in roles if r != "system"), None)
    if first is not None and first != "user":
        problems.add("the first message is not a user message")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            problems.add("a message is not an object")
            continue
        role = roles[i]
        prev = roles[i - 1] if i else None
        spoken = next((r for r in reversed(roles[:i]) if r != "system"), None)
        if role == "system" and spoken != "user":
            problems.add("a system message does not follow a user message")
        if role in ("user", "assistant") and prev == role:
            problems.add(f"two adjacent {role} messages")
        blocks = _blocks_of(message)
        if role == "assistant":
            ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            if ids and i + 1 < len(messages):
                following = messages[i + 1]
                answered = (
                    _result_ids(following)
                    if isinstance(following, Mapping) and following.get("role") == "user"
                    else set()
                )
                for missing in sorted(set(ids) - answered):
                    problems.add(f"tool_use {missing!r} has no tool_result in the next message")
        if role == "user":
            asked: set[str] = set()
            if i and roles[i - 1] == "assistant":
                asked = {str(b.get("id")) for b in _blocks_of(messages[i - 1]) if b.get("type") == "tool_use"}
            seen_other = False
            for block in blocks:
                if block.get("type") != "tool_result":
                    seen_other = True
                    continue
                if seen_other:
                    problems.add("tool_result blocks after other content in a user message")
                if str(block.get("tool_use_id")) not in asked:
                    orphan = str(block.get("tool_use_id"))
                    problems.add(f"tool_result {orphan!r} without its tool_use in the previous message")
    wires = [_Wire(str(m.get("role")), m.get("content") or []) for m in messages if isinstance(m, Mapping)]
    if _markers(body, wires, body.get("system")) > MAX_CACHE_BREAKPOINTS:
        problems.add(f"more than {MAX_CACHE_BREAKPOINTS} cache_control breakpoints")
    return sorted(problems)
