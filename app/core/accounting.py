"""OpenAI's chat accounting: the tokens of one message and of a request's tool definitions.

INTERFACE CONTRACT (``tokens.py`` composes it; a dialect may too):

* ``TextCount``: the protocol of what the rules add up: a callable ``(text) -> int``, the
  tokenizer's *raw* text count (``MessageCounter`` passes its cached raw count; a correction is
  applied after, by the caller).
* ``ChatAccounting(text, *, encoding)``: the rules over one ``TextCount``.
  ``tally_message(message)`` and ``tally_tools({"tools": ..., "functions": ...})`` return
  ``(fixed tokens, raw text tokens)``, kept apart so a correction scales the text only.
* ``ToolConstants`` and ``tool_constants(encoding)`` (the cookbook's by encoding name, cl100k's as
  the default); ``TOKENS_PER_MESSAGE``, ``TOKENS_PER_NAME``, ``TOKENS_PER_TOOL_CALL``;
  ``MAX_NESTING_DEPTH`` (how deep schemas and unknown values are walked).

Accounting rules (``count_message``), all conservative where OpenAI documents nothing:

* 3 per message, the role's text, +1 and the text for ``name`` (the cookbook's gpt-4o/gpt-4 rules);
* string content as text; content parts: ``text`` and ``refusal`` as text; ``image_url`` by OpenAI's
  image rule (``media.image_tokens``; the size is read from a data URL's header, a remote URL is taken
  to be ``DEFAULT_IMAGE_SIZE``); ``input_audio`` and ``file`` by the flat rules of ``media.py``; base64
  data is never counted as text; an unknown part counts its string values as text (data URLs excepted);
* assistant ``tool_calls``: ``TOKENS_PER_TOOL_CALL`` plus the text of the function name, arguments and
  call id; legacy ``function_call``: ``TOKENS_PER_TOOL_CALL`` plus name and arguments;
* ``conversation.PRICE_KEY`` (an int a dialect put on a message or a part) as that many fixed
  tokens; on a part it replaces the rules above (the dialect priced it by its own API's rule);
* every other key with a string value (``tool_call_id``, ``reasoning_content``, ``refusal``, ...) as
  text; other non-string values of unknown keys are ignored (``null`` content, ``audio`` references).

Tool definitions (``count_tools``): the cookbook's ``num_tokens_for_tools`` approximation (per
function ``func_init`` + ``name:description``; ``prop_init`` once per property list; per property
``prop_key`` + ``key:type:description``; ``enum_init`` + ``enum_item`` and the text per enum value;
``func_end`` once when there are tools), with its constants for o200k (gpt-4o) and cl100k (gpt-4);
the estimate uses cl100k's (larger). Extended here: nested ``properties`` of object properties and
of array ``items`` recurse with the same constants, ``anyOf``/``oneOf``/``allOf`` variants too, an
array's item type is counted as text; legacy ``functions`` count like ``tools``; a non-function tool
(``{"type": "custom", "custom": {...}}``) counts ``func_init`` plus the text of its string values.

Media parts are priced by ``media.py``. Counting never mutates the message and never caches (the
cache is ``MessageCounter``'s).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from .conversation import PRICE_KEY
from .media import FILE_PART_TOKENS, audio_part_tokens, data_url_tokens, image_part_tokens
from .messages import Message

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1

# Tool calls are rendered into the prompt with some framing around name and arguments that OpenAI
# does not document; a few tokens per call keeps us on the safe side of it.
TOKENS_PER_TOOL_CALL = 3


class _Tally:
    """Fixed tokens (formatting, images, flat rules) and text tokens of one item, kept apart."""

    __slots__ = ("fixed", "text")

    def __init__(self) -> None:
        self.fixed = 0
        self.text = 0


class TextCount(Protocol):
    """The tokenizer's raw text count, as the rules use it."""

    def __call__(self, text: str, /) -> int: ...


class ToolConstants(NamedTuple):
    """The cookbook's framing tokens of tool definitions (``num_tokens_for_tools``)."""

    func_init: int
    prop_init: int
    prop_key: int
    enum_init: int
    enum_item: int
    func_end: int


