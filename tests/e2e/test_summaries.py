"""LLM summaries end to end: two real ctxproxy replicas sharing one real Redis, the openai SDK as client.

A real fake upstream (uvicorn on loopback) serves one small-window model and doubles as the
summarizer (extractive and capped, ``tests/fake_summarizer.py``: it keeps what only one sentence
says, so each turn's fact, and drops the turn's repetitive details; it counts ``summary_calls``).
A real ``redis-server`` on a free loopback port is the shared summary cache of two real uvicorn
ctxproxy servers (``summarize=True``). Replica A prepares the next cut ahead of time (the default
``summary_ahead_ratio``); replica B does nothing in the
background (``summary_ahead_ratio=1.0``), so every summary call made while B answers would be B's
own in-line one. Conversations grow turn by turn against A, as a user chats (A is left to settle
between turns); one arrives whole at B, whose request then waits for its summary in line. Each
test uses its own fact ids, so the tests never share a cache key.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from fastapi import FastAPI

from app.main import create_app
from app.service.summaries import Summaries
from app.settings import Settings
from tests.compaction.conftest import free_port, start_redis
from tests.fake_upstream import FakeModel, FakeUpstream, serve_app
from tests.summaries_kit import facts, summary_message

MODEL = "summ-small"
WINDOW_TOKENS = 4096
SYSTEM_PROMPT = "You are the e2e assistant. Keep every FACT you are told."
MAX_TURNS = 40

pytestmark = pytest.mark.timeout(60)


@dataclass
class Replicas:
    fake: FakeUpstream
    redis_url: str
    a_url: str
    b_url: str
    a_app: FastAPI
    b_app: FastAPI

    def client(self, url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key="test", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    directory = tmp_path_factory.mktemp("e2e-summaries")
    redis = start_redis(free_port(), directory)
    try:
        fake = FakeUpstream([FakeModel(MODEL, WINDOW_TOKENS)])
        models_file = directory / "models.toml"
        models_file.write_text(fake.models_toml(), encoding="utf-8")
        with fake.serve() as upstream_url:

            def settings(**extra: Any) -> Settings:
                return Settings(
                    upstream_base_url=f"{upstream_url}/v1",
                    upstream_api_key=None,
                    models_file=models_file,
                    log_level="WARNING",
                    summarize=True,
                    cache_url=redis.url,
                    # The fake serves any number of requests at once (not a local server with few
                    # slots): a cut request's summary is waited for in line.
                    summary_yield="never",
                    **extra,
                )

            a_app = create_app(settings())
            b_app = create_app(settings(summary_ahead_ratio=1.0))
            with serve_app(a_app) as a_url, serve_app(b_app) as b_url:
                yield Replicas(fake, redis.url, a_url, b_url, a_app, b_app)
    finally:
        redis.kill()


@pytest.fixture
def stack(replicas: Replicas) -> Replicas:
    replicas.fake.clear()
    return replicas


def user_turn(seed: str, n: int) -> dict[str, Any]:
    """The n-th user message of a conversation: one fact (``FACT-<seed><n>``) and ~250 tokens."""
    filler = " ".join(f"detail {n}.{i} concerns item {n * 37 + i}." for i in range(24))
    return {"role": "user", "content": f"Turn {n}: remember FACT-{seed}{n}. {filler}"}


def summaries_of(app: FastAPI) -> Summaries:
    summaries = app.state.service.summaries
    assert isinstance(summaries, Summaries)
    return summaries


def settle(app: FastAPI, timeout_s: float = 10.0) -> None:
    """Wait until the replica has no summary running in the background (a user's think time)."""
    deadline = time.monotonic() + timeout_s
    while summaries_of(app).stats()["in_flight"]:
        assert time.monotonic() < deadline, "background summaries did not finish"
        time.sleep(0.02)


def last_forwarded(fake: FakeUpstream) -> dict[str, Any]:
    body: dict[str, Any] = fake.client_requests()[-1].json()
    return body


def check_summary(
    client_messages: list[dict[str, Any]], forwarded: list[dict[str, Any]], actions: str
) -> int:
    """The forwarded conversation carries one summary, of N messages: the cut ones (gone) and
    those up to the next memory stop; it holds every fact of the cut turns. Returns N."""
    found = summary_message(forwarded)
    assert found is not None, "no summary message reached the upstream"
    count, text = found
    dropped = int(re.search(r"dropped_messages=(\d+)", actions).group(1))  # type: ignore[union-attr]
    assert count >= dropped >= 2
    assert len(forwarded) == len(client_messages) - dropped + 1
    kept = facts([m for m in forwarded if summary_message([m]) is None])
    cut = facts(client_messages) - kept
    assert cut, "nothing was cut"
    assert cut <= facts([{"content": text}])
    assert forwarded[0] == client_messages[0] and forwarded[-1] == client_messages[-1]
    return count


@dataclass
class Turn:
    messages: list[dict[str, Any]]
    headers: Mapping[str, str]
    reply: str


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], *, stream: bool) -> Turn:
    """One request through the SDK; streamed ones are read to the end (with a usage chunk)."""
    if not stream:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
        content = raw.parse().choices[0].message.content
        assert content is not None
        return Turn(messages, raw.headers, content)
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(response.parse())
        headers = response.headers
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == int(headers["x-context-tokens-after"])
    return Turn(messages, headers, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices))


