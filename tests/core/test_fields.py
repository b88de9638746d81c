"""app.core.fields: one rule for the JSON type of a field and for "an integer of at least N"."""

from __future__ import annotations

import pytest

from app.core.fields import a_type, integer_problem, is_json, json_type


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, "null"),
        (True, "boolean"),
        (False, "boolean"),
        (0, "integer"),
        (-5, "integer"),
        (1.0, "number"),
        (1.5, "number"),
        ("10", "string"),
        ([], "array"),
        ({}, "object"),
    ],
)
def test_json_type_names_what_a_json_parser_made(value: object, kind: str) -> None:
    assert json_type(value) == kind
    assert is_json(value, kind)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (16, None),
        (17, None),
        (15, "minimum"),
        (0, "minimum"),
        (-5, "minimum"),
        (True, "type"),  # a boolean is no integer, though Python's bool is an int
        ("16", "type"),
        (16.0, "type"),  # an integral float is a float on the wire: refused, as OpenAI does
        (16.5, "type"),
        (None, "type"),
        ([16], "type"),
    ],
)
def test_an_integer_of_at_least_n_is_one_rule(value: object, problem: str | None) -> None:
    assert integer_problem(value, minimum=16) == problem


def test_types_read_with_their_article() -> None:
    assert [a_type(k) for k in ("integer", "number", "string", "array")] == [
        "an integer",
        "a decimal number",
        "a string",
        "an array",
    ]
