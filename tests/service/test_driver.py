"""The service without HTTP on the client side: parsing, policy, model resolution, the send loop."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import respx

from app.core.body_memo import BodyMemo, layout
from app.core.budget import Budget
from app.core.dialects import CHAT as CHAT_API
from app.core.dialects import MESSAGES
from app.core.dialects.chat import ChatDialect
from app.core.errors import CannotFit, InvalidRequest
from app.core.plan import Plan
from app.core.registry import ModelRegistry
from app.core.routes import KeySlot, Route, RouteMatch, RouteTable, key_slots
from app.service.driver import Service
from app.service.report import plan_report, request_budget_tokens
from app.service.request import RequestOptions, dump_body, parse_body
from app.upstream.client import UpstreamClient
from tests.api import (
    UPSTREAM,
    WINDOW_TOKENS,
    OneModelRegistry,
    WordVocabularies,
    chat_ok,
    make_settings,
    openai_overflow,
    words,
)

CHAT = f"{UPSTREAM}/chat/completions"
CHAT_ROUTE = RouteMatch.first(CHAT_API)


def service(router: respx.Router, **settings: Any) -> Service:
    http = httpx.AsyncClient(transport=httpx.MockTransport(router.handler))
    return Service(
        settings=make_settings(**settings),
        registry=OneModelRegistry(),
        vocabularies=WordVocabularies(),
        upstream=UpstreamClient(http, base_url=UPSTREAM),
    )


def dry_run(svc: Service, body: dict[str, Any], options: RequestOptions) -> Plan:
    """The decision for a chat ``body`` without I/O (the dry run's)."""
    return svc.dry_run(svc.request(body, options, route=CHAT_ROUTE)).plan


def conversation(turns: int, size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"u{i} " + words(size)})
        messages.append({"role": "assistant", "content": f"a{i} " + words(size)})
    messages.append({"role": "user", "content": "now"})
    return messages


def test_parse_body_accepts_objects_and_what_the_stdlib_accepts() -> None:
    assert parse_body(b' {"a": 1} ') == {"a": 1}
    assert parse_body(b'{"a": "\\ud800"}') == {"a": "\ud800"}
    for bad in (b"", b"{", b"[]", b"null", b"\xff"):
        with pytest.raises(InvalidRequest):
            parse_body(bad)


def test_parse_body_with_a_memo_parses_a_resent_body_from_what_was_appended() -> None:
    bodies = BodyMemo(min_bytes=0, min_reuse_bytes=0)
    history = conversation(turns=4, size=5)
    raws = [
        json.dumps({"model": "m", "messages": history[:n], "stream": False}).encode()
        for n in range(4, len(history) + 1)
    ]
    parsed = [parse_body(raw, memo=bodies, key="messages") for raw in raws]
    assert parsed == [json.loads(raw) for raw in raws]
    assert parsed[-1]["messages"][0] is parsed[0]["messages"][0]  # the history was not parsed again
    with pytest.raises(InvalidRequest):  # bytes appended that are not values: the whole body is bad
        found = layout(raws[-1], "messages")
        assert found is not None
        split = found.ends[-1]
        parse_body(raws[-1][:split] + b"," + raws[-1][split:], memo=bodies, key="messages")


