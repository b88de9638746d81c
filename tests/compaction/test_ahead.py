"""Ahead-of-time summaries: one call per span however many ask, bounded, cancellable, shared."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from app.compaction.ahead import AheadOfTime, Backlog
from app.compaction.cache import MemoryCache, RedisCache
from app.compaction.summarizer import Summarizer, SummaryJob
from tests.compaction.conftest import RedisServer

FACT = re.compile(r"FACT-\w+")


class SlowLLM:
    """A deterministic summarizer that takes ``delay_s`` and records how many calls overlap."""

    def __init__(self, *, delay_s: float = 0.02, error: Exception | None = None) -> None:
        self.delay_s = delay_s
        self.error = error
        self.calls = 0
        self.active = 0
        self.peak = 0
        self.cancelled = 0

    async def __call__(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> str:
        self.calls += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
        if self.error is not None:
            raise self.error
        return "Summary: " + " ".join(sorted(set(FACT.findall(messages[-1]["content"]))))


TENANT = "t-alice"
JOB = SummaryJob(TENANT, TENANT, 50_000, 2048, lambda t: len(t.split()))


def summarizer_for(llm: SlowLLM) -> Summarizer:
    return Summarizer(llm, model="summ-1", timeout_s=30)


def span(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"conversation {i} FACT-c{i}"},
        {"role": "assistant", "content": "ok"},
    ]


async def test_ten_concurrent_schedules_of_one_span_make_one_call() -> None:
    llm = SlowLLM()
    ahead = AheadOfTime(summarizer_for(llm), MemoryCache(100, 600))
    try:
        started = [ahead.schedule(span(1), JOB) for _ in range(10)]
        assert started == [True] + [False] * 9
        results = await asyncio.gather(*(ahead.wait_for(span(1), TENANT, 5) for _ in range(10)))
        assert results == ["Summary: FACT-c1"] * 10
        assert llm.calls == 1
        assert ahead.stats()["deduplicated"] == 9 and ahead.stats()["done"] == 1
    finally:
        await ahead.aclose()


async def test_concurrent_identical_requests_inline_path_make_one_call() -> None:
    llm = SlowLLM()
    ahead = AheadOfTime(summarizer_for(llm), MemoryCache(100, 600))

    async def request() -> str | None:
        ahead.schedule(span(2), JOB)
        return await ahead.wait_for(span(2), TENANT, 5)

    try:
        assert await asyncio.gather(*(request() for _ in range(10))) == ["Summary: FACT-c2"] * 10
        assert llm.calls == 1
        assert await request() == "Summary: FACT-c2"  # later: from the cache, still one call
        assert llm.calls == 1
    finally:
        await ahead.aclose()


async def test_a_cached_span_costs_no_call() -> None:
    llm = SlowLLM()
    cache = MemoryCache(100, 600)
    summarizer = summarizer_for(llm)
    await cache.set(summarizer.span_key(span(3), TENANT), "Summary: cached")
    ahead = AheadOfTime(summarizer, cache)
    try:
        assert await ahead.wait_for(span(3), TENANT, 0) == "Summary: cached"
        ahead.schedule(span(3), JOB)
        assert await ahead.wait_for(span(3), TENANT, 5) == "Summary: cached"
        assert llm.calls == 0
    finally:
        await ahead.aclose()


async def test_concurrency_is_bounded() -> None:
    llm = SlowLLM(delay_s=0.03)
    cache = MemoryCache(100, 600)
    ahead = AheadOfTime(summarizer_for(llm), cache, max_concurrency=2)
    try:
        assert all(ahead.schedule(span(i), JOB) for i in range(7))
        assert ahead.in_flight == 7
        results = await asyncio.gather(*(ahead.wait_for(span(i), TENANT, 5) for i in range(7)))
        assert results == [f"Summary: FACT-c{i}" for i in range(7)]
        assert llm.calls == 7 and llm.peak == 2
        assert ahead.in_flight == 0
    finally:
        await ahead.aclose()


async def test_pending_work_is_bounded() -> None:
    ahead = AheadOfTime(summarizer_for(SlowLLM(delay_s=10)), MemoryCache(100, 600), max_pending=2)
    try:
        assert [ahead.schedule(span(i), JOB) for i in range(3)] == [True, True, False]
        assert ahead.stats()["rejected"] == 1
    finally:
        await ahead.aclose()


async def test_a_shared_backlog_bounds_the_pending_work_of_every_summarizer_together() -> None:
    backlog = Backlog(3)
    cache = MemoryCache(100, 600)
    llm = SlowLLM(delay_s=0.05)
    one, two = (AheadOfTime(summarizer_for(llm), cache, backlog=backlog) for _ in range(2))
    try:
        assert [one.schedule(span(i), JOB) for i in range(2)] == [True, True]
        assert [two.schedule(span(i), JOB) for i in range(10, 12)] == [True, False]  # 3 in all
        assert backlog.pending == 3 and backlog.full
        await asyncio.gather(*(a.wait_for(span(i), TENANT, 5) for a, i in [(one, 0), (one, 1), (two, 10)]))
        assert backlog.pending == 0 and two.schedule(span(11), JOB)
    finally:
        await one.aclose()
        await two.aclose()
    assert backlog.pending == 0  # a cancelled task leaves the backlog too


async def test_wait_for_times_out_without_stopping_the_work() -> None:
    llm = SlowLLM(delay_s=0.2)
    ahead = AheadOfTime(summarizer_for(llm), MemoryCache(100, 600))
    try:
        assert await ahead.wait_for(span(4), TENANT, 1) is None  # neither scheduled nor cached
        ahead.schedule(span(4), JOB)
        assert await ahead.wait_for(span(4), TENANT, 0.01) is None
        assert ahead.in_flight == 1
        assert await ahead.wait_for(span(4), TENANT, 5) == "Summary: FACT-c4"
        assert llm.calls == 1
    finally:
        await ahead.aclose()


async def test_a_failing_summarizer_never_raises_into_the_caller() -> None:
    llm = SlowLLM(error=RuntimeError("upstream returned 500"))
    ahead = AheadOfTime(summarizer_for(llm), MemoryCache(100, 600))
    try:
        assert ahead.schedule(span(5), JOB)
        assert await ahead.wait_for(span(5), TENANT, 5) is None
        assert ahead.stats()["failed"] == 1 and ahead.in_flight == 0
        assert ahead.schedule(span(5), JOB)  # a failure is not remembered: the next request may retry
    finally:
        await ahead.aclose()


async def test_aclose_cancels_running_and_queued_work() -> None:
    llm = SlowLLM(delay_s=30)
    ahead = AheadOfTime(summarizer_for(llm), MemoryCache(100, 600), max_concurrency=1)
    assert ahead.schedule(span(6), JOB) and ahead.schedule(span(7), JOB)
    await asyncio.sleep(0.02)
    assert llm.active == 1  # one running, one waiting for the semaphore
    tasks = list(ahead._tasks.values())
    await ahead.aclose()
    assert all(t.cancelled() for t in tasks)
    assert llm.cancelled == 1 and llm.active == 0 and ahead.in_flight == 0
    assert ahead.schedule(span(8), JOB) is False
    assert await ahead.wait_for(span(6), TENANT, 0.01) is None


def test_schedule_outside_an_event_loop_is_refused() -> None:
    ahead = AheadOfTime(summarizer_for(SlowLLM()), MemoryCache(100, 600))
    assert ahead.schedule(span(9), JOB) is False
    assert ahead.schedule([], JOB) is False


async def test_two_replicas_sharing_redis_make_one_call(redis_server: RedisServer) -> None:
    llm_a, llm_b = SlowLLM(delay_s=0.1), SlowLLM(delay_s=0.1)
    cache_a, cache_b = RedisCache(redis_server.url, ttl_s=600), RedisCache(redis_server.url, ttl_s=600)
    a = AheadOfTime(summarizer_for(llm_a), cache_a, poll_interval_s=0.01)
    b = AheadOfTime(summarizer_for(llm_b), cache_b, poll_interval_s=0.01)
    try:
        assert a.schedule(span(10), JOB) and b.schedule(span(10), JOB)
        results = await asyncio.gather(a.wait_for(span(10), TENANT, 5), b.wait_for(span(10), TENANT, 5))
        assert results == ["Summary: FACT-c10"] * 2
        assert llm_a.calls + llm_b.calls == 1
        assert not cache_a.stats().degraded and not cache_b.stats().degraded
    finally:
        await a.aclose()
        await b.aclose()
        await cache_a.aclose()
        await cache_b.aclose()


def test_nonsense_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        AheadOfTime(summarizer_for(SlowLLM()), MemoryCache(1, 1), max_concurrency=0)
