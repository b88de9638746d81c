"""The summarizer: rendering, the incremental chain over a cache, chunking, fail-open, back-off,
the provider."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from app.compaction.cache import MemoryCache, RedisCache, summary_key
from app.compaction.pace import PACE_FACTOR, Pace
from app.compaction.prompts import PROMPT_VERSION, render_messages
from app.compaction.summarizer import (
    CHAIN_LENGTH,
    NO_SUMMARY_STREAK,
    PrefetchedSummaries,
    Summarizer,
    SummaryError,
    SummaryJob,
)
from app.core.fit import SummaryProvider
from app.upstream.traffic import Traffic
from tests.compaction.conftest import RedisServer

FACT = re.compile(r"FACT-\w+")


def words(text: str) -> int:
    return len(text.split())


def request_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The test's own count of a summary request (word tokens, chat accounting)."""
    return 3 + sum(3 + words(str(m["role"])) + words(str(m["content"])) for m in messages)


class FakeLLM:
    """A deterministic summarizer: answers with the sorted FACT-* markers it was shown."""

    def __init__(self, *, answer: object = None, error: Exception | None = None, delay_s: float = 0) -> None:
        self.calls: list[list[dict[str, Any]]] = []
        self.models: list[str] = []
        self.max_tokens: list[int] = []
        self.answer = answer
        self.error = error
        self.delay_s = delay_s

    async def __call__(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> str:
        self.calls.append(messages)
        self.models.append(model)
        self.max_tokens.append(max_tokens)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            return self.answer  # type: ignore[return-value]
        facts = sorted(set(FACT.findall(messages[-1]["content"])))
        return "  Summary: " + " ".join(facts) + "\n"

    @property
    def prompts(self) -> list[str]:
        return [call[-1]["content"] for call in self.calls]


TENANT = "t-alice"


def job_of(
    *,
    window_tokens: int = 100_000,
    reply_tokens: int | None = None,
    tenant: str = TENANT,
    credential: str = "",
) -> SummaryJob:
    reply = reply_tokens if reply_tokens is not None else min(2048, window_tokens // 4)
    return SummaryJob(tenant, credential or tenant, window_tokens, reply, words)


def make(
    llm: FakeLLM,
    *,
    window_tokens: int = 100_000,
    reply_tokens: int | None = None,
    timeout_s: float | None = 5.0,
    **kw: Any,
) -> tuple[Summarizer, SummaryJob]:
    """A summarizer, and the job of its calls (``TENANT``'s, sized by the window and reply)."""
    summarizer = Summarizer(llm, model="summ-1", timeout_s=timeout_s, **kw)
    return summarizer, job_of(window_tokens=window_tokens, reply_tokens=reply_tokens)


def turn(i: int, *, size: int = 5) -> list[dict[str, Any]]:
    filler = " ".join(f"w{i}x{k}" for k in range(size))
    return [
        {"role": "user", "content": f"question {i} FACT-u{i} {filler}"},
        {"role": "assistant", "content": f"answer {i} FACT-a{i} {filler}"},
    ]


# rendering and one call


async def test_one_call_renders_roles_tool_calls_results_and_images() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm)
    span: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at FACT-img"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAABBBBCCCC"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_7",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "src/app.py"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_7", "content": "def main(): FACT-tool"},
    ]
    summary = await summarizer.summarize_span(span, job)
    assert summary == "Summary: FACT-img FACT-tool"
    assert len(llm.calls) == 1 and llm.models == ["summ-1"]
    prompt = llm.prompts[0]
    assert "[user]: look at FACT-img\n[image]" in prompt
    assert 'tool call read_file({"path": "src/app.py"}) [call_7]' in prompt
    assert "[tool result for read_file [call_7]]: def main(): FACT-tool" in prompt
    assert "base64" not in prompt and "AAAABBBB" not in prompt
    assert llm.calls[0][0]["role"] == "system" and "in their words" in llm.calls[0][0]["content"]


