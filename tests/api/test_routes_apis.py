"""The routes of every fitted wire API (``/v1/responses``, ``/v1/messages``, Gemini's) end to end through
the ASGI app, the upstream a respx router: what it RECEIVED and what the client got back.

``/v1/messages`` is served here by a stand-in dialect (the chat rules under the Messages API's
name and path) so the routing, headers and counting fallbacks are tested on their own; the real
Anthropic dialect's own tests cover its wire shape.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import respx

from app.core.dialects import CHAT, DIALECTS, MESSAGES
from tests.api import UPSTREAM, chat_ok, proxy, words
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel

RESPONSES_URL = f"{UPSTREAM}/responses"
MESSAGES_URL = f"{UPSTREAM}/messages"
STUB_MESSAGES = replace(CHAT, name="messages", routes=MESSAGES.routes, key_slots=MESSAGES.key_slots)
APIS: dict[str, Any] = {**DIALECTS, "messages": STUB_MESSAGES}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def said(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def long_input(turns: int = 8, size: int = 150) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items += [user(f"question {i} " + words(size, "q")), said(f"answer {i} " + words(size, "a"))]
    return [*items, user("last question")]


def response_ok(input_tokens: int = 10) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [said("hi")],
        "usage": {"input_tokens": input_tokens, "output_tokens": 1, "total_tokens": input_tokens + 1},
    }


def responses_overflow() -> dict[str, Any]:
    return {
        "error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input "
            "and try again.",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }


def sent(route: respx.Route, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[index].request.content)
    return body


async def test_a_fitting_responses_request_is_forwarded_byte_for_byte_with_context_headers() -> None:
    raw = b'{"model":"gpt-test", "input":[{"type":"message","role":"user","content":"hi  there"}] ,"store":0}'
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(return_value=httpx.Response(200, json=response_ok()))
    async with proxy(router) as (client, _):
        response = await client.post(
            "/v1/responses", content=raw, headers={"content-type": "application/json"}
        )
        status = (await client.get("/status.json")).json()
    assert response.status_code == 200 and response.json()["id"] == "resp_1"
    assert route.calls[0].request.content == raw
    assert response.headers["x-context-actions"] == "none" and response.headers["x-context-retries"] == "0"
    assert int(response.headers["x-context-tokens-before"]) > 0
    assert status["counters"]["by_route"].get("responses") == 1


async def test_an_over_budget_responses_request_is_fitted_in_the_responses_shape() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(return_value=httpx.Response(200, json=response_ok()))
    body = {"model": "gpt-test", "input": long_input(), "store": False, "include": ["x"]}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/responses", json=body)
    assert response.status_code == 200
    forwarded = sent(route)
    assert "messages" not in forwarded and forwarded["store"] is False and forwarded["include"] == ["x"]
    assert len(forwarded["input"]) < len(body["input"])
    assert forwarded["input"][-1] == body["input"][-1]  # the newest turn is kept as sent
    assert int(response.headers["x-context-tokens-after"]) < int(response.headers["x-context-tokens-before"])
    assert "dropped_turns" in response.headers["x-context-actions"]


async def test_our_errors_on_the_responses_route_are_in_its_shape() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(return_value=httpx.Response(200, json=response_ok()))
    async with proxy(router) as (client, _):
        not_json = await client.post(
            "/v1/responses", content=b"{nope", headers={"content-type": "application/json"}
        )
        bad_input = await client.post("/v1/responses", json={"model": "gpt-test", "input": 42})
        rejected = await client.post(
            "/v1/responses",
            json={"model": "gpt-test", "input": long_input()},
            headers={"X-Context-Policy": "reject"},
        )
    assert route.call_count == 0
    for answer in (not_json, bad_input, rejected):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "invalid_request_error"
    assert bad_input.json()["error"]["param"] == "input"
    error = rejected.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "input"
    assert rejected.headers["x-context-actions"].startswith("rejected")


async def test_the_body_limit_and_upstream_failures_are_in_the_responses_shape() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(RESPONSES_URL).mock(side_effect=httpx.ConnectError("refused"))
    body = {"model": "gpt-test", "input": "hello"}
    async with proxy(router, max_body_bytes=64) as (client, _):
        too_large = await client.post("/v1/responses", json={**body, "input": words(100)})
        unreachable = await client.post("/v1/responses", json=body)
    assert too_large.status_code == 413
    assert too_large.json()["error"]["code"] == "request_too_large"
    assert unreachable.status_code == 502
    assert unreachable.json()["error"]["code"] == "upstream_unreachable"


async def test_an_upstream_context_error_on_responses_is_retried_smaller() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(
        side_effect=[httpx.Response(400, json=responses_overflow()), httpx.Response(200, json=response_ok())]
    )
    body = {"model": "gpt-test", "input": long_input(turns=3, size=100)}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/responses", json=body)
    assert response.status_code == 200 and route.call_count == 2
    assert response.headers["x-context-retries"] == "1"
    assert len(sent(route, 1)["input"]) < len(body["input"])


async def test_history_kept_upstream_is_forwarded_unchanged_and_said_so() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(
        side_effect=[httpx.Response(200, json=response_ok()), httpx.Response(400, json=responses_overflow())]
    )
    body = {"model": "gpt-test", "previous_response_id": "resp_0", "input": long_input()}
    async with proxy(router) as (client, _):
        ok = await client.post("/v1/responses", json=body)
        overflow = await client.post("/v1/responses", json=body)
    assert ok.status_code == 200 and sent(route, 0) == body
    assert ok.headers["x-context-actions"] == "none"
    assert ok.headers["x-context-warning"] == "history-upstream"
    # The upstream's overflow is classified but nothing here can shrink it: it goes back as is.
    assert overflow.status_code == 400 and overflow.json() == responses_overflow()
    assert route.call_count == 2


def failing_stream(first: bytes) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        yield first
        raise httpx.RemoteProtocolError("peer closed connection")

    return gen()


async def test_a_responses_stream_that_breaks_ends_with_a_responses_error_event() -> None:
    first = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1"}}\n\n'
        b'event: response.output_item.added\ndata: {"type":"response.output_item.added","item":{}}\n\n'
    )
    router = respx.Router(assert_all_called=False)
    router.post(RESPONSES_URL).mock(
        side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=failing_stream(first)
        )
    )
    body = {"model": "gpt-test", "input": "hi", "stream": True}
    async with (
        proxy(router) as (client, _),
        client.stream("POST", "/v1/responses", json=body) as response,
    ):
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert received.startswith(first)
    tail = received[len(first) :]
    assert tail.startswith(b"event: error\ndata: ") and tail.endswith(b"\n\n")
    event = json.loads(tail.split(b"data: ", 1)[1])
    assert event["type"] == "error" and event["code"] == "upstream_protocol_error"


async def test_a_stream_that_breaks_in_its_preamble_is_a_502_in_the_responses_shape() -> None:
    created = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1"}}\n\n'
    router = respx.Router(assert_all_called=False)
    router.post(RESPONSES_URL).mock(
        side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=failing_stream(created)
        )
    )
    async with proxy(router) as (client, _):
        response = await client.post(
            "/v1/responses", json={"model": "gpt-test", "input": "hi", "stream": True}
        )
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol_error"


async def test_the_responses_counting_endpoint_answers_our_exact_count() -> None:
    router = respx.Router(assert_all_called=False)
    upstream = router.post(f"{RESPONSES_URL}/input_tokens").mock(return_value=httpx.Response(500))
    body = {"model": "gpt-test", "input": [user("one two three")]}
    async with proxy(router) as (client, _):
        counted = await client.post("/v1/responses/input_tokens", json=body)
        plan = await client.post("/v1/context/plan", json=body)
        kept_upstream = await client.post(
            "/v1/responses/input_tokens", json={**body, "previous_response_id": "resp_0"}
        )
    assert counted.status_code == 200 and upstream.call_count == 1  # only the one kept upstream
    assert counted.json() == {"object": "response.input_tokens", "input_tokens": plan.json()["tokens_before"]}
    assert counted.headers["x-context-count"] == "exact"
    assert kept_upstream.status_code == 500


async def test_the_dry_run_takes_a_responses_or_messages_body() -> None:
    router = respx.Router(assert_all_called=False)
    body = {"model": "gpt-test", "input": long_input(turns=2, size=10)}
    async with proxy(router, dialects=APIS) as (client, _):
        detected = (await client.post("/v1/context/plan", json=body)).json()
        named = (await client.post("/v1/context/plan?api=responses", json=body)).json()
        unknown = await client.post("/v1/context/plan", json=body, headers={"X-Context-Api": "nope"})
    async with proxy(router) as (client, _):  # the real Messages dialect recognises its header
        header = await client.post(
            "/v1/context/plan",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            headers={"anthropic-version": "2023-06-01"},
        )
        plain = await client.post(
            "/v1/context/plan", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
    assert detected["api"] == named["api"] == "responses" and detected["tokens_before"] > 0
    assert header.json()["api"] == "messages" and plain.json()["api"] == "chat"
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "api"


async def test_the_dry_run_of_a_cut_body_is_the_body_the_upstream_receives_in_its_own_shape() -> None:
    router = respx.Router(assert_all_called=False)
    responses = router.post(RESPONSES_URL).mock(return_value=httpx.Response(200, json=response_ok()))
    messages = router.post(MESSAGES_URL).mock(return_value=httpx.Response(200, json={"type": "message"}))
    turns: list[dict[str, Any]] = []
    for i in range(8):
        turns += [
            {"role": "user", "content": [{"type": "text", "text": f"question {i} " + words(150, "q")}]},
            {"role": "assistant", "content": f"answer {i} " + words(150, "a")},
        ]
    bodies = {
        "responses": (
            {"model": "gpt-test", "instructions": "be brief", "input": long_input()},
            "/v1/responses",
        ),
        "messages": (
            {"model": "claude-x", "system": "be brief", "max_tokens": 50, "messages": [*turns, turns[0]]},
            "/v1/messages",
        ),
    }
    async with proxy(router) as (client, _):
        for api, (body, path) in bodies.items():
            plan = (await client.post(f"/v1/context/plan?api={api}", json=body)).json()
            sent_for_real = await client.post(path, json=body)
            assert sent_for_real.status_code == 200, sent_for_real.text
            assert plan["changed"] is True and plan["fits"] is True
            assert plan["body"] == sent(responses if api == "responses" else messages), api
            assert "messages" not in plan  # not the engine's chat-form messages
    assert sent(responses)["instructions"] == "be brief" and "messages" not in sent(responses)
    assert sent(messages)["system"] == "be brief"  # Anthropic's top-level system, not a message
    assert all(m["role"] != "system" for m in sent(messages)["messages"])


async def test_the_messages_route_sends_the_operator_key_as_x_api_key_and_anthropic_headers() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(MESSAGES_URL).mock(return_value=httpx.Response(200, json=chat_ok()))
    headers = {"x-api-key": "client-key", "anthropic-version": "2023-06-01", "anthropic-beta": "b1"}
    body = {"model": "claude-x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    async with proxy(router, dialects=APIS, upstream_api_key="sk-operator") as (client, _):
        response = await client.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 200 and response.headers["x-context-actions"] == "none"
    received = route.calls[0].request.headers
    assert received["x-api-key"] == "sk-operator" and "authorization" not in received
    assert received["anthropic-version"] == "2023-06-01" and received["anthropic-beta"] == "b1"


async def test_messages_count_tokens_asks_the_upstream_first_then_counts_itself() -> None:
    router = respx.Router(assert_all_called=False)
    upstream = router.post(f"{MESSAGES_URL}/count_tokens").mock(
        side_effect=[httpx.Response(200, json={"input_tokens": 4242}), httpx.Response(404, json={})]
    )
    body = {"model": "claude-x", "messages": [{"role": "user", "content": "one two three"}]}
    async with proxy(router, dialects=APIS) as (client, _):
        theirs = await client.post("/v1/messages/count_tokens", json=body)
        ours = await client.post("/v1/messages/count_tokens", json=body)
        plan = await client.post("/v1/context/plan?api=messages", json=body)
    assert upstream.call_count == 2
    assert theirs.json() == {"input_tokens": 4242}
    assert ours.status_code == 200 and ours.json()["input_tokens"] == plan.json()["tokens_before"] > 0
    assert ours.headers["x-context-count"] == "exact"


async def test_gemini_count_tokens_asks_the_upstream_first_then_counts_itself() -> None:
    origin = UPSTREAM.rsplit("/v1", 1)[0]  # Gemini's paths go to the client's own path at the origin
    router = respx.Router(assert_all_called=False)
    upstream = router.post(f"{origin}/v1beta/models/gemini-x:countTokens").mock(
        side_effect=[httpx.Response(200, json={"totalTokens": 4242}), httpx.Response(404, json={})]
    )
    body = {"contents": [{"role": "user", "parts": [{"text": "one two three"}]}]}
    async with proxy(router) as (client, _):
        theirs = await client.post("/v1beta/models/gemini-x:countTokens", json=body)
        ours = await client.post("/v1beta/models/gemini-x:countTokens?key=k", json=body)
        plan = await client.post("/v1/context/plan?api=gemini", json={**body, "model": "gemini-x"})
    assert upstream.call_count == 2 and upstream.calls[1].request.url.query == b"key=k"
    assert theirs.json() == {"totalTokens": 4242} and "x-context-count" not in theirs.headers
    assert ours.status_code == 200 and ours.json()["totalTokens"] == plan.json()["tokens_before"] > 0
    assert ours.headers["x-context-count"] == plan.json()["count"]  # ours, labelled as the plan's


async def test_our_errors_before_a_json_array_stream_are_that_arrays_form() -> None:
    router = respx.Router(assert_all_called=False)
    too_long = {"contents": [{"role": "user", "parts": [{"text": words(5000)}]}]}
    path = "/v1beta/models/gemini-x:streamGenerateContent"
    async with proxy(router) as (client, _):
        array = await client.post(path, json=too_long, headers={"X-Context-Policy": "reject"})
        events = await client.post(f"{path}?alt=sse", json=too_long, headers={"X-Context-Policy": "reject"})
        bad = await client.post(path, content=b"{not json")
    # Without alt=sse Google answers an error as the array's one element (api-core's REST
    # transport and python-genai read it so); with it, as a JSON object.
    (element,) = array.json()
    assert array.status_code == 400 and array.headers["content-type"] == "application/json"
    assert element["error"]["status"] == "INVALID_ARGUMENT"
    assert "exceeds the maximum number of tokens allowed" in element["error"]["message"]
    assert events.status_code == 400 and events.json()["error"] == element["error"]
    assert bad.status_code == 400 and set(bad.json()[0]) == {"error"}
    assert not router.calls


async def test_without_its_dialect_an_api_is_passed_through_and_head_root_answers() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(MESSAGES_URL).mock(return_value=httpx.Response(200, json={"ok": 1}))
    async with proxy(router, dialects={"chat": CHAT}) as (client, _):
        passed = await client.post("/v1/messages", json={"model": "m", "messages": "anything"})
        head = await client.head("/")
    assert passed.status_code == 200 and "x-context-actions" not in passed.headers
    assert route.call_count == 1
    assert head.status_code == 200


async def test_an_overflow_reported_inside_a_200_stream_is_retried_before_the_client_sees_it() -> None:
    fake = FakeResponsesUpstream([FakeModel("gpt-test", window_tokens=500)])
    fake.overflow_in_stream = True
    router = respx.Router(assert_all_called=False)
    router.post(RESPONSES_URL).mock(side_effect=fake.handler)
    body = {"model": "gpt-test", "input": long_input(turns=3, size=100), "stream": True}
    async with (
        proxy(router) as (client, _),
        client.stream("POST", "/v1/responses", json=body) as response,
    ):
        received = b"".join([chunk async for chunk in response.aiter_raw()])
        headers = response.headers
    assert [r.status for r in fake.requests] == [200, 200]
    assert headers["x-context-retries"] == "1"
    assert b"response.completed" in received and b"response.failed" not in received
    assert received.startswith(b"event: response.created\n")
    first, retry = (json.loads(r.body) for r in fake.requests)
    assert len(retry["input"]) < len(first["input"])


async def test_a_stream_that_fails_for_another_reason_is_passed_on_as_it_came() -> None:
    failed = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"r"}}\n\n'
        b'event: response.failed\ndata: {"type":"response.failed","response":{"id":"r","status":"failed",'
        b'"error":{"code":"server_error","message":"boom"}}}\n\n'
    )
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(
        side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=failed
        )
    )
    async with (
        proxy(router) as (client, _),
        client.stream(
            "POST", "/v1/responses", json={"model": "gpt-test", "input": "hi", "stream": True}
        ) as response,
    ):
        received = b"".join([chunk async for chunk in response.aiter_raw()])
    assert route.call_count == 1 and received == failed


async def test_proxy_keys_accept_x_api_key_and_refuse_in_the_routes_shape() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(RESPONSES_URL).mock(return_value=httpx.Response(200, json=response_ok()))
    body = {"model": "gpt-test", "input": "hi"}
    settings: dict[str, Any] = {"api_keys": "proxy-key", "upstream_api_key": "sk-operator"}
    async with proxy(router, **settings) as (client, _):
        refused = await client.post("/v1/responses", json=body, headers={"x-api-key": "wrong"})
        chat = await client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        accepted = await client.post("/v1/responses", json=body, headers={"x-api-key": "proxy-key"})
        probe = await client.head("/")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert chat.status_code == 401 and chat.json()["error"]["type"] == "invalid_request_error"
    assert accepted.status_code == 200 and route.call_count == 1
    assert route.calls[0].request.headers["authorization"] == "Bearer sk-operator"
    assert "x-api-key" not in route.calls[0].request.headers
    assert probe.status_code == 200


async def test_a_request_of_no_api_speaks_the_fallback_the_composition_root_injects() -> None:
    # The composition root chooses who speaks for a request no route took: chat's (OpenAI's) shape
    # when chat is registered, else the registry's first: no signature below defaults to one.
    router = respx.Router(assert_all_called=False)
    async with proxy(router) as (client, app):
        default = await client.get("/no/such/path")
        assert app.state.fallback_dialect is DIALECTS["chat"]
    async with proxy(router, dialects={"messages": DIALECTS["messages"]}) as (client, app):
        anthropic = await client.get("/no/such/path")
        assert app.state.fallback_dialect is DIALECTS["messages"]
    assert default.status_code == anthropic.status_code == 404
    assert set(default.json()["error"]) == {"message", "type", "param", "code"}  # OpenAI's
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "not_found_error"
