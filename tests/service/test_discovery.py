"""Discovery over HTTP (through app.upstream's client, a MockTransport as the upstream): what it asks,
what it stores, caching, timeouts and logging once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable

import httpx
import pytest

from app.core.dialects import DIALECTS
from app.core.knowledge import Knowledge
from app.core.routes import AUTHORIZATION, KeySlot, key_slots
from app.service.discovery import Discovery, safe_url
from app.upstream.client import UpstreamClient

BASE = "http://upstream.test/v1"
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def discovery(
    handler: Handler,
    *,
    timeout_s: float = 1.0,
    api_key: str | None = None,
    clock: Clock | None = None,
    key_slots: tuple[KeySlot, ...] = (AUTHORIZATION,),
) -> tuple[Discovery, Knowledge, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    async def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return await handler(request)

    http = httpx.AsyncClient(transport=httpx.MockTransport(record))
    upstream = UpstreamClient(http, base_url=BASE, api_key=api_key, key_slots=key_slots)
    knowledge = Knowledge()
    found = Discovery(upstream, knowledge, timeout_s=timeout_s, clock=clock or Clock())
    return found, knowledge, seen


def paths(seen: list[httpx.Request]) -> list[str]:
    return sorted(f"{r.method} {r.url.path}" for r in seen)


async def vllm_like(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(200, json={"data": [{"id": "qwen", "max_model_len": 32768}]})
    return httpx.Response(404, json={"detail": "Not Found"})


async def ollama_like(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/models":
        return httpx.Response(
            200, json={"object": "list", "data": [{"id": "llama3.1:8b"}, {"id": "qwen3:8b"}]}
        )
    if request.url.path == "/api/show":
        name = json.loads(request.content)["model"]
        if name == "llama3.1:8b":
            return httpx.Response(
                200, json={"parameters": "num_ctx 8192", "model_info": {"llama.context_length": 131072}}
            )
        return httpx.Response(404, json={"error": f"model '{name}' not found"})
    return httpx.Response(404, text="404 page not found")


async def test_start_asks_every_endpoint_once_in_the_background_and_stores_the_figures() -> None:
    found, knowledge, seen = discovery(vllm_like)
    found.start()
    assert seen == []  # start() only schedules
    await found.wait_idle()
    assert paths(seen) == ["GET /api/v0/models", "GET /props", "GET /v1/models"]
    figures = knowledge.discovered("qwen")
    assert figures is not None and figures.window_tokens == 32768 and figures.effective
    await found.ensure("qwen", BASE)
    assert len(seen) == 3  # listed with a window: no /api/show
    await found.aclose()


async def test_a_model_seen_first_is_asked_once_with_api_show_and_cached() -> None:
    found, knowledge, seen = discovery(ollama_like)
    await found.ensure("llama3.1:8b", BASE)
    await found.ensure("llama3.1:8b", BASE)
    shows = [r for r in seen if r.url.path == "/api/show"]
    assert len(shows) == 1 and json.loads(shows[0].content) == {"model": "llama3.1:8b"}
    assert shows[0].url == httpx.URL("http://upstream.test/api/show")  # at the root, not under /v1
    figures = knowledge.discovered("llama3.1:8b")
    assert figures is not None and figures.window_tokens == 8192 and figures.effective
    await found.ensure("unknown-model", BASE)  # answered 404: nothing stored, no error
    assert knowledge.discovered("unknown-model") is None
    await found.aclose()


async def test_a_server_without_api_show_is_not_asked_again_for_other_models() -> None:
    found, _, seen = discovery(vllm_like)
    await found.ensure("a", BASE)
    await found.ensure("b", BASE)
    assert [r.url.path for r in seen].count("/api/show") == 1
    await found.aclose()


async def test_ensure_returns_after_its_timeout_while_discovery_hangs() -> None:
    release = asyncio.Event()

    async def hanging(request: httpx.Request) -> httpx.Response:
        await release.wait()
        return httpx.Response(200, json={"data": [{"id": "m", "max_model_len": 4096}]})

    found, knowledge, _ = discovery(hanging, timeout_s=0.05)
    # A generous bound only guards against hanging forever; the point is that ensure returns.
    await asyncio.wait_for(found.ensure("m", BASE), 5.0)
    assert knowledge.discovered("m") is None
    await found.aclose()
    release.set()


async def test_an_unreachable_upstream_is_logged_once_and_asked_again_after_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    clock = Clock()
    found, _, seen = discovery(refused, clock=clock)
    with caplog.at_level(logging.WARNING, logger="ctxproxy.discovery"):
        await found.ensure("m", BASE)
        await found.ensure("m", BASE)
        await found.ensure("other", BASE)
    warnings = [r for r in caplog.records if r.name == "ctxproxy.discovery"]
    assert len(warnings) == 1 and "could not reach" in warnings[0].getMessage()
    asked = len(seen)
    assert asked == 3  # the base's three endpoints, once (api/show is not tried without an answer)
    clock.now += found.retry_after_s + 1
    await found.ensure("m", BASE)
    assert len(seen) == asked + 3
    await found.aclose()


async def test_discovery_sends_the_operators_key_and_no_client_header() -> None:
    found, _, seen = discovery(vllm_like, api_key="sk-operator")
    found.start()
    await found.wait_idle()
    assert seen and all(r.headers.get("authorization") == "Bearer sk-operator" for r in seen)
    assert all("user-agent" not in r.headers for r in seen)
    await found.aclose()


async def test_a_refusal_is_logged_once_with_a_hint(caplog: pytest.LogCaptureFixture) -> None:
    async def unauthorized(request: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": "no key"}})

    found, _, _ = discovery(unauthorized)
    with caplog.at_level(logging.INFO, logger="ctxproxy.discovery"):
        await found.ensure("m", BASE)
        await found.ensure("n", BASE)
    records = [r for r in caplog.records if r.name == "ctxproxy.discovery" and "refused" in r.getMessage()]
    assert len(records) == 1 and "CTXPROXY_UPSTREAM_API_KEY" in records[0].getMessage()
    assert records[0].levelno == logging.INFO  # normal when clients bring their own keys
    await found.aclose()


async def google_like(request: httpx.Request) -> httpx.Response:
    """Google's Gemini API: a key in ``x-goog-api-key``; a Bearer token must be an OAuth token."""
    if "authorization" in request.headers:
        return httpx.Response(401, json={"error": {"code": 401, "status": "UNAUTHENTICATED"}})
    if request.headers.get("x-goog-api-key") != "AIza-operator":
        return httpx.Response(403, json={"error": {"code": 403, "status": "PERMISSION_DENIED"}})
    if request.url.path == "/v1/models":
        model = {"name": "models/gemini-2.5-flash", "inputTokenLimit": 1048576, "outputTokenLimit": 65536}
        return httpx.Response(200, json={"models": [model]})
    return httpx.Response(404, json={"error": {"code": 404, "status": "NOT_FOUND"}})


