"""What a request brings: its ``X-Context-*`` options and its body, parsed once.

``parse_body(raw) -> dict`` turns bad JSON or a non-object into ``InvalidRequest``;
``dump_body(body) -> bytes`` writes a rewritten body back (``app.wire``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..core.budget import PolicyMode
from ..core.errors import InvalidRequest
from ..wire import dump_json


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """The request's validated ``X-Context-*`` headers; None means "not given"."""

    budget_tokens: int | None = None
    reserve_tokens: int | None = None
    window_tokens: int | None = None
    mode: PolicyMode | None = None
    keep_turns: int | None = None
    summarize: bool | None = None
    cut_target: float | None = None


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a dict; ``InvalidRequest`` for malformed JSON or a non-object."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson is stricter than the JSON the upstream accepts (escaped lone surrogates, ...):
        # fall back to the standard library before calling the body malformed.
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise InvalidRequest(
                f"We could not parse the JSON body of your request ({exc}). "
                "The body must be a JSON object (Content-Type: application/json)."
            ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"The request body must be a JSON object, not {type(body).__name__}.", param=None
        )
    return body


def dump_body(body: Mapping[str, Any]) -> bytes:
    """Serialize a rewritten body compactly (lone surrogates survive, see ``app.wire``)."""
    return dump_json(body)
