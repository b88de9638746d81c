"""The items of a Responses API ``input`` and the neutral messages they become (and back).

INTERFACE CONTRACT (``responses.py`` builds the dialect on these):

* ``parse_input(body, *, memo=None) -> ParsedInput``: validates ``instructions`` and ``input``
  (raises ``InvalidRequest`` naming the field) and maps them to neutral messages (rules in
  ``responses.py``'s docstring); ``ParsedInput.items`` is the ``input`` list (None for a string),
  ``kinds``/``keys`` each item's kind and pairing key. With a ``ParseMemo`` (``app.core.
  parse_memo``), the messages built from a strictly equal leading run of items of a remembered
  parse are reused (the leading decisions of its scan that provably hold, at once: see
  ``_Remembered``): the result equals a fresh parse's.
* ``render_input(body, messages) -> dict``: ``body`` with the fitted messages written back.
* ``input_problems(body) -> list[str]``: position-free structural problems of ``input``.
* ``unfittable_reason(body)``, ``reject_orphan_outputs(parsed)``; ``OUTPUT_OF_CALL``/
  ``CALL_OF_OUTPUT`` (call item type <-> output item type), ``ENCRYPTED_CHARS_PER_TOKEN``,
  ``INSTRUCTIONS_PATH``.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..conversation import PRICE_KEY, Path, neutral, origin_of
from ..errors import InvalidRequest
from ..messages import Message
from ..parse_memo import NOTHING, ParseMemo, Recalled, item_shapes
from ..strategies import is_ctxproxy_note

ENCRYPTED_CHARS_PER_TOKEN = 4
INSTRUCTIONS_PATH: Path = (-1,)
MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})

# Call item type -> its output item type. Outputs answer calls by ``call_id`` except where
# ``_ANSWER_KEY``/``_CALL_KEY`` say otherwise (local shell outputs carry the call's id as ``id``).
OUTPUT_OF_CALL: Mapping[str, str] = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "mcp_approval_request": "mcp_approval_response",
    "program": "program_output",
}
CALL_OF_OUTPUT: Mapping[str, str] = {v: k for k, v in OUTPUT_OF_CALL.items()}
# Calls whose output is plain text the model produced for us: prunable and cuttable.
_EDITABLE_CALLS = frozenset({"function_call", "custom_tool_call"})
_CALL_KEY: Mapping[str, str] = {"mcp_approval_request": "id"}
_ANSWER_KEY: Mapping[str, str] = {
    "local_shell_call_output": "id",
    "mcp_approval_response": "approval_request_id",
}
# Keys that never reach the model's context (identifiers, bookkeeping): not counted.
_UNCOUNTED_KEYS = frozenset({"type", "id", "status", "encrypted_content"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def _key_of(item: Mapping[str, Any]) -> str | None:
    """The pairing key of a call or an output item (``call_id`` unless the type says otherwise)."""
    return _key_for(_type(item), item)


def _key_for(kind: str, item: Mapping[str, Any]) -> str | None:
    """``_key_of`` for an item whose ``type`` is already known to be ``kind``."""
    field = _CALL_KEY.get(kind, "call_id") if kind in OUTPUT_OF_CALL else _ANSWER_KEY.get(kind, "call_id")
    value = item.get(field)
    return value if isinstance(value, str) else None


def _type(item: object) -> str:
    """The item's ``type`` ("" when it has none or it is not a string)."""
    # ``type(...) is dict`` first: parsed JSON is plain dicts, and the ABC check costs more.
    kind = item.get("type") if type(item) is dict or isinstance(item, Mapping) else None
    return kind if isinstance(kind, str) else ""


def _kind(item: Mapping[str, Any]) -> str:
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return kind if isinstance(kind, str) else ""


def _encrypted_tokens(value: object) -> int:
    return math.ceil(len(value) / ENCRYPTED_CHARS_PER_TOKEN) if isinstance(value, str) else 0


# -- parts ------------------------------------------------------------------------------------


def _neutral_part(part: Any) -> Any:
    """One Responses content part as the chat accounting knows it (text, image_url, file)."""
    if type(part) is not dict and not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        text = part.get("text")
        return {"type": "text", "text": text if isinstance(text, str) else ""}
    if kind == "input_image":
        url = part.get("image_url")
        image: dict[str, Any] = {"url": url if isinstance(url, str) else None}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        filename = part.get("filename")
        return {"type": "file", "file": {"filename": filename if isinstance(filename, str) else ""}}
    if kind == "refusal":
        return {"type": "refusal", "refusal": part.get("refusal")}
    return dict(part)