async def test_a_model_list_refused_in_the_first_key_slot_is_asked_in_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slots = key_slots(DIALECTS.values())
    found, knowledge, seen = discovery(google_like, api_key="AIza-operator", key_slots=slots)
    with caplog.at_level(logging.INFO, logger="ctxproxy.discovery"):
        await found.ensure("gemini-2.5-flash", BASE)
    figures = knowledge.discovered("gemini-2.5-flash")
    assert figures is not None and (figures.window_tokens, figures.max_output_tokens) == (1_048_576, 65_536)
    listings = [r for r in seen if r.url.path == "/v1/models"]
    # Authorization (refused), x-api-key (refused), x-goog-api-key (answered): the key in one slot.
    assert [
        sorted(k for k in r.headers if k in ("authorization", "x-api-key", "x-goog-api-key"))
        for r in listings
    ] == [
        ["authorization"],
        ["x-api-key"],
        ["x-goog-api-key"],
    ]
    assert not [r for r in caplog.records if "refused" in r.getMessage()]  # it was answered in the end
    await found.aclose()


async def test_without_an_operator_key_a_refused_list_is_not_asked_again() -> None:
    found, knowledge, seen = discovery(google_like, key_slots=key_slots(DIALECTS.values()))
    await found.ensure("gemini-2.5-flash", BASE)
    assert knowledge.discovered("gemini-2.5-flash") is None
    assert len([r for r in seen if r.url.path == "/v1/models"]) == 1
    await found.aclose()


async def test_discover_listed_covers_models_without_figures() -> None:
    found, knowledge, _ = discovery(ollama_like)
    ids = await found.discover_listed(BASE)
    assert ids == ("llama3.1:8b", "qwen3:8b")
    assert knowledge.discovered("llama3.1:8b") is not None and knowledge.discovered("qwen3:8b") is None
    await found.aclose()


def test_safe_url_drops_user_info() -> None:
    assert safe_url("https://user:secret@host.example/v1") == "https://host.example/v1"
    assert safe_url("http://h:8000/v1") == "http://h:8000/v1"
