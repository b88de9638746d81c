"""Sharing learned knowledge between replicas through the cache backend (a MemoryCache shared by two
replicas stands in for Redis)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import respx

from app.compaction.cache import MemoryCache
from app.core.knowledge import Knowledge
from app.core.overflow import ContextOverflow
from app.core.registry import ModelSpec
from app.service.knowledge_share import KnowledgeShare, share_key
from tests.api import UPSTREAM, chat_ok, proxy
from tests.compaction.conftest import free_port, start_redis
from tests.service.test_learning import EstimateRegistry, request

CHAT = f"{UPSTREAM}/chat/completions"

MODEL = "acme/llm"
T = "t-alice"
SPEC = ModelSpec(name=MODEL, window_tokens=8192, max_output_tokens=2048, encoding="estimate")


class CountingCache(MemoryCache):
    """Counts the values published (compare-and-set writes that landed); ``racing``: every read
    lets the other tasks run first, so two replicas publishing at once read the same value."""

    def __init__(self, *, racing: bool = False) -> None:
        super().__init__(100, 3600.0)
        self.writes = 0
        self.racing = racing

    async def get(self, key: str) -> str | None:
        if self.racing:
            await asyncio.sleep(0)
        return await super().get(key)

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        landed = await super().compare_and_set(key, expected, value, ttl_s=ttl_s)
        self.writes += landed
        return landed


def replica(cache: MemoryCache) -> tuple[Knowledge, KnowledgeShare]:
    knowledge = Knowledge()
    return knowledge, KnowledgeShare(cache, knowledge, publish_delay_s=0.0, timeout_s=1.0)


def learn(knowledge: Knowledge, *, limit: int, prompt: int) -> None:
    overflow = ContextOverflow("llamacpp", limit_tokens=limit, prompt_tokens=prompt)
    knowledge.observe_overflow(MODEL, overflow, fixed_tokens=10, text_tokens=1000, exact=False, tenant=T)


async def published_by_a(cache: CountingCache) -> tuple[KnowledgeShare, Knowledge, KnowledgeShare]:
    """Replica A learned a 4096-token window (and a 1.3 sample) for T and published it; replica B
    is new. Returns A's share, B's knowledge and B's share."""
    a, share_a = replica(cache)
    b, share_b = replica(cache)
    learn(a, limit=4096, prompt=1310)
    share_a.changed(MODEL, tenant=T)
    await asyncio.sleep(0.01)
    return share_a, b, share_b


async def test_what_a_replica_shares_is_its_tenants_only() -> None:
    cache = CountingCache()
    share_a, b, share_b = await published_by_a(cache)
    await share_b.sync(MODEL, tenant="t-bob")
    assert b.effective(SPEC, tenant="t-bob").window_tokens == 8192  # bob learned nothing
    assert await cache.get(share_key(MODEL, "t-bob")) is None
    await share_a.aclose()
    await share_b.aclose()


async def test_two_replicas_publishing_at_once_lose_nothing() -> None:
    cache = CountingCache(racing=True)
    a, share_a = replica(cache)
    b, share_b = replica(cache)
    learn(a, limit=4096, prompt=5000)  # a learned a window (and a sample)
    b.observe_usage(MODEL, tenant=T, prompt_tokens=1210, fixed_tokens=10, text_tokens=1000, exact=False)
    b.observe_overflow(
        MODEL,
        ContextOverflow("openai"),
        tenant=T,
        fixed_tokens=0,
        text_tokens=0,
        exact=False,
        sent_tokens=2000,
    )  # b learned a smaller bound
    bound = b.effective(SPEC, tenant=T).window_tokens
    assert bound < 4096
    share_a.changed(MODEL, tenant=T)
    share_b.changed(MODEL, tenant=T)
    await asyncio.sleep(0.05)
    shared = json.loads(await cache.get(share_key(MODEL, T)) or "{}")
    assert shared["learned_window_tokens"] == bound and shared["learned_from"] == "learned:bound"
    assert cache.writes == 2  # one lost the race, read the other's, and wrote the merge
    fresh, share_c = replica(cache)
    await share_c.sync(MODEL, tenant=T)
    assert fresh.effective(SPEC, tenant=T).window_tokens == bound
    for share in (share_a, share_b, share_c):
        await share.aclose()


