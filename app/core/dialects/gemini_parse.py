"""A Gemini request body: its validation and its neutral conversation (``gemini.py`` is the
dialect built on it; ``gemini_wire.py`` maps contents and renders).

INTERFACE CONTRACT (pure, standard library only):

* ``validate_body(body, *, recalled=NOTHING, kind=None) -> (contents, system, maxOutputTokens)``:
  what planning relies on and every field the proxy reads, ``InvalidRequest`` naming the field in
  Google's words otherwise (``kind``: the route's, ``Dialect.parse``); a content ``recalled``
  reusable at its index is not checked again (it is strictly equal to one checked before).
* ``parse_gemini(body, *, model, stream, memo=None, counted=None, kind=None) -> Conversation``:
  the neutral conversation of a body (a ``:countTokens`` body read through ``counted_request``);
  ``model`` and ``stream`` come from the request's path. With ``memo`` (``parse_memo``), the
  neutral messages of a resent history's strictly equal leading contents are reused (those of
  content ``i`` are a pure function of ``i``, it and the content before it:
  ``gemini_wire.content_messages``); the result equals a fresh parse. A body with
  ``cachedContent`` is not fittable (part of its prompt lives upstream, ``UNFITTABLE_CACHED``).
* ``counted_request(body)``: the ``generateContentRequest`` of a ``:countTokens`` body when it
  has one, else the body itself.
* ``body_model(body, *, counted=None)``: the body's ``model`` (or its ``generateContentRequest``'s) without
  ``models/``, else None (a request without a path: the dry run, the gateway engine).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..conversation import Conversation
from ..endpoints import RouteKind
from ..errors import InvalidRequest
from ..fields import JsonType, a_type, integer_problem, json_type
from ..parse_memo import NOTHING, ParseMemo, Recalled, item_shapes
from .gemini_wire import content_messages, field, plain_text, system_message

MEMO_NAME = "gemini"  # the ParseMemo's key for this API's parses
ROLES: frozenset[str] = frozenset({"user", "model"})
UNFITTABLE_CACHED = "cachedContent: part of the prompt is cached upstream"
MODEL_PREFIX = "models/"


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


# Google's proto type names in its "Invalid value at ..." answers, by the JSON type wanted.
_PROTO_TYPES: Mapping[JsonType, str] = {
    "integer": "TYPE_INT32",
    "boolean": "TYPE_BOOL",
    "string": "TYPE_STRING",
    "array": "a repeated field",
    "object": "a message",
}
# The body's objects the proxy reads besides ``contents`` and ``tools`` (lowerCamelCase;
# snake_case is accepted, as Google does).
OBJECT_FIELDS: tuple[str, ...] = ("systemInstruction", "toolConfig", "generationConfig")
MAX_OUTPUT_TOKENS_MINIMUM = 1
THINKING_BUDGET_MINIMUM = -1  # -1: the model decides (dynamic thinking)
_UPPER = re.compile(r"([A-Z])")


def _shown(value: object) -> str:
    """A value for an error message as Google echoes it, but never prompt text: numbers, booleans
    and short word-like strings as JSON, anything else by its type."""
    kind = json_type(value)
    if kind in ("integer", "number", "boolean", "null"):
        return json.dumps(value)
    if isinstance(value, str) and len(value) <= 24 and value.replace("_", "").replace("-", "").isalnum():
        return json.dumps(value)
    return a_type(kind)


def invalid_value(param: str, kind: JsonType, value: object) -> InvalidRequest:
    """Google's answer to a field of the wrong type, ``Invalid value at 'path' (TYPE), value``
    (``path``: ``param``, the body's lowerCamelCase path, in Google's snake_case)."""
    path = _UPPER.sub(r"_\1", param).lower()
    return InvalidRequest(f"Invalid value at '{path}' ({_PROTO_TYPES[kind]}), {_shown(value)}", param=param)


def _integer(value: object, param: str, *, minimum: int) -> None:
    problem = integer_problem(value, minimum=minimum)
    if problem == "type":
        raise invalid_value(param, "integer", value)
    if problem == "minimum":
        raise InvalidRequest(
            f"Unable to submit request because it has a {param.rpartition('.')[2]} value of {value} but "
            f"the supported range is from {minimum} (inclusive). Update the value and try again.",
            param=param,
        )


def _check_generation(config: Mapping[str, Any]) -> int | None:
    """``generationConfig``'s output cap (None: unset), its thinking budget checked."""
    cap: int | None = field(config, "maxOutputTokens")
    if cap is not None:
        _integer(cap, "generationConfig.maxOutputTokens", minimum=MAX_OUTPUT_TOKENS_MINIMUM)
    thinking = field(config, "thinkingConfig")
    if thinking is not None:
        if not _is_mapping(thinking):
            raise invalid_value("generationConfig.thinkingConfig", "object", thinking)
        budget = field(thinking, "thinkingBudget")
        if budget is not None:
            param = "generationConfig.thinkingConfig.thinkingBudget"
            _integer(budget, param, minimum=THINKING_BUDGET_MINIMUM)
    return cap