def grow_until_cut(stack: Replicas, client: openai.OpenAI, *, seed: str, stream: bool = False) -> Turn:
    """A user chatting with replica A turn by turn (each request: the history, the model's
    replies, one new user turn) until the proxy has to cut; returns that first cut turn."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for n in range(MAX_TURNS):
        messages.append(user_turn(seed, n))
        turn = chat(client, list(messages), stream=stream)
        assert turn.reply.startswith("Fake reply")
        settle(stack.a_app)
        if turn.headers["x-context-actions"] != "none":
            return turn
        messages.append({"role": "assistant", "content": turn.reply})
    raise AssertionError(f"no cut after {MAX_TURNS} turns")


def test_an_overflowing_turn_is_summarized_and_the_next_turn_reuses_it_on_another_replica(
    stack: Replicas,
) -> None:
    with stack.client(stack.a_url) as a:
        first = grow_until_cut(stack, a, seed="r")
    assert int(first.headers["x-context-tokens-before"]) > int(first.headers["x-context-budget"])
    assert int(first.headers["x-context-tokens-after"]) <= int(first.headers["x-context-budget"])
    actions = first.headers["x-context-actions"]
    assert "summarized=" in actions and "summary_failed" not in actions
    first_cut = check_summary(first.messages, last_forwarded(stack.fake)["messages"], actions)
    assert f"summarized={first_cut}" in actions
    assert stack.fake.summary_calls >= 1
    assert all(r.json()["stream"] is False for r in stack.fake.summary_requests())
    calls = stack.fake.summary_calls  # A has settled: what it prepared for the next turn is in Redis

    grown = [
        *first.messages,
        {"role": "assistant", "content": first.reply},
        user_turn("r", sum(m["role"] == "user" for m in first.messages)),
    ]
    cached_before = summaries_of(stack.b_app).stats()["cached"]
    with stack.client(stack.b_url) as b:
        second = chat(b, grown, stream=False)
    assert second.reply.startswith("Fake reply")
    assert stack.fake.summary_calls == calls  # B made no summary call: it read the summary from Redis
    assert "summarized=" in second.headers["x-context-actions"]
    second_cut = check_summary(
        grown, last_forwarded(stack.fake)["messages"], second.headers["x-context-actions"]
    )
    assert second_cut >= first_cut
    stats = summaries_of(stack.b_app).stats()
    assert stats["cached"] == cached_before + 1 and stats["waited"] == 0
    assert stats["cache"]["backend"] == "redis" and not stats["cache"]["degraded"]


def test_a_streamed_turn_with_a_cut_carries_the_summary(stack: Replicas) -> None:
    with stack.client(stack.a_url) as a:
        turn = grow_until_cut(stack, a, seed="s", stream=True)
    actions = turn.headers["x-context-actions"]
    assert "summarized=" in actions and "summary_failed" not in actions
    forwarded = last_forwarded(stack.fake)
    assert forwarded["stream"] is True and forwarded["stream_options"] == {"include_usage": True}
    count = check_summary(turn.messages, forwarded["messages"], actions)
    assert f"summarized={count}" in actions
    assert stack.fake.summary_calls >= 1


def test_a_long_conversation_arriving_at_once_waits_for_its_summary_in_line(stack: Replicas) -> None:
    """Cold cache, no ahead-of-time work (replica B): the request waits for the summarizer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for n in range(16):
        messages += [user_turn("c", n), {"role": "assistant", "content": f"Noted FACT-c{n}a."}]
    messages.append(user_turn("c", 16))
    before = summaries_of(stack.b_app).stats()
    with stack.client(stack.b_url) as b:
        turn = chat(b, messages, stream=False)
    assert turn.reply.startswith("Fake reply")
    actions = turn.headers["x-context-actions"]
    assert "summarized=" in actions and "summary_failed" not in actions
    check_summary(messages, last_forwarded(stack.fake)["messages"], actions)
    stats = summaries_of(stack.b_app).stats()
    assert stats["waited"] == before["waited"] + 1 and stats["cached"] == before["cached"]
    summary_requests = stack.fake.summary_requests()
    assert stack.fake.summary_calls == len(summary_requests) >= 1
    # no upstream key is configured: the summary calls carry the client's own Authorization
    assert all(r.headers["authorization"] == "Bearer test" for r in summary_requests)


def test_a_client_whose_key_is_refused_leaves_other_clients_their_summaries_on_both_replicas(
    stack: Replicas,
) -> None:
    """Issue 27: one client's refused key (its summary calls answer 401) must not switch memory off
    for the others, on the replica it used nor on the other one (the back-off lives in Redis)."""
    stack.fake.refused_keys.add("sk-e2e-refused")

    def long_conversation(seed: str) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
        for n in range(16):
            messages += [user_turn(seed, n), {"role": "assistant", "content": f"Noted FACT-{seed}{n}a."}]
        return [*messages, user_turn(seed, 16)]

    def client(url: str, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)

    try:
        with client(stack.b_url, "sk-e2e-refused") as bad, pytest.raises(openai.AuthenticationError):
            chat(bad, long_conversation("x"), stream=False)
        refused_calls = stack.fake.summary_calls
        assert [r.status for r in stack.fake.summary_requests()] == [401]
        with client(stack.a_url, "sk-e2e-refused") as bad, pytest.raises(openai.AuthenticationError):
            chat(bad, long_conversation("y"), stream=False)
        assert stack.fake.summary_calls == refused_calls  # A knows from Redis: not asked again
        for url, seed in ((stack.b_url, "z"), (stack.a_url, "v")):
            with client(url, "sk-e2e-good") as good:
                turn = chat(good, long_conversation(seed), stream=False)
            assert turn.headers["x-context-memory"] == "summary"
            check_summary(
                turn.messages, last_forwarded(stack.fake)["messages"], turn.headers["x-context-actions"]
            )
    finally:
        stack.fake.refused_keys.clear()
        settle(stack.a_app)
