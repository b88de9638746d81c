"""The strict fake upstream of ``bench.boundary``: every wire API's paths, counted with a tokenizer
of its own, refusing what is over its window in its API's words.

* ``Upstream(models)``: an httpx handler (``handler``) serving ``/v1/chat/completions``,
  ``/v1/responses`` (+ ``/input_tokens``), ``/v1/messages`` (+ ``/count_tokens``) and Gemini's
  ``/v1beta/models/{model}:generateContent`` (+ ``:countTokens``, a ``generateContentRequest``):
  ``count(dialect, body, model=)`` is its count of a request (the proxy's own accounting over the
  pricing's tokenizer, see ``Model.pricing``); a body with a structural problem
  (``Dialect.problems``) is refused (recorded as 422: the bench stops); what is over the window is
  refused 400 with the API's overflow wording (Chat Completions, Anthropic and Gemini with numbers,
  OpenAI Responses without); the rest answered with ``usage`` (Gemini: ``usageMetadata``) = the
  count (a summary request of the proxy answered by the test suite's fake summarizer,
  ``tests.fake_summarizer``, the rest ``ok``). Gemini's window limits the input alone
  (``maxOutputTokens`` not counted against it). Every call is recorded (``calls``: path, body,
  status, count).
* Pricings (``Model.pricing``): ``exact`` (o200k: the proxy's own accounting, as the table says),
  ``claude-like`` (1.15x over cl100k), ``gemma-like`` (word pieces, 0.8x), ``encrypted`` (exact,
  but encrypted reasoning, Anthropic ``redacted_thinking`` and Gemini thought signatures at 6
  characters a token where the proxy prices 4).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.compaction.prompts import SYSTEM_MARKER
from app.core.dialect import Dialect
from app.core.dialects import CHAT, GEMINI, MESSAGES, RESPONSES
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter, TokenCounter
from app.tokenizer import counter_for
from bench.calibration import word_pieces
from tests.fake_summarizer import prompt_text, summary_answer

DIALECT_OF: dict[str, Dialect] = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/responses/input_tokens": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": MESSAGES,
}
COUNT_PATHS = frozenset({"/v1/responses/input_tokens", "/v1/messages/count_tokens"})
GEMINI_MODELS = "/v1beta/models/"


class WordPieces:
    """A tokenizer the proxy does not have (``gemma-like``): 0.8x word pieces."""

    name = "gemma-like"
    exact = True

    def count_text(self, text: str, /) -> int:
        return math.ceil(word_pieces(text) * 0.8)

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Model:
    """A model of the fake: its real window, how it counts, whether its errors carry numbers."""

    name: str
    window_tokens: int
    pricing: str
    encoding: str  # what the proxy's table says (estimate for the tokenizers it does not have)
    table_window_tokens: int = 0  # the window the proxy's table states (0: the real one)
    numbers: bool = True


def _counter(pricing: str) -> MessageCounter:
    base: TokenCounter
    if pricing == "claude-like":
        base = counter_for("cl100k_base")
    elif pricing == "gemma-like":
        base = WordPieces()
    else:
        base = counter_for("o200k_base")
    return MessageCounter(base)


def _secrets(body: Mapping[str, Any]) -> int:
    """Characters of encrypted reasoning in a Responses, Messages or Gemini body."""
    total = 0
    for item in body.get("input") or []:
        if isinstance(item, dict) and isinstance(item.get("encrypted_content"), str):
            total += len(item["encrypted_content"])
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if isinstance(block, dict) and block.get("type") == "redacted_thinking":
                total += len(block.get("data") or "")
    for content in body.get("contents") or []:
        for part in content.get("parts") or [] if isinstance(content, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("thoughtSignature"), str):
                total += len(part["thoughtSignature"])
    return total


def route_of(path: str) -> tuple[Dialect, str | None, bool]:
    """The dialect of a path, its model when the path names it (Gemini), whether it counts."""
    if path.startswith(GEMINI_MODELS):
        model, _, method = path[len(GEMINI_MODELS) :].rpartition(":")
        return GEMINI, model, method == "countTokens"
    return DIALECT_OF[path], None, path in COUNT_PATHS


@dataclass
class Call:
    path: str
    body: bytes
    status: int
    tokens: int

    @property
    def counting(self) -> bool:
        return route_of(self.path)[2]

    @property
    def summary(self) -> bool:
        """A summary call of the proxy (summaries are on by default), not a client's request."""
        return SYSTEM_MARKER.encode() in self.body