def test_render_keeps_names_refusals_and_legacy_function_calls() -> None:
    rendered = render_messages(
        [
            {"role": "user", "name": "alice", "content": "hi"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "42"},
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "xx"}}]},
        ]
    )
    assert rendered[0] == "[user (alice)]: hi"
    assert rendered[1] == "[assistant]: [refusal] no"
    assert rendered[2] == "[assistant]\n  -> function call f({})"
    assert rendered[3] == "[function (f)]: 42"
    assert rendered[4] == "[user]: [audio]"


async def test_previous_summary_is_folded_into_the_request() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm)
    summary = await summarizer.summarize_span(turn(1), job, previous_summary="Summary: FACT-old")
    assert summary == "Summary: FACT-a1 FACT-old FACT-u1"
    assert "<previous_summary>\nSummary: FACT-old\n</previous_summary>" in llm.prompts[0]


# the incremental chain


def growing(turns: int) -> list[dict[str, Any]]:
    return [m for i in range(turns) for m in turn(i)]


async def test_a_growing_span_costs_one_call_per_step_on_the_new_messages_only() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm)
    cache = MemoryCache(max_entries=100, ttl_s=600)
    for k in range(1, 9):
        span = growing(k)
        summary = await summarizer.memory_for(span, cache, job)
        assert len(llm.calls) == k
        assert summary is not None
        assert set(FACT.findall(summary)) == {f"FACT-{r}{i}" for i in range(k) for r in "ua"}
    last = llm.prompts[-1]
    assert "<previous_summary>" in last and "FACT-u6" in last  # the previous summary ...
    assert "question 6" not in last and "question 7" in last  # ... then only the new messages
    assert await summarizer.memory_for(growing(8), cache, job) is not None
    assert len(llm.calls) == 8  # cached: no call at all
    assert await cache.get(summarizer.span_key(growing(8), TENANT)) == summary


async def test_a_step_of_several_messages_is_still_one_call() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm)
    cache = MemoryCache(max_entries=100, ttl_s=600)
    await summarizer.memory_for(growing(2), cache, job)
    summary = await summarizer.memory_for(growing(7), cache, job)  # five turns more, at once
    assert len(llm.calls) == 2 and summary is not None and "FACT-u0" in summary
    assert "question 1" not in llm.prompts[-1] and all(
        f"question {i}" in llm.prompts[-1] for i in range(2, 7)
    )


async def test_the_chain_resumes_from_the_longest_summarized_prefix() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm)
    cache = MemoryCache(max_entries=100, ttl_s=600)
    await summarizer.memory_for(growing(1), cache, job)
    await summarizer.memory_for(growing(3), cache, job)
    other = [{"role": "user", "content": "question 0 FACT-u0 w0x0 w0x1 w0x2 w0x3 w0x4"}, *turn(9)]
    await summarizer.memory_for(other, cache, job)  # another conversation with the same first message
    calls = len(llm.calls)
    summary = await summarizer.memory_for(growing(6), cache, job)
    assert len(llm.calls) == calls + 1 and summary is not None
    assert "question 3" in llm.prompts[-1] and "question 2" not in llm.prompts[-1]
    assert "FACT-u9" not in summary  # the other conversation's summary was not taken


async def test_a_changed_message_in_the_prefix_starts_the_chain_where_it_changed() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm)
    cache = MemoryCache(max_entries=100, ttl_s=600)
    await summarizer.memory_for(growing(2), cache, job)
    await summarizer.memory_for(growing(4), cache, job)
    edited = growing(6)
    edited[5] = {**edited[5], "content": "answer 2 edited FACT-e"}  # inside the second step
    await summarizer.memory_for(edited, cache, job)
    assert "question 2" in llm.prompts[-1] and "question 1" not in llm.prompts[-1]  # from the 2-turn prefix


