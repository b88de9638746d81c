"""Chat Completions as a dialect: the identity adapter (its messages already are the neutral ones).

``CHAT`` serves ``POST /v1/chat/completions`` (sent to ``chat/completions`` under the upstream base
URL; the body's ``stream`` chooses streaming), takes the client's key as ``Authorization: Bearer``
and has no counting endpoint of its own. It is no default: the composition root (``app.main``)
chooses it to speak for routes of no dialect, and the dry run's detection falls back to it as the
registry's first. Its body is the chat accounting's own shape (``accounting_view``: the body).

``CHAT`` parses ``body["messages"]`` by ``messages.validate_messages`` (the same list, no copy of a
message), counts ``tools``/``functions`` by the chat accounting, renders by replacing ``messages``
only (``{**body, "messages": [...]}``), and speaks OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` (the table in ``app/api/errors.py``). Its
mid-stream error is ``data: {"error": {...}}`` followed by a blank line, as OpenAI's servers end a
stream that failed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..budget import requested_output_tokens
from ..conversation import Conversation
from ..dialect import ErrorInfo, Headers, SummaryCall, model_from_body
from ..endpoints import AUTHORIZATION, KeySlot, Route, UpstreamTarget
from ..messages import Message, pairing_problems, validate_messages
from ..overflow import ContextOverflow, classify_overflow
from ..parse_memo import ParseMemo
from ..registry import ModelSpec
from ..tokens import MessageCounter

_AT_INDEX = re.compile(r" at \d+\b")
OUTPUT_CAP_KEYS: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
# The client's headers an OpenAI-style summary call repeats: its key and its account scoping.
OPENAI_SUMMARY_HEADERS: tuple[str, ...] = ("authorization", "openai-organization", "openai-project")


def openai_error_type(error: ErrorInfo) -> str:
    """OpenAI's ``type`` for one of our errors: ours are request errors, upstream failures
    ``upstream_error``, a busy upstream and our own bugs ``server_error``."""
    if error.status in (502, 504):
        return "upstream_error"
    if error.status >= 500:
        return "server_error"
    return "invalid_request_error"


def openai_error(error: ErrorInfo) -> dict[str, Any]:
    """``{"error": {...}}`` in OpenAI's shape; a plain request error has no ``code`` (``None``)."""
    code = None if error.code == "invalid_request_error" else error.code
    return {
        "error": {
            "message": error.message,
            "type": openai_error_type(error),
            "param": error.param,
            "code": code,
        }
    }


def prompt_tokens_of(answer: Mapping[str, Any]) -> int | None:
    """``usage.prompt_tokens`` of a chat answer or stream chunk, when it is a count."""
    usage = answer.get("usage")
    if not isinstance(usage, Mapping):
        return None
    value = usage.get("prompt_tokens")
    if type(value) is not int or value < 0:
        return None
    return value


def positive_count(answer: Mapping[str, Any], key: str) -> int | None:
    """``answer[key]`` when it is a positive integer (a counting endpoint's answer), else None."""
    value = answer.get(key)
    return value if type(value) is int and value > 0 else None


