"""Summary caches: keys, the in-process LRU, and Redis shared by two "replicas" (a real server)."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from app.compaction.cache import (
    MemoryCache,
    RedisCache,
    SummaryCache,
    cache_from_url,
    merged_chain,
    prefix_keys,
    summary_key,
)
from tests.compaction.conftest import RedisServer

MODEL = "gpt-4o-mini"
VERSION = "handoff-v1"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


TENANT = "t-alice"


def _key(
    span: list[dict[str, object]], *, model: str = MODEL, version: str = VERSION, tenant: str = TENANT
) -> str:
    return summary_key(span, summarizer_model=model, prompt_version=version, tenant=tenant)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ctxproxy.compaction" and r.levelno >= logging.WARNING]


# keys


def test_key_is_a_sha256_that_depends_on_span_model_prompt_version_and_tenant() -> None:
    span = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    key = _key(span)
    assert len(key) == 64 and all(c in "0123456789abcdef" for c in key)
    assert _key([dict(m) for m in span]) == key
    assert _key(span, model="other") != key
    assert _key(span, version="handoff-v2") != key
    assert _key(span, tenant="t-bob") != key
    assert _key([span[0], {"role": "assistant", "content": "hello!"}]) != key
    assert _key(span[:1]) != key
    assert _key([*span, {"role": "user", "content": ""}]) != key


def test_key_ignores_dict_order_but_not_unknown_keys() -> None:
    a = {"role": "user", "content": "x", "name": "bob"}
    b = {"name": "bob", "content": "x", "role": "user"}
    assert _key([a]) == _key([b])
    assert _key([{**a, "extra": 1}]) != _key([a])


def test_key_does_not_confuse_message_boundaries() -> None:
    one = [{"role": "user", "content": "a\nb"}]
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert _key(one) != _key(two)


_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text()}),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_messages, min_size=1, max_size=5))
def test_prefix_keys_equal_keys_of_the_concatenated_prefixes(blocks: list[list[dict[str, str]]]) -> None:
    keys = prefix_keys(blocks, summarizer_model=MODEL, prompt_version=VERSION, tenant=TENANT)
    assert len(keys) == len(blocks)
    for j in range(len(blocks)):
        flat = [m for block in blocks[: j + 1] for m in block]
        assert keys[j] == _key(flat)


# memory


async def test_memory_cache_is_a_bounded_lru() -> None:
    cache = MemoryCache(max_entries=3, ttl_s=60)
    for k in "abc":
        await cache.set(k, k.upper())
    assert await cache.get("a") == "A"  # a is now the most recently used
    await cache.set("d", "D")
    assert len(cache) == 3
    assert await cache.get("b") is None  # the least recently used went
    assert [await cache.get(k) for k in "acd"] == ["A", "C", "D"]


async def test_memory_cache_entries_expire() -> None:
    clock = FakeClock()
    cache = MemoryCache(max_entries=10, ttl_s=60, clock=clock)
    await cache.set("k", "v")
    await cache.set("short", "s", ttl_s=5)
    clock.now += 5
    assert await cache.get("short") is None
    assert await cache.get("k") == "v"
    clock.now += 55
    assert await cache.get("k") is None
    assert len(cache) == 0  # expired entries are dropped when touched
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.sets) == (1, 2, 2)


async def test_memory_cache_prefers_evicting_expired_entries() -> None:
    clock = FakeClock()
    cache = MemoryCache(max_entries=2, ttl_s=60, clock=clock)
    await cache.set("old", "o", ttl_s=1)
    await cache.set("keep", "k")
    clock.now += 2
    await cache.get("keep")
    await cache.set("new", "n")
    assert await cache.get("keep") == "k" and await cache.get("new") == "n"


async def test_memory_lock_is_exclusive_and_expires() -> None:
    clock = FakeClock()
    cache = MemoryCache(max_entries=10, ttl_s=60, clock=clock)
    async with cache.lock("k", ttl_s=10) as first:
        assert first is True
        async with cache.lock("k", ttl_s=10) as second:
            assert second is False
        async with cache.lock("other", ttl_s=10) as other:
            assert other is True
        clock.now += 11  # the holder took too long: the lock may be retaken ...
        async with cache.lock("k", ttl_s=10) as third:
            assert third is True
            async with cache.lock("k", ttl_s=10) as fourth:
                assert fourth is False
    # ... and the first holder's exit did not free the lock it had lost
    async with cache.lock("k", ttl_s=10) as again:
        assert again is True


def test_memory_cache_rejects_nonsense_configuration() -> None:
    with pytest.raises(ValueError):
        MemoryCache(max_entries=0, ttl_s=1)
    with pytest.raises(ValueError):
        MemoryCache(max_entries=1, ttl_s=0)


def test_cache_from_url() -> None:
    assert isinstance(cache_from_url(None, ttl_s=10, max_entries=5), MemoryCache)
    assert isinstance(cache_from_url("", ttl_s=10, max_entries=5), MemoryCache)
    redis_cache = cache_from_url("redis://127.0.0.1:6390/0", ttl_s=10, max_entries=5)
    assert isinstance(redis_cache, RedisCache) and redis_cache.ttl_s == 10
    with pytest.raises(ValueError, match="scheme"):
        cache_from_url("memcached://localhost", ttl_s=10, max_entries=5)


# redis


async def test_two_replicas_share_one_redis(redis_server: RedisServer) -> None:
    a, b = RedisCache(redis_server.url, ttl_s=60), RedisCache(redis_server.url, ttl_s=60)
    try:
        assert await b.get("k1") is None
        await a.set("k1", "summary one")
        assert await b.get("k1") == "summary one"
        assert b.stats().hits == 1 and b.stats().misses == 1 and not b.stats().degraded
        assert a.stats().sets == 1 and a.stats().errors == 0
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_stores_the_summary_under_the_prefix_with_a_ttl(redis_server: RedisServer) -> None:
    cache = RedisCache(redis_server.url, ttl_s=30, prefix="t:")
    raw = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        span = [{"role": "user", "content": "secret prompt text"}]
        key = _key(span)
        await cache.set(key, "the summary")
        assert await raw.keys("*") == [f"t:{key}"]
        assert await raw.get(f"t:{key}") == "the summary"
        assert 0 < await raw.pttl(f"t:{key}") <= 30_000
        await cache.set("short", "x", ttl_s=2)
        assert 0 < await raw.pttl("t:short") <= 2_000
    finally:
        await raw.aclose()
        await cache.aclose()


async def test_redis_lock_is_exclusive_across_replicas(redis_server: RedisServer) -> None:
    a, b = RedisCache(redis_server.url, ttl_s=60), RedisCache(redis_server.url, ttl_s=60)
    try:
        async with a.lock("span", ttl_s=10) as got_a:
            assert got_a is True
            async with b.lock("span", ttl_s=10) as got_b:
                assert got_b is False
            async with a.lock("span", ttl_s=10) as again_a:
                assert again_a is False  # not re-entrant either
            async with b.lock("other", ttl_s=10) as other:
                assert other is True
        async with b.lock("span", ttl_s=10) as after:
            assert after is True
    finally:
        await a.aclose()
        await b.aclose()


async def test_redis_lock_release_never_frees_someone_elses_lock(redis_server: RedisServer) -> None:
    a, b = RedisCache(redis_server.url, ttl_s=60), RedisCache(redis_server.url, ttl_s=60)
    raw = Redis.from_url(redis_server.url, decode_responses=True)
    name = "ctxproxy:summary:lock:span"
    try:
        lock_a = a.lock("span", ttl_s=10)
        assert await lock_a.__aenter__() is True
        await raw.delete(name)  # as if A's lock had expired while A was still working
        lock_b = b.lock("span", ttl_s=10)
        assert await lock_b.__aenter__() is True
        await lock_a.__aexit__(None, None, None)
        assert await raw.exists(name) == 1  # A's late release left B's lock alone
        await lock_b.__aexit__(None, None, None)
        assert await raw.exists(name) == 0
    finally:
        await raw.aclose()
        await a.aclose()
        await b.aclose()


async def test_redis_down_degrades_to_memory_with_one_warning(
    dead_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = RedisCache(dead_redis_url, ttl_s=60, retry_after_s=0)  # retry Redis on every call
    try:
        assert await cache.get("k") is None
        await cache.set("k", "v")
        assert await cache.get("k") == "v"
        async with cache.lock("k", ttl_s=5) as first:
            assert first is True
            async with cache.lock("k", ttl_s=5) as second:
                assert second is False  # still exclusive, in-process
        for _ in range(3):
            await cache.set("k2", "v2")
        stats = cache.stats()
        assert stats.degraded and stats.errors >= 5 and stats.hits == 1
        assert len(_warnings(caplog)) == 1
        assert "in-process" in _warnings(caplog)[0].getMessage()
    finally:
        await cache.aclose()


async def test_redis_killed_mid_session_degrades_and_recovers(
    redis_factory: Callable[[int | None], RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    server = redis_factory(None)
    a = RedisCache(server.url, ttl_s=60, retry_after_s=30, clock=clock)
    b = RedisCache(server.url, ttl_s=60, retry_after_s=30, clock=clock)
    try:
        await a.set("before", "1")
        assert await b.get("before") == "1"
        server.kill()
        await a.set("during", "2")  # no exception: written to memory
        assert await a.get("during") == "2"
        assert await b.get("during") is None
        assert await b.get("before") == "1"  # b's in-process copy
        assert a.stats().degraded and b.stats().degraded
        assert len(_warnings(caplog)) == 2  # one per replica, not one per call
        clock.now += 10
        await a.set("still-backing-off", "3")
        errors = a.stats().errors
        redis_factory(server.port)  # Redis is back on the same port
        clock.now += 21
        await a.set("after", "4")
        assert not a.stats().degraded and a.stats().errors == errors
        assert await b.get("after") == "4"
        assert len(_warnings(caplog)) == 2
    finally:
        await a.aclose()
        await b.aclose()


async def test_lock_release_with_redis_gone_does_not_raise(redis_server: RedisServer) -> None:
    cache = RedisCache(redis_server.url, ttl_s=60)
    try:
        async with cache.lock("k", ttl_s=5) as got:
            assert got is True
            redis_server.kill()  # the release cannot reach Redis; it must not raise
        assert cache.stats().degraded
    finally:
        await cache.aclose()


async def test_a_redis_url_that_cannot_be_used_degrades_too(caplog: pytest.LogCaptureFixture) -> None:
    cache = RedisCache("redis://127.0.0.1:notaport/0", ttl_s=60, retry_after_s=0)
    try:
        await cache.set("k", "v")
        assert await cache.get("k") == "v"
        assert await cache.get("missing") is None
        assert cache.stats().degraded and cache.stats().errors == 3  # each call tried Redis first
        assert len(_warnings(caplog)) == 1
    finally:
        await cache.aclose()


def test_a_missing_redis_server_fails_the_test_instead_of_skipping(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.compaction import conftest

    monkeypatch.setattr(conftest, "REDIS_SERVER", str(tmp_path / "no-redis-server"))
    monkeypatch.setattr(conftest.shutil, "which", lambda name: None)
    with pytest.raises(pytest.fail.Exception, match="redis-server is not installed"):
        conftest.start_redis(conftest.free_port(), tmp_path)


# atomic updates: the same contract in process and on Redis


@pytest.fixture(params=["memory", "redis"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[SummaryCache]:
    if request.param == "memory":
        yield MemoryCache(max_entries=64, ttl_s=60)
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    cache = RedisCache(server.url, ttl_s=60)
    try:
        yield cache
    finally:
        assert not cache.stats().degraded  # every operation below ran on Redis
        await cache.aclose()


async def test_incr_counts_from_one_and_restarts_on_what_is_not_a_count(backend: SummaryCache) -> None:
    assert [await backend.incr("tries:a", ttl_s=30) for _ in range(3)] == [1, 2, 3]
    assert await backend.incr("tries:b", ttl_s=30) == 1
    await backend.set("tries:c", "not a count")
    assert await backend.incr("tries:c", ttl_s=30) == 1
    assert await backend.get("tries:a") == "3"


async def test_merge_chain_puts_the_entry_first_once_within_the_limit(backend: SummaryCache) -> None:
    for length, key in [(2, "k2"), (4, "k4"), (6, "k6"), (4, "k4")]:
        await backend.merge_chain("chain:c", length, key, limit=3)
    assert json.loads(await backend.get("chain:c") or "") == [[4, "k4"], [6, "k6"], [2, "k2"]]
    await backend.merge_chain("chain:c", 8, "k8", limit=3)
    assert json.loads(await backend.get("chain:c") or "") == [[8, "k8"], [4, "k4"], [6, "k6"]]
    await backend.set("chain:bad", '{"not": "a chain"}')
    await backend.merge_chain("chain:bad", 1, "k1", limit=3)
    assert json.loads(await backend.get("chain:bad") or "") == [[1, "k1"]]


async def test_compare_and_set_stores_only_over_the_expected_value(backend: SummaryCache) -> None:
    assert await backend.compare_and_set("k", None, "one") is True
    assert await backend.compare_and_set("k", None, "two") is False  # not absent any more
    assert await backend.compare_and_set("k", "stale", "two") is False
    assert await backend.get("k") == "one"
    assert await backend.compare_and_set("k", "one", "two") is True
    assert await backend.get("k") == "two"


def test_merged_chain_is_what_the_redis_script_computes() -> None:
    assert json.loads(merged_chain(None, 3, "a", limit=2)) == [[3, "a"]]
    assert json.loads(merged_chain('[[1, "b"], [3, "a"], [5, "c"]]', 3, "a", limit=2)) == [
        [3, "a"],
        [1, "b"],
    ]
    assert json.loads(merged_chain("not json", 3, "a", limit=2)) == [[3, "a"]]


async def test_two_replicas_racing_on_one_redis_lose_no_update(redis_server: RedisServer) -> None:
    # A generous timeout: a hundred connections open at once on a busy machine.
    a, b = (RedisCache(redis_server.url, ttl_s=60, socket_timeout_s=5.0) for _ in range(2))
    try:
        counts = await asyncio.gather(*(cache.incr("tries:x", ttl_s=30) for cache in [a, b] * 100))
        assert sorted(counts) == list(range(1, 201))  # every increment seen once, none lost
        await asyncio.gather(
            *(cache.merge_chain("chain:x", n, f"k{n}", limit=500) for n, cache in enumerate([a, b] * 100))
        )
        chain = json.loads(await a.get("chain:x") or "")
        assert sorted(n for n, _ in chain) == list(range(200))

        # compare-and-set as a counter: each replica retries until its update lands on the latest.
        async def bump(cache: RedisCache) -> None:
            while True:
                current = await cache.get("cas:x")
                if await cache.compare_and_set("cas:x", current, str(int(current or 0) + 1)):
                    return

        await asyncio.gather(*(bump(cache) for cache in [a, b] * 50))
        assert await b.get("cas:x") == "100"
        assert not a.stats().degraded and not b.stats().degraded
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_replica_reads_what_another_changed_and_keeps_it_as_long_as_redis(
    redis_server: RedisServer,
) -> None:
    clock = FakeClock()
    a = RedisCache(redis_server.url, ttl_s=600, clock=clock)
    b = RedisCache(redis_server.url, ttl_s=600, clock=clock)
    try:
        await a.merge_chain("chain:y", 2, "k2", limit=8)
        assert json.loads(await b.get("chain:y") or "") == [[2, "k2"]]
        await a.merge_chain("chain:y", 4, "k4", limit=8)
        assert json.loads(await b.get("chain:y") or "") == [[4, "k4"], [2, "k2"]]  # not b's old copy
        await a.set("fail:z", "backing off", ttl_s=5)
        assert await b.get("fail:z") == "backing off"
        redis_server.kill()
        assert await b.get("fail:z") == "backing off"  # b's in-process copy, while Redis is down
        clock.now += 6
        assert await b.get("fail:z") is None  # ...which ended when Redis would have ended it
        assert await b.incr("tries:z", ttl_s=30) == 1  # counted in process, no error raised
        assert b.stats().degraded
    finally:
        await a.aclose()
        await b.aclose()


async def test_memory_cache_bounds_the_memory_of_its_values_too() -> None:
    four = sys.getsizeof("aaaa")
    cache = MemoryCache(100, 60.0, max_bytes=2 * four + 2)
    await cache.set("a", "aaaa")
    await cache.set("b", "bbbb")
    await cache.get("a")  # a is now the most recently used
    await cache.set("c", "cccc")  # over the bound: the least recently used goes
    assert cache.peek("b") is None and cache.peek("a") == "aaaa" and cache.peek("c") == "cccc"
    await cache.set("a", "aaaaa")  # replaced: its old bytes are not counted twice
    assert cache.peek("a") == "aaaaa" and cache.peek("c") == "cccc"
    await cache.set("big", "x" * (2 * four))  # larger than the whole bound: not kept
    assert cache.peek("big") is None and len(cache) == 2
    # A character outside Latin-1 takes more memory than one inside it: the bound counts what
    # four CJK characters take, more than four ASCII ones.
    wide = MemoryCache(100, 60.0, max_bytes=2 * four + 2)
    await wide.set("a", "汉字汉字")
    await wide.set("b", "bbbb")
    assert sys.getsizeof("汉字汉字") > four + 2 and wide.peek("a") is None and wide.peek("b") == "bbbb"
