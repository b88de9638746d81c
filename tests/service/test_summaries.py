"""LLM summaries in the chat path, through the whole app, against the fake upstream as summarizer."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import pytest

from app.api.headers import parse_context_headers
from app.compaction.prompts import SYSTEM_MARKER, summarize_messages
from app.compaction.summarizer import blocks_from_spans
from app.core.budget import Policy
from app.core.errors import InvalidRequest
from app.core.fit import plan_request, preview_next_cut
from app.core.messages import Message
from app.core.registry import ModelSpec
from app.core.tokens import MessageCounter
from app.service.report import request_budget_tokens
from app.service.summaries import next_cut_blocks
from app.settings import Settings
from tests.api import OneModelRegistry, WordCounter
from tests.fake_upstream import FakeUpstream, fact_summary, is_summary_request
from tests.summaries_kit import (
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
    turn,
)

CHAT = "/v1/chat/completions"
NO_AHEAD = {"summary_ahead_ratio": 1.0}


def cut_facts(client_messages: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> set[str]:
    """Facts of the client's messages that are no longer forwarded as messages of their own."""
    kept = facts([m for m in forwarded if summary_message([m]) is None])
    return facts(client_messages) - kept


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SUMMARIZE", "CACHE_URL", "SUMMARY_MODEL", "SUMMARY_BASE_URL", "SUMMARY_TIMEOUT_S"):
        monkeypatch.delenv(f"CTXPROXY_{name}", raising=False)
    settings = Settings()
    assert settings.summarize is False and settings.cache_url is None
    assert (settings.cache_ttl_s, settings.cache_max_entries) == (86400.0, 4096)
    assert settings.summary_model is None and settings.summary_base_url is None
    assert settings.summary_timeout_s == 4.0
    assert (settings.summary_ahead_ratio, settings.summary_concurrency) == (0.85, 2)
    monkeypatch.setenv("CTXPROXY_SUMMARIZE", "true")
    monkeypatch.setenv("CTXPROXY_CACHE_URL", "redis://cache:6379/0")
    monkeypatch.setenv("CTXPROXY_SUMMARY_MODEL", "gpt-4o-mini")
    monkeypatch.setenv("CTXPROXY_SUMMARY_BASE_URL", "http://cheap:8000/v1/")
    monkeypatch.setenv("CTXPROXY_SUMMARY_TIMEOUT_S", "1.5")
    settings = Settings()
    assert settings.summarize is True and settings.cache_url == "redis://cache:6379/0"
    assert settings.summary_model == "gpt-4o-mini" and settings.summary_base_url == "http://cheap:8000/v1"
    assert settings.summary_timeout_s == 1.5
    for bad in ({"summary_base_url": "cheap:8000"}, {"summary_ahead_ratio": 1.5}, {"summary_concurrency": 0}):
        with pytest.raises(ValueError):
            Settings(**bad)


def test_summarize_header_is_validated() -> None:
    assert parse_context_headers({"X-Context-Summarize": " ON "}).summarize is True
    assert parse_context_headers({"X-Context-Summarize": "off"}).summarize is False
    assert parse_context_headers({}).summarize is None
    with pytest.raises(InvalidRequest) as info:
        parse_context_headers({"X-Context-Summarize": "yes"})
    assert info.value.param == "X-Context-Summarize"


def test_the_fake_recognises_the_projects_summary_prompt_and_keeps_facts() -> None:
    transcript = "[user]: keep FACT-7 and FACT-x9, then FACT-7 again"
    request = summarize_messages(transcript, previous_summary="FACT-1")
    assert request[0]["content"].startswith(SYSTEM_MARKER)
    assert is_summary_request({"messages": request})
    assert not is_summary_request({"messages": [{"role": "system", "content": "be brief"}]})
    assert fact_summary(request) == "- Facts established: FACT-1, FACT-7, FACT-x9."


async def test_a_cut_request_gets_a_summary_with_the_facts_of_the_cut_turns() -> None:
    fake = fake_upstream()
    messages = conversation(12)
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        auth = {"Authorization": "Bearer sk-client"}
        response = await client.post(CHAT, json=chat(messages), headers=auth)
        dry_run = (await client.post("/v1/context/plan", json=chat(messages))).json()
    assert response.status_code == 200
    actions = response.headers["x-context-actions"]
    assert "summarized=" in actions and "summary_failed" not in actions
    forwarded = forwarded_messages(fake)
    found = summary_message(forwarded)
    assert found is not None
    count, text = found
    assert f"dropped_messages={count}" in actions and f"summarized={count}" in actions
    assert len(forwarded) == len(messages) - count + 1
    lost = cut_facts(messages, forwarded)
    assert lost and lost <= facts([{"content": text}])
    assert not any(NOTE.match(str(m.get("content"))) for m in forwarded)
    # a cold cache: one rolling step per dropped level (then each new cut costs one call)
    levels = sum(len(span["block_stops"]) for span in dry_run["dropped"])
    assert fake.summary_calls == levels >= 1
    for summary_request in fake.summary_requests():
        assert summary_request.headers["authorization"] == "Bearer sk-client"
        assert summary_request.json()["model"] == MODEL and summary_request.json()["stream"] is False


