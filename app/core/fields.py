"""The type and range checks every dialect's parse makes of the fields the proxy reads, written once.

Each dialect words the problem as its own API does (OpenAI's ``Invalid type for 'max_tokens':
expected an integer, but got a string instead.``, Anthropic's ``max_tokens: Input should be a
valid integer``, Google's ``Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32),
"10"``); what counts as wrong is decided here, the same on every route.

INTERFACE CONTRACT (pure, standard library only):

* ``json_type(value) -> JsonType``: the JSON type of a parsed value: ``"string"``, ``"boolean"``,
  ``"integer"``, ``"number"`` (a float: ``1.0`` too, which a JSON parser reads as one),
  ``"array"``, ``"object"``, ``"null"``.
* ``is_json(value, *types) -> bool``: ``json_type(value)`` is one of ``types``.
* ``integer_problem(value, *, minimum) -> "type" | "minimum" | None``: None for an integer (not a
  boolean) of at least ``minimum``; ``"type"`` for anything that is not an integer (booleans,
  strings such as ``"10"``, floats such as ``1.5`` and ``1.0``, null); ``"minimum"`` for an
  integer below it.
* ``a_type(kind) -> str``: the type with its article, for messages (``"an integer"``,
  ``"a decimal number"`` for ``"number"``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

JsonType = Literal["string", "boolean", "integer", "number", "array", "object", "null"]
IntegerProblem = Literal["type", "minimum"]

_ARTICLED: Mapping[str, str] = {
    "string": "a string",
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a decimal number",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def json_type(value: object) -> JsonType:
    """The JSON type of a value a JSON parser made (see the module docstring)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    return "array"


def is_json(value: object, *types: JsonType) -> bool:
    """True when ``value`` is of one of the JSON ``types``."""
    return json_type(value) in types


def integer_problem(value: object, *, minimum: int) -> IntegerProblem | None:
    """What is wrong with ``value`` as an integer of at least ``minimum`` (None: nothing)."""
    if type(value) is not int:
        return "type"
    return "minimum" if value < minimum else None


def a_type(kind: JsonType) -> str:
    """``kind`` with its article, as error messages say it (``"an integer"``)."""
    return _ARTICLED[kind]


__all__ = ["IntegerProblem", "JsonType", "a_type", "integer_problem", "is_json", "json_type"]