@dataclass(frozen=True, slots=True)
class ChatDialect:
    """``POST /v1/chat/completions`` (see the module docstring)."""

    name: str = "chat"
    routes: tuple[Route, ...] = (Route("/v1/chat/completions", upstream="chat/completions"),)
    key_slots: tuple[KeySlot, ...] = (AUTHORIZATION,)
    items_key: str = "messages"
    output_in_window: bool = True
    preamble_events: frozenset[str] = frozenset()
    # OpenAI's usage chunk (``stream_options.include_usage``); every other chunk says ``"usage":
    # null`` and is not parsed.
    usage_needles: tuple[bytes, ...] = (b'"usage"', b'"prompt_tokens"')

    def recognition(self, body: Mapping[str, Any], headers: Mapping[str, str], /) -> int:
        """1 for a body with a ``messages`` array (its shape; other APIs share it)."""
        return 1 if isinstance(body.get("messages"), list) else 0

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str:
        return model_from_body(body)

    def refine_spec(self, spec: ModelSpec, headers: Headers, /) -> ModelSpec:
        return spec

    def upstream_count(self, answer: Mapping[str, Any], /) -> int | None:
        return positive_count(answer, "input_tokens")

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation:
        """``memo`` is not used: chat messages are already neutral (nothing is built to reuse)."""
        model = body.get("model")
        return Conversation(
            model=model if isinstance(model, str) else "",
            messages=tuple(validate_messages(body.get("messages"))),
            requested_output_tokens=requested_output_tokens(body),
            stream=body.get("stream") is True,
        )

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int:
        return counter.count_tools(body)


    def accounting_view(
        self, body: Mapping[str, Any], messages: Sequence[Message], tool_tokens: int, /
    ) -> Mapping[str, Any]:
        """The body itself: it is the chat accounting's own shape (its tools counted as text)."""
        return body

    def render(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        /,
        *,
        source: Sequence[Message] | None = None,
    ) -> dict[str, Any]:
        return {**body, "messages": list(messages)}

    def problems(self, body: Mapping[str, Any], /) -> list[str]:
        messages = validate_messages(body.get("messages"))
        return sorted({_AT_INDEX.sub("", problem) for problem in pairing_problems(messages)})

    def error_body(self, error: ErrorInfo, /) -> dict[str, Any]:
        return openai_error(error)

    def overflow(
        self, status: int, body: bytes | str | Mapping[str, object] | None, /
    ) -> ContextOverflow | None:
        return classify_overflow(status, body)

    def input_tokens_used(self, answer: Mapping[str, Any], /) -> int | None:
        return prompt_tokens_of(answer)

    def count_answer(self, input_tokens: int, /) -> dict[str, Any]:
        # Chat Completions has no counting endpoint; the shape of OpenAI's Responses one is the
        # closest a client of ours could expect.
        return {"object": "response.input_tokens", "input_tokens": input_tokens}

    def json_stream_error(self, error: ErrorInfo, /, *, started: bool) -> bytes | None:
        return None  # every answer of this API streams as server-sent events

    def stream_error(self, error: ErrorInfo, /) -> bytes:
        payload = json.dumps(openai_error(error), ensure_ascii=False, separators=(",", ":"))
        return b"data: " + payload.encode("utf-8") + b"\n\n"

    def count_request(
        self, body: Mapping[str, Any], path: str, /
    ) -> tuple[UpstreamTarget, dict[str, Any]] | None:
        """None: Chat Completions has no counting endpoint (vLLM's and llama.cpp's ``/tokenize``
        live outside ``/v1`` and count a templated prompt, not this request)."""
        return None

    def with_output_cap(self, body: Mapping[str, Any], tokens: int, /) -> dict[str, Any] | None:
        """Every output cap the body sets (``max_completion_tokens``, ``max_tokens``) lowered to
        ``tokens``; a body without one is returned as it is (the upstream's default applies)."""
        capped = dict(body)
        for key in OUTPUT_CAP_KEYS:
            value = body.get(key)
            if type(value) is int and value > tokens:
                capped[key] = tokens
        return capped

    def summary_request(
        self, prompt: Sequence[Mapping[str, Any]], /, *, model: str, max_tokens: int
    ) -> SummaryCall:
        """A non-streaming chat completion of the prompt as is."""
        body = {
            "model": model,
            "messages": [dict(m) for m in prompt],
            "max_tokens": max_tokens,
            "stream": False,
        }
        return SummaryCall(self.routes[0].upstream, body, carry=OPENAI_SUMMARY_HEADERS)

    def summary_text(self, answer: Mapping[str, Any], /) -> str | None:
        choices = answer.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        return content if isinstance(content, str) else None


CHAT = ChatDialect()