@dataclass
class Upstream:
    """The strict fake (see the module docstring)."""

    models: dict[str, Model]
    calls: list[Call] = field(default_factory=list)
    counters: dict[str, MessageCounter] = field(default_factory=dict)
    spent_s: float = 0.0

    def count(self, dialect: Dialect, body: Mapping[str, Any], *, model: str | None = None) -> int:
        spec = self.models[model or str(body.get("model"))]
        counter = self.counters.get(spec.pricing)
        if counter is None:
            counter = self.counters[spec.pricing] = _counter(spec.pricing)
        messages = dialect.parse(body).messages
        tokens = (
            sum(counter.count_messages(messages)) + REPLY_PRIMING_TOKENS + dialect.tool_tokens(body, counter)
        )
        if spec.pricing == "claude-like":
            return math.ceil(tokens * 1.15)
        if spec.pricing == "encrypted":
            chars = _secrets(body)
            return tokens - math.ceil(chars / 4) + math.ceil(chars / 6)
        return tokens

    def handler(self, request: httpx.Request) -> httpx.Response:
        started = time.perf_counter()
        try:
            return self._answer(request)
        finally:
            self.spent_s += time.perf_counter() - started

    def _answer(self, request: httpx.Request) -> httpx.Response:
        path, raw = request.url.path, request.read()
        body = json.loads(raw)
        dialect, named, counting = route_of(path)
        if counting and dialect is GEMINI:
            body = body["generateContentRequest"]  # the whole request, its model named in it
        model_name = named or str(body.get("model"))
        tokens = self.count(dialect, body, model=model_name)
        if counting:
            self.calls.append(Call(path, raw, 200, tokens))
            answer = {"totalTokens": tokens} if dialect is GEMINI else {"input_tokens": tokens}
            return httpx.Response(200, json=answer)
        model = self.models[model_name]
        problems = dialect.problems(body)
        if problems:
            self.calls.append(Call(path, raw, 422, tokens))
            return httpx.Response(400, json={"error": {"message": f"broken: {problems}", "type": "invalid"}})
        output = output_cap(raw) if dialect.output_in_window else 0
        if tokens + output > model.window_tokens:
            self.calls.append(Call(path, raw, 400, tokens))
            return httpx.Response(400, json=_overflow(path, model, tokens, output))
        call = Call(path, raw, 200, tokens)
        self.calls.append(call)
        text = _summary(dialect, body, raw) if call.summary else "ok"
        return httpx.Response(200, json=_answer(path, tokens, text))


def _overflow(path: str, model: Model, tokens: int, output: int) -> dict[str, Any]:
    window = model.window_tokens
    if path.startswith(GEMINI_MODELS):
        message = f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({window})."
        return {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    if path == "/v1/messages":
        message = f"prompt is too long: {tokens} tokens > {window} maximum"
        if tokens <= window:
            message = (
                f"input length and `max_tokens` exceed context limit: {tokens} + {output} > {window}, "
                "decrease input length or `max_tokens` and try again"
            )
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if path == "/v1/responses" or not model.numbers:
        message = (
            "Your input exceeds the context window of this model. Please adjust your input and try again."
        )
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }
        }
    message = (
        f"This model's maximum context length is {window} tokens. However, your messages resulted in "
        f"{tokens} tokens. Please reduce the length of the messages."
    )
    return {"error": {"message": message, "type": "invalid_request_error", "code": "context_length_exceeded"}}


def output_cap(raw: bytes) -> int:
    """The output cap a request body carries (every API's spelling; 0 when none)."""
    body = json.loads(raw)
    config = body.get("generationConfig") or {}
    return int(body.get("max_tokens") or body.get("max_output_tokens") or config.get("maxOutputTokens") or 0)


def _summary(dialect: Dialect, body: Mapping[str, Any], raw: bytes) -> str:
    """The test suite's fake summarizer's answer to a summary request (``tests.fake_summarizer``)."""
    messages = dialect.parse(body).messages
    system = next((prompt_text(m.get("content")) for m in messages if m.get("role") == "system"), "")
    user = "\n\n".join(prompt_text(m.get("content")) for m in messages if m.get("role") == "user")
    count = counter_for("o200k_base").count_text
    return summary_answer(system, user, cap_tokens=output_cap(raw) or 1024, count_text=count) or ""


def _answer(path: str, tokens: int, text: str = "ok") -> dict[str, Any]:
    if path.startswith(GEMINI_MODELS):
        candidate = {
            "content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP",
            "index": 0,
        }
        usage = {"promptTokenCount": tokens, "candidatesTokenCount": 1, "totalTokenCount": tokens + 1}
        return {"candidates": [candidate], "usageMetadata": usage}
    if path == "/v1/messages":
        return {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "m",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": tokens, "output_tokens": 1},
        }
    if path == "/v1/responses":
        output = [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]
        usage = {"input_tokens": tokens, "output_tokens": 1, "total_tokens": tokens + 1}
        return {"id": "resp_1", "object": "response", "status": "completed", "output": output, "usage": usage}
    return {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1},
    }
