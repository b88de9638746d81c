"""Shared test doubles for the service tests: a word-counting tokenizer, a one-entry model table
and an app factory whose upstream is a respx router injected through the transport seam."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import respx
from fastapi import FastAPI

from app.core.registry import ModelSpec
from app.main import create_app
from app.settings import Settings

UPSTREAM = "http://upstream.test/v1"
WINDOW_TOKENS = 1000
MAX_OUTPUT_TOKENS = 200


class WordCounter:
    """One token per whitespace-separated word: easy to reason about in assertions."""

    name = "words"
    exact = True

    def count_text(self, text: str, /) -> int:
        return len(text.split())

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        words = text.split()
        head = " ".join(words[:head_tokens])
        tail = " ".join(words[len(words) - tail_tokens :]) if tail_tokens > 0 else ""
        return head, tail


class WordVocabularies:
    def __init__(self) -> None:
        self.loaded: tuple[str, ...] = ()
        self.encodings_asked: list[str] = []

    def counter_for(self, encoding: str, /) -> WordCounter:
        self.encodings_asked.append(encoding)
        return WordCounter()

    def preload(self) -> None:
        self.loaded = ("o200k_base", "cl100k_base")

    def loaded_encodings(self) -> tuple[str, ...]:
        return self.loaded


class OneModelRegistry:
    """Every model gets the same small window; ``unknown-*`` models are marked guessed."""

    def resolve(self, model: str, /) -> ModelSpec:
        guessed = model.startswith("unknown")
        return ModelSpec(
            name=model,
            window_tokens=WINDOW_TOKENS,
            max_output_tokens=MAX_OUTPUT_TOKENS,
            encoding="o200k_base",
            source="default" if guessed else "test",
            matched=None if guessed else model,
            guessed=guessed,
        )


def make_settings(**overrides: Any) -> Settings:
    overrides.setdefault("upstream_base_url", UPSTREAM)
    overrides.setdefault("upstream_transport", "httpx")
    return Settings(**overrides)


@asynccontextmanager
async def proxy(
    router: respx.Router, *, registry: Any = None, dialects: Any = None, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """The app with its lifespan running, and an ASGI client to call it (``dialects``: the wire
    APIs served, default every registered one). Summaries and recall are off unless asked for: a
    router's canned answers are for the client's requests, and summaries and recall (on by
    default) have their own tests against the fake upstreams (``tests/service/test_summaries.py``,
    ``tests/e2e/test_recall.py``)."""
    settings.setdefault("summarize", False)
    settings.setdefault("recall", False)
    app = create_app(
        make_settings(**settings),
        upstream_transport=httpx.MockTransport(router.handler),
        registry=registry or OneModelRegistry(),
        vocabularies=WordVocabularies(),
        dialects=dialects,
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            yield client, app


DISCOVERY_PATHS = ("/models", "/props", "/api/v0/models")


def forwarded_calls(route: Any) -> list[str]:
    """The paths ``route`` (a respx route) was called with, without the model discovery's own
    ``GET``s (started with the app, they run whenever the proxy's event loop turns)."""
    return [
        call.request.url.path
        for call in route.calls
        if not (call.request.method == "GET" and call.request.url.path.endswith(DISCOVERY_PATHS))
    ]


def words(n: int, word: str = "w") -> str:
    return " ".join([word] * n)


def chat_ok(content: str = "hi") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
    }


def openai_overflow(limit: int, prompt: int) -> dict[str, Any]:
    """OpenAI's verbatim context_length_exceeded error body."""
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {limit} tokens. However, your messages "
                f"resulted in {prompt} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