# From the OpenAI cookbook "How to count tokens with tiktoken", num_tokens_for_tools.
_TOOL_CONSTANTS_O200K = ToolConstants(7, 3, 3, -3, 3, 12)
_TOOL_CONSTANTS_CL100K = ToolConstants(10, 3, 3, -3, 3, 12)
_TOOL_CONSTANTS = {"o200k_base": _TOOL_CONSTANTS_O200K, "cl100k_base": _TOOL_CONSTANTS_CL100K}
# Nested schemas and unknown values are walked this deep; deeper parts are not counted (a body
# that deep is hostile, and Python's own recursion limit must never be reached here).
MAX_NESTING_DEPTH = 32


def tool_constants(encoding: str) -> ToolConstants:
    """The cookbook's constants for ``encoding``; cl100k's (the larger) for any other vocabulary."""
    return _TOOL_CONSTANTS.get(encoding, _TOOL_CONSTANTS_CL100K)


class ChatAccounting:
    """The accounting rules over a raw text count (composed into
    :class:`app.core.tokens.MessageCounter`, which caches what they return).

    Stateless besides its two inputs: thread-safe when ``text`` is, never mutates what it counts.
    """

    __slots__ = ("_text", "_tool_constants")

    def __init__(self, text: TextCount, *, encoding: str) -> None:
        self._text = text
        self._tool_constants = tool_constants(encoding)

    def tally_message(self, message: Message) -> tuple[int, int]:
        """``(fixed tokens, raw text tokens)`` of one message (see the module docstring)."""
        t = _Tally()
        t.fixed = TOKENS_PER_MESSAGE
        count = self._text
        for key, value in message.items():
            if key == "content":
                self._tally_content(value, t)
            elif key == "name":
                t.fixed += TOKENS_PER_NAME
                t.text += count(value if isinstance(value, str) else _json_text(value))
            elif key == "tool_calls":
                self._tally_tool_calls(value, t)
            elif key == "function_call":
                self._tally_function_call(value, t)
            elif key == PRICE_KEY:
                t.fixed += value if type(value) is int and value > 0 else 0
            elif isinstance(value, str):
                t.text += count(value)
        return t.fixed, t.text

    def _tally_content(self, content: Any, t: _Tally) -> None:
        if content is None:
            return
        if isinstance(content, str):
            t.text += self._text(content)
        elif isinstance(content, list | tuple):
            for part in content:
                self._tally_part(part, t)
        else:
            t.text += self._text(_json_text(content))

    def _tally_part(self, part: Any, t: _Tally) -> None:
        count = self._text
        if isinstance(part, str):
            t.text += count(part)
            return
        if not isinstance(part, Mapping):
            return
        price = part.get(PRICE_KEY)
        if type(price) is int:  # the dialect priced this part by its own API's rule
            t.fixed += max(0, price)
            return
        kind = part.get("type")
        if kind == "text":
            t.text += count(_as_text(part.get("text")))
        elif kind == "refusal":
            t.text += count(_as_text(part.get("refusal")))
        elif kind == "image_url":
            t.fixed += image_part_tokens(part.get("image_url"))
        elif kind == "input_audio":
            t.fixed += audio_part_tokens(part.get("input_audio"))
        elif kind == "file":
            file = part.get("file")
            t.fixed += FILE_PART_TOKENS
            if isinstance(file, Mapping) and isinstance(file.get("filename"), str):
                t.text += count(file["filename"])
        else:
            for key, value in part.items():
                if key != "type":
                    self._tally_unknown(value, t, depth=0)

    def _tally_unknown(self, value: Any, t: _Tally, *, depth: int) -> None:
        if isinstance(value, str):
            if value.startswith("data:"):
                t.fixed += data_url_tokens(value)
            else:
                t.text += self._text(value)
        elif depth < MAX_NESTING_DEPTH and isinstance(value, Mapping):
            for item in value.values():
                self._tally_unknown(item, t, depth=depth + 1)
        elif depth < MAX_NESTING_DEPTH and isinstance(value, list | tuple):
            for item in value:
                self._tally_unknown(item, t, depth=depth + 1)

    def _tally_tool_calls(self, calls: Any, t: _Tally) -> None:
        if not isinstance(calls, list | tuple):
            return
        count = self._text
        for call in calls:
            if not isinstance(call, Mapping):
                continue
            t.fixed += TOKENS_PER_TOOL_CALL
            call_id = call.get("id")
            if isinstance(call_id, str):
                t.text += count(call_id)
            function = call.get("function")
            if isinstance(function, Mapping):
                t.text += count(_as_text(function.get("name")))
                t.text += count(_as_text(function.get("arguments")))
            else:
                for key, value in call.items():
                    if key not in ("id", "type"):
                        self._tally_unknown(value, t, depth=0)

    def _tally_function_call(self, call: Any, t: _Tally) -> None:
        if not isinstance(call, Mapping):
            return
        t.fixed += TOKENS_PER_TOOL_CALL
        t.text += self._text(_as_text(call.get("name")))
        t.text += self._text(_as_text(call.get("arguments")))

    def tally_tools(self, definitions: Mapping[str, Any]) -> tuple[int, int]:
        """``(fixed tokens, raw text tokens)`` of ``{"tools": ..., "functions": ...}``."""
        t = _Tally()
        c = self._tool_constants
        seen = False
        for group in (definitions.get("tools"), definitions.get("functions")):
            if not isinstance(group, list | tuple):
                continue
            for tool in group:
                if not isinstance(tool, Mapping):
                    continue
                seen = True
                t.fixed += c.func_init
                kind = tool.get("type")
                function = tool.get("function") if "function" in tool else tool if kind is None else None
                if isinstance(function, Mapping):
                    self._tally_function_def(function, t)
                else:
                    spec = tool.get(kind) if isinstance(kind, str) else None
                    self._tally_unknown(spec if spec is not None else dict(tool), t, depth=0)
        if seen:
            t.fixed += c.func_end
        return t.fixed, t.text

    def _tally_function_def(self, function: Mapping[str, Any], t: _Tally) -> None:
        description = _strip_dot(_as_text(function.get("description")))
        t.text += self._text(f"{_as_text(function.get('name'))}:{description}")
        parameters = function.get("parameters")
        if isinstance(parameters, Mapping):
            self._tally_schema_children(parameters, t, depth=0)

    def _tally_schema_children(self, schema: Mapping[str, Any], t: _Tally, *, depth: int) -> None:
        """Count what sits *inside* ``schema``: its properties, its items and its variants."""
        if depth >= MAX_NESTING_DEPTH:
            return
        c = self._tool_constants
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties:
            t.fixed += c.prop_init
            for key, prop in properties.items():
                t.fixed += c.prop_key
                if not isinstance(prop, Mapping):
                    t.text += self._text(f"{key}::")
                    continue
                self._tally_enum(prop, t)
                description = _strip_dot(_as_text(prop.get("description")))
                t.text += self._text(f"{key}:{_type_text(prop)}:{description}")
                self._tally_schema_children(prop, t, depth=depth + 1)
        items = schema.get("items")
        if isinstance(items, Mapping):
            item_type = _type_text(items)
            if item_type:
                t.text += self._text(item_type)
            self._tally_enum(items, t)
            self._tally_schema_children(items, t, depth=depth + 1)
        for keyword in ("anyOf", "oneOf", "allOf"):
            variants = schema.get(keyword)
            if isinstance(variants, list | tuple):
                for variant in variants:
                    if isinstance(variant, Mapping):
                        item_type = _type_text(variant)
                        if item_type:
                            t.text += self._text(item_type)
                        self._tally_enum(variant, t)
                        self._tally_schema_children(variant, t, depth=depth + 1)

    def _tally_enum(self, schema: Mapping[str, Any], t: _Tally) -> None:
        enum = schema.get("enum")
        if isinstance(enum, list | tuple):
            c = self._tool_constants
            t.fixed += c.enum_init
            for item in enum:
                t.fixed += c.enum_item
                t.text += self._text(item if isinstance(item, str) else _json_text(item))


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(value)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else _json_text(value)


def _strip_dot(text: str) -> str:
    return text[:-1] if text.endswith(".") else text


def _type_text(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list | tuple):
        return " | ".join(str(k) for k in kind)
    return ""
