"""LLM summaries on the request path, through the whole app: the fake upstreams as summarizers
(their summarizer is extractive and capped, ``tests.fake_summarizer``), in each wire API."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from app.api.headers import parse_context_headers
from app.core.dialects import DIALECTS
from app.core.errors import InvalidRequest
from app.core.registry import ModelSpec
from app.core.routes import RouteMatch
from app.main import create_app
from app.settings import InvalidSettings, Settings
from tests.api import OneModelRegistry
from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude
from tests.fake_gemini_upstream import FakeGemini, FakeGeminiModel
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, FakeUpstream, is_summary_request
from tests.summaries_kit import (
    INDEX,
    INDEX_HEAD,
    LARGE_MODEL,
    MODEL,
    NOTE,
    SMALL_MODEL,
    SMALL_WINDOW_TOKENS,
    RecordingTransport,
    chat,
    conversation,
    facts,
    fake_upstream,
    forwarded_messages,
    proxy,
    settle,
    summaries_of,
    summary_message,
)

CHAT = "/v1/chat/completions"
# No background work, and a summarizer whose window holds a cut step in one call (the request
# model's small window would take a cold span in parts).
NO_AHEAD = {"summary_ahead_ratio": 1.0, "summary_model": LARGE_MODEL}
PREVIOUS = re.compile(r"<previous_summary>\n(.*?)\n</previous_summary>", re.DOTALL)


def cut_facts(client_messages: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> set[str]:
    """Facts of the client's messages that are no longer forwarded as messages of their own."""
    kept = facts([m for m in forwarded if summary_message([m]) is None])
    return facts(client_messages) - kept


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    names = (
        "SUMMARIZE",
        "CACHE_URL",
        "SUMMARY_MODEL",
        "SUMMARY_BASE_URL",
        "SUMMARY_TIMEOUT_S",
        "SUMMARY_API",
    )
    for name in names:
        monkeypatch.delenv(f"CTXPROXY_{name}", raising=False)
    settings = Settings()
    assert settings.summarize is True and settings.cache_url is None  # on by default
    assert (settings.cache_ttl_s, settings.cache_max_entries) == (86400.0, 4096)
    assert settings.summary_model is None and settings.summary_base_url is None
    assert settings.summary_api is None and settings.summary_retry_after_s == 60.0
    assert settings.summary_timeout_s == 4.0
    assert (settings.summary_ahead_ratio, settings.summary_concurrency) == (0.85, 2)
    monkeypatch.setenv("CTXPROXY_SUMMARIZE", "false")
    monkeypatch.setenv("CTXPROXY_CACHE_URL", "redis://cache:6379/0")
    monkeypatch.setenv("CTXPROXY_SUMMARY_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("CTXPROXY_SUMMARY_BASE_URL", "http://cheap:8000/v1/")
    monkeypatch.setenv("CTXPROXY_SUMMARY_TIMEOUT_S", "1.5")
    monkeypatch.setenv("CTXPROXY_SUMMARY_API", "Chat")
    settings = Settings()
    assert settings.summarize is False and settings.cache_url == "redis://cache:6379/0"
    assert settings.summary_model == "gpt-4o-mini" and settings.summary_base_url == "http://cheap:8000/v1"
    assert settings.summary_timeout_s == 1.5 and settings.summary_api == "chat"
    bad: list[dict[str, Any]] = [
        {"summary_base_url": "cheap:8000"},
        {"summary_ahead_ratio": 1.5},
        {"summary_concurrency": 0},
        {"summary_retry_after_s": 0},
    ]
    for values in bad:
        with pytest.raises(ValueError):
            Settings(**values)
    # The settings know no API: the composition root checks the name against its registry.
    named = Settings(summary_api="Gemini-ish")
    with pytest.raises(InvalidSettings, match="CTXPROXY_SUMMARY_API: unknown API 'gemini-ish'"):
        named.require_apis(tuple(DIALECTS))
    Settings(summary_api="Gemini").require_apis(tuple(DIALECTS))
    with pytest.raises(InvalidSettings):
        create_app(named)


def test_summarize_header_is_validated() -> None:
    assert parse_context_headers({"X-Context-Summarize": " ON "}).summarize is True
    assert parse_context_headers({"X-Context-Summarize": "off"}).summarize is False
    assert parse_context_headers({}).summarize is None
    with pytest.raises(InvalidRequest) as info:
        parse_context_headers({"X-Context-Summarize": "yes"})
    assert info.value.param == "X-Context-Summarize"


async def test_a_cut_request_gets_one_memory_with_the_facts_of_the_cut_turns() -> None:
    fake = fake_upstream()
    messages = conversation(12)
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        auth = {"Authorization": "Bearer sk-client", "OpenAI-Organization": "org-1"}
        response = await client.post(CHAT, json=chat(messages), headers=auth)
    assert response.status_code == 200
    assert response.headers["x-context-memory"] == "summary"
    actions = response.headers["x-context-actions"]
    assert "summarized=" in actions and "summary_failed" not in actions
    forwarded = forwarded_messages(fake)
    found = summary_message(forwarded)
    assert found is not None
    count, text = found
    dropped = int(re.search(r"dropped_messages=(\d+)", actions).group(1))  # type: ignore[union-attr]
    # It stands for the dropped messages and the shown ones up to the next memory stop.
    assert f"summarized={count}" in actions and count >= dropped
    assert len(forwarded) == len(messages) - dropped + 1  # the memory stands where the note was
    lost = cut_facts(messages, forwarded)
    kept = facts([{"content": text}])
    assert lost and lost <= kept
    assert not any(NOTE.match(str(m.get("content"))) for m in forwarded)
    # A cold cache: one call for the whole span (it fits the summarizer's window).
    (summary_request,) = fake.summary_requests()
    assert summary_request.headers["authorization"] == "Bearer sk-client"
    assert summary_request.headers["openai-organization"] == "org-1"
    sent = summary_request.json()
    assert sent["model"] == LARGE_MODEL and sent["stream"] is False and 0 < sent["max_tokens"] < 200
    assert summary_request.status == 200


async def test_the_next_request_of_the_conversation_reuses_the_cached_memory() -> None:
    fake = fake_upstream()
    first = conversation(12)
    async with proxy(fake, **NO_AHEAD) as (client, app):
        one = await client.post(CHAT, json=chat(first))
        before = forwarded_messages(fake)
        grown = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
        two = await client.post(CHAT, json=chat(grown))
        after = forwarded_messages(fake)
        stats = summaries_of(app).stats()
    assert one.headers["x-context-actions"] == two.headers["x-context-actions"]
    assert fake.summary_calls == 1
    assert stats["cached"] == 1 and stats["waited"] == 1
    assert after[: len(before)] == before  # the forwarded prefix is byte-stable


async def test_on_an_upstream_with_few_slots_a_request_never_waits_in_line_for_its_summary() -> None:
    # The upstream's slots are its clients' (CTXPROXY_SUMMARY_YIELD=always: a local one-slot
    # server): the cut request goes at once with the index, its summary is written after it (in
    # the pause; waiting for it would hold the slot the request needs) and the next request of the
    # conversation has it.
    fake = fake_upstream()
    first = conversation(12)
    async with proxy(fake, summary_yield="always", **NO_AHEAD) as (client, app):
        one = await client.post(CHAT, json=chat(first))
        await settle(app)
        grown = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
        two = await client.post(CHAT, json=chat(grown))
        stats = summaries_of(app).stats()
    assert one.headers["x-context-memory"] == "index" and two.headers["x-context-memory"] == "summary"
    kinds = ["summary" if is_summary_request(r.json()) else "client" for r in fake.chat_requests()]
    assert kinds == ["client", "summary", "client"]
    assert stats["cached"] == 1 and stats["calls"] == 1 and stats["preempted"] == 0


async def test_a_growing_session_folds_each_step_into_the_previous_summary() -> None:
    fake = fake_upstream()
    async with proxy(fake, **NO_AHEAD) as (client, app):
        cuts: list[int] = []
        for turns in range(10, 30):
            response = await client.post(CHAT, json=chat(conversation(turns)))
            assert response.headers["x-context-memory"] == "summary"
            found = summary_message(forwarded_messages(fake))
            assert found is not None
            cuts.append(found[0])
        stats = summaries_of(app).stats()
    steps = len(set(cuts))
    assert steps >= 3 and fake.summary_calls == steps  # one call per cut step, none per request
    requests = fake.summary_requests()
    for earlier, later in itertools.pairwise(requests):
        previous = PREVIOUS.search(later.json()["messages"][-1]["content"])
        assert previous is not None  # folds the previous summary ...
        earlier_text = earlier.json()["messages"][-1]["content"]
        # ... with the newly forgotten messages only: none of the earlier step's
        newest = re.findall(
            r"FACT-\d+u", later.json()["messages"][-1]["content"].split("</previous_summary>")[1]
        )
        assert newest and not set(newest) & set(re.findall(r"FACT-\d+u", earlier_text))
    assert stats["by_api"]["chat"]["calls"] == steps and stats["by_api"]["chat"]["tokens_in"] > 0


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        ("error", "HTTP 500"),
        ("missing", "HTTP 404"),
        ("empty", "empty answer"),
        ("slow", "still being written"),
    ],
)
async def test_fail_open_with_the_real_cause(
    mode: Any, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake = fake_upstream()
    fake.summary_mode = mode
    fake.summary_delay_s = 5.0
    messages = conversation(12)
    with caplog.at_level(logging.INFO, logger="ctxproxy.compaction"):
        async with proxy(fake, summary_timeout_s=0.2, **NO_AHEAD) as (client, _app):
            response = await client.post(CHAT, json=chat(messages))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"].startswith("Fake reply")
    assert "summary_failed=" in response.headers["x-context-actions"]
    assert response.headers["x-context-memory"] == "index"  # the index of what it forgot stands in
    forwarded = forwarded_messages(fake)
    assert summary_message(forwarded) is None
    assert sum(bool(INDEX.match(str(m.get("content")))) for m in forwarded) == 1
    assert fake.summary_calls == 1
    assert any(logged in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not any("within 4.0s" in r.getMessage() for r in caplog.records)


async def test_the_index_stands_in_with_the_very_cut_the_memory_would_have_had() -> None:
    with_memory, without = fake_upstream(), fake_upstream()
    without.summary_mode = "error"
    for fake in (with_memory, without):
        async with proxy(fake, **NO_AHEAD) as (client, _app):
            await client.post(CHAT, json=chat(conversation(12)))
    a, b = forwarded_messages(with_memory), forwarded_messages(without)
    assert len(a) == len(b) and summary_message(a) is not None and INDEX.match(b[2]["content"])
    assert a[:2] == b[:2] and a[3:] == b[3:]


async def test_a_failed_span_is_not_asked_for_again_on_every_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = fake_upstream()
    fake.summary_mode = "error"
    with caplog.at_level(logging.WARNING, logger="ctxproxy.compaction"):
        async with proxy(fake, **NO_AHEAD) as (client, app):
            for _ in range(5):
                response = await client.post(CHAT, json=chat(conversation(12)))
                assert response.headers["x-context-memory"] == "index"
            stats = summaries_of(app).stats()
    assert fake.summary_calls == 1 and stats["backing_off"] == 4 and stats["failures"] == 1
    assert len([r for r in caplog.records if "HTTP 500" in r.getMessage()]) == 1


async def test_an_upstream_without_the_summary_route_turns_summaries_off_for_every_span(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = fake_upstream()
    fake.summary_mode = "missing"
    with caplog.at_level(logging.WARNING, logger="ctxproxy.compaction"):
        async with proxy(fake, **NO_AHEAD) as (client, _app):
            for turns in range(10, 30):  # many cut steps
                await client.post(CHAT, json=chat(conversation(turns)))
    assert fake.summary_calls == 1
    (warning,) = [r.getMessage() for r in caplog.records if "HTTP 404" in r.getMessage()]
    assert "are off" in warning and "/chat/completions" in warning


def tagged(messages: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """``messages`` made a conversation of their own: no summary of another matches it."""
    return [{**m, "content": m["content"].replace("remember", f"remember {tag}")} for m in messages]


async def test_a_client_with_a_refused_key_leaves_every_other_client_its_summaries() -> None:
    fake = fake_upstream()
    fake.refused_keys.add("sk-bad")
    good, bad = {"Authorization": "Bearer sk-good"}, {"Authorization": "Bearer sk-bad"}
    async with proxy(fake, **NO_AHEAD) as (client, app):
        before = await client.post(CHAT, json=chat(tagged(conversation(12), "g1")), headers=good)
        refused = await client.post(CHAT, json=chat(tagged(conversation(12), "b1")), headers=bad)
        calls = fake.summary_calls
        again = await client.post(CHAT, json=chat(tagged(conversation(12), "b2")), headers=bad)
        assert fake.summary_calls == calls  # that key backs off: not asked again
        after = await client.post(CHAT, json=chat(tagged(conversation(12), "g2")), headers=good)
        anonymous = await client.post(CHAT, json=chat(tagged(conversation(12), "a1")))
        stats = summaries_of(app).stats()
    assert before.headers["x-context-memory"] == "summary"
    assert refused.status_code == again.status_code == 401
    assert [r.status for r in fake.summary_requests()] == [200, 401, 200, 200]
    assert after.headers["x-context-memory"] == anonymous.headers["x-context-memory"] == "summary"
    assert stats["backing_off"] == 1 and stats["failures"] == 1


async def test_a_summary_is_its_clients_a_hit_never_tells_another_what_was_sent() -> None:
    fake = fake_upstream()
    body = chat(conversation(12))
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        made = await client.post(CHAT, json=body, headers={"Authorization": "Bearer sk-alice"})
        calls = fake.summary_calls
        reused = await client.post(
            CHAT, json=body, headers={"x-api-key": "ignored", "Authorization": "Bearer sk-alice"}
        )
        assert fake.summary_calls == calls  # the same client: its cached summary
        probed = await client.post(CHAT, json=body, headers={"Authorization": "Bearer sk-mallory"})
    assert made.headers["x-context-memory"] == reused.headers["x-context-memory"] == "summary"
    assert probed.headers["x-context-memory"] == "summary"
    assert fake.summary_calls == calls + 1  # written for mallory: alice's was not found for it


async def test_a_summary_over_its_size_is_cut_to_it_and_fits_its_room() -> None:
    # A reply over the size asked is cut (its last lines first) to that size, which the room of
    # its memory was sized for: it is placed, never refused as too large for the room.
    fake = fake_upstream()
    fake.summary_padding = "\nMore about it:" + " detail" * 400
    async with proxy(fake, **NO_AHEAD) as (client, app):
        response = await client.post(CHAT, json=chat(conversation(10)))
        stats = summaries_of(app).stats()
    assert response.status_code == 200
    assert "summarized=" in response.headers["x-context-actions"]
    message = summary_message(forwarded_messages(fake))
    assert message is not None and "detail detail" not in message[1] and "FACT-" in message[1]
    assert stats["too_large"] == 0 and stats["failed"] == 0 and fake.summary_calls == 1


async def test_a_streamed_request_gets_the_memory_too() -> None:
    fake = fake_upstream()
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        response = await client.post(CHAT, json=chat(conversation(10), stream=True))
    assert response.status_code == 200 and response.text.rstrip().endswith("data: [DONE]")
    assert "summarized=" in response.headers["x-context-actions"]
    assert summary_message(forwarded_messages(fake)) is not None


@pytest.mark.timeout(30)  # a shutdown that waited for the 60 s summary would hit this
async def test_shutdown_cancels_a_summary_still_running_in_the_background() -> None:
    fake = fake_upstream()
    fake.summary_mode, fake.summary_delay_s = "slow", 60.0
    async with proxy(fake, summary_timeout_s=0.1, **NO_AHEAD) as (client, app):
        response = await client.post(CHAT, json=chat(conversation(10)))
        summaries = summaries_of(app)
        assert summaries.stats()["in_flight"] == 1
    assert summaries.stats()["in_flight"] == 0
    assert "summary_failed=" in response.headers["x-context-actions"]


async def test_concurrent_identical_requests_make_one_summary_call() -> None:
    fake = fake_upstream()
    fake.summary_mode, fake.summary_delay_s = "slow", 0.3
    body = chat(conversation(10))
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        responses = await asyncio.gather(*(client.post(CHAT, json=body) for _ in range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    assert all("summarized=" in r.headers["x-context-actions"] for r in responses)
    assert fake.summary_calls == 1


async def test_the_header_overrides_the_setting_and_is_never_forwarded() -> None:
    fake = fake_upstream()
    body = chat(conversation(10))
    async with proxy(fake, summarize=False, **NO_AHEAD) as (client, _app):
        plain = await client.post(CHAT, json=body)
        assert fake.summary_calls == 0 and "summar" not in plain.headers["x-context-actions"]
        assert plain.headers["x-context-memory"] == "index"  # summaries off: the index alone
        on = await client.post(CHAT, json=body, headers={"X-Context-Summarize": "on"})
        assert "summarized=" in on.headers["x-context-actions"] and fake.summary_calls == 1
        bad = await client.post(CHAT, json=body, headers={"X-Context-Summarize": "maybe"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "X-Context-Summarize"
    assert all("x-context-summarize" not in r.headers for r in fake.requests)
    async with proxy(fake, summarize=True, **NO_AHEAD) as (client, _app):
        off = await client.post(CHAT, json=body, headers={"X-Context-Summarize": "off"})
    assert "summar" not in off.headers["x-context-actions"] and fake.summary_calls == 1


@pytest.mark.parametrize("policy", ["truncate", "reject", "off"])
async def test_only_policy_auto_calls_an_llm(policy: str) -> None:
    fake = fake_upstream()
    async with proxy(fake, summary_ahead_ratio=0.0) as (client, app):
        await client.post(CHAT, json=chat(conversation(12)), headers={"X-Context-Policy": policy})
        await client.post(CHAT, json=chat(conversation(3)), headers={"X-Context-Policy": policy})
        await settle(app)
    assert fake.summary_calls == 0


async def test_a_request_that_is_not_cut_costs_nothing() -> None:
    fake = fake_upstream()
    async with proxy(fake) as (client, app):
        response = await client.post(CHAT, json=chat(conversation(2)))
        await settle(app)
        stats = summaries_of(app).stats()
    assert response.headers["x-context-memory"] == "none"
    assert fake.summary_calls == 0 and stats["by_api"] == {} and stats["cache"]["misses"] == 0


async def test_a_configured_key_a_summary_model_and_base_url_are_used() -> None:
    fake = fake_upstream()
    transport = RecordingTransport(fake)
    settings = {
        "upstream_api_key": "sk-operator",
        "summary_model": SMALL_MODEL,
        "summary_base_url": "http://summarizer.test/v1",
    }
    async with proxy(fake, transport=transport, **settings, summary_ahead_ratio=1.0) as (client, _app):
        auth = {"Authorization": "Bearer sk-c"}
        response = await client.post(CHAT, json=chat(conversation(12)), headers=auth)
    assert "summarized=" in response.headers["x-context-actions"]
    summaries = fake.summary_requests()
    assert summaries and all(r.headers["authorization"] == "Bearer sk-operator" for r in summaries)
    assert all(r.json()["model"] == SMALL_MODEL for r in summaries)
    hosts = [host for host, path in transport.seen if path.endswith("/chat/completions")]
    assert hosts.count("summarizer.test") == len(summaries) and hosts.count("upstream.test") == 1


async def test_a_span_larger_than_the_summarizers_window_is_chunked_and_merged() -> None:
    fake = fake_upstream()
    messages = conversation(14)
    async with proxy(fake, summary_model=SMALL_MODEL, summary_ahead_ratio=1.0) as (client, _app):
        response = await client.post(CHAT, json=chat(messages))
    assert "summarized=" in response.headers["x-context-actions"]
    requests = fake.summary_requests()
    assert len(requests) >= 3  # parts, then a merge
    assert all(r.status == 200 and (r.prompt_tokens or 0) <= SMALL_WINDOW_TOKENS for r in requests)
    found = summary_message(forwarded_messages(fake))
    assert found is not None and facts([{"content": found[1]}])


async def test_ahead_of_time_summarizes_the_next_cut_so_the_overflow_waits_for_nothing() -> None:
    fake = fake_upstream()
    async with proxy(fake) as (client, app):
        waited: list[int] = []
        cuts: list[int] = []
        for turns in range(6, 24):
            before = summaries_of(app).stats()["waited"]
            response = await client.post(CHAT, json=chat(conversation(turns)))
            assert response.status_code == 200
            waited.append(summaries_of(app).stats()["waited"] - before)
            found = summary_message(forwarded_messages(fake))
            cuts.append(found[0] if found else 0)
            await settle(app)
        stats = summaries_of(app).stats()
    first = next(i for i, cut in enumerate(cuts) if cut)
    assert waited[first] == 0  # the first overflow found its summary made ahead of time
    # Ahead of time predicts the next level; a cut that jumps further (when the still-growing
    # block completes) waits once, in line, for one fold.
    steps = len(set(cuts) - {0})
    assert stats["ahead"] >= steps - 1 and sum(waited) <= 1 and stats["cached"] >= steps - 1
    assert fake.summary_calls <= steps + 2


async def test_a_summarizer_that_cannot_be_built_fails_open() -> None:
    fake: FakeUpstream = fake_upstream()

    class Tiny(OneModelRegistry):
        def resolve(self, model: str, /) -> ModelSpec:
            spec = super().resolve(model)
            return spec if model == MODEL else replace(spec, window_tokens=8)

    async with proxy(fake, summary_model="tiny", summary_ahead_ratio=1.0) as (client, app):
        app.state.service.summaries.registry = Tiny()
        response = await client.post(CHAT, json=chat(conversation(12)))
    assert response.status_code == 200
    assert response.headers["x-context-memory"] == "index" and fake.summary_calls == 0


async def test_emergency_retry_also_gets_the_memory() -> None:
    fake = fake_upstream()
    fake.models[MODEL] = replace(fake.models[MODEL], counter_ratio=1.8)
    async with proxy(fake, summary_model=SMALL_MODEL, summary_ahead_ratio=1.0) as (client, _app):
        response = await client.post(CHAT, json=chat(conversation(12)))
    assert response.status_code == 200
    assert response.headers["x-context-retries"] == "1"
    assert "summarized=" in response.headers["x-context-actions"]
    assert summary_message(forwarded_messages(fake)) is not None
    assert [r.status for r in fake.client_requests()] == [400, 200]


def agent_turns(steps: int) -> list[dict[str, Any]]:
    """A task, then ``steps`` tool calls whose results each hold one fact among repeated lines."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": "read all"},
    ]
    for k in range(steps):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": f'{{"n": {k}}}'}}
        lines = [f"line {i} of file {k} is filler" for i in range(20)]
        lines[10] = f"The secret of file {k} is FACT-{k}f."
        out += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{k}", "content": "\n".join(lines)},
        ]
    return out


async def test_old_tool_results_are_remembered_not_only_replaced_by_placeholders() -> None:
    fake = fake_upstream()
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        messages = agent_turns(12)
        response = await client.post(CHAT, json=chat(messages))
    assert response.headers["x-context-memory"] == "summary"
    actions = response.headers["x-context-actions"]
    assert "pruned=" in actions and "summarized=" in actions
    forwarded = forwarded_messages(fake)
    found = summary_message(forwarded)
    assert found is not None
    # Every fact is in a tool result still shown, or in the memory (within its room: 10% of this
    # small budget), though most results are gone or placeholders.
    assert len(facts(forwarded)) >= 10, sorted(facts(forwarded))
    assert sum(1 for m in forwarded if m["role"] == "tool" and "FACT-" in m["content"]) <= 3


def _anthropic_body(steps: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "read all"}]
    for k in range(steps):
        lines = [f"line {i} of file {k} is filler" for i in range(40)]
        lines[20] = f"The secret of file {k} is FACT-{k}m."
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{k}", "name": "read", "input": {"n": k}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"t{k}", "content": "\n".join(lines)}],
            },
        ]
    return {"model": "claude-test", "max_tokens": 256, "messages": messages}


def _app(settings: Settings, transport: httpx.AsyncBaseTransport, window_tokens: int, encoding: str) -> Any:
    class Registry(OneModelRegistry):
        def resolve(self, model: str, /) -> ModelSpec:
            return ModelSpec(
                name=model,
                window_tokens=window_tokens,
                max_output_tokens=1024,
                encoding=encoding,
                source="test",
            )

    return create_app(settings, upstream_transport=transport, registry=Registry())


@contextlib.asynccontextmanager
async def _messages_proxy(fake: FakeAnthropic) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """The whole app (4,000-token window, cl100k) in front of ``fake``, and a client of it."""
    settings = Settings(
        upstream_base_url="http://upstream.test/v1", upstream_transport="httpx", log_level="WARNING"
    )
    app = _app(settings, httpx.MockTransport(fake.handler), 4000, "cl100k_base")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        yield client, app


async def test_a_messages_request_is_summarized_with_messages_and_its_own_headers() -> None:
    fake = FakeAnthropic([FakeClaude("claude-test", window_tokens=4000)])
    headers = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
    async with _messages_proxy(fake) as (client, app):
        response = await client.post("/v1/messages", json=_anthropic_body(40), headers=headers)
        stats = app.state.service.summaries.stats()
    assert response.status_code == 200, response.text
    assert response.headers["x-context-memory"] == "summary"
    summaries = [
        r for r in fake.message_requests() if r.json().get("system", "").startswith("You write handoff")
    ]
    assert summaries and fake.summary_calls == len(summaries)
    assert all(r.path == "/v1/messages" and r.status == 200 for r in summaries)
    assert all(r.headers["x-api-key"] == "sk-ant-client" for r in summaries)
    assert all(r.headers["anthropic-version"] == "2023-06-01" for r in summaries)
    assert all("authorization" not in r.headers for r in summaries)
    forwarded = fake.client_requests()[-1].json()
    memory = [
        b["text"]
        for m in forwarded["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "text" and b["text"].startswith("[ctxproxy: summary of")
    ]
    assert len(memory) == 1 and "FACT-" in memory[0]
    assert stats["by_api"]["messages"]["calls"] == fake.summary_calls and "chat" not in stats["by_api"]


async def test_a_responses_request_is_summarized_with_responses() -> None:
    model = FakeModel("resp-test", 4000, max_output_tokens=256)
    fake = FakeResponsesUpstream([model])
    settings = Settings(
        upstream_base_url="http://upstream.test/v1", upstream_transport="httpx", log_level="WARNING"
    )
    app = _app(settings, httpx.MockTransport(fake.handler), 4000, "o200k_base")
    items: list[dict[str, Any]] = [{"role": "user", "content": "read all"}]
    for k in range(40):
        lines = [f"line {i} of file {k} is filler" for i in range(40)]
        lines[20] = f"The secret of file {k} is FACT-{k}r."
        items += [
            {"type": "function_call", "call_id": f"c{k}", "name": "read", "arguments": json.dumps({"n": k})},
            {"type": "function_call_output", "call_id": f"c{k}", "output": "\n".join(lines)},
        ]
    body = {"model": "resp-test", "input": items, "max_output_tokens": 256}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        response = await client.post("/v1/responses", json=body, headers={"Authorization": "Bearer sk-r"})
    assert response.status_code == 200, response.text
    assert response.headers["x-context-memory"] == "summary"
    summaries = [r for r in fake.responses() if r not in fake.client_responses()]
    assert summaries and fake.summary_calls == len(summaries)
    sent = summaries[0].json()
    assert sent["store"] is False and sent["instructions"].startswith("You write handoff")
    assert summaries[0].headers["authorization"] == "Bearer sk-r"
    forwarded = fake.client_responses()[-1].json()["input"]
    memory = [i for i in forwarded if i.get("type") == "message" and "summary of" in json.dumps(i)]
    assert len(memory) == 1 and "FACT-" in json.dumps(memory[0])


def _gemini_body(steps: int) -> dict[str, Any]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "read all"}]}]
    for k in range(steps):
        lines = [f"line {i} of file {k} is filler" for i in range(40)]
        lines[20] = f"The secret of file {k} is FACT-{k}g."
        call = {"functionCall": {"name": "read", "args": {"n": k}, "id": f"r{k}"}}
        result = {
            "functionResponse": {"name": "read", "id": f"r{k}", "response": {"output": "\n".join(lines)}}
        }
        contents += [{"role": "model", "parts": [call]}, {"role": "user", "parts": [result]}]
    return {"contents": contents}


@pytest.mark.parametrize("where", ["header", "query"])
async def test_a_gemini_request_is_summarized_with_its_key_where_the_client_put_it(
    where: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = FakeGeminiModel("gemini-test", input_token_limit=4000, thinking=False, requires_signatures=False)
    fake = FakeGemini([model], api_key="g-key")
    settings = Settings(
        upstream_base_url="http://upstream.test/v1", upstream_transport="httpx", log_level="DEBUG"
    )
    app = _app(settings, httpx.MockTransport(fake.handler), 4000, "estimate")
    path = "/v1beta/models/gemini-test:generateContent"
    headers = {"x-goog-api-key": "g-key"} if where == "header" else {}
    query = "?key=g-key&alt=json" if where == "query" else ""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        with caplog.at_level(logging.DEBUG):
            response = await client.post(path + query, json=_gemini_body(40), headers=headers)
        stats = app.state.service.summaries.stats()
    assert response.status_code == 200, response.text
    assert response.headers["x-context-memory"] == "summary"
    summaries = fake.summary_requests()
    assert summaries and fake.summary_calls == len(summaries) and stats["by_api"]["gemini"]["failures"] == 0
    assert all(r.status == 200 and r.path == path and r.api_key == "g-key" for r in summaries)
    # The key goes where the client put it, alone: none of the client's other parameters.
    assert all(r.query == ("key=g-key" if where == "query" else "") for r in summaries)
    assert all(("x-goog-api-key" in r.headers) is (where == "header") for r in summaries)
    forwarded = fake.client_requests()[-1].json()
    assert "[ctxproxy: summary of" in json.dumps(forwarded["contents"])
    # Never logged by the proxy (httpx's own lines are the test transport's and the test client's).
    ours = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    assert ours and not any("g-key" in str(record.__dict__) for record in ours)


class Routes(httpx.AsyncBaseTransport):
    """``/chat/...`` to the chat fake's app, everything else to the Anthropic fake."""

    def __init__(self, chat_fake: FakeUpstream, messages_fake: FakeAnthropic) -> None:
        self.chat = httpx.ASGITransport(app=chat_fake.app)
        self.messages = httpx.MockTransport(messages_fake.handler)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        inner = self.chat if "/chat/" in request.url.path else self.messages
        return await inner.handle_async_request(request)


async def test_the_summary_api_setting_overrides_the_requests_own() -> None:
    fake = FakeAnthropic([FakeClaude("claude-test", window_tokens=4000)])
    chat_fake = FakeUpstream([FakeModel("claude-test", 4000)])
    settings = Settings(
        upstream_base_url="http://upstream.test/v1",
        upstream_transport="httpx",
        log_level="WARNING",
        summary_api="chat",
    )
    app = _app(settings, Routes(chat_fake, fake), 4000, "cl100k_base")
    headers = {
        "x-api-key": "sk-ant-client",
        "anthropic-version": "2023-06-01",
        "Authorization": "Bearer sk-o",
    }
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as client,
    ):
        response = await client.post("/v1/messages", json=_anthropic_body(40), headers=headers)
    assert response.status_code == 200
    assert response.headers["x-context-memory"] == "summary"
    assert fake.summary_calls == 0 and chat_fake.summary_calls >= 1
    assert all(r.headers["authorization"] == "Bearer sk-o" for r in chat_fake.summary_requests())
    assert all("x-api-key" not in r.headers for r in chat_fake.summary_requests())


async def test_a_late_summary_leaves_the_earlier_memory_in_place_not_the_note() -> None:
    fake = fake_upstream()
    async with proxy(fake, summary_timeout_s=0.2, **NO_AHEAD) as (client, app):
        first = None
        for turns in range(10, 40):
            response = await client.post(CHAT, json=chat(conversation(turns)))
            message = summary_message(forwarded_messages(fake))
            assert message is not None
            found = message[1].split(INDEX_HEAD)[0]  # the summary (the index grows with every cut)
            if first is None:
                first = found
                fake.summary_mode, fake.summary_delay_s = "slow", 5.0  # every later step is late
            elif found != first:
                break
            assert response.headers["x-context-memory"] == "summary"
        stats = summaries_of(app).stats()
    # Every request after the first step kept the first step's memory while the next was late.
    assert first is not None and stats["earlier"] >= 1 and stats["failed"] >= 1
    assert "summarized=" in response.headers["x-context-actions"]


async def test_a_gemini_summary_may_fill_the_input_limit_as_its_reply_is_not_counted_in_it() -> None:
    settings = Settings(
        upstream_base_url="http://upstream.test/v1", upstream_transport="httpx", log_level="WARNING"
    )
    fake = FakeGemini([FakeGeminiModel("m", input_token_limit=8000)])
    app = _app(settings, httpx.MockTransport(fake.handler), 8000, "o200k_base")
    async with app.router.lifespan_context(app):
        service = app.state.service
        options = parse_context_headers({})
        gemini = service.request(
            {"model": "m", "contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
            options,
            route=RouteMatch.first(DIALECTS["gemini"]),
        )
        chat = service.request(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            options,
            route=RouteMatch.first(DIALECTS["chat"]),
        )
        found = [
            service.summaries.ahead_for(request, reply_tokens=500, room_tokens=7000)
            for request in (gemini, chat)
        ]
    assert all(f is not None for f in found)
    on_gemini, on_chat = (job for _, job in filter(None, found))
    assert on_gemini.reply_tokens == on_chat.reply_tokens == 500
    assert on_chat.input_budget_tokens == 7000 - 500  # prompt and reply within the room
    assert on_gemini.input_budget_tokens == 7000  # the prompt alone within it


async def test_one_summarizer_per_model_whatever_the_sizes_and_a_bounded_number_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import app.service.summaries as module

    monkeypatch.setattr(module, "MAX_SUMMARIZERS", 3)
    fake = fake_upstream()
    async with proxy(fake, summary_ahead_ratio=1.0) as (client, app):
        summaries = summaries_of(app)
        for cap in (50, 120, 300):  # the client's output cap changes the reply and the window
            body = chat(tagged(conversation(12), f"cap{cap}"), max_tokens=cap)
            response = await client.post(CHAT, json=body)
            assert response.headers["x-context-memory"] == "summary"
        assert len(summaries._ahead) == 1
        service = app.state.service
        for i in range(6):  # six more model names (the request model writes the summaries)
            request = service.request(
                chat([{"role": "user", "content": "hi"}], model=f"m-{i}"),
                parse_context_headers({}),
                route=RouteMatch.first(DIALECTS["chat"]),
            )
            assert summaries.ahead_for(request, reply_tokens=200) is not None
        stats = summaries.stats()
    assert len(summaries._ahead) == 3
    assert set(summaries._ahead) == {("chat", f"m-{i}", summaries.upstream.base_url) for i in (3, 4, 5)}
    assert stats["calls"] == fake.summary_calls >= 3  # the dropped summarizer's calls still counted


def _sample(metrics_text: str, name: str, **labels: str) -> float:
    """One sample of the Prometheus text exposition (0 when absent)."""
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    total = 0.0
    for line in metrics_text.splitlines():
        found = re.fullmatch(rf"{re.escape(name)}\{{([^}}]*)\}} (\S+)", line)
        if found and ",".join(sorted(found.group(1).split(","))) == wanted:
            total += float(found.group(2))
    return total


async def test_summary_calls_and_cache_lookups_are_in_the_metrics_and_on_the_status_page_by_api() -> None:
    fake = FakeAnthropic([FakeClaude("claude-test", window_tokens=4000)])
    headers = {"x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
    async with _messages_proxy(fake) as (client, app):
        first = await client.post("/v1/messages", json=_anthropic_body(40), headers=headers)
        again = await client.post("/v1/messages", json=_anthropic_body(40), headers=headers)  # cached
        metrics = (await client.get("/metrics")).text
        status = (await client.get("/status.json")).json()
        stats = app.state.service.summaries.stats()
    assert [r.headers["x-context-memory"] for r in (first, again)] == ["summary", "summary"]
    summaries = [
        r for r in fake.message_requests() if r.json().get("system", "").startswith("You write handoff")
    ]
    assert summaries and all(r.status == 200 for r in summaries)
    assert len(summaries) == stats["by_api"]["messages"]["calls"]
    calls = "ctxproxy_summary_calls_total"
    assert _sample(metrics, calls, api="messages", outcome="ok") == len(summaries)
    assert _sample(metrics, calls, api="chat", outcome="ok") == 0
    tokens_in = _sample(metrics, "ctxproxy_summary_tokens_total", api="messages", direction="in")
    tokens_out = _sample(metrics, "ctxproxy_summary_tokens_total", api="messages", direction="out")
    assert tokens_in == stats["by_api"]["messages"]["tokens_in"] > 0
    assert tokens_out == stats["by_api"]["messages"]["tokens_out"] > 0
    lookups = "ctxproxy_summary_cache_requests_total"
    # One memory lookup per cut request: the first waited for its summary, the second found it.
    assert _sample(metrics, lookups, api="messages", result="miss") == 1
    assert _sample(metrics, lookups, api="messages", result="hit") == 1
    board = status["counters"]["by_api"]["messages"]["summaries"]
    assert board["calls"] == len(summaries) and board["failures"] == 0
    assert board["tokens_in"] == tokens_in and board["tokens_out"] == tokens_out
    assert board["cache_hit"] == 1 and board["cache_miss"] == 1
    assert status["counters"]["by_api"].get("chat", {}).get("summaries", {}).get("calls", 0) == 0


async def test_a_failed_summary_call_is_counted_with_its_outcome() -> None:
    fake = fake_upstream()
    fake.summary_mode = "error"
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        response = await client.post(CHAT, json=chat(conversation(12)))
        metrics = (await client.get("/metrics")).text
        status = (await client.get("/status.json")).json()
    assert response.headers["x-context-memory"] == "index" and fake.summary_calls == 1
    assert _sample(metrics, "ctxproxy_summary_calls_total", api="chat", outcome="http_500") == 1
    assert _sample(metrics, "ctxproxy_summary_calls_total", api="chat", outcome="ok") == 0
    assert _sample(metrics, "ctxproxy_summary_tokens_total", api="chat", direction="in") > 0
    board = status["counters"]["by_api"]["chat"]["summaries"]
    assert board["calls"] == 1 and board["failures"] == 1 and board["tokens_out"] == 0


async def test_a_request_that_leaves_no_room_for_a_summary_call_is_no_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny request with a huge output cap on a 4K model: the summarizer's window would be a few
    # tokens. That is no problem to warn about: no summarizer is built, the request goes on.
    import app.service.summaries as summaries_module

    built: list[object] = []
    original = summaries_module.Summarizer

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(kwargs.get("window_tokens"))
        return original(*args, **kwargs)

    fake = FakeUpstream([FakeModel("probe-4k", 4096, max_output_tokens=8192)])
    settings = Settings(
        upstream_base_url="http://upstream.test/v1",
        upstream_transport="httpx",
        discovery=False,
        default_window_tokens=4096,
        default_max_output_tokens=4096,
        log_level="DEBUG",
    )
    app = create_app(settings, upstream_transport=httpx.ASGITransport(app=fake.app))
    body = {"model": "probe-4k", "max_tokens": 5000, "messages": [{"role": "user", "content": "hi there"}]}
    with caplog.at_level(logging.DEBUG, logger="ctxproxy"):
        async with app.router.lifespan_context(app):
            monkeypatch.setattr(summaries_module, "Summarizer", counted)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
                response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "summar" in r.getMessage()]
    assert built == []  # no summarizer built for it (nothing forgotten, nothing to prepare)


@pytest.mark.parametrize("style", ["echo", "template", "repeat", "requote", "invent", "real"])
async def test_an_answer_that_is_no_summary_is_refused_counted_and_not_cached(
    style: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The bad answers of small local models (tests.fake_summarizer's styles, 'real': Gemma 3
    # 270M's own through llama.cpp) are checked before they are trusted: the index stands in,
    # the refusal is counted by API with the outcome 'rejected', logged once with its cause, and
    # nothing is cached (the span backs off instead of being asked again on every request).
    fake = fake_upstream()
    fake.summary_style = style
    body = chat(conversation(12))
    with caplog.at_level(logging.WARNING, logger="ctxproxy.compaction"):
        async with proxy(fake, **NO_AHEAD) as (client, app):
            responses = [await client.post(CHAT, json=body) for _ in range(3)]
            metrics = (await client.get("/metrics")).text
            status = (await client.get("/status.json")).json()
            stats = summaries_of(app).stats()
    assert all(r.status_code == 200 and r.headers["x-context-memory"] == "index" for r in responses)
    assert summary_message(forwarded_messages(fake)) is None and fake.summary_calls == 1
    assert _sample(metrics, "ctxproxy_summary_calls_total", api="chat", outcome="rejected") == 1
    assert status["counters"]["by_api"]["chat"]["summaries"]["rejected"] == 1
    refusals = [r.getMessage() for r in caplog.records if "is no summary" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert stats["cached"] == 0 and stats["backing_off"] == 2 and stats["by_api"]["chat"]["rejected"] == 1