async def test_the_next_request_of_the_conversation_reuses_the_cached_summary() -> None:
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
    calls = fake.summary_calls
    assert calls >= 1 and len(fake.summary_requests()) == calls
    assert stats["cached"] == 1 and stats["waited"] == 1
    assert after[: len(before)] == before  # the forwarded prefix is stable


async def test_a_growing_session_makes_one_call_per_newly_cut_block() -> None:
    fake = fake_upstream()
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        cuts: list[int] = []
        for turns in range(10, 17):
            response = await client.post(CHAT, json=chat(conversation(turns)))
            assert "summarized=" in response.headers["x-context-actions"]
            found = summary_message(forwarded_messages(fake))
            assert found is not None
            cuts.append(found[0])
    assert fake.summary_calls == len(set(cuts)) < len(cuts)


@pytest.mark.parametrize("mode", ["error", "empty", "slow"])
async def test_fail_open(mode: Any, caplog: pytest.LogCaptureFixture) -> None:
    fake = fake_upstream()
    fake.summary_mode = mode
    fake.summary_delay_s = 5.0
    messages = conversation(12)
    with caplog.at_level(logging.WARNING, logger="ctxproxy.compaction"):
        async with proxy(fake, summary_timeout_s=0.2, **NO_AHEAD) as (client, _app):
            response = await client.post(CHAT, json=chat(messages))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"].startswith("Fake reply")
    assert "summary_failed=" in response.headers["x-context-actions"]
    forwarded = forwarded_messages(fake)
    assert summary_message(forwarded) is None
    assert sum(bool(NOTE.match(str(m.get("content")))) for m in forwarded) == 1
    assert fake.summary_calls == 1
    assert any("forwarding with the note instead" in r.getMessage() for r in caplog.records)


