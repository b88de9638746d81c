"""A Gemini request body: its validation and its neutral conversation (``gemini.py`` is the
dialect built on it; ``gemini_wire.py`` maps contents and renders).

INTERFACE CONTRACT (pure, standard library only):

* ``validate_body(body, *, recalled=NOTHING) -> (contents, system, maxOutputTokens)``: what
  planning relies on, ``InvalidRequest`` naming the field otherwise; a content ``recalled``
  reusable at its index is not checked again (it is strictly equal to one checked before).
* ``parse_gemini(body, *, model, stream, memo=None, counted=None) -> Conversation``: the neutral conversation
  of a body (a ``:countTokens`` body read through ``counted_request``); ``model`` and ``stream``
  come from the request's path. With ``memo`` (``parse_memo``), the neutral messages of a resent
  history's strictly equal leading contents are reused (those of content ``i`` are a pure
  function of ``i``, it and the content before it: ``gemini_wire.content_messages``); the result
  equals a fresh parse. A body with ``cachedContent`` is not fittable (part of its prompt lives
  upstream, ``UNFITTABLE_CACHED``).
* ``counted_request(body)``: the ``generateContentRequest`` of a ``:countTokens`` body when it
  has one, else the body itself.
* ``body_model(body, *, counted=None)``: the body's ``model`` (or its ``generateContentRequest``'s) without
  ``models/``, else None (a request without a path: the dry run, the gateway engine).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..conversation import Conversation
from ..errors import InvalidRequest
from ..parse_memo import NOTHING, ParseMemo, Recalled, item_shapes
from .gemini_wire import content_messages, field, plain_text, system_message

MEMO_NAME = "gemini"  # the ParseMemo's key for this API's parses
ROLES: frozenset[str] = frozenset({"user", "model"})
UNFITTABLE_CACHED = "cachedContent: part of the prompt is cached upstream"
MODEL_PREFIX = "models/"


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _check_parts(parts: object, where: str) -> None:
    if parts is None:
        return
    if not isinstance(parts, list):
        raise _invalid("Input should be a list of parts", where)
    for k, part in enumerate(parts):
        if plain_text(part):
            continue
        if not isinstance(part, Mapping):
            raise _invalid("Input should be an object (a part)", f"{where}[{k}]")
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
    body: Mapping[str, Any], *, recalled: Recalled = NOTHING
) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None, int | None]:
    """What planning relies on (raise ``InvalidRequest`` naming the field): ``(contents, system,
    maxOutputTokens)``. A content ``recalled.reusable`` at its index is not checked again: it is
    strictly equal to one an earlier parse validated at the same index (the checks are pure
    functions of both)."""
    if not _is_mapping(body):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    contents = field(body, "contents")
    if not isinstance(contents, list):
        raise _invalid("Field required (an array of Content objects)", "contents")
    for i in range(recalled.limit, len(contents)):
        if recalled.reusable(i):
            continue
        content = contents[i]
        if not _is_mapping(content):
            raise _invalid("Input should be a Content object", f"contents[{i}]")
        role = content.get("role")
        if not (role is None or role == "" or (isinstance(role, str) and role in ROLES)):
            raise _invalid("Please use a valid role: user, model.", f"contents[{i}].role")
        _check_parts(content.get("parts"), f"contents[{i}].parts")
    system = field(body, "systemInstruction")
    if system is not None:
        if not _is_mapping(system):
            raise _invalid("Input should be a Content object", "systemInstruction")
        _check_parts(system.get("parts"), "systemInstruction.parts")
    config = field(body, "generationConfig")
    cap = None
    if config is not None:
        if not _is_mapping(config):
            raise _invalid("Input should be an object", "generationConfig")
        cap = field(config, "maxOutputTokens")
        if cap is not None and (type(cap) is not int or cap < 1):
            raise _invalid("Input should be an integer of at least 1", "generationConfig.maxOutputTokens")
    tools = field(body, "tools")
    if tools is not None and not (isinstance(tools, list) and all(_is_mapping(t) for t in tools)):
        raise _invalid("Input should be a list of Tool objects", "tools")
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
    contents, system, cap = validate_body(request, recalled=recalled)
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
