"""The request context and the scope keys the routes record into."""

from __future__ import annotations

from types import SimpleNamespace

from app.observability.context import (
    ACCESS_SCOPE_KEY,
    DIALECT_SCOPE_KEY,
    api_of,
    new_request_id,
    valid_request_id,
)


def test_the_api_is_the_name_of_the_dialect_the_route_recorded() -> None:
    assert api_of({DIALECT_SCOPE_KEY: SimpleNamespace(name="responses")}) == "responses"
    assert api_of({}) is None
    assert api_of({DIALECT_SCOPE_KEY: SimpleNamespace(name="")}) is None
    assert api_of({DIALECT_SCOPE_KEY: object()}) is None
    assert api_of({DIALECT_SCOPE_KEY: SimpleNamespace(name=42)}) is None
    matched = SimpleNamespace(dialect=SimpleNamespace(name="gemini"), params={"model": "g"})
    assert api_of({DIALECT_SCOPE_KEY: matched}) == "gemini"  # a matched route that carries its dialect


def test_the_api_layer_uses_the_same_keys() -> None:
    from app.api import errors, responses

    assert errors.DIALECT_SCOPE_KEY == DIALECT_SCOPE_KEY
    scope: dict[str, object] = {}
    responses.access_fields(scope)["model"] = "m"
    assert scope[ACCESS_SCOPE_KEY] == {"model": "m"}


def test_request_ids() -> None:
    assert valid_request_id(new_request_id()) and len(new_request_id()) == 32
    assert not valid_request_id("has space") and not valid_request_id(None)
