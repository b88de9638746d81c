"""The learner inside the app (respx upstream through the transport seam): calibration from usage,
the X-Context-Count and X-Context-Warning headers, learning from context errors, bytes unchanged."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import respx

from app.core.estimate import EstimateCounter
from app.core.overflow import ContextOverflow
from app.core.registry import ModelSpec
from app.core.tenant import ANONYMOUS, key_hash
from app.core.tokens import MessageCounter
from app.service.learning import TRUNCATED_WARNING, Learner
from tests.api import UPSTREAM, WordCounter, proxy
from tests.fake_gemini_upstream import FakeGemini, FakeGeminiModel

CHAT = f"{UPSTREAM}/chat/completions"
MODEL = "acme/llm"


class EstimateRegistry:
    """One model counted by the estimate, window 8192, from the built-in table."""

    def resolve(self, model: str, /) -> ModelSpec:
        return ModelSpec(name=model, window_tokens=8192, max_output_tokens=2048, encoding="estimate")


def prose(words: int, seed: int = 0) -> str:
    vocabulary = ["window", "tokens", "upstream", "count", "model", "proxy", "request", "answer", "usage"]
    return " ".join(vocabulary[(i * 7 + seed) % len(vocabulary)] for i in range(words))


def request(words: int = 400, seed: int = 0, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": prose(words, seed)}], **extra}


def usage_response(prompt_tokens: int) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "c",
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 1,
                "total_tokens": prompt_tokens + 1,
            },
        },
    )


def sse_response(prompt_tokens: int) -> httpx.Response:
    chunks = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "ok"}}]},
        {"id": "c", "choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 1}},
    ]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})


def learner_of(app: Any) -> Learner:
    learner: Learner = app.state.service.learner
    return learner


def upstream_counting(ratio: float, *, stream: bool = False, cut_at: int | None = None) -> Any:
    """An upstream that reports ``ratio`` times the proxy's own raw count of the prompt (cut at
    ``cut_at`` when given), the way a server with another tokenizer would."""
    from app.core.estimate import EstimateCounter
    from app.core.tokens import MessageCounter

    counter = MessageCounter(EstimateCounter())

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        fixed, text = counter.request_parts(body)
        prompt = fixed + round(text * ratio)
        if cut_at is not None:
            prompt = min(prompt, cut_at)
        return sse_response(prompt) if body.get("stream") else usage_response(prompt)

    return answer


async def test_usage_calibrates_the_estimate_and_the_count_says_so() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(side_effect=upstream_counting(1.3))
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        first = await client.post("/v1/chat/completions", json=request(seed=1))
        assert first.headers["x-context-count"] == "estimate"
        second = await client.post("/v1/chat/completions", json=request(seed=2))
        assert second.headers["x-context-count"] == "calibrated"
        facts = learner_of(app).knowledge.facts(MODEL, tenant=ANONYMOUS)
        assert facts is not None and facts.samples == 2 and abs((facts.factor or 0) - 1.3) < 0.01
        plan = await client.post("/v1/context/plan", json=request(seed=3))
    report = plan.json()
    assert report["count"] == "calibrated"
    assert abs(report["spec"]["correction"] - 1.3) < 0.01
    assert report["spec"]["sources"] == {
        "window": "builtin",
        "max_output": "builtin",
        "encoding": "builtin",
        "correction": "calibrated:usage",
    }


async def test_streamed_usage_is_read_as_it_passes_and_the_bytes_are_unchanged() -> None:
    router = respx.Router(assert_all_called=False)
    answer = upstream_counting(1.2)
    sent: list[bytes] = []

    def record(request: httpx.Request) -> httpx.Response:
        response: httpx.Response = answer(request)
        sent.append(response.content)
        return response

    router.post(CHAT).mock(side_effect=record)
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        response = await client.post("/v1/chat/completions", json=request(stream=True))
        assert response.content == sent[0]
        facts = learner_of(app).knowledge.facts(MODEL, tenant=ANONYMOUS)
    assert facts is not None and facts.samples == 1 and abs((facts.factor or 0) - 1.2) < 0.01


async def test_a_json_array_streams_usage_is_read_as_it_passes_and_the_bytes_are_unchanged() -> None:
    fake = FakeGemini([FakeGeminiModel("gemini-x", ratio=1.4, thinking=False)])
    sent: list[bytes] = []

    def record(request: httpx.Request) -> httpx.Response:
        response = fake.handler(request)
        sent.append(response.content)
        return response

    router = respx.Router(assert_all_called=False)
    router.post(url__regex=r"http://upstream\.test/v1beta/models/.*").mock(side_effect=record)
    body = {"contents": [{"role": "user", "parts": [{"text": prose(400)}]}]}
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        response = await client.post(
            "/v1beta/models/gemini-x:streamGenerateContent", json=body, headers={"x-goog-api-key": "k"}
        )
        facts = learner_of(app).knowledge.facts("gemini-x", tenant=key_hash("k"))  # the key's tenant
    assert response.headers["content-type"].startswith("application/json")
    assert response.content == sent[0] and sent[0].startswith(b"[")  # one JSON array, unchanged
    assert facts is not None and facts.samples == 1 and (facts.factor or 0) > 1.2  # the fake's 1.4


async def test_a_silent_cut_warns_on_the_response_and_teaches_the_window() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(side_effect=upstream_counting(1.0, cut_at=1024))
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, _):
        for seed in range(2):  # calibrate on requests that are not cut
            ok = await client.post("/v1/chat/completions", json=request(200, seed=seed))
            assert "x-context-warning" not in ok.headers
        cut = await client.post("/v1/chat/completions", json=request(3000, seed=5))
        assert cut.headers["x-context-warning"] == "upstream-truncated"
        assert cut.json()["usage"]["prompt_tokens"] == 1024  # the body is the upstream's, as is
        after = await client.post("/v1/chat/completions", json=request(200, seed=6))
    assert after.headers["x-context-window"] == "1024"
    assert "x-context-warning" not in after.headers


async def test_a_silent_cut_of_a_streamed_response_warns_on_the_next_response() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(side_effect=upstream_counting(1.0, cut_at=1024))
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, _):
        for seed in range(2):
            await client.post("/v1/chat/completions", json=request(200, seed=seed))
        cut = await client.post("/v1/chat/completions", json=request(3000, seed=5, stream=True))
        assert "x-context-warning" not in cut.headers
        after = await client.post("/v1/chat/completions", json=request(200, seed=6))
        again = await client.post("/v1/chat/completions", json=request(200, seed=7))
    assert after.headers["x-context-warning"] == "upstream-truncated"
    assert after.headers["x-context-window"] == "1024"
    assert "x-context-warning" not in again.headers


async def test_a_context_error_teaches_the_window_for_the_next_request() -> None:
    router = respx.Router(assert_all_called=False)
    overflow = {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 6000,
            "n_ctx": 4096,
        }
    }
    route = router.post(CHAT).mock(
        side_effect=[httpx.Response(400, json=overflow), usage_response(3000), usage_response(3000)]
    )
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, _):
        first = await client.post("/v1/chat/completions", json=request(4000))
        second = await client.post("/v1/chat/completions", json=request(4000, seed=1))
    # The retry was fitted to the window the error taught, and says so.
    assert first.headers["x-context-retries"] == "1" and first.headers["x-context-window"] == "4096"
    assert second.headers["x-context-retries"] == "0" and second.headers["x-context-window"] == "4096"
    assert route.call_count == 3


async def test_discovered_windows_apply_from_the_first_request() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(
        return_value=httpx.Response(200, json={"data": [{"id": MODEL, "max_model_len": 4096}]})
    )
    router.route(method="GET", path="/props").mock(return_value=httpx.Response(404))
    router.route(method="GET", path="/api/v0/models").mock(return_value=httpx.Response(404))
    router.post(CHAT).mock(side_effect=upstream_counting(1.0))
    async with proxy(router, registry=EstimateRegistry()) as (client, app):
        response = await client.post("/v1/chat/completions", json=request())
        plan = (await client.post("/v1/context/plan", json=request())).json()
        metrics = app.state.observability.metrics.registry

        def discovery(endpoint: str, result: str) -> float | None:
            labels = {"endpoint": endpoint, "result": result}
            value: float | None = metrics.get_sample_value("ctxproxy_discovery_total", labels)
            return value

        def chat_latency_count() -> float | None:
            labels = {"api": "chat", "upstream": UPSTREAM, "status": "2xx"}
            value: float | None = metrics.get_sample_value("ctxproxy_upstream_latency_seconds_count", labels)
            return value

        # Discovery calls are counted by endpoint, and stay out of the chat traffic's upstream latency.
        assert discovery("models", "answered") == 1.0
        assert discovery("props", "not_found") == 1.0
        assert chat_latency_count() == 1.0
    assert response.headers["x-context-window"] == "4096"
    assert plan["spec"]["sources"]["window"] == "discovered" and plan["spec"]["source"] == "discovered"


async def test_without_discovery_the_upstream_is_never_asked_about_models() -> None:
    router = respx.Router(assert_all_called=False)
    models = router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    router.post(CHAT).mock(side_effect=upstream_counting(1.0))
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        await client.post("/v1/chat/completions", json=request())
        assert learner_of(app).discovery is None
    assert models.call_count == 0


async def test_an_exact_count_is_compared_with_usage_as_the_plan_counted_it() -> None:
    # For exact counters the learner takes the plan's own count of what was forwarded (no second
    # tally): the recorded ratio is the upstream's count over X-Context-Tokens-After.
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT)
    body = {**request(words=100), "model": "test-model"}
    async with proxy(router, discovery=False) as (client, app):
        ours = (await client.post("/v1/context/plan", json=body)).json()["tokens_after"]
        route.mock(return_value=usage_response(ours + 7))
        response = await client.post("/v1/chat/completions", json=body)
        assert response.headers["x-context-count"] == "exact"
        assert int(response.headers["x-context-tokens-after"]) == ours
        facts = learner_of(app).knowledge.facts("test-model", tenant=ANONYMOUS)
    assert facts is not None and facts.samples == 1 and facts.factor is not None
    assert abs(facts.factor - (ours + 7) / ours) < 1e-9


MESSAGES_COUNT = f"{UPSTREAM}/messages/count_tokens"


def messages_request(words: int = 400, seed: int = 0) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 256,
        "messages": [{"role": "user", "content": prose(words, seed)}],
    }


async def test_the_upstreams_count_tokens_answer_calibrates_the_estimate_before_any_request() -> None:
    # Claude Code counts before it sends: Anthropic's own count of the body is the usage the
    # estimate is corrected from, and the answer still reaches the client byte for byte.
    router = respx.Router(assert_all_called=False)
    answers: list[bytes] = []
    ratio = 1.5

    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        ours = await client.post("/v1/context/plan?api=messages", json=messages_request(seed=1))
        assert ours.json()["count"] == "estimate"
        theirs = round(ours.json()["tokens_before"] * ratio)

        def count(_: httpx.Request) -> httpx.Response:
            answer = httpx.Response(200, json={"input_tokens": theirs})
            answers.append(answer.content)
            return answer

        router.post(MESSAGES_COUNT).mock(side_effect=count)
        counted = await client.post("/v1/messages/count_tokens", json=messages_request(seed=1))
        assert counted.status_code == 200 and counted.content == answers[0]
        facts = learner_of(app).knowledge.facts(MODEL, tenant=ANONYMOUS)
        assert facts is not None and facts.samples == 1 and 1.45 < (facts.factor or 0) < 1.6
        after = await client.post("/v1/context/plan?api=messages", json=messages_request(seed=1))
    report = after.json()
    assert report["count"] == "calibrated" and report["spec"]["sources"]["correction"] == "calibrated:count"
    assert abs(report["tokens_before"] - theirs) <= 0.02 * theirs


async def test_a_count_far_below_the_estimate_is_an_over_estimate_not_a_silent_cut() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(MESSAGES_COUNT).mock(return_value=httpx.Response(200, json={"input_tokens": 120}))
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        await client.post("/v1/messages/count_tokens", json=messages_request(words=2000))
        facts = learner_of(app).knowledge.facts(MODEL, tenant=ANONYMOUS)
        assert facts is not None and facts.samples == 1 and facts.truncations == 0
        assert facts.learned_window_tokens is None
        assert not learner_of(app).knowledge.take_warning(MODEL, tenant=ANONYMOUS)


async def test_a_count_answer_that_is_not_a_count_teaches_nothing_and_passes_back() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(MESSAGES_COUNT).mock(
        side_effect=[
            httpx.Response(200, json={"input_tokens": "many"}),
            httpx.Response(200, content=b"input_tokens: 12", headers={"content-type": "text/plain"}),
        ]
    )
    async with proxy(router, registry=EstimateRegistry(), discovery=False) as (client, app):
        first = await client.post("/v1/messages/count_tokens", json=messages_request())
        second = await client.post("/v1/messages/count_tokens", json=messages_request())
        assert first.json() == {"input_tokens": "many"} and second.content == b"input_tokens: 12"
        assert learner_of(app).knowledge.facts(MODEL, tenant=ANONYMOUS) is None


class Answer:
    """The part of an upstream response ``Learner.observe`` reads, for a non-streaming answer."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.status_code = 200
        self.headers: list[tuple[str, str]] = []
        self._body = json.dumps(body).encode()

    async def aread(self) -> bytes:
        return self._body

    def decoded_body(self) -> bytes:
        return self._body


