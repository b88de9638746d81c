"""The boundary work inside the app (respx upstream through the transport seam): a request the
upstream takes whole is forwarded whole (anchored on the last request's usage, or counted by the
API's endpoint), an output cap that leaves no room is lowered; every switch; what the upstream got."""

from __future__ import annotations

import json
from typing import Any

import httpx
import respx

from app.core.registry import ModelSpec
from tests.api import UPSTREAM, proxy, words

MODEL = "acme/llm"
CHAT = f"{UPSTREAM}/chat/completions"
MESSAGES = f"{UPSTREAM}/messages"
COUNT = f"{UPSTREAM}/messages/count_tokens"


class Registry:
    """One model, window 1,000, counted exactly (the tests' word counter) or by the estimate."""

    def __init__(self, encoding: str = "o200k_base", window: int = 1_000) -> None:
        self.encoding = encoding
        self.window = window

    def resolve(self, model: str, /) -> ModelSpec:
        return ModelSpec(
            name=model,
            window_tokens=self.window,
            max_output_tokens=self.window,
            encoding=self.encoding,
            source="test",
        )


def chat_answer(prompt_tokens: int) -> httpx.Response:
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


def conversation(turns: int, size: int = 40) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": words(20, "s")}]
    for k in range(turns):
        messages.append({"role": "user", "content": words(size, f"u{k}")})
        messages.append({"role": "assistant", "content": words(size, f"a{k}")})
    messages.append({"role": "user", "content": words(size, "last")})
    return messages


def sent(route: respx.Route) -> list[dict[str, Any]]:
    return [json.loads(call.request.content) for call in route.calls]


async def test_a_request_over_our_budget_that_the_upstream_takes_whole_is_forwarded_whole() -> None:
    # The upstream counts 0.85 of ours (e.g. encrypted reasoning we price high): its usage of the
    # previous request anchors the next one, which is over our budget but not over its window.
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        ours = sum(3 + 1 + len(m["content"].split()) for m in body["messages"]) + 3
        return chat_answer(int(ours * 0.85))

    for exact, expect_whole in ((True, True), (False, False)):
        router = respx.Router(assert_all_called=False)
        route = router.post(CHAT).mock(side_effect=answer)
        async with proxy(router, registry=Registry(), discovery=False, boundary_exact=exact) as (client, _):
            first = {"model": MODEL, "max_tokens": 100, "messages": conversation(9)}  # 863 tokens: fits
            assert (await client.post("/v1/chat/completions", json=first)).status_code == 200
            # 951 tokens by ours: over the 884-token budget; 808 by the upstream's: under its room.
            second = {"model": MODEL, "max_tokens": 100, "messages": conversation(10)}
            raw = json.dumps(second).encode()
            response = await client.post(
                "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
            )
        assert response.status_code == 200
        forwarded = route.calls[-1].request.content
        assert (forwarded == raw) is expect_whole
        if expect_whole:
            assert int(response.headers["x-context-upstream-tokens"]) < int(
                response.headers["x-context-tokens-before"]
            )
            assert response.headers["x-context-actions"] == "none"
        else:
            assert "x-context-upstream-tokens" not in response.headers


def messages_body(size: int, *, max_tokens: int = 100) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": False,
        "system": words(30, "s"),
        "messages": [
            {"role": "user", "content": words(size, "u")},
            {"role": "assistant", "content": words(size, "a")},
            {"role": "user", "content": words(40, "q")},
        ],
    }


def anthropic_answer(tokens: int) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": tokens, "output_tokens": 1},
        },
    )


async def test_near_the_boundary_the_apis_counting_endpoint_decides_and_can_be_switched_off() -> None:
    body = messages_body(430)  # ~940 of our tokens (an estimate): over the budget, maybe not the window
    cases: list[tuple[dict[str, Any], dict[str, str], bool]] = [
        ({}, {}, True),
        ({}, {"X-Context-Upstream-Count": "off"}, False),
        ({"upstream_count": False}, {}, False),
    ]
    for settings, headers, asks in cases:
        router = respx.Router(assert_all_called=False)
        count = router.post(COUNT).mock(return_value=httpx.Response(200, json={"input_tokens": 700}))
        route = router.post(MESSAGES).mock(return_value=anthropic_answer(700))
        async with proxy(router, registry=Registry("estimate"), discovery=False, **settings) as (client, _):
            raw = json.dumps(body).encode()
            response = await client.post(
                "/v1/messages", content=raw, headers={"content-type": "application/json", **headers}
            )
        assert response.status_code == 200
        assert count.called is asks
        if asks:
            (counted,) = sent(count)
            assert counted == {
                k: body[k] for k in ("model", "system", "messages")
            }  # no max_tokens, no stream
            assert route.calls[-1].request.content == raw
            assert response.headers["x-context-upstream-tokens"] == "700"
        else:
            assert route.calls[-1].request.content != raw  # cut by our count


