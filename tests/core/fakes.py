"""Fakes for the core: a word-counting tokenizer, a chat accounting over it, conversation and
context builders.

One token per whitespace-separated word keeps counts obvious in tests and fast in property runs.
``FakeMessageCounter`` implements the ``MessageCounter`` contract on its own (3 per message, role,
``name`` +1, text, 85 per image part, tool-call names/arguments/ids) so these tests do not depend
on the real accounting's details.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.core.budget import Budget, Policy
from app.core.context import FitContext, build_context
from app.core.conversation import PRICE_KEY
from app.core.messages import Message
from app.core.registry import ModelSpec
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter

_WORD = re.compile(r"\S+")
IMAGE_TOKENS = 85
SPEC = ModelSpec(name="test-model", window_tokens=1_000_000, max_output_tokens=4096, encoding="estimate")
TINY_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9"
    "awAAAABJRU5ErkJggg=="
)


class WordCounter:
    """A ``TokenCounter``: one token per word; ``head_tail`` cuts at word boundaries."""

    name = "words"
    exact = True

    def count_text(self, text: str, /) -> int:
        return len(_WORD.findall(text))

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        words = list(_WORD.finditer(text))
        head = text[: words[head_tokens - 1].end()] if 0 < head_tokens <= len(words) else ""
        if head_tokens > len(words):
            head = text
        tail = text[words[-tail_tokens].start() :] if 0 < tail_tokens <= len(words) else ""
        if tail_tokens > len(words):
            tail = text
        return head, tail


class FakeMessageCounter(MessageCounter):
    """The ``MessageCounter`` contract over ``WordCounter`` with simple, documented rules."""

    def __init__(self) -> None:
        super().__init__(WordCounter())
        self.calls = 0

    def count_message(self, message: Mapping[str, Any]) -> int:
        self.calls += 1
        words = self.counter.count_text
        tokens = 3 + words(str(message.get("role", "")))
        if "name" in message:
            tokens += 1 + words(str(message["name"]))
        content = message.get("content")
        if isinstance(content, str):
            tokens += words(content)
        elif isinstance(content, list):
            for part in content:
                if type(part.get(PRICE_KEY)) is int:  # a dialect's own price (app.core.conversation)
                    tokens += part[PRICE_KEY]
                elif part.get("type") == "text":
                    tokens += words(str(part.get("text", "")))
                elif part.get("type") == "image_url":
                    tokens += IMAGE_TOKENS
                else:
                    tokens += words(json.dumps(part))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            tokens += words(str(call.get("id", ""))) + words(str(function.get("name", "")))
            tokens += words(str(function.get("arguments", "")))
        if "tool_call_id" in message:
            tokens += words(str(message["tool_call_id"]))
        if type(message.get(PRICE_KEY)) is int:
            tokens += message[PRICE_KEY]
        return tokens

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
        return tuple(self.count_message(m) for m in messages)

    def count_tools(self, body: Mapping[str, Any]) -> int:
        tools = body.get("tools")
        return self.counter.count_text(json.dumps(tools)) if tools else 0

    def count_request(self, body: Mapping[str, Any]) -> int:
        return sum(self.count_messages(body["messages"])) + REPLY_PRIMING_TOKENS + self.count_tools(body)


def words(n: int, tag: str = "w") -> str:
    """``n`` distinct words (``n`` tokens for the fake)."""
    return " ".join(f"{tag}{i}" for i in range(n))


def system(n: int = 5) -> dict[str, Any]:
    return {"role": "system", "content": words(n, "sys")}


def user(n: int = 10, tag: str = "u") -> dict[str, Any]:
    return {"role": "user", "content": words(n, tag)}


def assistant(n: int = 10, tag: str = "a") -> dict[str, Any]:
    return {"role": "assistant", "content": words(n, tag)}


def tool_exchange(call_ids: Sequence[str], result_tokens: int, tag: str = "t") -> list[dict[str, Any]]:
    """An assistant message calling ``call_ids`` in parallel and one result per call."""
    calls = [
        {"id": cid, "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": cid})}}
        for cid in call_ids
    ]
    out: list[dict[str, Any]] = [{"role": "assistant", "content": None, "tool_calls": calls}]
    out += [
        {"role": "tool", "tool_call_id": cid, "content": words(result_tokens, f"{tag}{cid}")}
        for cid in call_ids
    ]
    return out


def image_user(n: int = 5, tag: str = "iu") -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": words(n, tag)},
            {"type": "image_url", "image_url": {"url": TINY_PNG}},
        ],
    }


def chat(
    turns: int, *, user_tokens: int = 20, assistant_tokens: int = 40, with_system: bool = True
) -> list[dict[str, Any]]:
    """A plain conversation of ``turns`` user/assistant turns (the last turn is a lone user message)."""
    out: list[dict[str, Any]] = [system()] if with_system else []
    for k in range(turns):
        out.append(user(user_tokens, f"u{k}_"))
        if k < turns - 1:
            out.append(assistant(assistant_tokens, f"a{k}_"))
    return out


def body(messages: Sequence[Mapping[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": list(messages), **extra}


def policy(**overrides: Any) -> Policy:
    return Policy(**overrides)


def budget(input_tokens: int) -> Budget:
    return Budget(
        window_tokens=10_000_000, reserve_tokens=0, margin_tokens=0, tool_tokens=0, cap_tokens=input_tokens
    )


def ctx_for(
    messages: Sequence[Message], input_tokens: int, counter: FakeMessageCounter, **policy: Any
) -> FitContext:
    return build_context(messages, budget=budget(input_tokens), policy=Policy(**policy), counter=counter)


def agent_session(units: int, result_tokens: int, *, parallel: int = 1) -> list[dict[str, Any]]:
    """One user message (the task), then ``units`` tool exchanges: a single-turn agent session."""
    out: list[dict[str, Any]] = [system(), user(10, "task")]
    for k in range(units):
        out += tool_exchange([f"c{k}_{j}" for j in range(parallel)], result_tokens)
    return out
