"""The ASGI app end to end, with the upstream a respx router: what the upstream RECEIVED."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import orjson
import respx

from app.core.dialects import CHAT as CHAT_API
from app.core.messages import pairing_problems
from tests.api import UPSTREAM, WINDOW_TOKENS, chat_ok, forwarded_calls, openai_overflow, proxy, words

CHAT = f"{UPSTREAM}/chat/completions"


def long_conversation(turns: int = 8, size: int = 150) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + words(size, "q")})
        messages.append({"role": "assistant", "content": f"answer {i} " + words(size, "a")})
    messages.append({"role": "user", "content": "last question"})
    return messages


def sent_body(route: respx.Route, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[index].request.content)
    return body


async def test_fitting_request_is_forwarded_byte_for_byte_with_context_headers() -> None:
    raw = b'{ "messages" :[{"content":"hello  there","role":"user"}],\n  "model":"gpt-test" ,"zeta":1 }'
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(
        return_value=httpx.Response(200, json=chat_ok(), headers={"x-request-id": "up-1"})
    )
    async with proxy(router) as (client, _):
        response = await client.post(
            "/v1/chat/completions",
            content=raw,
            headers={
                "content-type": "application/json",
                "x-context-keep-turns": "3",
                "X-Context-Budget": "700",
                "x-custom": "kept",
                "user-agent": "OpenAI/Python 1.99",
                "accept-encoding": "identity",
            },
        )
    assert response.status_code == 200
    assert response.json() == chat_ok()
    sent = route.calls[0].request
    assert sent.content == raw
    assert not [k for k in sent.headers if k.lower().startswith("x-context-")]
    assert sent.headers["x-custom"] == "kept"
    assert sent.headers.get_list("user-agent") == ["OpenAI/Python 1.99"]
    assert sent.headers.get_list("accept-encoding") == ["identity"]
    assert response.headers["x-upstream-request-id"] == "up-1"  # ours is X-Request-ID
    assert response.headers["x-context-window"] == str(WINDOW_TOKENS)
    assert response.headers["x-context-budget"] == "700"
    assert response.headers["x-context-tokens-before"] == response.headers["x-context-tokens-after"]
    assert int(response.headers["x-context-tokens-before"]) > 0
    assert response.headers["x-context-count"] == "exact"
    assert response.headers["x-context-actions"] == "none"
    assert response.headers["x-context-retries"] == "0"


async def test_authorization_is_forwarded_as_is_without_an_upstream_key() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    async with proxy(router) as (client, _):
        await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer client-key"})
    assert route.calls[0].request.headers["authorization"] == "Bearer client-key"


async def test_authorization_is_replaced_when_an_upstream_key_is_configured() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    async with proxy(router, upstream_api_key="sk-operator") as (client, _):
        await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer client-key"})
    assert route.calls[0].request.headers.get_list("authorization") == ["Bearer sk-operator"]


async def test_per_model_route_sends_to_its_own_upstream() -> None:
    router = respx.Router(assert_all_called=False)
    local = router.post("http://vllm.local:8000/v1/chat/completions").mock(
        return_value=httpx.Response(200, json=chat_ok())
    )
    cloud = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    routes = {"meta-llama/": "http://vllm.local:8000/v1"}
    async with proxy(router, upstream_routes=routes) as (client, _):
        for model in ("meta-llama/Llama-3.1-8B", "gpt-test"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert local.call_count == 1 and cloud.call_count == 1


async def test_over_budget_request_is_rewritten_and_keeps_every_other_key() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "gpt-test", "messages": long_conversation(), "temperature": 0.2, "user": "u1"}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    sent = sent_body(route)
    assert {k: v for k, v in sent.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }
    assert sent["messages"] != body["messages"]
    assert sent["messages"][0] == body["messages"][0]
    assert sent["messages"][-1] == body["messages"][-1]
    assert pairing_problems(sent["messages"]) == []
    before = int(response.headers["x-context-tokens-before"])
    after = int(response.headers["x-context-tokens-after"])
    assert after < before
    assert after <= int(response.headers["x-context-budget"])
    assert response.headers["x-context-actions"] != "none"


async def test_reject_policy_over_budget_is_a_400_context_length_exceeded_and_no_upstream_call() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "gpt-test", "messages": long_conversation()}
    async with proxy(router) as (client, _):
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"X-Context-Policy": "reject"}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["type"] == "invalid_request_error"
    assert str(WINDOW_TOKENS) in error["message"]
    assert route.call_count == 0
    assert response.headers["x-context-window"] == str(WINDOW_TOKENS)
    assert int(response.headers["x-context-tokens-after"]) > int(response.headers["x-context-budget"])


async def test_tool_definitions_alone_over_the_budget_are_what_the_400_names() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    tool = {
        "type": "function",
        "function": {"name": "read", "description": words(WINDOW_TOKENS), "parameters": {"type": "object"}},
    }
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "the tool definitions alone (" in message and "exceed the input budget" in message
    assert "shortening the conversation as far as" not in message
    assert route.call_count == 0


async def test_off_policy_forwards_an_over_budget_request_unchanged() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    raw = orjson.dumps({"model": "gpt-test", "messages": long_conversation()})
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", content=raw, headers={"X-Context-Policy": "off"})
    assert response.status_code == 200
    assert route.calls[0].request.content == raw


def sse_stream(chunks: list[bytes]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return gen()


SSE_CHUNKS = [
    b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\n',
    b"data: [DONE]\n\n",
]


async def test_streaming_passes_chunks_through_in_order_with_context_headers() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(
        side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=sse_stream(SSE_CHUNKS)
        )
    )
    body = {
        "model": "gpt-test",
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with (
        proxy(router) as (client, _),
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["x-context-retries"] == "0"
        assert response.headers["x-context-count"] == "exact"
        received = [chunk async for chunk in response.aiter_raw()]
    assert b"".join(received) == b"".join(SSE_CHUNKS)
    assert sent_body(route)["stream_options"] == {"include_usage": True}


async def test_context_overflow_from_upstream_is_retried_smaller_once() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(
        side_effect=[
            httpx.Response(400, json=openai_overflow(limit=600, prompt=900)),
            httpx.Response(200, json=chat_ok("saved")),
        ]
    )
    body = {"model": "gpt-test", "messages": long_conversation(turns=2, size=150)}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.json() == chat_ok("saved")
    assert route.call_count == 2
    first, second = route.calls[0].request.content, route.calls[1].request.content
    assert len(second) < len(first)
    assert pairing_problems(json.loads(second)["messages"]) == []
    assert response.headers["x-context-retries"] == "1"
    assert response.headers["x-context-actions"] != "none"


async def test_streaming_request_is_retried_too_before_the_first_byte() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(
        side_effect=[
            httpx.Response(400, json=openai_overflow(limit=600, prompt=900)),
            httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=sse_stream(SSE_CHUNKS)
            ),
        ]
    )
    body = {"model": "gpt-test", "stream": True, "messages": long_conversation(turns=2, size=150)}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.content == b"".join(SSE_CHUNKS)
    assert route.call_count == 2
    assert response.headers["x-context-retries"] == "1"


async def test_retries_exhausted_return_the_upstreams_last_error_as_is() -> None:
    router = respx.Router(assert_all_called=False)
    error = openai_overflow(limit=560, prompt=700)
    route = router.post(CHAT).mock(
        return_value=httpx.Response(400, json=error, headers={"x-upstream": "yes"})
    )
    body = {"model": "gpt-test", "messages": long_conversation(turns=12, size=20)}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=body, headers={"X-Context-Keep-Turns": "0"})
    assert response.status_code == 400
    assert response.json() == error
    assert response.headers["x-upstream"] == "yes"
    assert route.call_count == 3
    sizes = [len(call.request.content) for call in route.calls]
    assert sizes[0] > sizes[1] > sizes[2]
    assert response.headers["x-context-retries"] == "2"


async def test_non_overflow_upstream_errors_pass_through_unchanged_with_one_call() -> None:
    cases = [
        (
            400,
            b'{"error":{"message":"bad temperature","type":"invalid_request_error","param":"temperature"}}',
        ),
        (429, b'{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}'),
        (500, b"upstream exploded"),
    ]
    for status, raw_error in cases:
        router = respx.Router(assert_all_called=False)
        route = router.post(CHAT).mock(return_value=httpx.Response(status, content=raw_error))
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        async with proxy(router) as (client, _):
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == status
        assert response.content == raw_error
        assert route.call_count == 1
        assert response.headers["x-context-retries"] == "0"


async def test_passthrough_get_models_with_query_untouched() -> None:
    router = respx.Router(assert_all_called=False)
    listing = b'{"object":"list","data":[{"id":"gpt-test"}]}'
    route = router.get(f"{UPSTREAM}/models").mock(
        return_value=httpx.Response(200, content=listing, headers={"x-up": "1", "keep-alive": "timeout=5"})
    )
    async with proxy(router) as (client, _):
        response = await client.get(
            "/v1/models?limit=2&after=a%2Fb", headers={"Authorization": "Bearer k", "X-Context-Budget": "5"}
        )
    assert response.status_code == 200
    assert response.content == listing
    assert response.headers["x-up"] == "1"
    assert "keep-alive" not in response.headers
    assert "x-context-window" not in response.headers
    sent = route.calls[0].request
    assert sent.url.query == b"limit=2&after=a%2Fb"
    assert sent.headers["authorization"] == "Bearer k"
    assert "x-context-budget" not in sent.headers


async def test_passthrough_post_embeddings_body_and_status_untouched() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(f"{UPSTREAM}/embeddings").mock(
        return_value=httpx.Response(201, content=b'{"data":[]}', headers={"content-type": "application/json"})
    )
    raw = b'{"input": ["a  b"],  "model":"text-embedding-3-small"}'
    async with proxy(router) as (client, _):
        response = await client.post(
            "/v1/embeddings", content=raw, headers={"content-type": "application/json"}
        )
    assert response.status_code == 201
    assert response.content == b'{"data":[]}'
    assert route.calls[0].request.content == raw


async def test_dry_run_returns_the_plan_without_calling_the_upstream() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.route().mock(return_value=httpx.Response(500))
    body = {"model": "unknown-model", "messages": long_conversation()}
    async with proxy(router) as (client, _):
        response = await client.post("/v1/context/plan", json=body, headers={"X-Context-Window": "5000"})
        small = await client.post(
            "/v1/context/plan", json=body, headers={"X-Context-Window": "300", "X-Context-Policy": "reject"}
        )
    assert forwarded_calls(route) == []
    assert response.status_code == 200
    plan = response.json()
    assert plan["model"] == "unknown-model"
    assert plan["spec"]["window_tokens"] == 5000
    assert plan["spec"]["source"] == "request"
    assert plan["spec"]["guessed"] is True
    assert plan["fits"] is True and plan["changed"] is False
    assert plan["body"] == body  # it fits: forwarded as it came
    assert len(plan["message_tokens"]) == len(body["messages"])
    assert plan["tokens_before"] == plan["tokens_after"]
    assert plan["count"] == "exact"
    assert small.status_code == 200
    assert small.json()["fits"] is False


async def test_lone_surrogates_are_planned_and_forwarded_when_cut_not_a_500() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(f"{UPSTREAM}/chat/completions").mock(
        return_value=httpx.Response(200, json={"choices": []})
    )
    messages = [*long_conversation(), {"role": "user", "content": "odd \ud800 text"}]
    raw = json.dumps({"model": "unknown-model", "messages": messages}).encode()
    assert b"\\ud800" in raw  # the escape, as a client's JSON library writes it
    async with proxy(router) as (client, _):
        plan = await client.post("/v1/context/plan", content=raw, headers={"X-Context-Window": "1500"})
        chat = await client.post("/v1/chat/completions", content=raw, headers={"X-Context-Window": "1500"})
    assert plan.status_code == 200
    assert plan.json()["changed"] is True and plan.json()["fits"] is True, plan.json()["actions"]
    assert chat.status_code == 200
    forwarded = json.loads(route.calls[0].request.content)
    assert forwarded["messages"][-1]["content"] == "odd \ud800 text"


async def test_healthz_and_readyz() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(401, json={"error": {}}))
    async with proxy(router) as (client, _):
        health = await client.get("/healthz")
        ready = await client.get("/readyz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json()["upstreams"][UPSTREAM] == {"reachable": True, "status": 401}
    assert ready.json()["vocabularies_ready"] is True


async def test_readyz_is_503_when_the_upstream_is_unreachable() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(side_effect=httpx.ConnectError("refused"))
    async with proxy(router) as (client, _):
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["upstreams"][UPSTREAM]["reachable"] is False


async def test_access_log_line_has_the_numbers_but_no_prompt_or_key(caplog: Any) -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "secret prompt words"}]}
    caplog.set_level("INFO", logger="ctxproxy.access")
    async with proxy(router) as (client, _):
        await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-secret"})
    records = [r for r in caplog.records if r.name == "ctxproxy.access"]
    assert len(records) == 1
    fields = records[0].access  # type: ignore[attr-defined]
    assert fields["model"] == "gpt-test"
    assert fields["status"] == 200 and fields["upstream_status"] == 200
    assert fields["retries"] == 0
    assert fields["tokens_before"] > 0 and "latency_ms" in fields
    assert "secret" not in json.dumps(fields)


async def test_client_disconnect_stops_the_stream_and_closes_the_upstream() -> None:
    from app.api.responses import UpstreamStreamResponse
    from app.upstream.client import UpstreamResponse

    closed: list[bool] = []
    produced: list[int] = []

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            n = 0
            while True:
                n += 1
                produced.append(n)
                yield b"data: {}\n\n"

        async def aclose(self) -> None:
            closed.append(True)

    upstream = UpstreamResponse.of_httpx(httpx.Response(200, stream=Endless()), base_url=UPSTREAM)
    sent: list[dict[str, Any]] = []
    disconnect = anyio.Event()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if len(sent) == 3:
            disconnect.set()
        await anyio.sleep(0)  # a real server's send yields to the loop

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    scope: dict[str, Any] = {"type": "http"}
    await UpstreamStreamResponse(upstream, dialect=CHAT_API)(scope, receive, send)
    assert closed == [True]
    assert sent[0]["type"] == "http.response.start"
    assert all(m.get("more_body") for m in sent[1:])
    assert len(produced) < 100
    assert scope["ctxproxy.access"]["client_disconnected"] is True


async def test_passthrough_streams_a_non_json_body_with_its_declared_length() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(f"{UPSTREAM}/files").mock(return_value=httpx.Response(200, json={"id": "file-1"}))
    raw = b"--b\r\ncontent-disposition: form-data; name=purpose\r\n\r\nbatch\r\n--b--\r\n"
    async with proxy(router) as (client, _):
        response = await client.post(
            "/v1/files", content=raw, headers={"content-type": "multipart/form-data; boundary=b"}
        )
    assert response.status_code == 200
    sent = route.calls[0].request
    assert sent.content == raw
    assert sent.headers["content-length"] == str(len(raw))
    assert "transfer-encoding" not in sent.headers


async def test_passthrough_json_body_is_routed_by_model_when_routes_exist() -> None:
    router = respx.Router(assert_all_called=False)
    local = router.post("http://vllm.local/v1/embeddings").mock(return_value=httpx.Response(200, json={}))
    raw = b'{"model": "bge-small", "input": "x"}'
    async with proxy(router, upstream_routes={"bge-": "http://vllm.local/v1"}) as (client, _):
        response = await client.post(
            "/v1/embeddings", content=raw, headers={"content-type": "application/json"}
        )
    assert response.status_code == 200
    assert local.calls[0].request.content == raw


async def test_a_send_that_fails_because_the_client_left_ends_quietly_and_closes_the_upstream() -> None:
    from app.api.responses import UpstreamStreamResponse
    from app.upstream.client import UpstreamResponse

    closed: list[bool] = []

    class Chunks(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for _ in range(5):
                yield b"data: {}\n\n"

        async def aclose(self) -> None:
            closed.append(True)

    upstream = UpstreamResponse.of_httpx(httpx.Response(200, stream=Chunks()), base_url=UPSTREAM)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            raise OSError("client disconnected")
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    await UpstreamStreamResponse(upstream, dialect=CHAT_API)({"type": "http"}, receive, send)
    assert closed == [True]
    assert [m["type"] for m in sent] == ["http.response.start"]


async def test_another_method_on_a_routes_path_refused_by_the_upstream_is_our_405_in_its_apis_shape() -> None:
    router = respx.Router(assert_all_called=False)
    # As Starlette (the demo upstream, FastAPI servers) answers: plain text, its own Allow.
    refused = router.route(method__in=["GET", "PUT", "HEAD"]).mock(
        return_value=httpx.Response(405, text="Method Not Allowed", headers={"allow": "POST"})
    )
    async with proxy(router, discovery=False) as (client, _):
        chat = await client.get("/v1/chat/completions")
        put = await client.put("/v1/responses", json={})
        messages = await client.get("/v1/messages", headers={"anthropic-version": "2023-06-01"})
        counting = await client.get("/v1/messages/count_tokens")
        head = await client.head("/v1/chat/completions")
    assert refused.call_count == 5  # the upstream is asked: the method is its to refuse
    for response in (chat, put, messages, counting, head):
        assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert chat.json() == {
        "error": {
            "message": "GET is not allowed on /v1/chat/completions: this route takes POST.",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert put.json()["error"]["message"].startswith("PUT is not allowed on /v1/responses")
    assert messages.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "GET is not allowed on /v1/messages: this route takes POST.",
        },
    }
    assert counting.json()["type"] == "error"
    assert head.content == b""


async def test_a_get_the_upstream_serves_on_a_routes_path_is_passed_through() -> None:
    """OpenAI lists stored chat completions at ``GET /v1/chat/completions``: not ours to refuse."""
    router = respx.Router(assert_all_called=False)
    listed = {"object": "list", "data": [{"id": "chatcmpl-1"}], "has_more": False}
    route = router.get(CHAT).mock(return_value=httpx.Response(200, json=listed))
    other = router.get(f"{UPSTREAM}/models").mock(
        return_value=httpx.Response(405, text="no", headers={"allow": "PUT"})
    )
    async with proxy(router, discovery=False) as (client, _):
        response = await client.get("/v1/chat/completions?limit=1", headers={"Authorization": "Bearer sk-c"})
        not_a_route = await client.get("/v1/models")
    assert response.status_code == 200 and response.json() == listed
    assert route.calls[0].request.url.query == b"limit=1"
    assert route.calls[0].request.headers["authorization"] == "Bearer sk-c"
    # A 405 on a path that is no route of ours is the upstream's answer, as it came.
    assert not_a_route.status_code == 405 and not_a_route.text == "no" and other.call_count == 1