async def test_a_count_over_the_window_is_cut_and_an_upstream_without_the_endpoint_is_not_asked_again() -> (
    None
):
    router = respx.Router(assert_all_called=False)
    count = router.post(COUNT).mock(return_value=httpx.Response(404, json={"error": "no such route"}))
    route = router.post(MESSAGES).mock(return_value=anthropic_answer(500))
    async with proxy(router, registry=Registry("estimate"), discovery=False) as (client, _):
        for size in (430, 431):
            response = await client.post("/v1/messages", json=messages_body(size))
            assert response.status_code == 200
    assert count.call_count == 1
    assert all(
        json.loads(c.request.content)["messages"] != messages_body(431)["messages"] for c in route.calls
    )


async def test_an_output_cap_that_leaves_no_room_is_lowered_instead_of_cutting_what_must_be_kept() -> None:
    messages = [
        {"role": "system", "content": words(300, "s")},
        {"role": "user", "content": words(250, "u")},
    ]
    body = {"model": MODEL, "max_tokens": 600, "messages": messages}  # 560 + 600 > 1,000
    cases: list[tuple[dict[str, Any], dict[str, str], bool]] = [
        ({}, {}, True),
        ({}, {"X-Context-Lower-Output": "off"}, False),
        ({"lower_output": False}, {"X-Context-Lower-Output": "on"}, False),  # the operator's off wins
    ]
    for settings, headers, lowers in cases:
        router = respx.Router(assert_all_called=False)
        route = router.post(CHAT).mock(return_value=chat_answer(560))
        async with proxy(
            router, registry=Registry(), discovery=False, output_floor_tokens=100, **settings
        ) as (client, _):
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200
        (forwarded,) = sent(route)
        if lowers:
            assert forwarded["messages"] == messages  # everything kept
            assert forwarded["max_tokens"] < 600 and 560 + forwarded["max_tokens"] <= 1_000
            assert response.headers["x-context-output-lowered"] == str(forwarded["max_tokens"])
            assert "output_lowered=1" in response.headers["x-context-actions"]
        else:
            assert forwarded["max_tokens"] == 600 and forwarded["messages"] != messages  # the last resort cut
            assert "x-context-output-lowered" not in response.headers


async def test_when_even_the_floor_leaves_no_room_the_proxy_refuses_with_its_numbers() -> None:
    # Tool definitions the proxy cannot cut take 800 tokens of the 1,000: the floor (300) does not fit.
    tool = {"type": "function", "function": {"name": "t", "description": words(800, "d"), "parameters": {}}}
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": MODEL, "max_tokens": 600, "tools": [tool], "messages": messages}
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=chat_answer(10))
    async with proxy(router, registry=Registry(), discovery=False, output_floor_tokens=300) as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and not route.called
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert int(response.headers["x-context-tokens-before"]) > 800
    assert "x-context-tokens-after" not in response.headers  # nothing was forwarded


async def test_as_the_upstreams_counts_confirm_ours_the_margin_shrinks_for_whole_requests_only() -> None:
    # Usage equal to our count, three times (three conversations, so no anchor helps later): the
    # margin comes down from 1% of the window (1,000) to its floor, 0.5% (500).
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return chat_answer(sum(3 + 1 + len(m["content"].split()) for m in body["messages"]) + 3)

    def single(tag: str, size: int) -> dict[str, Any]:
        messages = [
            {"role": "system", "content": f"task {tag}"},
            {"role": "user", "content": words(size, tag)},
        ]
        return {"model": MODEL, "max_tokens": 1_000, "messages": messages}

    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(side_effect=answer)
    async with proxy(router, registry=Registry(window=100_000), discovery=False, upstream_count=False) as (
        client,
        _,
    ):
        for tag in ("a", "b", "c"):
            assert (await client.post("/v1/chat/completions", json=single(tag, 60_000))).status_code == 200
        # 98,300 tokens: over the 98,000 the 1% margin leaves, under the 98,500 the learned one does.
        near = single("d", 98_300 - 13)
        response = await client.post("/v1/chat/completions", json=near)
    assert response.status_code == 200
    assert int(response.headers["x-context-tokens-before"]) == 98_300
    assert json.loads(route.calls[-1].request.content)["messages"] == near["messages"]
    assert response.headers["x-context-budget"] == str(100_000 - 1_000 - 500)