async def test_a_summary_too_large_for_the_cuts_room_falls_back_to_the_note(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = fake_upstream()
    fake.summary_padding = " detail" * 400
    with caplog.at_level(logging.WARNING, logger="ctxproxy.compaction"):
        # cut target 1.0: the cut moves block by block, so there is a span one block longer
        async with proxy(fake, cut_target=1.0, **NO_AHEAD) as (client, app):
            response = await client.post(CHAT, json=chat(conversation(10)))
            stats = summaries_of(app).stats()
    assert response.status_code == 200
    assert "summary_failed=" in response.headers["x-context-actions"]
    assert summary_message(forwarded_messages(fake)) is None
    # the planned span's summary, then in line the span a block longer (its padded prompt is
    # summarized in chunks and merged): both too large, so the note, after a bounded few calls
    assert stats["too_large"] == 1 and stats["failed"] == 0 and 1 < fake.summary_calls <= 4
    assert any("does not fit" in r.getMessage() for r in caplog.records)


async def test_a_cold_summary_too_large_for_its_room_is_extended_by_one_block_in_line() -> None:
    # A long conversation arriving whole (cold cache): the summary of the note's cut does not fit
    # the room that cut left, so the span one block longer is summarized in line and used.
    fake = fake_upstream()
    fake.summary_padding = " detail" * 80
    async with proxy(fake, cut_target=1.0, **NO_AHEAD) as (client, app):
        response = await client.post(CHAT, json=chat(conversation(10)))
        stats = summaries_of(app).stats()
    assert response.status_code == 200
    assert "summarized=" in response.headers["x-context-actions"]
    assert "summary_failed" not in response.headers["x-context-actions"]
    assert summary_message(forwarded_messages(fake)) is not None
    assert fake.summary_calls == 2 and stats["too_large"] == 0


async def test_a_streamed_request_gets_the_summary_too() -> None:
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
    body = chat(conversation(10))  # one block cut
    async with proxy(fake, **NO_AHEAD) as (client, _app):
        responses = await asyncio.gather(*(client.post(CHAT, json=body) for _ in range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    assert all("summarized=" in r.headers["x-context-actions"] for r in responses)
    assert fake.summary_calls == 1


async def test_the_header_overrides_the_setting_and_is_never_forwarded() -> None:
    fake = fake_upstream()
    body = chat(conversation(10))  # one block cut
    async with proxy(fake, summarize=False, **NO_AHEAD) as (client, _app):
        plain = await client.post(CHAT, json=body)
        assert fake.summary_calls == 0 and "summar" not in plain.headers["x-context-actions"]
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


async def test_a_configured_key_a_summary_model_and_base_url_are_used() -> None:
    fake = fake_upstream()
    transport = RecordingTransport(fake)
    settings = {
        "upstream_api_key": "sk-operator",
        "summary_model": SMALL_MODEL,
        "summary_base_url": "http://summarizer.test/v1",
    }
    async with proxy(fake, transport=transport, **settings, **NO_AHEAD) as (client, _app):
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
    async with proxy(fake, summary_model=SMALL_MODEL, **NO_AHEAD) as (client, _app):
        response = await client.post(CHAT, json=chat(messages))
    assert "summarized=" in response.headers["x-context-actions"]
    requests = fake.summary_requests()
    assert len(requests) >= 3  # parts, then a merge
    assert all(r.status == 200 and (r.prompt_tokens or 0) <= SMALL_WINDOW_TOKENS for r in requests)
    forwarded = forwarded_messages(fake)
    found = summary_message(forwarded)
    assert found is not None
    assert cut_facts(messages, forwarded) <= facts([{"content": found[1]}])


async def test_ahead_of_time_summarizes_the_next_cut_so_the_overflow_waits_for_nothing() -> None:
    fake = fake_upstream()
    # a cut target whose first level ends before the still-growing block at this small scale
    async with proxy(fake, cut_target=0.8) as (client, app):
        fits = await client.post(CHAT, json=chat(conversation(7)))
        assert fits.headers["x-context-actions"] == "none"
        await settle(app)
        assert fake.summary_calls == 1 and summaries_of(app).stats()["ahead"] == 1
        overflow = await client.post(CHAT, json=chat(conversation(9)))
        stats = summaries_of(app).stats()
        await settle(app)
    assert "summarized=" in overflow.headers["x-context-actions"]
    assert stats["waited"] == 0 and stats["cached"] == 1


async def test_ahead_of_time_after_a_cut_extends_the_rolling_chain() -> None:
    fake = fake_upstream()
    async with proxy(fake) as (client, app):
        waited: list[int] = []
        for turns in range(8, 18):
            before = summaries_of(app).stats()["waited"]
            response = await client.post(CHAT, json=chat(conversation(turns)))
            assert response.status_code == 200
            waited.append(summaries_of(app).stats()["waited"] - before)
            await settle(app)
        calls = fake.summary_calls
    assert sum(waited) == 0
    assert calls <= 6


def word_counter() -> MessageCounter:
    return MessageCounter(WordCounter())


def plan_for(messages: list[Message], policy: Policy) -> Any:
    return plan_request(
        chat(messages), spec=OneModelRegistry().resolve(MODEL), policy=policy, counter=word_counter()
    )


def test_next_cut_blocks_start_with_the_engines_preview() -> None:
    policy = Policy(summarize=True)
    messages = conversation(7)
    plan = plan_for(messages, policy)
    assert not plan.dropped and plan.tokens_after > 0.85 * request_budget_tokens(plan.budget)
    preview = preview_next_cut(chat(messages), spec=plan.spec, policy=policy, counter=word_counter())
    assert preview
    blocks = next_cut_blocks(chat(messages), messages, plan, policy=policy, counter=word_counter())
    assert blocks == blocks_from_spans(messages, preview)


def test_next_cut_blocks_extend_what_was_dropped_by_one_block() -> None:
    policy = Policy(summarize=True)
    messages = conversation(12)
    plan = plan_for(messages, policy)
    assert plan.dropped
    dropped = blocks_from_spans(messages, plan.dropped)
    blocks = next_cut_blocks(chat(messages), messages, plan, policy=policy, counter=word_counter())
    assert blocks[: len(dropped)] == dropped and len(blocks) == len(dropped) + 1
    grown = [*messages[:-1], *turn(12, 40), *turn(13, 40), *turn(14, 40), messages[-1]]
    plan_next = plan_for(grown, policy)
    assert blocks_from_spans(grown, plan_next.dropped) == blocks


def test_next_cut_blocks_never_pick_the_still_growing_block() -> None:
    policy = Policy(summarize=True)
    messages = conversation(2, size=5)
    plan = plan_for(messages, policy)
    assert next_cut_blocks(chat(messages), messages, plan, policy=policy, counter=word_counter()) == []


async def test_a_summarizer_that_cannot_be_built_fails_open() -> None:
    fake: FakeUpstream = fake_upstream()

    class Tiny(OneModelRegistry):
        def resolve(self, model: str, /) -> ModelSpec:
            spec = super().resolve(model)
            return spec if model == MODEL else replace(spec, window_tokens=8)

    async with proxy(fake, summary_model="tiny", **NO_AHEAD) as (client, app):
        app.state.service.summaries.registry = Tiny()
        response = await client.post(CHAT, json=chat(conversation(12)))
    assert response.status_code == 200
    assert "summary_failed=" in response.headers["x-context-actions"] and fake.summary_calls == 0


async def test_emergency_retry_also_gets_a_summary() -> None:
    fake = fake_upstream()
    fake.models[MODEL] = replace(fake.models[MODEL], counter_ratio=1.8)
    async with proxy(fake, summary_model=SMALL_MODEL, **NO_AHEAD) as (client, _app):
        response = await client.post(CHAT, json=chat(conversation(12)))
    assert response.status_code == 200
    assert response.headers["x-context-retries"] == "1"
    assert "summarized=" in response.headers["x-context-actions"]
    assert summary_message(forwarded_messages(fake)) is not None
    assert [r.status for r in fake.client_requests()] == [400, 200]
