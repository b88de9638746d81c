"""The chat path's speed rules, asserted by causality (what happened before what), never by time.

* a large body that surely fits is forwarded before its exact count finishes, and the outcome
  still carries the exact count;
* a large body is counted off the event loop: a small request completes while it is counted;
* small bodies are counted inline, on the event loop: one that surely fits after it was sent
  (``plan_soon``), while the upstream works; counts that are not exact never take the fast path.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
import respx

from app.core.dialects import CHAT as CHAT_API
from app.core.registry import ModelSpec
from app.core.routes import RouteMatch
from app.service.driver import Service
from app.service.fastpath import (
    OFFLOAD_MIN_BYTES,
    SoonPlan,
    abandon_plan,
    finish_plan,
    plan_soon,
    run_plan,
    start_plan,
)
from app.service.request import RequestOptions
from app.upstream.client import UpstreamClient
from app.upstream.errors import UpstreamUnreachable
from tests.api import UPSTREAM, chat_ok, make_settings, words

CHAT = f"{UPSTREAM}/chat/completions"
MARK = "HUGE"
WAIT_S = 5.0  # only bounds a failing test; nothing is asserted about time

CHAT_ROUTE = RouteMatch.first(CHAT_API)


class GatedCounter:
    """Words as tokens; a text holding ``MARK`` blocks its count until ``gate`` opens."""

    name = "words"

    def __init__(self, *, exact: bool = True) -> None:
        self.exact = exact
        self.gate = threading.Event()
        self.started = threading.Event()
        self.events: list[str] = []
        self.threads: list[str] = []

    def count_text(self, text: str, /) -> int:
        if MARK in text:
            self.threads.append(threading.current_thread().name)
            self.started.set()
            self.gate.wait(WAIT_S)
            self.events.append("huge counted")
        elif text.startswith("small"):
            self.threads.append(threading.current_thread().name)
        return len(text.split())

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        parts = text.split()
        return " ".join(parts[:head_tokens]), " ".join(parts[len(parts) - tail_tokens :][:tail_tokens])


class Vocab:
    def __init__(self, counter: GatedCounter) -> None:
        self.counter = counter

    def counter_for(self, encoding: str, /) -> GatedCounter:
        return self.counter

    def preload(self) -> None:
        return None

    def loaded_encodings(self) -> tuple[str, ...]:
        return ("o200k_base",)


class Registry:
    """``big`` has room for anything here; ``tight`` is far smaller than the huge body."""

    def resolve(self, model: str, /) -> ModelSpec:
        window = 2_000_000 if model == "big" else 5_000
        return ModelSpec(model, window, 1000, "o200k_base", source="test", matched=model)


def make_service(router: respx.Router, counter: GatedCounter) -> Service:
    http = httpx.AsyncClient(transport=httpx.MockTransport(router.handler))
    return Service(
        settings=make_settings(),
        registry=Registry(),
        vocabularies=Vocab(counter),
        upstream=UpstreamClient(http, base_url=UPSTREAM),
    )


def huge_body(model: str) -> bytes:
    content = f"{MARK} " + words(OFFLOAD_MIN_BYTES // 2 + 1000)
    raw = json.dumps({"model": model, "messages": [{"role": "user", "content": content}]}).encode()
    assert len(raw) >= OFFLOAD_MIN_BYTES
    return raw


def small_body() -> bytes:
    return json.dumps({"model": "big", "messages": [{"role": "user", "content": "small question"}]}).encode()


async def test_a_body_that_surely_fits_is_forwarded_before_its_count_finishes() -> None:
    counter = GatedCounter()
    received: list[bytes] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        counter.events.append("upstream got the request")
        received.append(request.content)
        counter.gate.set()  # only now may the exact count finish
        return httpx.Response(200, json=chat_ok())

    router = respx.Router()
    router.post(CHAT).mock(side_effect=upstream)
    raw = huge_body("big")
    outcome = await make_service(router, counter).handle(raw, [], options=RequestOptions(), route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert counter.events == ["upstream got the request", "huge counted"]
    assert received == [raw]  # the original bytes
    exact_tokens = 3 + 1 + len(json.loads(raw)["messages"][0]["content"].split()) + 3
    assert outcome.plan.tokens_before == outcome.plan.tokens_after == exact_tokens
    assert outcome.plan.fits and not outcome.plan.changed


@pytest.mark.parametrize("model", ["big", "tight"])
async def test_a_small_request_completes_while_a_huge_one_is_counted(model: str) -> None:
    counter = GatedCounter()
    router = respx.Router()
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    svc = make_service(router, counter)
    huge = asyncio.ensure_future(svc.handle(huge_body(model), [], options=RequestOptions(), route=CHAT_ROUTE))
    assert await asyncio.to_thread(counter.started.wait, WAIT_S)
    small = await svc.handle(small_body(), [], options=RequestOptions(), route=CHAT_ROUTE)
    await small.response.aclose()
    counter.events.append("small request completed")
    counter.gate.set()
    outcome = await huge
    await outcome.response.aclose()
    # (fitting the tight one counts the cut message again, after the gate opened)
    assert counter.events[:2] == ["small request completed", "huge counted"]
    assert set(counter.events[2:]) <= {"huge counted"}
    assert outcome.plan.fits and outcome.plan.changed is (model == "tight")
    main = threading.current_thread().name
    assert counter.threads[0] != main  # the huge count ran in a worker thread
    assert counter.threads[1] == main  # the small one inline


async def test_counts_that_are_not_exact_finish_before_the_send() -> None:
    counter = GatedCounter(exact=False)
    counter.gate.set()

    def upstream(request: httpx.Request) -> httpx.Response:
        counter.events.append("upstream got the request")
        return httpx.Response(200, json=chat_ok())

    router = respx.Router()
    router.post(CHAT).mock(side_effect=upstream)
    svc = make_service(router, counter)
    outcome = await svc.handle(huge_body("big"), [], options=RequestOptions(), route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert counter.events == ["huge counted", "upstream got the request"]
    assert outcome.plan.count_kind == "estimate"


async def test_a_failed_send_abandons_the_pending_count_quietly() -> None:
    counter = GatedCounter()
    counter.gate.set()
    router = respx.Router()
    router.post(CHAT).mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(UpstreamUnreachable):
        svc = make_service(router, counter)
        await svc.handle(huge_body("big"), [], options=RequestOptions(), route=CHAT_ROUTE)


async def test_run_plan_is_inline_below_the_threshold_and_threaded_above() -> None:
    def where() -> Any:
        return threading.current_thread()

    assert await run_plan(where, size_bytes=OFFLOAD_MIN_BYTES - 1) is threading.current_thread()
    assert await run_plan(where, size_bytes=OFFLOAD_MIN_BYTES) is not threading.current_thread()


async def test_abandoning_a_failed_plan_retrieves_its_error() -> None:
    def boom() -> Any:
        raise RuntimeError("bug")

    pending = start_plan(boom)
    with pytest.raises(RuntimeError):
        await asyncio.shield(pending)
    abandon_plan(pending)
    assert pending.done() and not pending.cancelled()
    abandon_plan(None)


async def test_a_resent_large_conversation_is_planned_inline_from_what_the_counter_remembers() -> None:
    counter = GatedCounter()
    counter.gate.set()
    router = respx.Router()
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    svc = make_service(router, counter)
    history: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(5):
        history.append({"role": "user", "content": f"{MARK} {i} " + words(OFFLOAD_MIN_BYTES // 8)})
        history.append({"role": "assistant", "content": f"answer {i}"})
    grown = [*history, {"role": "user", "content": "small new"}]
    first = json.dumps({"model": "big", "messages": history}).encode()
    resent = json.dumps({"model": "big", "messages": grown}).encode()
    assert len(first) >= OFFLOAD_MIN_BYTES
    for raw in (first, resent):
        outcome = await svc.handle(raw, [], options=RequestOptions(), route=CHAT_ROUTE)
        await outcome.response.aclose()
    main = threading.current_thread().name
    marked, small = counter.threads[:5], counter.threads[5:]
    assert all(name != main for name in marked)  # the new conversation: counted in a worker thread
    assert small == [main]  # the resent one: only its new message was counted, inline
    assert route.call_count == 2


async def test_a_small_body_that_surely_fits_is_counted_inline_after_it_was_sent() -> None:
    counter = GatedCounter()
    counter.gate.set()
    events: list[str] = []
    counted = counter.count_text

    def count_text(text: str, /) -> int:
        if text.startswith("small"):
            events.append("small counted")
        return counted(text)

    counter.count_text = count_text  # type: ignore[method-assign]

    def upstream(request: httpx.Request) -> httpx.Response:
        events.append("upstream got the request")
        return httpx.Response(200, json=chat_ok())

    router = respx.Router()
    router.post(CHAT).mock(side_effect=upstream)
    svc = make_service(router, counter)
    outcome = await svc.handle(small_body(), [], options=RequestOptions(), route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert events == ["upstream got the request", "small counted"]
    assert counter.threads == [threading.current_thread().name]  # on the loop, not in a thread
    assert outcome.plan.tokens_before == outcome.plan.tokens_after == 3 + 1 + 2 + 3  # exact
    assert outcome.plan.fits and not outcome.plan.changed


async def test_a_soon_plan_is_made_two_loop_turns_later_or_when_taken_and_keeps_its_error() -> None:
    made: list[str] = []

    def plan() -> Any:
        made.append("made")
        return "plan"

    soon = plan_soon(plan)
    await asyncio.sleep(0)
    assert made == []  # not in the next turn: the upstream client's write goes first
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert made == ["made"] and soon.result() == "plan" and made == ["made"]
    early = SoonPlan(plan)
    assert early.result() == "plan" and made == ["made", "made"]  # taken before its turn: made now
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert made == ["made", "made"]  # and not a second time

    def boom() -> Any:
        raise RuntimeError("bug")

    failed = plan_soon(boom)
    for _ in range(3):
        await asyncio.sleep(0)
    closed: list[bool] = []

    class Closing:
        async def aclose(self) -> None:
            closed.append(True)

    with pytest.raises(RuntimeError, match="bug"):
        await finish_plan(failed, Closing())  # type: ignore[arg-type]
    assert closed == [True]  # the response is closed when its plan failed
    dropped = plan_soon(plan)
    abandon_plan(dropped)
    for _ in range(3):
        await asyncio.sleep(0)
    assert made == ["made", "made"]  # an abandoned plan is never made