def _neutral_content(content: Any) -> Any:
    if isinstance(content, list):
        return [_neutral_part(p) for p in content]
    return content


def _opaque_parts(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Parts that price an item the engine keeps whole: its texts as text, ciphertext by length."""
    kind = _kind(item)
    parts: list[dict[str, Any]] = []
    if kind == "reasoning":
        for field in ("summary", "content"):
            entries = item.get(field)
            if isinstance(entries, list):
                for entry in entries:
                    text = entry.get("text") if isinstance(entry, Mapping) else None
                    if isinstance(text, str):
                        parts.append({"type": "text", "text": text})
    elif kind == "message":
        content = item.get("content")
        if isinstance(content, str):
            parts.append({"type": "text", "text": content})
        elif isinstance(content, list):
            parts.extend(
                p if isinstance(p, dict) else {"type": "text", "text": ""}
                for p in map(_neutral_part, content)
            )
    else:
        rest = {k: v for k, v in item.items() if k not in _UNCOUNTED_KEYS}
        if rest:
            parts.append({"type": f"item:{kind}", **rest})
    price = _encrypted_tokens(item.get("encrypted_content"))
    if price:
        parts.append({"type": "encrypted", PRICE_KEY: price})
    return parts


def _call_entry(item: Mapping[str, Any]) -> dict[str, Any]:
    kind = _kind(item)
    key = _key_of(item) or ""
    if kind == "function_call":
        return {
            "id": key,
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
        }
    if kind == "custom_tool_call":
        return {
            "id": key,
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("input")},
        }
    rest = {k: v for k, v in item.items() if k not in _UNCOUNTED_KEYS and k != "call_id"}
    return {"id": key, "type": kind, kind: rest}


# -- validation -------------------------------------------------------------------------------


def _validate_item(i: int, item: Any) -> str:
    """The item's kind; raise ``InvalidRequest`` for what planning cannot rely on. (``type(x) is
    dict`` comes before every ``Mapping`` check: parsed JSON is plain dicts, and the ABC check
    costs more; it stays as the fallback for other mappings.)"""
    if type(item) is not dict and not isinstance(item, Mapping):
        raise InvalidRequest(f"input[{i}] must be an object.", param=f"input[{i}]")
    kind = item.get("type")
    if kind is None:
        if "role" not in item:
            raise InvalidRequest(
                f"input[{i}] has no 'type' and no 'role': it is not an input item.", param=f"input[{i}]"
            )
        kind = "message"
    if not isinstance(kind, str):
        raise InvalidRequest(f"input[{i}].type must be a string.", param=f"input[{i}].type")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or role not in MESSAGE_ROLES:
            where = f"input[{i}]"
            raise InvalidRequest(
                f"{where}.role must be one of {sorted(MESSAGE_ROLES)}.", param=f"{where}.role"
            )
        content = item.get("content")
        if isinstance(content, list):
            for k, part in enumerate(content):
                if (type(part) is not dict and not isinstance(part, Mapping)) or not isinstance(
                    part.get("type"), str
                ):
                    where = f"input[{i}]"
                    raise InvalidRequest(
                        f"{where}.content[{k}] must be an object with a string 'type'.",
                        param=f"{where}.content[{k}]",
                    )
        elif not isinstance(content, str):
            where = f"input[{i}]"
            raise InvalidRequest(
                f"{where}.content must be a string or an array of content parts.", param=f"{where}.content"
            )
    elif kind in OUTPUT_OF_CALL or kind in CALL_OF_OUTPUT:
        where = f"input[{i}]"
        if _key_for(kind, item) is None:
            field = (
                _CALL_KEY.get(kind, "call_id") if kind in OUTPUT_OF_CALL else _ANSWER_KEY.get(kind, "call_id")
            )
            raise InvalidRequest(f"{where}.{field} must be a string.", param=f"{where}.{field}")
        if kind in ("function_call_output", "custom_tool_call_output") and not isinstance(
            item.get("output"), str | list
        ):
            raise InvalidRequest(
                f"{where}.output must be a string or an array of content parts.", param=f"{where}.output"
            )
    return kind


# -- parse ------------------------------------------------------------------------------------

MEMO_NAME = "responses"


@dataclass(frozen=True, slots=True)
class ParsedInput:
    """The neutral messages of a body and what ``render`` needs to write them back; ``kinds`` and
    ``keys`` (each item's kind and pairing key, or None) for the checks that follow the parse."""

    messages: tuple[dict[str, Any], ...]
    items: tuple[Any, ...] | None  # the ``input`` list, or None for a string/absent input
    kinds: tuple[str, ...] = ()
    keys: tuple[str | None, ...] = ()
    orphan: int = -1  # the first output item whose call is not in ``input`` (-1: none)


@dataclass(frozen=True, slots=True)
class _Remembered:
    """What a parse of an ``input`` list leaves in a ``ParseMemo``: every item's kind and key, and
    every neutral message it built, by descriptor. A descriptor is a tuple that starts with a tag
    and names every item index the message was built from; the message is a pure function of the
    descriptor and of those items, so it is reused when every index is inside the strictly equal
    prefix of a new request (``app.core.parse_memo``).

    ``chain`` is every decision of the scan (``_Group``) in scan order (``starts`` their starts),
    ``out`` the messages the scan made (``ends[g]``: how many after ``chain[g]``), ``reach[g]``
    the largest index any of ``chain[:g + 1]`` read (horizon or output position), ``first_dep``
    for each key some ``g`` at or before the first group whose ``deps`` name it, and
    ``answer_at`` where the outputs of each key sit (all below ``answers_top``), ``calls`` every
    call's kind and key (all below ``calls_top``) and ``orphan`` the first orphan output. A new scan
    whose items below ``limit`` are reusable passes the per-group check of ``_Builder.skipped``
    for every leading group with ``reach < limit`` whose keys no output at or after ``limit``
    answers: it takes them wholesale (``_Builder.resume``)."""

    kinds: tuple[str, ...]
    keys: tuple[str | None, ...]
    made: dict[tuple[Any, ...], dict[str, Any]]
    chain: tuple[_Group, ...]
    starts: tuple[int, ...]
    reach: tuple[int, ...]
    ends: tuple[int, ...]
    out: tuple[dict[str, Any], ...]
    first_dep: dict[str, int]
    answer_at: dict[str, list[int]]
    answers_top: int
    calls: set[tuple[str, str | None]]  # (kind, key) of every call; never mutated
    calls_top: int  # one past the last call
    orphan: int


@dataclass(frozen=True, slots=True)
class _Group:
    """One decision of the scan in ``_parse_items``: the items ``[start, stop)`` became
    ``messages``. The decision read no item past ``horizon`` (the first item at or after ``stop``
    that is not reasoning; ``len(items)`` when the end of the list was read) and, of the rest of
    the list, only where the outputs of its calls sit (``deps``: key -> their indices; ``top``
    is the largest of ``horizon`` and those indices). A new scan that reaches ``start`` with
    every item up to ``horizon`` strictly equal and the same ``deps`` makes the same decision
    from equal items: it takes ``messages`` and goes on at ``stop``."""

    start: int
    stop: int
    horizon: int
    deps: tuple[tuple[str, tuple[int, ...]], ...]
    messages: tuple[dict[str, Any], ...]
    top: int


class _Builder:
    """Builds (or reuses) the neutral message of a descriptor and records it for the next parse."""

    __slots__ = (
        "chain",
        "ends",
        "first_dep",
        "items",
        "last",
        "limit",
        "made",
        "previous",
        "previous_state",
        "reach",
        "recalled",
        "remember",
        "starts",
    )

    def __init__(
        self, items: Sequence[Any], previous: _Remembered | None, recalled: Recalled, *, remember: bool
    ) -> None:
        self.items = items
        self.remember = remember
        self.previous_state = previous
        self.previous = previous.made if previous is not None else None
        self.recalled = recalled
        # Every item below ``limit`` is reusable (the common case: one check per message).
        self.limit = recalled.limit
        self.made: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.chain: list[_Group] = []
        self.reach: list[int] = []
        self.ends: list[int] = []
        self.starts: list[int] = []
        self.first_dep: dict[str, int] = {}
        self.last = -1  # the largest index ``reach`` covers so far

    def reused(self, descriptor: tuple[Any, ...], indices: Sequence[int]) -> dict[str, Any] | None:
        if self.previous is None:
            return None
        if max(indices) >= self.limit and not all(self.recalled.reusable(i) for i in indices):
            return None
        return self.previous.get(descriptor)

    def resume(self, late_keys: Sequence[str]) -> tuple[int, list[dict[str, Any]]]:
        """Where the scan starts and what it has made so far: the leading groups of the
        remembered chain that ``skipped`` would take one by one, taken at once. ``late_keys``:
        the keys of the outputs at or after ``limit``. Exactly the groups with ``reach < limit``
        (every index they read is reusable, so their outputs sit where they sat, below
        ``limit``) and before ``first_dep`` of every late key (no output moved in)."""
        state = self.previous_state
        if state is None or not self.remember:
            return 0, []
        taken = bisect_left(state.reach, self.limit)
        for key in late_keys:
            taken = min(taken, state.first_dep.get(key, taken))
        # Entries of ``first_dep`` past ``taken`` stay: each is still at or before its first group.
        self.first_dep = dict(state.first_dep)
        if taken == 0:
            return 0, []
        self.chain = list(state.chain[:taken])
        self.reach = list(state.reach[:taken])
        self.ends = list(state.ends[:taken])
        self.starts = list(state.starts[:taken])
        self.last = self.reach[-1]
        return self.chain[-1].stop, list(state.out[: self.ends[-1]])

    def skipped(self, start: int, answer_at: Mapping[str, list[int]]) -> _Group | None:
        """The remembered decision at ``start`` when it holds for these items (see ``_Group``)."""
        state = self.previous_state
        if state is None or not self.remember:
            return None
        at = bisect_left(state.starts, start)
        if at == len(state.starts) or state.starts[at] != start:
            return None
        group = state.chain[at]
        if group.horizon >= self.limit:
            return None
        for key, positions in group.deps:
            if tuple(answer_at.get(key, ())) != positions:
                return None
        return group

    def record(self, group: _Group, made: int) -> None:
        """Add ``group`` (taken or decided) to this scan's chain; ``made``: messages so far."""
        ordinal = len(self.chain)
        self.chain.append(group)
        self.last = max(self.last, group.top)
        self.reach.append(self.last)
        self.ends.append(made)
        self.starts.append(group.start)
        first_dep = self.first_dep
        for key, _ in group.deps:
            if first_dep.get(key, ordinal) >= ordinal:
                first_dep[key] = ordinal

    def decided(
        self,
        start: int,
        stop: int,
        kinds: Sequence[str],
        keys: Sequence[str | None],
        answer_at: Mapping[str, list[int]],
        messages: Sequence[dict[str, Any]],
        made: int,
    ) -> None:
        """Record the decision that made ``messages`` of items ``[start, stop)``."""
        if not self.remember:
            return
        n = len(kinds)
        horizon = stop
        while horizon < n and kinds[horizon] == "reasoning":
            horizon += 1
        deps = tuple(
            (key, tuple(answer_at.get(key, ())))
            for m in range(start, stop)
            if kinds[m] in OUTPUT_OF_CALL and (key := keys[m]) is not None
        )
        top = max([horizon, *(p for _, positions in deps for p in positions)])
        self.record(_Group(start, stop, horizon, deps, tuple(messages), top), made)

    def reused_one(self, descriptor: tuple[Any, ...], index: int) -> dict[str, Any] | None:
        if self.previous is None:
            return None
        if index >= self.limit and not self.recalled.reusable(index):
            return None
        return self.previous.get(descriptor)

    def keep(self, descriptor: tuple[Any, ...], message: dict[str, Any]) -> dict[str, Any]:
        self.made[descriptor] = message
        return message

    def message(self, i: int) -> dict[str, Any]:
        """A ``message`` item with no reasoning before it."""
        descriptor = ("m", i)
        found = self.reused_one(descriptor, i)
        if found is not None:
            return self.keep(descriptor, found)
        item = self.items[i]
        role = item["role"]
        content = item["content"]
        if isinstance(content, list) and len(content) == 1 and content[0].get("type") in _TEXT_PARTS:
            # A note we wrote earlier is read back as the string the engine recognises.
            text = content[0].get("text")
            if isinstance(text, str) and is_ctxproxy_note({"role": role, "content": text}):
                content = text
        return self.keep(descriptor, neutral(role, _neutral_content(content), origin=[(i,)]))

    def output(self, i: int, kind: str, key: str | None) -> dict[str, Any]:
        """An output item as a ``tool`` message (after its call run, or on its own)."""
        descriptor = ("o", i)
        found = self.reused_one(descriptor, i)
        if found is not None:
            return self.keep(descriptor, found)
        item = self.items[i]
        editable = CALL_OF_OUTPUT[kind] in _EDITABLE_CALLS
        content = _neutral_content(item.get("output")) if editable else _opaque_parts(item)
        return self.keep(
            descriptor, neutral("tool", content, origin=[(i,)], opaque=not editable, tool_call_id=key or "")
        )

    def opaque(self, indices: Sequence[int], *, role: str) -> dict[str, Any]:
        descriptor = ("x", role, *indices)
        found = self.reused(descriptor, indices)
        if found is not None:
            return self.keep(descriptor, found)
        return self.keep(descriptor, _opaque(self.items, indices, role=role))

    def call_run(
        self, kinds: Sequence[str], reasoning: Sequence[int], members: Sequence[int], calls: Sequence[int]
    ) -> dict[str, Any]:
        """The assistant message of a call run (its calls, reasoning glued inside the run)."""
        descriptor = ("r", len(reasoning), len(calls), *reasoning, *calls, *members)
        found = self.reused(descriptor, members)
        if found is not None:
            return self.keep(descriptor, found)
        items = self.items
        opaque = (
            bool(reasoning)
            or len(members) != len(calls)
            or any(kinds[c] not in _EDITABLE_CALLS for c in calls)
        )
        content: list[dict[str, Any]] | None = None
        texts = [p for r in members if kinds[r] == "reasoning" for p in _opaque_parts(items[r])]
        if texts:
            content = texts
        message = neutral(
            "assistant",
            content,
            origin=[(m,) for m in members],
            opaque=opaque,
            tool_calls=[_call_entry(items[c]) for c in calls],
        )
        return self.keep(descriptor, message)


def _answers(
    kinds: Sequence[str], keys: Sequence[str | None], previous: _Remembered | None, limit: int
) -> tuple[dict[str, list[int]], list[str], int]:
    """Where the outputs of each key sit, the keys of the outputs at or after ``limit``, and one
    past the last output (0 when there is none). The
    remembered map is taken (copied on write: it is never mutated) when all its outputs sit below
    ``limit``: those items are reusable, so their kinds and keys are the remembered ones."""
    if previous is not None and previous.answers_top <= limit:
        answer_at = dict(previous.answer_at)
        begin, top = limit, previous.answers_top
    else:
        answer_at, begin, top = {}, 0, 0
    late: list[str] = []
    for j in range(begin, len(kinds)):
        if kinds[j] in CALL_OF_OUTPUT:
            key = keys[j]
            if key is not None:
                answer_at[key] = [*answer_at.get(key, ()), j]
                top = j + 1
                if j >= limit:
                    late.append(key)
    return answer_at, late, top


def _calls(
    kinds: Sequence[str], keys: Sequence[str | None], previous: _Remembered | None, limit: int
) -> tuple[set[tuple[str, str | None]], int, int]:
    """Every call's ``(kind, key)``, one past the last call, and the first output whose call is not
    among them (-1: none). The remembered calls are taken (copied) when they all sit below
    ``limit`` and the remembered list had no orphan: then every output below ``limit`` has its
    call below ``limit`` (equal items at equal indices), and only the outputs past it are looked
    at."""
    if previous is not None and previous.orphan < 0 and previous.calls_top <= limit:
        calls, begin, top = set(previous.calls), limit, previous.calls_top
    else:
        calls, begin, top = set(), 0, 0
    n = len(kinds)
    for j in range(begin, n):
        if kinds[j] in OUTPUT_OF_CALL:
            calls.add((kinds[j], keys[j]))
            top = j + 1
    for j in range(begin, n):
        kind = kinds[j]
        if kind in CALL_OF_OUTPUT and (CALL_OF_OUTPUT[kind], keys[j]) not in calls:
            return calls, top, j
    return calls, top, -1


def _parse_items(
    items: Sequence[Any],
    kinds: Sequence[str],
    keys: Sequence[str | None],
    answer_at: Mapping[str, list[int]],
    late_keys: Sequence[str],
    build: _Builder,
) -> list[dict[str, Any]]:
    n = len(items)
    i, out = build.resume(late_keys)
    while i < n:
        group = build.skipped(i, answer_at)
        if group is not None:
            out.extend(group.messages)
            i = group.stop
            build.record(group, len(out))
            continue
        start = i
        first = len(out)
        while i < n and kinds[i] == "reasoning":
            i += 1
        reasoning = list(range(start, i))
        if i == n:  # reasoning with no item after it: kept whole on its own
            out.append(build.opaque(reasoning, role="assistant"))
            break
        kind = kinds[i]
        if kind in OUTPUT_OF_CALL:
            i = _parse_call_run(kinds, keys, i, reasoning, answer_at, out, build)
            build.decided(start, i, kinds, keys, answer_at, out[first:], len(out))
            continue
        if kind == "message":
            if reasoning:
                out.append(build.opaque([*reasoning, i], role=items[i]["role"]))
            else:
                out.append(build.message(i))
        elif kind in CALL_OF_OUTPUT and not reasoning:
            out.append(build.output(i, kind, keys[i]))
        elif kind == "compaction":
            out.append(build.opaque([*reasoning, i], role="developer"))
        else:
            # An item that instructs (``additional_tools`` is a developer item) stays pinned like one.
            role = items[i].get("role")
            out.append(
                build.opaque([*reasoning, i], role=role if role in ("system", "developer") else "assistant")
            )
        i += 1
        build.decided(start, i, kinds, keys, answer_at, out[first:], len(out))
    return out


def _parse_call_run(
    kinds: Sequence[str],
    keys: Sequence[str | None],
    i: int,
    reasoning: list[int],
    answer_at: Mapping[str, list[int]],
    out: list[dict[str, Any]],
    build: _Builder,
) -> int:
    """Parse the call run starting at ``i`` (reasoning before it in ``reasoning``) and its outputs;
    append the neutral messages to ``out`` and return the index after what was consumed."""
    n = len(kinds)
    members = list(reasoning)
    calls: list[int] = []
    j = i
    while j < n:
        if kinds[j] in OUTPUT_OF_CALL:
            calls.append(j)
            members.append(j)
            j += 1
            continue
        k = j
        while k < n and kinds[k] == "reasoning":
            k += 1
        if k > j and k < n and kinds[k] in OUTPUT_OF_CALL:  # reasoning that leads to another call
            members.extend(range(j, k))
            j = k
            continue
        break
    run_keys = {key for c in calls if (key := keys[c]) is not None}
    outputs: list[int] = []
    k = j
    while k < n and kinds[k] in CALL_OF_OUTPUT and keys[k] in run_keys:
        outputs.append(k)
        k += 1
    later = [a for key in run_keys for a in answer_at.get(key, ()) if a >= k]
    if later:
        # An output sits after other items: keep the whole span whole (closed over the calls in it).
        stop = max(later) + 1
        grown = True
        while grown:
            grown = False
            for m in range(i, stop):
                if kinds[m] in OUTPUT_OF_CALL:
                    key = keys[m]
                    far = max(answer_at.get(key, [m]) if key else [m])
                    if far + 1 > stop:
                        stop, grown = far + 1, True
        out.append(build.opaque([*reasoning, *range(i, stop)], role="assistant"))
        return stop
    out.append(build.call_run(kinds, reasoning, members, calls))
    for o in outputs:
        out.append(build.output(o, kinds[o], keys[o]))
    return k


def _opaque(items: Sequence[Any], indices: Sequence[int], *, role: str) -> dict[str, Any]:
    parts = [p for m in indices for p in _opaque_parts(items[m])]
    return neutral(role, parts, origin=[(m,) for m in indices], opaque=True)


def parse_input(body: Mapping[str, Any], *, memo: ParseMemo | None = None) -> ParsedInput:
    """Validate and map ``instructions`` and ``input``. With ``memo``, the neutral messages of a
    strictly equal leading run of items are taken from the remembered parse of an earlier request
    (the same objects, equal to what a fresh parse builds), and this parse is remembered."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest("'instructions' must be a string.", param="instructions")
    messages: list[dict[str, Any]] = []
    if isinstance(instructions, str) and instructions:
        messages.append(neutral("system", instructions, origin=[INSTRUCTIONS_PATH]))
    raw = body.get("input")
    if raw is None:
        return ParsedInput(tuple(messages), None)
    if isinstance(raw, str):
        messages.append(neutral("user", raw, origin=[(0,)]))
        return ParsedInput(tuple(messages), None)
    if not isinstance(raw, list):
        raise InvalidRequest("'input' must be a string or an array of input items.", param="input")
    if memo is not None and not memo.remembers(raw):
        memo = None  # too short to be remembered: nothing to recall or keep
    recalled = memo.recall(MEMO_NAME, raw) if memo is not None else NOTHING
    previous = recalled.state if isinstance(recalled.state, _Remembered) else None
    if previous is None:
        recalled = NOTHING
    # Kinds and keys are pure functions of (index, item): a strictly equal item keeps its own.
    limit = recalled.limit if previous is not None else 0
    kinds: list[str] = list(previous.kinds[:limit]) if previous is not None else []
    keys: list[str | None] = list(previous.keys[:limit]) if previous is not None else []
    for i in range(limit, len(raw)):
        if previous is not None and recalled.reusable(i):
            kinds.append(previous.kinds[i])
            keys.append(previous.keys[i])
            continue
        item = raw[i]
        kind = _validate_item(i, item)
        kinds.append(kind)
        keys.append(_key_for(kind, item) if kind in OUTPUT_OF_CALL or kind in CALL_OF_OUTPUT else None)
    if memo is None and all(kind == "message" for kind in kinds):
        # Role messages only (a short input, not remembered): no calls, outputs or reasoning to
        # group, so each item is its own message; what the general scan below makes of them.
        plain = _Builder(raw, None, NOTHING, remember=False)
        messages.extend([plain.message(i) for i in range(len(raw))])
        return ParsedInput(tuple(messages), tuple(raw), tuple(kinds), tuple(keys), -1)
    answer_at, late_keys, answers_top = _answers(kinds, keys, previous, limit)
    build = _Builder(raw, previous, recalled, remember=memo is not None)
    made = _parse_items(raw, kinds, keys, answer_at, late_keys, build)
    messages.extend(made)
    calls, calls_top, orphan = _calls(kinds, keys, previous, limit)
    parsed = ParsedInput(tuple(messages), tuple(raw), tuple(kinds), tuple(keys), orphan)
    if memo is not None:
        chain = tuple(build.chain)
        state = _Remembered(
            kinds=parsed.kinds,
            keys=parsed.keys,
            made=build.made,
            chain=chain,
            starts=tuple(build.starts),
            reach=tuple(build.reach),
            ends=tuple(build.ends),
            out=tuple(made),
            first_dep=build.first_dep,
            answer_at=answer_at,
            answers_top=answers_top,
            calls=calls,
            calls_top=calls_top,
            orphan=orphan,
        )
        shapes = item_shapes(raw, recalled)
        memo.keep(MEMO_NAME, raw, shapes, state, replacing=recalled.entry)
    return parsed


def unfittable_reason(body: Mapping[str, Any]) -> str:
    if body.get("previous_response_id") is not None:
        return "previous_response_id: the conversation's history is stored upstream"
    if body.get("conversation") is not None:
        return "conversation: the conversation's history is stored upstream"
    return ""


def reject_orphan_outputs(parsed: ParsedInput) -> None:
    """Reject an output item whose call is not in ``input`` (the upstream would refuse it too)."""
    kinds, keys = parsed.kinds, parsed.keys
    if "item_reference" in kinds:
        return  # a referenced item may be the call
    i = parsed.orphan
    if i >= 0:
        kind = kinds[i]
        raise InvalidRequest(
            f"input[{i}] is a {kind} for call {_shown_id(keys[i])}, but no {CALL_OF_OUTPUT[kind]} "
            "with that id is in 'input'.",
            param=f"input[{i}]",
        )


def _shown_id(value: str | None) -> str:
    """An id for an error message: echoed only when it looks like an id (never prompt text)."""
    if value is not None and len(value) <= 64 and value.replace("_", "").replace("-", "").isalnum():
        return repr(value)
    return "with an unusual id"


# -- render -----------------------------------------------------------------------------------


def _wire_part(original: Any, was: Any, now: Any, *, assistant: bool) -> Any:
    """One content part written back: the original when its neutral form is unchanged."""
    if now == was:
        return original
    if isinstance(now, Mapping) and now.get("type") == "text":
        if isinstance(original, Mapping) and original.get("type") in _TEXT_PARTS:
            return {**original, "text": now.get("text")}
        return {"type": "output_text" if assistant else "input_text", "text": now.get("text")}
    return now


def _wire_content(original: Any, was: Any, now: Any, *, assistant: bool) -> Any:
    if isinstance(now, str) or now is None:
        return now
    if isinstance(original, list) and isinstance(was, list) and len(was) == len(now) == len(original):
        return [_wire_part(o, w, n, assistant=assistant) for o, w, n in zip(original, was, now, strict=True)]
    fresh = [] if not isinstance(now, list) else now
    return [_wire_part(None, None, p, assistant=assistant) for p in fresh]


def _made_item(message: Message) -> dict[str, Any]:
    """A message the engine wrote (note, summary) as a Responses ``message`` item."""
    role = message.get("role")
    role = role if role in ("user", "assistant", "system", "developer") else "user"
    kind = "output_text" if role == "assistant" else "input_text"
    content = message.get("content")
    if isinstance(content, list):
        text = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    else:
        text = "" if content is None else str(content)
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _changed_item(item: Mapping[str, Any], was: Message, now: Message) -> dict[str, Any]:
    """``item`` with only what the engine changed (its output or its content) replaced."""
    kind = _kind(item)
    if kind in CALL_OF_OUTPUT:
        new = _wire_content(item.get("output"), was.get("content"), now.get("content"), assistant=False)
        return {**item, "output": new}
    if kind == "message":
        assistant = item.get("role") == "assistant"
        new = _wire_content(item.get("content"), was.get("content"), now.get("content"), assistant=assistant)
        return {**item, "content": new}
    return dict(item)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def render_input(
    body: Mapping[str, Any], messages: Sequence[Message], *, source: Sequence[Message] | None = None
) -> dict[str, Any]:
    """``body`` with the fitted neutral ``messages`` written back (see the module docstring).
    ``source``: the messages ``parse_input(body)`` gives, when the caller has them (the plan's
    conversation): the body is not parsed a second time."""
    if source is None:
        parsed = parse_input(body)
        source, raw_items = parsed.messages, parsed.items
    else:
        raw = body.get("input")
        raw_items = tuple(raw) if isinstance(raw, list) else None
    by_origin = {tuple(origin_of(m)): m for m in source}
    out = dict(body)
    items: list[Any] = []
    for message in messages:
        origin = origin_of(message)
        if not origin:
            items.append(_made_item(message))
            continue
        was = by_origin.get(origin)
        if was is None:
            raise AssertionError(f"render: a message with an unknown origin {origin}")
        if origin == (INSTRUCTIONS_PATH,):
            if message != was:
                out["instructions"] = _text_of(message.get("content"))
            continue
        if raw_items is None:  # a string input: one user message
            if message != was:
                out["input"] = _text_of(message.get("content"))
            continue
        if message == was or len(origin) > 1:
            # Several items (a call run, glued reasoning) change only by being dropped whole.
            items.extend(raw_items[path[0]] for path in origin)
        else:
            items.append(_changed_item(raw_items[origin[0][0]], was, message))
    if raw_items is not None:
        out["input"] = items
    return out


def input_problems(body: Mapping[str, Any]) -> list[str]:
    """Broken pairings (by call id, both ways) and trailing reasoning items, position-free."""
    raw = body.get("input")
    if not isinstance(raw, list):
        return []
    found: list[str] = []
    calls: dict[tuple[str, str | None], int] = {}
    answers: dict[tuple[str, str | None], int] = {}
    for item in raw:
        kind = _type(item)
        if kind in OUTPUT_OF_CALL:
            calls[(kind, _key_of(item))] = calls.get((kind, _key_of(item)), 0) + 1
        elif kind in CALL_OF_OUTPUT:
            pair = (CALL_OF_OUTPUT[kind], _key_of(item))
            answers[pair] = answers.get(pair, 0) + 1
    for (kind, key), _count in calls.items():
        if (kind, key) not in answers:
            found.append(f"{kind} {key!r} has no {OUTPUT_OF_CALL[kind]}")
    for (kind, key), _count in answers.items():
        if (kind, key) not in calls:
            found.append(f"{OUTPUT_OF_CALL[kind]} {key!r} has no {kind}")
    for k, item in enumerate(raw):
        if isinstance(item, Mapping) and item.get("type") == "reasoning":
            after = raw[k + 1] if k + 1 < len(raw) else None
            if after is None:
                found.append(f"reasoning item {item.get('id')!r} is not followed by an item")
    return sorted(found)