async def test_a_failed_step_keeps_the_steps_already_made() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm, retry_after_s=0.05)
    cache = MemoryCache(max_entries=100, ttl_s=600)
    await summarizer.memory_for(growing(2), cache, job)
    llm.error = RuntimeError("upstream said 500")
    assert await summarizer.memory_for(growing(4), cache, job) is None
    assert await cache.get(summarizer.span_key(growing(4), TENANT)) is None
    llm.error = None
    calls = len(llm.calls)
    assert await summarizer.memory_for(growing(4), cache, job) is None  # backing off: not asked again
    assert len(llm.calls) == calls
    await asyncio.sleep(0.06)
    assert await summarizer.memory_for(growing(4), cache, job) is not None
    assert len(llm.calls) == calls + 1 and "question 1" not in llm.prompts[-1]


async def test_a_failed_span_backs_off_doubling_and_its_cause_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    cache = MemoryCache(max_entries=100, ttl_s=600, clock=lambda: clock[0])
    llm = FakeLLM(error=SummaryError("POST http://up/v1/chat/completions answered HTTP 500", status=500))
    summarizer, job = make(llm, retry_after_s=10, retry_max_s=25)
    caplog.set_level(logging.DEBUG, logger="ctxproxy.compaction")
    span = growing(3)
    waits = []
    for _ in range(4):
        assert await summarizer.memory_for(span, cache, job) is None
        calls = len(llm.calls)
        waited = 0.0
        while len(llm.calls) == calls:
            clock[0] += 1
            waited += 1
            await summarizer.memory_for(span, cache, job)
        waits.append(waited)
    assert waits == [10, 20, 25, 25]  # doubling, up to the most
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 500" in warnings[0] and "6 cut messages" in warnings[0]
    assert await summarizer.blocked(summarizer.span_key(span, TENANT), cache, job) is not None


async def test_a_permanent_failure_turns_the_summarizer_off_for_every_span(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = MemoryCache(max_entries=100, ttl_s=600)
    llm = FakeLLM(error=SummaryError("POST http://up/v1/messages answered HTTP 404: not found", status=404))
    summarizer, job = make(llm, identity="POST http://up/v1/messages (messages)")
    assert await summarizer.memory_for(growing(2), cache, job) is None
    assert await summarizer.memory_for(growing(3), cache, job) is None  # another span: not even tried
    assert await summarizer.memory_for(turn(7), cache, job) is None
    assert len(llm.calls) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 404" in warnings[0] and "POST http://up/v1/messages" in warnings[0]
    cause = await summarizer.blocked(summarizer.span_key(turn(7), TENANT), cache, job)
    assert cause is not None and "HTTP 404" in cause


def test_span_keys_depend_on_the_model_the_tenant_and_every_message() -> None:
    summarizer, _ = make(FakeLLM())
    span = growing(2)
    assert summarizer.span_key(span, TENANT) == summary_key(
        span, summarizer_model="summ-1", prompt_version=PROMPT_VERSION, tenant=TENANT
    )
    other = Summarizer(FakeLLM(), model="summ-2", timeout_s=1)
    assert other.span_key(span, TENANT) != summarizer.span_key(span, TENANT)
    changed = [*span[:-1], {**span[-1], "content": "x"}]
    assert summarizer.span_key(changed, TENANT) != summarizer.span_key(span, TENANT)
    assert summarizer.span_key(span, "t-bob") != summarizer.span_key(span, TENANT)


# chunking


async def test_a_span_larger_than_the_window_is_chunked_then_merged() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm, window_tokens=700, reply_tokens=100)
    span = [m for i in range(20) for m in turn(i, size=60)]
    assert request_tokens([{"role": "user", "content": "\n\n".join(render_messages(span))}]) > 700
    summary = await summarizer.summarize_span(span, job)
    assert summary is not None
    assert set(FACT.findall(summary)) == {f"FACT-{r}{i}" for i in range(20) for r in "ua"}
    assert len(llm.calls) >= 4
    chunk_prompts, last = llm.prompts[:-1], llm.prompts[-1]
    assert all(p.startswith("Below is part ") for p in chunk_prompts)
    assert f"of {len(chunk_prompts)} of a conversation" in chunk_prompts[0]
    assert last.startswith(f"Below are {len(chunk_prompts)} summaries")
    for call in llm.calls:
        assert request_tokens(call) <= 700 - 100
    every_message = "\n".join(chunk_prompts)
    assert all(f"question {i} " in every_message for i in range(20))  # nothing skipped


