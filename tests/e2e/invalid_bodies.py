"""The probe of issue 27's strict input: invalid request bodies of every fitted API, with the routes
each is sent on (``tests/e2e/test_strict_input.py``) and what the answer must say.

Every body is valid but for one thing: a token that is not JSON (``NaN``, ``Infinity``,
``-Infinity``), a number that overflows a double (``1e400``, in a history long enough to be cut
were it forwarded), an output cap of the wrong type or under the provider's minimum, an empty
history, a field the proxy reads of the wrong type. ``python -m tests.e2e.invalid_bodies`` prints
the list.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

Api = Literal["chat", "responses", "messages", "gemini"]
Scope = Literal["all", "fit"]  # every route of the API, or the routes that answer (not counting)
JSON_ERROR: dict[Api, str] = {
    "chat": "We could not parse the JSON body of your request.",
    "responses": "We could not parse the JSON body of your request.",
    "messages": "The request body is not valid JSON:",
    "gemini": "Invalid JSON payload received.",
}
MODELS: dict[Api, str] = {
    "chat": "probe-chat",
    "responses": "probe-responses",
    "messages": "probe-messages",
    "gemini": "probe-gemini",
}
LONG_TURNS = 60  # a history of this many turns is over the probe proxy's 4,096-token window


def turn_text(i: int) -> str:
    return f"turn {i}: " + " ".join(f"word{i}_{k}" for k in range(60))


def base(api: Api, *, turns: int = 1) -> dict[str, Any]:
    """A valid body of ``api`` with ``turns`` user turns (and an answer between them)."""
    texts = [turn_text(i) for i in range(turns)]
    model = MODELS[api]
    if api == "chat":
        messages = []
        for text in texts:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        return {"model": model, "messages": messages[:-1], "max_tokens": 64}
    if api == "responses":
        items = []
        for text in texts:
            items += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        return {"model": model, "input": items[:-1], "max_output_tokens": 64}
    if api == "messages":
        messages = []
        for text in texts:
            messages += [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        return {"model": model, "max_tokens": 64, "messages": messages[:-1]}
    contents = []
    for text in texts:
        contents += [
            {"role": "user", "parts": [{"text": text}]},
            {"role": "model", "parts": [{"text": "ok"}]},
        ]
    # The model in the body too (GenerateContentRequest has it): the dry run has no path.
    return {
        "model": f"models/{model}",
        "contents": contents[:-1],
        "generationConfig": {"maxOutputTokens": 64},
    }


@dataclass(frozen=True, slots=True)
class Case:
    """One invalid body: ``api``, a ``name``, the ``raw`` bytes, the routes it goes to (``scope``)
    and a piece of the message the answer must have (``says``)."""

    api: Api
    name: str
    raw: bytes
    says: str
    scope: Scope = "all"

    @property
    def id(self) -> str:
        return f"{self.api}:{self.name}"


def _with(api: Api, change: Callable[[dict[str, Any]], None], *, turns: int = 1) -> bytes:
    body = base(api, turns=turns)
    change(body)
    return json.dumps(body).encode()


def _token(api: Api, literal: str, *, turns: int = 1) -> bytes:
    """A body whose temperature is ``literal``, written as is (not JSON when it is NaN...)."""

    def change(body: dict[str, Any]) -> None:
        target = body.setdefault("generationConfig", {}) if api == "gemini" else body
        target["temperature"] = "@@"

    return _with(api, change, turns=turns).replace(b'"@@"', literal.encode())


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return change


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body.pop(key, None)


def not_json() -> Iterator[Case]:
    """``NaN``, ``Infinity``, ``-Infinity`` on every route; ``1e400`` in a history that would be cut."""
    for api in JSON_ERROR:
        for literal in ("NaN", "Infinity", "-Infinity"):
            yield Case(api, f"temperature {literal}", _token(api, literal), JSON_ERROR[api])
        yield Case(api, "1e400 in a long body", _token(api, "1e400", turns=LONG_TURNS), JSON_ERROR[api])


def output_caps() -> Iterator[Case]:
    """The output cap of each API: the wrong type, under the minimum."""
    for key in ("max_tokens", "max_completion_tokens"):
        for value, says in (
            (-5, "Expected a value >= 1"),
            ("10", "expected an integer, but got a string"),
            (True, "expected an integer, but got a boolean"),
            (1.5, "expected an integer, but got a decimal number"),
            (1.0, "expected an integer, but got a decimal number"),
            (0, "Expected a value >= 1"),
        ):
            yield Case("chat", f"{key} {json.dumps(value)}", _with("chat", _set(key, value)), says, "fit")
    for value, says in (
        (0, "Expected a value >= 16"),
        (15, "Expected a value >= 16"),
        ("16", "expected an integer, but got a string"),
        (16.0, "but got a decimal number"),
        (False, "expected an integer, but got a boolean"),
    ):
        raw = _with("responses", _set("max_output_tokens", value))
        yield Case("responses", f"max_output_tokens {json.dumps(value)}", raw, says, "fit")
    for value, says in (
        (0, "greater than or equal to 1"),
        (-1, "greater than or equal to 1"),
        ("64", "Input should be a valid integer"),
        (True, "Input should be a valid integer"),
        (1.5, "fractional part"),
        (64.0, "Input should be a valid integer"),
    ):
        raw = _with("messages", _set("max_tokens", value))
        yield Case("messages", f"max_tokens {json.dumps(value)}", raw, says, "fit")
    yield Case(
        "messages",
        "max_tokens missing",
        _with("messages", _drop("max_tokens")),
        "max_tokens: Field required",
        "fit",
    )
    for value, says in (
        (0, "supported range is from 1"),
        ("64", "(TYPE_INT32)"),
        (True, "(TYPE_INT32)"),
        (1.5, "(TYPE_INT32)"),
        (64.0, "(TYPE_INT32)"),
    ):
        raw = _with("gemini", _set("generationConfig.maxOutputTokens", value))
        yield Case("gemini", f"maxOutputTokens {json.dumps(value)}", raw, says, "fit")


def histories() -> Iterator[Case]:
    """An empty or missing history where the provider refuses one."""
    yield Case("chat", "messages []", _with("chat", _set("messages", [])), "empty array")
    yield Case("messages", "messages []", _with("messages", _set("messages", [])), "at least one message")
    yield Case(
        "gemini", "contents []", _with("gemini", _set("contents", [])), "contents is not specified", "fit"
    )
    yield Case("gemini", "contents missing", _with("gemini", _drop("contents")), "contents is not specified")


def wrong_types() -> Iterator[Case]:
    """A field the proxy reads, present with the wrong type: the answer says the type is wrong."""
    openai_type = "Invalid type for"
    for api, key, value in (
        ("chat", "model", 5),
        ("chat", "messages", "hi"),
        ("chat", "stream", "yes"),
        ("chat", "stream_options", "usage"),
        ("chat", "tools", {"type": "function"}),
        ("chat", "tool_choice", 5),
        ("responses", "model", ["gpt"]),
        ("responses", "input", 5),
        ("responses", "instructions", 5),
        ("responses", "stream", 1),
        ("responses", "tools", "all"),
        ("responses", "tool_choice", 5),
        ("responses", "stream_options", []),
    ):
        yield Case(api, f"{key} {json.dumps(value)}", _with(api, _set(key, value)), openai_type)  # type: ignore[arg-type]
    yield Case(
        "chat", "role robot", _with("chat", _set("messages", [{"role": "robot", "content": "x"}])), "role"
    )
    yield Case(
        "chat",
        "part type 5",
        _with("chat", _set("messages", [{"role": "user", "content": [{"type": 5}]}])),
        "must be an object with a string 'type'",
    )
    yield Case(
        "responses",
        "role robot",
        _with("responses", _set("input", [{"role": "robot", "content": "x"}])),
        "role must be one of",
    )
    for key, value, says in (
        ("model", 5, "model: Input should be a valid string"),
        ("messages", "hi", "messages: Input should be a valid list"),
        ("stream", "yes", "stream: Input should be a valid boolean"),
        ("system", 5, "system: Input should be"),
        ("tools", {"name": "t"}, "tools: Input should be a valid list"),
        ("tool_choice", "auto", "tool_choice: Input should be a valid dictionary"),
        ("thinking", "on", "thinking: Input should be a valid dictionary"),
        (
            "thinking",
            {"type": "enabled", "budget_tokens": "2048"},
            "budget_tokens: Input should be a valid integer",
        ),
        ("thinking", {"type": "enabled", "budget_tokens": 512}, "greater than or equal to 1024"),
        ("messages", [{"role": "robot", "content": "x"}], "messages.0.role: Input should be"),
        ("messages", [{"role": "user", "content": [{"type": 5}]}], "messages.0.content.0"),
    ):
        yield Case("messages", f"{key} {json.dumps(value)}", _with("messages", _set(key, value)), says)
    for key, value, says in (
        ("contents", "hi", "Invalid value at 'contents'"),
        ("contents", ["hi"], "Invalid value at 'contents[0]'"),
        ("systemInstruction", "be nice", "Invalid value at 'system_instruction'"),
        ("tools", {"functionDeclarations": []}, "Invalid value at 'tools'"),
        ("toolConfig", "auto", "Invalid value at 'tool_config'"),
        ("generationConfig", 5, "Invalid value at 'generation_config'"),
        ("generationConfig.thinkingConfig.thinkingBudget", "1024", "thinking_budget' (TYPE_INT32)"),
        ("contents", [{"role": "assistant", "parts": [{"text": "x"}]}], "valid role"),
    ):
        yield Case("gemini", f"{key} {json.dumps(value)}", _with("gemini", _set(key, value)), says)


def corpus() -> list[Case]:
    return [*not_json(), *output_caps(), *histories(), *wrong_types()]


if __name__ == "__main__":
    for case in corpus():
        print(f"{case.id:60} {case.raw[:100]!r}")