async def test_a_new_replica_takes_what_another_learned() -> None:
    cache = CountingCache()
    share_a, b, share_b = await published_by_a(cache)
    assert cache.writes == 1
    stored = json.loads(await cache.get(share_key(MODEL, T)) or "{}")
    assert set(stored) == {"model", "learned_window_tokens", "learned_from", "samples", "factor_source"}
    await share_b.sync(MODEL, tenant=T)
    spec = b.effective(SPEC, tenant=T)
    assert spec.window_tokens == 4096 and spec.source == "learned:overflow"
    assert abs(spec.correction - 1.3) < 1e-9
    await share_a.aclose()
    await share_b.aclose()


async def test_own_samples_are_kept_and_only_a_smaller_window_is_taken() -> None:
    cache = CountingCache()
    a, share_a = replica(cache)
    b, share_b = replica(cache)
    learn(a, limit=4096, prompt=1310)
    share_a.changed(MODEL, tenant=T)
    await asyncio.sleep(0.01)
    learn(b, limit=2048, prompt=1510)
    await share_b.sync(MODEL, tenant=T)
    spec = b.effective(SPEC, tenant=T)
    assert spec.window_tokens == 2048 and abs(spec.correction - 1.5) < 1e-9
    await share_a.aclose()
    await share_b.aclose()


async def test_publishing_is_one_write_per_delay_whatever_the_rate() -> None:
    cache = CountingCache()
    knowledge = Knowledge()
    share = KnowledgeShare(cache, knowledge, publish_delay_s=0.05)
    for prompt in range(1100, 1120):
        learn(knowledge, limit=4096, prompt=prompt)
        share.changed(MODEL, tenant=T)
    await asyncio.sleep(0.2)
    assert cache.writes == 1
    share.changed(MODEL, tenant=T)  # nothing new since: no write
    await asyncio.sleep(0.1)
    assert cache.writes == 1
    await share.aclose()


async def test_bad_shared_values_are_ignored() -> None:
    cache = CountingCache()
    knowledge, share = replica(cache)
    bad_values = [
        "not json",
        json.dumps({"model": "other", "learned_window_tokens": 10, "samples": []}),
        json.dumps({"model": MODEL, "learned_window_tokens": -5, "samples": []}),
        json.dumps({"model": MODEL, "learned_window_tokens": None, "samples": [99.0]}),
        json.dumps({"model": MODEL, "learned_window_tokens": 100, "learned_from": "evil", "samples": []}),
    ]
    for value in bad_values:
        await cache.set(share_key(MODEL, T), value)
        share._fetched.clear()
        await share.sync(MODEL, tenant=T)
    spec = knowledge.effective(SPEC, tenant=T)
    assert spec.window_tokens == 8192 and spec.correction == 1.0
    await share.aclose()


async def test_a_slow_cache_costs_the_first_request_at_most_the_timeout() -> None:
    release = asyncio.Event()

    class SlowCache(MemoryCache):
        async def get(self, key: str) -> str | None:
            await release.wait()
            return None

    knowledge = Knowledge()
    share = KnowledgeShare(SlowCache(), knowledge, timeout_s=0.05)
    await asyncio.wait_for(share.sync(MODEL, tenant=T), 5.0)  # a generous bound: it must not hang
    await share.sync(MODEL, tenant=T)  # already asked: no wait at all
    release.set()
    await share.aclose()


async def test_two_proxies_share_a_learned_window_through_redis(tmp_path: Path) -> None:
    server = start_redis(free_port(), tmp_path)
    try:
        overflow = {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 6000,
                "n_ctx": 4096,
            }
        }
        first = respx.Router(assert_all_called=False)
        first.post(CHAT).mock(
            side_effect=[httpx.Response(400, json=overflow), httpx.Response(200, json=chat_ok())]
        )
        settings = {"discovery": False, "cache_url": server.url}
        async with proxy(first, registry=EstimateRegistry(), **settings) as (client, app):
            share = app.state.service.learner.share
            assert share is not None
            share.publish_delay_s = 0.0
            response = await client.post("/v1/chat/completions", json=request(4000))
            assert response.headers["x-context-retries"] == "1"
            await asyncio.sleep(0.2)  # the background publish
        second = respx.Router(assert_all_called=False)
        route = second.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
        async with proxy(second, registry=EstimateRegistry(), **settings) as (client, _):
            response = await client.post("/v1/chat/completions", json=request(4000, seed=1))
        # The other replica's first request already knows the window: no overflow, no retry.
        assert response.headers["x-context-window"] == "4096"
        assert response.headers["x-context-retries"] == "0" and route.call_count == 1
    finally:
        server.kill()
