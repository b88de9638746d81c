"""Two proxy replicas sharing one real Redis: a summary made by one is used by the other; a Redis
that is down degrades to the in-process cache with a warning, never to errors."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.compaction.conftest import RedisServer
from tests.summaries_kit import (
    LARGE_MODEL,
    chat,
    conversation,
    fake_upstream,
    forwarded_messages,
    proxy,
    summary_message,
)

CHAT = "/v1/chat/completions"
# No background work, and a summarizer whose window holds the span in one call.
NO_AHEAD = {"summary_ahead_ratio": 1.0, "summary_model": LARGE_MODEL}


async def test_two_replicas_share_one_summary_through_redis(redis_server: RedisServer) -> None:
    fake = fake_upstream()
    body = chat(conversation(12))
    auth = {"Authorization": "Bearer sk-secret-client-key"}
    async with (
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (first, _app_one),
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (second, app_two),
    ):
        made = await first.post(CHAT, json=body, headers=auth)
        calls = fake.summary_calls
        by_one = summary_message(forwarded_messages(fake))
        used = await second.post(CHAT, json=body, headers=auth)  # the same client (its key)
        by_two = summary_message(forwarded_messages(fake))
        stats_two = app_two.state.service.summaries.stats()
    assert calls >= 1 and fake.summary_calls == calls  # the second replica made no call
    assert "summarized=" in made.headers["x-context-actions"]
    assert "summarized=" in used.headers["x-context-actions"]
    assert by_one is not None and by_one == by_two
    assert stats_two["cached"] == 1 and stats_two["cache"]["backend"] == "redis"
    assert not stats_two["cache"]["degraded"]
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    try:
        keys = await redis.keys("*")
        values = [await redis.get(key) for key in keys]
    finally:
        await redis.aclose()
    assert keys and all(key.startswith("ctxproxy:summary:") for key in keys)
    # Summaries and the chain's index (spans' lengths and keys) only: no key, no prompt.
    # The summary is what stands between the memory's heading and its index's heading.
    summary = by_one[1].split("\n", 1)[1].split("\n[ctxproxy: exact strings from them]\n", 1)[0]
    chains = [v for k, v in zip(keys, values, strict=True) if k.startswith("ctxproxy:summary:chain:")]
    assert len(chains) == 1 and all(isinstance(n, int) and len(key) == 64 for n, key in json.loads(chains[0]))
    assert sorted(v for v in values if v not in chains) == [summary]
    assert not any("sk-secret" in v or "You write handoff" in v for v in values)


async def test_two_replicas_racing_on_one_span_make_it_once(redis_server: RedisServer) -> None:
    fake = fake_upstream()
    fake.summary_mode, fake.summary_delay_s = "slow", 0.3
    body = chat(conversation(10))  # one block cut: one summary call
    async with (
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (first, _one),
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (second, _two),
    ):
        responses = await asyncio.gather(first.post(CHAT, json=body), second.post(CHAT, json=body))
    assert all("summarized=" in r.headers["x-context-actions"] for r in responses)
    assert fake.summary_calls == 1


@pytest.mark.parametrize("mode", ["error", "missing"])
async def test_a_failed_span_backs_off_on_every_replica(redis_server: RedisServer, mode: Any) -> None:
    # A span that failed on one replica (or an upstream without the summary route) is not asked for
    # again by another one while it backs off: the back-off lives in the shared cache.
    fake = fake_upstream()
    fake.summary_mode = mode
    body = chat(conversation(12))
    async with (
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (first, _one),
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (second, app_two),
    ):
        failed = await first.post(CHAT, json=body)
        assert fake.summary_calls == 1
        again = await second.post(CHAT, json=body)
        stats = app_two.state.service.summaries.stats()
    assert failed.headers["x-context-memory"] == again.headers["x-context-memory"] == "index"
    assert fake.summary_calls == 1 and stats["backing_off"] == 1 and stats["calls"] == 0


def tagged(messages: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """``messages`` made a conversation of their own: no summary of another matches it."""
    return [{**m, "content": m["content"].replace("remember", f"remember {tag}")} for m in messages]


async def test_a_refused_key_on_one_replica_leaves_other_clients_their_summaries_on_both(
    redis_server: RedisServer,
) -> None:
    fake = fake_upstream()
    fake.refused_keys.add("sk-bad")
    good, bad = {"Authorization": "Bearer sk-good"}, {"Authorization": "Bearer sk-bad"}
    async with (
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (first, _one),
        proxy(fake, cache_url=redis_server.url, **NO_AHEAD) as (second, app_two),
    ):
        refused = await first.post(CHAT, json=chat(tagged(conversation(12), "b1")), headers=bad)
        calls = fake.summary_calls
        # The refusal is shared through Redis, for that key only: the other replica asks nothing for it...
        again = await second.post(CHAT, json=chat(tagged(conversation(12), "b2")), headers=bad)
        assert fake.summary_calls == calls
        # ...and both replicas still summarize for every other client.
        on_two = await second.post(CHAT, json=chat(tagged(conversation(12), "g1")), headers=good)
        on_one = await first.post(CHAT, json=chat(tagged(conversation(12), "g2")), headers=good)
        stats_two = app_two.state.service.summaries.stats()
    assert refused.status_code == again.status_code == 401
    assert on_two.headers["x-context-memory"] == on_one.headers["x-context-memory"] == "summary"
    assert [r.status for r in fake.summary_requests()] == [401, 200, 200]
    assert stats_two["backing_off"] == 1 and stats_two["cache"]["backend"] == "redis"


async def test_a_redis_that_is_down_degrades_to_memory_with_a_warning(
    dead_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = fake_upstream()
    body = chat(conversation(12))
    with caplog.at_level(logging.WARNING, logger="ctxproxy.compaction"):
        async with proxy(fake, cache_url=dead_redis_url, **NO_AHEAD) as (client, app):
            first = await client.post(CHAT, json=body)
            calls = fake.summary_calls
            again = await client.post(CHAT, json=body)
            stats = app.state.service.summaries.stats()
    assert first.status_code == again.status_code == 200
    assert "summarized=" in first.headers["x-context-actions"]
    assert "summarized=" in again.headers["x-context-actions"]
    assert calls >= 1 and fake.summary_calls == calls  # reused from the in-process cache
    assert stats["cache"]["degraded"] and stats["cache"]["errors"] >= 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("using the in-process cache" in w for w in warnings)