def _check_parts(parts: object, where: str) -> None:
    if parts is None:
        return
    if not isinstance(parts, list):
        raise invalid_value(where, "array", parts)
    for k, part in enumerate(parts):
        if plain_text(part):
            continue
        if not isinstance(part, Mapping):
            raise invalid_value(f"{where}[{k}]", "object", part)
        call = field(part, "functionCall")
        if call is not None:
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str) or not call["name"]:
                raise _invalid("a functionCall needs a non-empty string 'name'", f"{where}[{k}].functionCall")
            if call.get("args") is not None and not isinstance(call["args"], Mapping):
                raise _invalid("'args' should be an object", f"{where}[{k}].functionCall.args")
        response = field(part, "functionResponse")
        if response is not None and (
            not isinstance(response, Mapping) or not isinstance(response.get("name"), str)
        ):
            raise _invalid("a functionResponse needs a string 'name'", f"{where}[{k}].functionResponse")


def _is_mapping(value: object) -> bool:
    """``isinstance(value, Mapping)``, with the JSON case (a dict) decided without the ABC check."""
    return type(value) is dict or isinstance(value, Mapping)


def validate_body(
    body: Mapping[str, Any], *, recalled: Recalled = NOTHING, kind: RouteKind | None = None
) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None, int | None]:
    """What planning relies on and every field the proxy reads, as Google checks them (raise
    ``InvalidRequest`` naming the field, in Google's words: ``contents is not specified`` for a
    missing history, or an empty one but on a ``"count"`` route, ``Invalid value at 'path'
    (TYPE), value`` for a field of another type): ``(contents, system, maxOutputTokens)``. A content
    ``recalled.reusable`` at its index is not checked again: it is strictly equal to one an earlier
    parse validated at the same index (the checks are pure functions of both)."""
    if not _is_mapping(body):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    contents = field(body, "contents")
    if contents is None or (contents == [] and kind != "count"):
        raise InvalidRequest("* GenerateContentRequest.contents: contents is not specified", param="contents")
    if not isinstance(contents, list):
        raise invalid_value("contents", "array", contents)
    for i in range(recalled.limit, len(contents)):
        if recalled.reusable(i):
            continue
        content = contents[i]
        if not _is_mapping(content):
            raise invalid_value(f"contents[{i}]", "object", content)
        role = content.get("role")
        if not (role is None or role == "" or (isinstance(role, str) and role in ROLES)):
            raise _invalid("Please use a valid role: user, model.", f"contents[{i}].role")
        _check_parts(content.get("parts"), f"contents[{i}].parts")
    for name in OBJECT_FIELDS:
        value = field(body, name)
        if value is not None and not _is_mapping(value):
            raise invalid_value(name, "object", value)
    system = field(body, "systemInstruction")
    if system is not None:
        _check_parts(system.get("parts"), "systemInstruction.parts")
    config = field(body, "generationConfig")
    cap = _check_generation(config) if config is not None else None
    tools = field(body, "tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid_value("tools", "array", tools)
        for k, tool in enumerate(tools):
            if not _is_mapping(tool):
                raise invalid_value(f"tools[{k}]", "object", tool)
    cached = field(body, "cachedContent")
    if cached is not None and not isinstance(cached, str):
        raise invalid_value("cachedContent", "string", cached)
    return contents, system, cap


def counted_request(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a ``:countTokens`` body asks to count: its ``generateContentRequest`` when it has one."""
    inner = field(body, "generateContentRequest") if _is_mapping(body) else None
    return inner if inner is not None and _is_mapping(inner) else body


@dataclass(frozen=True, slots=True)
class _Remembered:
    """What a parse leaves in a ``ParseMemo``: the neutral messages built from each content
    (``built[i]``, a pure function of ``i``, ``contents[i]`` and ``contents[i - 1]``)."""

    built: tuple[list[dict[str, Any]], ...]


def parse_gemini(
    body: Mapping[str, Any],
    *,
    model: str,
    stream: bool,
    memo: ParseMemo | None = None,
    counted: Mapping[str, Any] | None = None,
    kind: RouteKind | None = None,
) -> Conversation:
    """The neutral conversation of a Gemini body; ``model`` and ``stream`` from the path
    (``counted``: ``counted_request(body)`` when the caller has it already)."""
    request = counted_request(body) if counted is None else counted
    previous: _Remembered | None = None
    recalled = NOTHING
    if memo is not None:
        wire = field(request, "contents") if _is_mapping(request) else None
        if not (isinstance(wire, list) and memo.remembers(wire)):
            memo = None  # too short to be remembered: nothing to recall or keep
        else:
            recalled = memo.recall(MEMO_NAME, wire)
            previous = recalled.state if isinstance(recalled.state, _Remembered) else None
            if previous is None:
                recalled = NOTHING
    contents, system, cap = validate_body(request, recalled=recalled, kind=kind)
    out: list[dict[str, Any]] = []
    if system is not None:
        instruction = system_message(system)
        if instruction is not None:
            out.append(instruction)
    built: list[list[dict[str, Any]]] = []
    if previous is not None:
        # Every content below the limit, and the one before it, are strictly equal to the
        # remembered ones: what was built from them is taken at once.
        built = list(previous.built[: recalled.limit])
    for i in range(len(built), len(contents)):
        reuse = previous is not None and recalled.reusable(i) and (i == 0 or recalled.reusable(i - 1))
        group = previous.built[i] if reuse and previous is not None else None
        if group is None:
            group = content_messages(i, contents[i], contents[i - 1] if i else None)
        built.append(group)
    for group in built:
        out.extend(group)
    if memo is not None:
        memo.keep(MEMO_NAME, contents, item_shapes(contents, recalled), _Remembered(tuple(built)),
                  replacing=recalled.entry)  # fmt: skip
    cached = field(request, "cachedContent")
    return Conversation(
        model=model,
        messages=tuple(out),
        requested_output_tokens=cap,
        stream=stream,
        fittable=cached is None,
        unfittable_reason="" if cached is None else UNFITTABLE_CACHED,
    )


def body_model(body: Mapping[str, Any], *, counted: Mapping[str, Any] | None = None) -> str | None:
    """The body's ``model`` (or its ``generateContentRequest``'s), ``models/`` stripped
    (``counted``: ``counted_request(body)`` when the caller has it already)."""
    named = body.get("model")
    if named is None:
        inner = counted_request(body) if counted is None else counted
        named = inner.get("model") if inner is not body else None
    if isinstance(named, str) and named.removeprefix(MODEL_PREFIX):
        return named.removeprefix(MODEL_PREFIX)
    return None


__all__ = [
    "MODEL_PREFIX",
    "UNFITTABLE_CACHED",
    "body_model",
    "counted_request",
    "parse_gemini",
    "validate_body",
]
