"""Messages, units and turns: the shapes the fit pipeline reasons about.

Wire payloads stay plain dicts (``Message``) and keep every key we do not know; the engine only
ever builds *new* dicts (``{**message, "content": ...}``) and never mutates what it was given.

Two groupings sit on top of the flat list:

* a **unit** is the smallest run of messages that may be removed or kept as a whole: an assistant
  message that carries ``tool_calls`` (or a legacy ``function_call``) together with the tool
  (``function``) results that answer it; every other message is a unit of its own;
* a **turn** starts at a ``user`` message and runs up to (not including) the next one. Messages
  before the first user message form the preamble (turn index -1 is never dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .errors import InvalidRequest

Message = Mapping[str, Any]
Role = Literal["system", "developer", "user", "assistant", "tool", "function"]
ROLES: frozenset[str] = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
INSTRUCTION_ROLES: frozenset[str] = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages ``[start, stop)`` that move together; ``tool_group`` marks call plus results."""

    start: int
    stop: int
    kind: Literal["message", "tool_group"]

    @property
    def indices(self) -> range:
        return range(self.start, self.stop)


@dataclass(frozen=True, slots=True)
class Turn:
    """Messages ``[start, stop)`` from one user message up to the next (``index`` counts from 0)."""

    index: int
    start: int
    stop: int


def tool_call_ids(message: Message) -> tuple[str, ...]:
    """The ids of the tool calls an assistant message makes (empty when it makes none)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return ()
    return tuple(str(c.get("id")) for c in calls if isinstance(c, Mapping) and c.get("id") is not None)


def _answers(message: Message, call_ids: frozenset[str], *, legacy: bool) -> bool:
    role = message.get("role")
    if legacy:
        return role == "function"
    return role == "tool" and str(message.get("tool_call_id")) in call_ids


def group_units(messages: Sequence[Message]) -> tuple[Unit, ...]:
    """Split ``messages`` into units; an assistant call and the results right after it are one unit.

    Results are taken while they answer one of the calls (by ``tool_call_id``), so a stray tool
    message further on stays a unit of its own: we never *create* an orphan, and we never hide one.
    """
    units: list[Unit] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        ids = frozenset(tool_call_ids(message)) if message.get("role") == "assistant" else frozenset()
        legacy = message.get("role") == "assistant" and isinstance(message.get("function_call"), Mapping)
        j = i + 1
        if ids or legacy:
            while j < n and _answers(messages[j], ids, legacy=legacy and not ids):
                j += 1
                if legacy and not ids:
                    break  # a legacy function_call has exactly one result
        units.append(Unit(i, j, "tool_group" if j > i + 1 or ids else "message"))
        i = j
    return tuple(units)


def group_turns(messages: Sequence[Message]) -> tuple[Turn, ...]:
    """Turns in order; the preamble before the first user message is not a turn."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    turns: list[Turn] = []
    for k, start in enumerate(starts):
        stop = starts[k + 1] if k + 1 < len(starts) else len(messages)
        turns.append(Turn(k, start, stop))
    return tuple(turns)


def pairing_problems(messages: Sequence[Message]) -> list[str]:
    """Every broken tool pairing in ``messages``: orphaned results and calls without all results.

    Used by tests and as a final guard in the pipeline: the engine's output may have no problem
    its input did not already have.
    """
    problems: list[str] = []
    for unit in group_units(messages):
        head = messages[unit.start]
        if head.get("role") == "tool":
            problems.append(f"orphaned tool result {head.get('tool_call_id')!r} at {unit.start}")
            continue
        wanted = set(tool_call_ids(head))
        answered = {str(messages[i].get("tool_call_id")) for i in range(unit.start + 1, unit.stop)}
        for missing in sorted(wanted - answered):
            problems.append(f"tool call {missing!r} at {unit.start} has no result")
    return problems


def validate_messages(messages: object) -> list[Message]:
    """Check the shape we rely on and return the messages as a list; raise :class:`InvalidRequest`.

    We check only what planning needs (a list of objects with a known string role and a content
    of a known shape); everything else is the upstream's business and is forwarded untouched.
    """
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be an array of message objects.", param="messages")
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{i}] must be an object.", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role must be one of {sorted(ROLES)}, got {_shown_role(role)}.",
                param=f"messages[{i}].role",
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise InvalidRequest(
                f"messages[{i}].content must be a string, an array of content parts or null.",
                param=f"messages[{i}].content",
            )
        if isinstance(content, list):
            for k, part in enumerate(content):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise InvalidRequest(
                        f"messages[{i}].content[{k}] must be an object with a string 'type'.",
                        param=f"messages[{i}].content[{k}]",
                    )
        calls = message.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise InvalidRequest(
                f"messages[{i}].tool_calls must be an array.", param=f"messages[{i}].tool_calls"
            )
    return messages


def is_pinned_by_default(messages: Sequence[Message], index: int, *, pin_first_user: bool) -> bool:
    """System and developer messages are pinned; so is the first user message when asked."""
    role = messages[index].get("role")
    if role in INSTRUCTION_ROLES:
        return True
    if pin_first_user and role == "user":
        return all(messages[i].get("role") != "user" for i in range(index))
    return False


def _shown_role(role: object) -> str:
    """A bad role for an error message: echoed only when it looks like a role name, since error
    messages must never carry prompt text (which a client may have put in the wrong field)."""
    if isinstance(role, str) and len(role) <= 24 and role.replace("_", "").replace("-", "").isalnum():
        return repr(role)
    return f"a {type(role).__name__}" if not isinstance(role, str) else f"a string of {len(role)} characters"