async def test_one_message_larger_than_the_window_is_split_on_word_boundaries() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm, window_tokens=600, reply_tokens=100)
    text = " ".join(f"FACT-m{k}" if k % 50 == 0 else f"word{k}" for k in range(2000))
    summary = await summarizer.summarize_span([{"role": "tool", "tool_call_id": "c", "content": text}], job)
    assert summary is not None
    assert set(FACT.findall(summary)) == {f"FACT-m{k}" for k in range(0, 2000, 50)}
    assert all(request_tokens(call) <= 500 for call in llm.calls)
    assert len(llm.calls) >= 5


async def test_partial_summaries_too_big_to_merge_at_once_are_merged_in_levels() -> None:
    class Verbose(FakeLLM):
        async def __call__(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> str:
            answer = await super().__call__(messages, model, max_tokens)
            if not messages[-1]["content"].startswith("Below is part"):
                return answer
            # Long, and no repetition the checks would refuse: words of what it read.
            return answer + " " + " ".join(re.findall(r"w[0-9]+x[0-9]+", messages[-1]["content"])[:120])

    llm = Verbose()
    # Each partial within its reply size (an answer over it is cut to it): 8 of them overflow a merge.
    summarizer, job = make(llm, window_tokens=900, reply_tokens=130)
    span = [m for i in range(30) for m in turn(i, size=60)]
    summary = await summarizer.summarize_span(span, job)
    assert summary is not None
    assert set(FACT.findall(summary)) == {f"FACT-{r}{i}" for i in range(30) for r in "ua"}
    merges = [p for p in llm.prompts if p.startswith("Below are ")]
    assert len(merges) >= 2  # one merge could not hold every partial summary
    assert all(request_tokens(call) <= 800 for call in llm.calls)


async def test_summaries_that_never_shrink_give_up_instead_of_looping() -> None:
    llm = FakeLLM(answer=" ".join(["long"] * 300))
    summarizer, job = make(llm, window_tokens=700, reply_tokens=100)
    span = [m for i in range(20) for m in turn(i, size=60)]
    assert await summarizer.summarize_span(span, job) is None
    assert len(llm.calls) <= 7 + 7  # the parts, then one level of merges that did not shrink
    assert all(request_tokens(call) <= 600 for call in llm.calls)


async def test_a_window_too_small_for_the_prompt_asks_nothing() -> None:
    llm = FakeLLM()
    summarizer, job = make(llm, window_tokens=200)
    assert job.problem() is not None and "too small" in (job.problem() or "")
    assert await summarizer.summarize_span(turn(0), job) is None
    assert llm.calls == [] and "too small" in summarizer.last_error
    assert job_of(window_tokens=2000).problem() is None


# fail open


@pytest.mark.parametrize(
    ("llm", "timeout_s"),
    [
        (FakeLLM(error=RuntimeError("upstream returned 500")), 5.0),
        (FakeLLM(delay_s=10), 0.05),
        (FakeLLM(answer="  \n\t"), 5.0),
        (FakeLLM(answer=""), 5.0),
        (FakeLLM(answer=None, error=None), 5.0),
    ],
    ids=["error", "timeout", "whitespace", "empty", "ok"],
)
async def test_fail_open(llm: FakeLLM, timeout_s: float, caplog: pytest.LogCaptureFixture) -> None:
    summarizer, job = make(llm, timeout_s=timeout_s)
    cache = MemoryCache(max_entries=10, ttl_s=60)
    span = growing(2)
    result = await summarizer.memory_for(span, cache, job)
    warnings = [r for r in caplog.records if r.name == "ctxproxy.compaction" and r.levelno == logging.WARNING]
    if llm.error is None and llm.delay_s == 0 and llm.answer is None:
        assert result is not None and not warnings and summarizer.failures == 0
        return
    assert result is None
    assert len(llm.calls) == 1
    assert summarizer.failures == 1 and len(warnings) == 1 and summarizer.last_error
    assert await cache.get(summarizer.span_key(span, TENANT)) is None  # nothing cached from a failure


async def test_a_non_string_answer_fails_open() -> None:
    summarizer, job = make(FakeLLM(answer=123))
    assert await summarizer.summarize_span(turn(0), job) is None


async def test_a_broken_cache_fails_open() -> None:
    class BrokenCache(MemoryCache):
        async def get(self, key: str) -> str | None:
            raise OSError("disk on fire")

    llm = FakeLLM()
    summarizer, job = make(llm)
    assert await summarizer.memory_for(turn(0), BrokenCache(), job) is None
    assert llm.calls == []


async def test_cancellation_is_not_swallowed() -> None:
    summarizer, job = make(FakeLLM(delay_s=10), timeout_s=None)
    task = asyncio.create_task(summarizer.summarize_span(turn(0), job))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# the engine's provider


def test_prefetched_summaries_answer_by_span_key() -> None:
    summarizer, _ = make(FakeLLM())
    span = growing(2)
    key = summarizer.span_key(span, TENANT)
    provider: SummaryProvider = PrefetchedSummaries(
        {key: "Summary: FACT-x"}, summarizer_model="summ-1", tenant=TENANT
    )
    assert provider.summary_for(span) == "Summary: FACT-x"
    assert isinstance(provider, PrefetchedSummaries)
    assert provider.summary_for(span[:2]) is None
    assert provider.summary_for([{**span[0], "content": "changed"}, *span[1:]]) is None
    assert provider.asked[0] == key and len(provider.asked) == 3
    assert provider.missed == provider.asked[1:]
    other_model = PrefetchedSummaries({key: "s"}, summarizer_model="summ-2", tenant=TENANT)
    assert other_model.summary_for(span) is None
    other_tenant = PrefetchedSummaries({key: "s"}, summarizer_model="summ-1", tenant="t-bob")
    assert other_tenant.summary_for(span) is None
    blank = PrefetchedSummaries({key: "  "}, summarizer_model="summ-1", tenant=TENANT)
    assert blank.summary_for(span) is None


# isolation and sizes per call


async def test_a_refused_key_backs_off_that_credential_only() -> None:
    cache = MemoryCache(max_entries=100, ttl_s=600)
    llm = FakeLLM(error=SummaryError("POST http://up/v1/chat/completions answered HTTP 401", status=401))
    summarizer, _ = make(llm)
    bad, good = job_of(tenant="t-bad"), job_of(tenant="t-good")
    assert await summarizer.memory_for(growing(2), cache, bad) is None
    assert await summarizer.memory_for(growing(3), cache, bad) is None  # that key is off: not asked
    assert len(llm.calls) == 1
    assert await summarizer.blocked(summarizer.span_key(turn(9), "t-bad"), cache, bad) is not None
    assert await summarizer.blocked(summarizer.span_key(turn(9), "t-good"), cache, good) is None
    llm.error = None
    assert await summarizer.memory_for(growing(3), cache, good) is not None  # another key: summarized
    # Two clients behind the operator's key share its credential: a refusal of it is everyone's.
    llm.error = SummaryError("HTTP 403", status=403)
    operator_a, operator_b = job_of(tenant="t-a", credential="t-op"), job_of(tenant="t-b", credential="t-op")
    assert await summarizer.memory_for(turn(4), cache, operator_a) is None
    calls = len(llm.calls)
    assert await summarizer.memory_for(turn(5), cache, operator_b) is None and len(llm.calls) == calls


async def test_a_model_whose_answers_are_no_summary_is_not_asked_again_for_that_key() -> None:
    # A small local model that answers with nothing usable (empty, the prompt echoed): after
    # NO_SUMMARY_STREAK such answers in a row for one key, that key's summaries are off (each
    # call would hold one of the upstream's few slots for nothing); another key's are not; a
    # summary in between ends the streak.
    cache = MemoryCache(max_entries=100, ttl_s=600)
    llm = FakeLLM(answer="   ")
    summarizer, _ = make(llm)
    alice, bob = job_of(tenant="t-alice"), job_of(tenant="t-bob")
    for k in range(NO_SUMMARY_STREAK - 1):
        assert await summarizer.memory_for(turn(10 + k), cache, alice) is None
    llm.answer = None  # a summary: the streak ends
    assert await summarizer.memory_for(turn(20), cache, alice) is not None
    llm.answer = "   "
    for k in range(NO_SUMMARY_STREAK):
        assert await summarizer.memory_for(turn(30 + k), cache, alice) is None
    calls = len(llm.calls)
    assert calls == 2 * NO_SUMMARY_STREAK
    why = await summarizer.blocked(summarizer.span_key(turn(40), "t-alice"), cache, alice)
    assert why is not None and "no summary" in why
    assert await summarizer.memory_for(turn(40), cache, alice) is None and len(llm.calls) == calls
    llm.answer = None
    assert await summarizer.memory_for(turn(41), cache, bob) is not None  # another key: asked
    assert len(llm.calls) == calls + 1


async def test_a_route_the_upstream_lacks_turns_the_summarizer_off_for_every_key() -> None:
    cache = MemoryCache(max_entries=100, ttl_s=600)
    llm = FakeLLM(error=SummaryError("HTTP 405", status=405))
    summarizer, _ = make(llm)
    assert await summarizer.memory_for(turn(1), cache, job_of(tenant="t-a")) is None
    assert await summarizer.memory_for(turn(2), cache, job_of(tenant="t-b")) is None
    assert len(llm.calls) == 1


async def test_tenants_never_share_a_summary_or_a_chain() -> None:
    llm = FakeLLM()
    summarizer, alice = make(llm)
    bob = job_of(tenant="t-bob")
    cache = MemoryCache(max_entries=100, ttl_s=600)
    await summarizer.memory_for(growing(2), cache, alice)
    await summarizer.memory_for(growing(4), cache, alice)
    assert await summarizer.longest_summarized(growing(6), cache, "t-bob") == (0, None)
    assert await summarizer.memory_for(growing(4), cache, bob) is not None
    assert len(llm.calls) == 3  # bob's span was summarized for bob, from its start
    assert "question 0" in llm.prompts[-1] and "<previous_summary>" not in llm.prompts[-1]


async def test_the_sizes_travel_with_each_call() -> None:
    llm = FakeLLM()
    summarizer, _ = make(llm)
    span = [m for i in range(20) for m in turn(i, size=60)]
    wide, narrow = (
        job_of(window_tokens=100_000, reply_tokens=500),
        job_of(window_tokens=700, reply_tokens=100),
    )
    assert await summarizer.summarize_span(span, wide) is not None
    assert len(llm.calls) == 1 and llm.max_tokens == [500]
    assert await summarizer.summarize_span(span, narrow) is not None
    assert len(llm.calls) > 2 and set(llm.max_tokens[1:]) == {100}  # parts, each within 700 - 100
    assert all(request_tokens(call) <= 600 for call in llm.calls[1:])


async def test_the_spans_whose_failure_was_logged_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import app.compaction.summarizer as module

    monkeypatch.setattr(module, "LOGGED_SPANS_MAX", 3)
    summarizer, job = make(FakeLLM(error=RuntimeError("500")))
    cache = MemoryCache(max_entries=100, ttl_s=600)
    for i in range(10):
        await summarizer.memory_for(turn(i), cache, job)
    assert len(summarizer._logged) == 3


async def test_two_replicas_racing_on_one_redis_lose_no_chain_entry_and_no_failure(
    redis_server: RedisServer,
) -> None:
    a, b = (RedisCache(redis_server.url, ttl_s=600, socket_timeout_s=5.0) for _ in range(2))
    try:
        llm = FakeLLM(delay_s=0.01)
        one, job = make(llm, retry_after_s=0.001)
        two, _ = make(llm, retry_after_s=0.001)
        spans = [growing(k) for k in range(1, CHAIN_LENGTH + 1)]  # one conversation, 16 cut steps
        made = await asyncio.gather(
            *(
                summarizer.memory_for(span, cache, job)
                for span, summarizer, cache in zip(spans, [one, two] * 8, [a, b] * 8, strict=True)
            )
        )
        assert all(made)
        chain = json.loads(await a.get(one.chain_key(spans[0], TENANT)) or "")
        assert sorted(n for n, _ in chain) == [len(span) for span in spans]  # every step, none lost
        assert await one.longest_summarized([*spans[-1], *turn(99)], b, TENANT) == (
            len(spans[-1]),
            made[-1],
        )
        llm.error = SummaryError("HTTP 500", status=500)
        failing = growing(40)
        await asyncio.gather(*(s.memory_for(failing, c, job) for s, c in [(one, a), (two, b)] * 10))
        tries = await a.get("tries:fail:" + one.span_key(failing, TENANT))
        assert tries is not None and int(tries) == one.failures + two.failures  # each failure counted
        assert not a.stats().degraded and not b.stats().degraded
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_time_limit_follows_the_summarizers_pace() -> None:
    # A model slower than the floor times out, each timeout doubles its limit until it answers;
    # then the limit is four times its slowest answer (a slow local model is not cut off at a
    # fixed limit, and a fast one is not waited for long).
    pace = Pace(floor_s=0.02, ceiling_s=30.0)
    summarizer, job = make(FakeLLM(delay_s=0.15), timeout_s=None, pace=pace)
    timeouts = 0
    while await summarizer.summarize_span(turn(1), job) is None and timeouts < 8:
        timeouts += 1
    assert 2 <= timeouts < 8  # 0.02 s and 0.04 s at least were too short for a 0.15 s model
    assert pace.expected_s is not None and pace.expected_s >= 0.15
    assert pace.limit_s == pytest.approx(PACE_FACTOR * pace.expected_s)  # one answer: its median


async def test_a_reply_over_its_size_loses_its_lowest_sections_first() -> None:
    facts = " ".join(f"w1x{k}" for k in range(200))
    answer = f"## User requests\n- keep FACT-u1\n## Files\n- src/app.py showed FACT-a1\n## Facts\n{facts}"
    summarizer, job = make(FakeLLM(answer=answer), reply_tokens=40)
    summary = await summarizer.summarize_span(turn(1, size=300), job)
    assert summary == "## User requests\n- keep FACT-u1\n## Files\n- src/app.py showed FACT-a1"


async def test_a_span_whose_call_client_requests_keep_cancelling_is_given_up_and_backs_off() -> None:
    # A one-slot local upstream and a conversation without pauses: every re-sent summary call is
    # cancelled by the next client request. After a few, the span backs off like any failure (the
    # index stands in) instead of holding the slot again on every turn; the pace is untouched.
    traffic = Traffic(max_preemptions=2, quiet_s=0)
    base = "http://127.0.0.1:9/v1"
    sent: list[int] = []

    async def slow(messages: list[dict[str, Any]], model: str, max_tokens: int) -> str:
        async def attempt() -> str:
            sent.append(len(sent))
            await asyncio.sleep(60)
            return "never"

        return await traffic.background(base, attempt)

    pace = Pace(floor_s=30.0, ceiling_s=60.0)
    summarizer = Summarizer(slow, model="summ-1", timeout_s=None, pace=pace)
    cache = MemoryCache(max_entries=100, ttl_s=600)
    job = job_of()
    span = growing(3)
    pending = asyncio.create_task(summarizer.memory_for(span, cache, job))
    for attempts in (1, 2):
        while len(sent) < attempts:
            await asyncio.sleep(0.01)
        traffic.client(base).release()
    assert await asyncio.wait_for(pending, 5) is None
    cause = await summarizer.blocked(summarizer.span_key(span, TENANT), cache, job)
    assert cause is not None and "cancelled it 2 times" in cause
    assert await summarizer.memory_for(span, cache, job) is None and len(sent) == 2  # not sent again
    assert pace.limit_s == 30.0 and traffic.abandoned == 1
