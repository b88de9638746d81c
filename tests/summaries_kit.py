"""Shared helpers for the summary integration tests: the proxy app over the fake upstream in process.

The fake upstream (``tests.fake_upstream``) is reached through ``httpx.ASGITransport`` injected as the
app's upstream transport, and both sides count one token per word, so the numbers are easy to follow.
``LARGE_MODEL`` is a summarizer whose window holds a whole cut step of these small conversations (the
request model's 1000-token window would take a cold span in parts).
A ``RecordingTransport`` in between notes the host of every upstream request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from app.core.registry import ModelSpec
from app.main import create_app
from app.service.summaries import Summaries
from tests.api import (
    MAX_OUTPUT_TOKENS,
    WINDOW_TOKENS,
    OneModelRegistry,
    WordCounter,
    WordVocabularies,
    make_settings,
)
from tests.fake_upstream import FakeModel, FakeUpstream

MODEL = "m"
SMALL_MODEL = "small-summarizer"
SMALL_WINDOW_TOKENS = 600
# A summarizer whose window holds a whole cut step of these small conversations in one call.
LARGE_MODEL = "large-summarizer"
LARGE_WINDOW_TOKENS = 8000
FACT = re.compile(r"FACT-\w+")
SUMMARY_HEAD = re.compile(
    r"^\[ctxproxy: summary of ([0-9,]+) earlier messages?(?:; recall id [0-9a-f]{12})?\]\n"
)
# The memory when no summary stands in: the index of the exact strings the cut forgot.
INDEX = re.compile(
    r"^\[ctxproxy: index of [0-9,]+ earlier messages?, removed to fit the context window"
    r"(?:; recall id [0-9a-f]{12})?\]\n"
)
INDEX_HEAD = "\n[ctxproxy: exact strings from them]\n"
NOTE = re.compile(r"^\[ctxproxy: [0-9,]+ earlier messages? (?:\([0-9,]+ tokens\) )?(was|were) removed here")


class Registry(OneModelRegistry):
    """The one-model table, plus a small-window model for chunked summaries."""

    def resolve(self, model: str, /) -> ModelSpec:
        spec = super().resolve(model)
        windows = {SMALL_MODEL: SMALL_WINDOW_TOKENS, LARGE_MODEL: LARGE_WINDOW_TOKENS}
        if model in windows:
            return ModelSpec(
                name=model,
                window_tokens=windows[model],
                max_output_tokens=MAX_OUTPUT_TOKENS,
                encoding="o200k_base",
                source="test",
                matched=model,
            )
        return spec


def fake_upstream() -> FakeUpstream:
    models = [
        FakeModel(MODEL, WINDOW_TOKENS),
        FakeModel(SMALL_MODEL, SMALL_WINDOW_TOKENS),
        FakeModel(LARGE_MODEL, LARGE_WINDOW_TOKENS),
    ]
    return FakeUpstream(models, counter_factory=lambda _encoding: WordCounter())


class RecordingTransport(httpx.AsyncBaseTransport):
    """Forwards to the fake's ASGI app and records ``(host, path)`` of every request."""

    def __init__(self, fake: FakeUpstream) -> None:
        self.inner = httpx.ASGITransport(app=fake.app)
        self.seen: list[tuple[str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.url.host, request.url.path))
        return await self.inner.handle_async_request(request)


@asynccontextmanager
async def proxy(
    fake: FakeUpstream, *, transport: httpx.AsyncBaseTransport | None = None, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    """The app (summaries on unless overridden; recall off unless asked for: its tool's tokens in a
    cut's budget would move the spans these tests measure, and recall has its own tests) with its
    lifespan running, and a client for it."""
    settings.setdefault("summarize", True)
    settings.setdefault("recall", False)
    settings.setdefault("log_level", "WARNING")
    app = create_app(
        make_settings(**settings),
        upstream_transport=transport or httpx.ASGITransport(app=fake.app),
        registry=Registry(),
        vocabularies=WordVocabularies(),
    )
    async with app.router.lifespan_context(app):
        asgi = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=asgi, base_url="http://proxy.test", timeout=30) as client:
            yield client, app


def summaries_of(app: FastAPI) -> Summaries:
    summaries = app.state.service.summaries
    assert isinstance(summaries, Summaries)
    return summaries


async def settle(app: FastAPI, timeout_s: float = 10.0) -> None:
    """Wait until no background summary is running."""
    summaries = summaries_of(app)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while summaries.stats()["in_flight"]:
        assert loop.time() < deadline, "background summaries did not finish"
        await asyncio.sleep(0.01)


def turn(i: int, size: int) -> list[dict[str, Any]]:
    filler = " ".join(["w"] * size)
    return [
        {"role": "user", "content": f"u{i} remember FACT-{i}u. {filler}"},
        {"role": "assistant", "content": f"a{i} noted FACT-{i}a. {filler}"},
    ]


def conversation(turns: int, size: int = 40, *, question: str = "now?") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages += turn(i, size)
    messages.append({"role": "user", "content": question})
    return messages


def chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **extra}


def forwarded_messages(fake: FakeUpstream) -> list[dict[str, Any]]:
    """The messages of the last client request the fake received."""
    messages: list[dict[str, Any]] = fake.client_requests()[-1].json()["messages"]
    return messages


def summary_message(messages: list[dict[str, Any]]) -> tuple[int, str] | None:
    """``(N, text)`` of the summary message in ``messages``, if there is one."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and (match := SUMMARY_HEAD.match(content)):
            return int(match.group(1).replace(",", "")), content
    return None


def facts(messages: list[dict[str, Any]]) -> set[str]:
    texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    return {fact for text in texts for fact in FACT.findall(text)}