def test_dump_body_is_compact_and_survives_lone_surrogates() -> None:
    assert dump_body({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()
    assert json.loads(dump_body({"a": "\ud800"})) == {"a": "\ud800"}


def test_request_budget_is_window_minus_reserve_and_margin_capped() -> None:
    budget = Budget(window_tokens=1000, reserve_tokens=200, margin_tokens=16, tool_tokens=50)
    assert request_budget_tokens(budget) == 784
    assert budget.input_budget_tokens == 734
    capped = Budget(window_tokens=1000, reserve_tokens=200, margin_tokens=16, tool_tokens=50, cap_tokens=300)
    assert request_budget_tokens(capped) == 300


def test_options_refine_the_operator_policy() -> None:
    svc = service(respx.Router(), keep_turns=5, policy_mode="truncate")
    assert svc.policy(RequestOptions()).keep_turns == 5
    refined = svc.policy(RequestOptions(mode="reject", keep_turns=0, reserve_tokens=64))
    assert (refined.mode, refined.keep_turns, refined.reserve_tokens) == ("reject", 0, 64)


def test_window_header_overrides_the_spec_and_counters_are_kept_per_encoding() -> None:
    svc = service(respx.Router())
    body = {"model": "unknown-x", "messages": [{"role": "user", "content": "hi"}]}
    plan = dry_run(svc, body, RequestOptions(window_tokens=64_000))
    assert plan.spec.window_tokens == 64_000 and plan.spec.source == "request"
    assert dry_run(svc, body, RequestOptions()).spec.window_tokens == WINDOW_TOKENS
    assert svc.counter("o200k_base") is svc.counter("o200k_base")
    assert svc.vocabularies.encodings_asked == ["o200k_base"]  # type: ignore[attr-defined]


def test_budget_header_caps_the_plan() -> None:
    svc = service(respx.Router())
    body = {"model": "m", "messages": conversation(turns=3, size=40)}
    plan = dry_run(svc, body, RequestOptions(budget_tokens=100, keep_turns=0))
    assert plan.budget.cap_tokens == 100
    assert plan.fits and plan.tokens_after <= 100 < plan.tokens_before


def test_plan_report_is_json_ready() -> None:
    svc = service(respx.Router())
    body = {"model": "m", "messages": conversation(turns=6, size=60), "temperature": 0}
    plan = dry_run(svc, body, RequestOptions())
    report = json.loads(json.dumps(plan_report(plan, body)))
    assert report["budget"]["window_tokens"] == WINDOW_TOKENS
    assert report["tokens_after"] == plan.tokens_after
    assert report["actions_header"] == plan.actions_header()
    assert plan.changed and report["body"] == plan.body(body)  # what the proxy forwards
    assert report["body"]["temperature"] == 0
    assert len(report["body"]["messages"]) == len(report["message_tokens"]) < len(body["messages"])


async def test_reject_raises_cannot_fit_with_the_numbers() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    raw = json.dumps({"model": "m", "messages": conversation(turns=6, size=60)}).encode()
    with pytest.raises(CannotFit) as info:
        await service(router).handle(raw, [], options=RequestOptions(mode="reject"), route=CHAT_ROUTE)
    assert info.value.window_tokens == WINDOW_TOKENS
    assert info.value.tokens > info.value.budget_tokens
    assert route.call_count == 0


async def test_unchanged_plan_sends_the_original_bytes_and_changed_plan_sends_the_rewrite() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    svc = service(router)
    small = b'{"model":"m",   "messages":[{"role":"user","content":"hi"}]}'
    outcome = await svc.handle(small, [], options=RequestOptions(), route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert route.calls[0].request.content == small
    assert not outcome.plan.changed and outcome.retries == 0 and outcome.stream is False

    big = json.dumps({"model": "m", "stream": True, "messages": conversation(turns=6, size=60)}).encode()
    outcome = await svc.handle(big, [], options=RequestOptions(), route=CHAT_ROUTE)
    await outcome.response.aclose()
    sent = json.loads(route.calls[1].request.content)
    assert outcome.plan.changed and outcome.stream is True
    assert sent["messages"] == list(outcome.plan.messages)
    assert sent["stream"] is True


async def test_a_resent_conversation_forwards_its_own_bytes_and_plans_as_a_fresh_service_does() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    svc, fresh = service(router), service(router)
    history = conversation(turns=40, size=300)  # over the memo's minimum size, under the window
    for n in (61, 71, 81):
        raw = json.dumps({"model": "m", "messages": history[:n]}, indent=1).encode()
        options = RequestOptions(window_tokens=100_000)
        outcome = await svc.handle(raw, [], options=options, route=CHAT_ROUTE)
        await outcome.response.aclose()
        assert route.calls[-1].request.content == raw
        assert not outcome.plan.changed
        again = fresh.request(json.loads(raw), options, raw=raw, route=CHAT_ROUTE)
        assert outcome.plan == fresh.dry_run(again).plan
    assert len(svc.bodies) == 1 and svc.bodies.parse(raw, key="messages", loads=json.loads) == json.loads(raw)


async def test_overflow_that_a_retry_cannot_help_is_returned_after_one_call() -> None:
    router = respx.Router(assert_all_called=False)
    # The upstream says its window is smaller than the output it was asked for: no retry helps.
    route = router.post(CHAT).mock(
        return_value=httpx.Response(400, json=openai_overflow(limit=100, prompt=900))
    )
    raw = json.dumps({"model": "m", "messages": conversation(turns=2, size=60)}).encode()
    outcome = await service(router).handle(raw, [], options=RequestOptions(), route=CHAT_ROUTE)
    assert route.call_count == 1
    assert outcome.retries == 0 and outcome.response.status_code == 400
    assert json.loads(b"".join([c async for c in outcome.response.aiter_raw()])) == openai_overflow(100, 900)
    await outcome.response.aclose()


async def test_overflow_under_the_off_policy_is_not_retried() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(
        return_value=httpx.Response(400, json=openai_overflow(limit=600, prompt=900))
    )
    raw = json.dumps({"model": "m", "messages": conversation(turns=2, size=150)}).encode()
    outcome = await service(router).handle(raw, [], options=RequestOptions(mode="off"), route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert route.call_count == 1 and outcome.retries == 0


class CountingRegistry(OneModelRegistry):
    def __init__(self) -> None:
        self.resolved = 0

    def resolve(self, model: str, /) -> Any:
        self.resolved += 1
        return super().resolve(model)


async def test_a_retried_request_resolves_its_model_once_and_sends_the_rendered_retry() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(
        side_effect=[
            httpx.Response(400, json=openai_overflow(limit=600, prompt=700)),
            httpx.Response(200, json=chat_ok()),
        ]
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(router.handler))
    registry = CountingRegistry()
    svc = Service(
        settings=make_settings(),
        registry=registry,
        vocabularies=WordVocabularies(),
        upstream=UpstreamClient(http, base_url=UPSTREAM),
    )
    raw = json.dumps({"model": "m", "messages": conversation(turns=3, size=100)}).encode()
    key = [("Authorization", "Bearer k")]
    outcome = await svc.handle(raw, key, options=RequestOptions(), route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert route.call_count == 2 and outcome.retries == 1 and outcome.plan.changed
    assert registry.resolved == 1
    assert json.loads(route.calls[1].request.content)["messages"] == list(outcome.plan.messages)
    assert route.calls[1].request.headers["authorization"] == "Bearer k"


async def test_the_fast_path_renders_while_the_upstream_works_an_answered_retry_after() -> None:
    """A body the ceiling proves fits goes at once; its prefix reuse and the caller's rendering
    of the plan (``render``) are made while the upstream works and come back with the answer
    (``Outcome.rendered``). An answer to a retry (another plan) comes back with none: the caller
    renders what was answered."""
    router = respx.Router(assert_all_called=False)
    answer = {k: v for k, v in chat_ok().items() if k != "usage"}  # no usage: no warning either
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=answer))
    svc = service(router)
    made: list[Any] = []

    def render(plan: Any, reuse: Any) -> tuple[str, int]:
        made.append((plan, reuse))
        return ("rendered", plan.tokens_after)

    raw = json.dumps({"model": "m", "messages": conversation(turns=4, size=20)}).encode()  # ~210 tokens
    outcome = await svc.handle(raw, [], options=RequestOptions(), render=render, route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert route.calls[0].request.content == raw and not outcome.plan.changed
    assert made == [(outcome.plan, outcome.prefix_reuse)]
    assert outcome.rendered == ("rendered", outcome.plan.tokens_after)
    route.mock(
        side_effect=[
            httpx.Response(400, json=openai_overflow(limit=150, prompt=220)),
            httpx.Response(200, json=answer),
        ]
    )
    outcome = await svc.handle(raw, [], options=RequestOptions(), render=render, route=CHAT_ROUTE)
    await outcome.response.aclose()
    assert route.call_count == 3 and outcome.retries == 1 and outcome.plan.changed
    assert len(made) == 2 and made[1][0] is not outcome.plan  # rendered for the first send only
    assert outcome.rendered is None and outcome.prefix_reuse is not None


def test_the_request_value_is_made_once_with_everything_planning_needs() -> None:
    svc = service(respx.Router())
    body = {"model": "m", "messages": conversation(turns=1, size=5), "stream": True}
    options = RequestOptions(keep_turns=1, window_tokens=5_000)
    request = svc.request(body, options, raw=b"{}", route=CHAT_ROUTE)
    assert request.stream and request.model == "m" and request.policy.keep_turns == 1
    assert request.spec.window_tokens == 5_000 and request.base_url == UPSTREAM
    assert request.conversation.messages[0] is body["messages"][0]
    assert request.plan().budget.window_tokens == 5_000
    with pytest.raises(InvalidRequest) as caught:
        svc.request({"model": "", "messages": "x"}, RequestOptions(), route=CHAT_ROUTE)
    assert caught.value.param == "model"  # the model is checked before the conversation


def test_the_anthropic_long_context_beta_opens_the_1m_window_on_the_messages_route() -> None:
    table = '[models]\n"claude-sonnet-4-5" = { window = 200_000, max_output = 64_000 }\n'
    svc = Service(
        settings=make_settings(),
        registry=ModelRegistry.from_toml(table, source="test"),
        vocabularies=WordVocabularies(),
        upstream=UpstreamClient(
            httpx.AsyncClient(transport=httpx.MockTransport(respx.Router().handler)), base_url=UPSTREAM
        ),
    )
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
    }
    beta = [("Anthropic-Beta", "claude-code-20250219,context-1m-2025-08-07")]
    on_messages = RouteMatch.first(MESSAGES)
    wide = svc.request(body, RequestOptions(), headers=beta, route=on_messages)
    assert wide.spec.window_tokens == 1_000_000
    assert svc.request(body, RequestOptions(), route=on_messages).spec.window_tokens == 200_000
    chat_body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}
    on_chat = svc.request(chat_body, RequestOptions(), headers=beta, route=CHAT_ROUTE)
    assert on_chat.spec.window_tokens == 200_000


async def test_prefix_reuse_of_a_growing_conversation_and_the_same_bytes_from_two_instances() -> None:
    """The cut is a function of the history: two services (two replicas) that see the same
    history forward the same bytes, whatever each saw before; the second request of a
    conversation reports what the previous forwarded request already sent as its prefix."""
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    one, two = service(router), service(router)
    for turns in range(4, 9):  # instance one sees the conversation grow turn by turn
        raw = json.dumps({"model": "m", "messages": conversation(turns=turns, size=60)}).encode()
        outcome = await one.handle(raw, [], options=RequestOptions(), route=CHAT_ROUTE)
        await outcome.response.aclose()
        assert outcome.prefix_reuse is not None
        if turns > 4:
            assert outcome.prefix_reuse.reused_tokens > 0
    seen_by_one = route.calls[-1].request.content
    outcome = await two.handle(raw, [], options=RequestOptions(), route=CHAT_ROUTE)  # cold, only the last one
    await outcome.response.aclose()
    assert outcome.plan.changed and route.calls[-1].request.content == seen_by_one
    assert outcome.prefix_reuse is not None and outcome.prefix_reuse.reused_tokens == 0


async def test_prefix_reuse_is_per_model_a_new_models_first_request_reuses_nothing() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    svc = service(router)
    shares = []
    for model, turns in (("m", 4), ("m", 5), ("m2", 5), ("m2", 6)):
        raw = json.dumps({"model": model, "messages": conversation(turns=turns, size=20)}).encode()
        outcome = await svc.handle(raw, [], options=RequestOptions(), route=CHAT_ROUTE)
        await outcome.response.aclose()
        assert outcome.prefix_reuse is not None
        shares.append(outcome.prefix_reuse.share)
    assert shares[0] == 0.0 and shares[1] > 0.5
    assert shares[2] == 0.0  # the same conversation's first request to another model
    assert shares[3] > 0.5


@dataclass(frozen=True, slots=True)
class PathModelChat(ChatDialect):
    """Chat's wire under a versioned path that names the model (Gemini's shape of route)."""

    name: str = "path-model"
    routes: tuple[Route, ...] = (Route("/v1beta/models/{model}:stream", stream=True),)
    key_slots: tuple[KeySlot, ...] = (KeySlot("key", in_query=True),)

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str:
        return params["model"]


async def test_the_model_streaming_and_where_it_goes_come_from_the_matched_route() -> None:
    dialect = PathModelChat()
    router = respx.Router()
    sent = router.post(url__regex=r"http://upstream\.test/v1beta/.*").mock(
        return_value=httpx.Response(
            200, content=b"data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
        )
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(router.handler))
    svc = Service(
        settings=make_settings(),
        registry=OneModelRegistry(),
        vocabularies=WordVocabularies(),
        upstream=UpstreamClient(http, base_url=UPSTREAM, api_key="op", key_slots=key_slots([dialect])),
    )
    match = RouteTable.of({"p": dialect}).match("/v1beta/models/gm-1:stream", "alt=sse&key=client")
    assert match is not None
    raw = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    request = svc.request(json.loads(raw), RequestOptions(), route=match)
    assert request.model == request.conversation.model == "gm-1" and request.stream
    outcome = await svc.handle(raw, [], options=RequestOptions(), route=match)
    await outcome.response.aclose()
    assert outcome.plan.model == "gm-1" and outcome.stream
    # Unchanged: the client's bytes, at its own path on the base URL's origin, its query kept and
    # its key replaced by the operator's in the dialect's slot.
    assert sent.calls[0].request.content == raw
    assert sent.calls[0].request.url.raw_path == b"/v1beta/models/gm-1:stream?alt=sse&key=op"