async def test_usage_reaches_the_on_usage_hook_unless_it_is_a_truncation() -> None:
    counter = MessageCounter(EstimateCounter())
    forwarded = request(400)
    fixed, text = counter.request_parts(forwarded)
    learner = Learner()
    seen: list[int] = []
    for prompt in (fixed + text, 10):  # the same as ours; then far below it: a silent cut
        await learner.observe(
            Answer(usage_response(prompt).json()),  # type: ignore[arg-type]
            model=MODEL,
            counter=counter,
            forwarded=forwarded,
            stream=False,
            on_usage=seen.append,
            tenant=ANONYMOUS,
        )
    assert seen == [fixed + text]


async def test_an_exact_counts_usage_is_recorded_after_the_answer_and_a_cut_at_once() -> None:
    # An exact count's verdict is known from the numbers alone: a usage that says nothing for the
    # response's headers is recorded on the loop's next turn (after the answer is written); one
    # that says the upstream cut the prompt is recorded at once and warns on this very response.
    counter = MessageCounter(WordCounter())
    learner = Learner()
    seen: list[int] = []

    async def observe(prompt: int, forwarded_tokens: int) -> tuple[str, ...]:
        _, warnings = await learner.observe(
            Answer(usage_response(prompt).json()),  # type: ignore[arg-type]
            model=MODEL,
            counter=counter,
            forwarded={},
            stream=False,
            window_tokens=100_000,
            forwarded_tokens=forwarded_tokens,
            on_usage=seen.append,
            tenant=ANONYMOUS,
        )
        return warnings

    assert await observe(5_000, 5_000) == ()
    assert (
        seen == [] and learner.knowledge.facts(MODEL, tenant=ANONYMOUS) is None
    )  # not yet: after the answer
    await asyncio.sleep(0)
    assert seen == [5_000]
    facts = learner.knowledge.facts(MODEL, tenant=ANONYMOUS)
    assert facts is not None and facts.truncations == 0
    assert await observe(100, 6_000) == (TRUNCATED_WARNING,)  # far below ours: a silent cut, now
    assert seen == [5_000]
    facts = learner.knowledge.facts(MODEL, tenant=ANONYMOUS)
    assert facts is not None and facts.truncations == 1
    assert await observe(100_000, 90_000) == (TRUNCATED_WARNING,)  # at the window: a cut too


def test_a_proven_window_after_an_error_without_numbers_is_learned() -> None:
    learner = Learner()
    learner.learn_proven_window(MODEL, 3_000, tenant=ANONYMOUS)  # nothing learned from a bound yet: no change
    assert learner.knowledge.facts(MODEL, tenant=ANONYMOUS) is None
    counter_body = {"messages": [{"role": "user", "content": prose(50)}]}
    learner.learn_from_overflow(
        MODEL,
        ContextOverflow("openai", message="Your input exceeds the context window of this model."),
        counter=MessageCounter(EstimateCounter()),
        forwarded=counter_body,
        sent_tokens=20_000,
        tenant=ANONYMOUS,
    )
    facts = learner.knowledge.facts(MODEL, tenant=ANONYMOUS)
    assert (
        facts is not None and facts.learned_window_tokens == 10_000 and facts.learned_from == "learned:bound"
    )
    learner.learn_proven_window(MODEL, 3_500, tenant=ANONYMOUS)
    facts = learner.knowledge.facts(MODEL, tenant=ANONYMOUS)
    assert facts is not None and facts.learned_window_tokens == 3_500
