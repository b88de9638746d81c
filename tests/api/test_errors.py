"""Every bad input gets the right 4xx in OpenAI's shape, upstream failures get 502/504, bugs a
logged 500, and the app keeps serving afterwards."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import respx

from app.api.errors import BodyTooLarge, error_info_of, render
from app.core.dialects import DIALECTS
from app.core.errors import CannotFit, InvalidRequest
from app.upstream.errors import UpstreamProtocolError, UpstreamTimeout, UpstreamUnreachable
from tests.api import UPSTREAM, chat_ok, forwarded_calls, proxy

CHAT = f"{UPSTREAM}/chat/completions"
GOOD = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}


def assert_openai_error(response: httpx.Response, status: int, *, param: Any = ..., code: Any = ...) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param is not ...:
        assert error["param"] == param
    if code is not ...:
        assert error["code"] == code


BAD_BODIES: list[tuple[bytes, Any]] = [
    (b"{not json", None),
    (b"", None),
    (b"\xff\xfe", None),
    (b"[1, 2]", None),
    (b'"text"', None),
    (b'{"model": "gpt-test"}', "messages"),
    (b'{"model": "gpt-test", "messages": "hi"}', "messages"),
    (b'{"model": "gpt-test", "messages": []}', "messages"),
    (b'{"model": "gpt-test", "messages": [42]}', "messages[0]"),
    (b'{"model": "gpt-test", "messages": [{"content": "x"}]}', "messages[0].role"),
    (b'{"model": "gpt-test", "messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role"),
    (b'{"model": "gpt-test", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', "model"),
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/context/plan"])
async def test_bad_bodies_are_400_invalid_request_and_the_app_keeps_serving(path: str) -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router) as (client, _):
        for raw, param in BAD_BODIES:
            response = await client.post(path, content=raw, headers={"content-type": "application/json"})
            assert_openai_error(response, 400, param=param)
            assert response.json()["error"]["type"] == "invalid_request_error"
        assert route.call_count == 0
        assert (await client.post("/v1/chat/completions", json=GOOD)).status_code == 200


BAD_HEADERS = [
    ("X-Context-Budget", "0"),
    ("X-Context-Budget", "-5"),
    ("X-Context-Budget", "ten"),
    ("X-Context-Budget", "1.5"),
    ("X-Context-Reserve", "-1"),
    ("X-Context-Window", "0"),
    ("X-Context-Window", "+100"),
    ("X-Context-Policy", "shrink"),
    ("X-Context-Keep-Turns", "-1"),
    ("X-Context-Keep-Turns", "two"),
]


@pytest.mark.parametrize(("name", "value"), BAD_HEADERS)
async def test_bad_context_headers_are_400_naming_the_header(name: str, value: str) -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router) as (client, _):
        response = await client.post("/v1/chat/completions", json=GOOD, headers={name: value})
    assert_openai_error(response, 400, param=name, code=None)
    assert name in response.json()["error"]["message"]
    assert route.call_count == 0


async def test_body_over_the_limit_is_413_from_content_length() -> None:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router, max_body_bytes=100) as (client, _):
        big = {"model": "gpt-test", "messages": [{"role": "user", "content": "x" * 200}]}
        response = await client.post("/v1/chat/completions", json=big)
        assert_openai_error(response, 413, code="request_too_large")
        assert (await client.post("/v1/chat/completions", json=GOOD)).status_code == 200
    assert route.call_count == 1


async def test_chunked_body_over_the_limit_is_413_while_reading() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    pulled: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(50):
            pulled.append(i)
            yield b" " * 40

    async with proxy(router, max_body_bytes=100) as (client, _):
        response = await client.post("/v1/chat/completions", content=chunks())
    assert_openai_error(response, 413, code="request_too_large")


async def test_upstream_unreachable_is_502_and_timeout_is_504() -> None:
    for error, status, code in (
        (httpx.ConnectError("refused"), 502, "upstream_unreachable"),
        (httpx.ReadTimeout("slow"), 504, "upstream_timeout"),
        (httpx.RemoteProtocolError("garbage"), 502, "upstream_protocol_error"),
    ):
        router = respx.Router(assert_all_called=False)
        router.post(CHAT).mock(side_effect=error)
        async with proxy(router) as (client, _):
            response = await client.post("/v1/chat/completions", json=GOOD)
            assert_openai_error(response, status, code=code)
            assert response.json()["error"]["type"] == "upstream_error"


async def test_unknown_route_is_an_openai_shaped_404() -> None:
    async with proxy(respx.Router(assert_all_called=False)) as (client, _):
        response = await client.get("/nope")
    assert_openai_error(response, 404)


async def test_a_bug_is_a_logged_openai_shaped_500_and_the_app_keeps_serving(caplog: Any) -> None:
    class Exploding:
        calls = 0

        def resolve(self, model: str, /) -> Any:
            Exploding.calls += 1
            if Exploding.calls == 1:
                raise RuntimeError("bug in the model table")
            from tests.api import OneModelRegistry

            return OneModelRegistry().resolve(model)

    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router, registry=Exploding()) as (client, _):
        first = await client.post("/v1/chat/completions", json=GOOD)
        second = await client.post("/v1/chat/completions", json=GOOD)
    assert_openai_error(first, 500)
    assert first.json()["error"]["type"] == "server_error"
    assert "bug in the model table" not in first.text
    assert second.status_code == 200
    assert any("RuntimeError" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_status_mapping_covers_every_error_the_proxy_raises() -> None:
    fit = CannotFit(tokens=900, budget_tokens=700, window_tokens=1000, reserve_tokens=200, reason="r")
    for dialect in DIALECTS.values():
        info = error_info_of(fit, dialect)
        # The conversation that does not fit is the dialect's own array (``items_key``).
        assert (info.status, info.code, info.param) == (400, "context_length_exceeded", dialect.items_key)
        assert "900" in info.message and "700" in info.message
        bad = error_info_of(InvalidRequest("m", param="p"), dialect)
        assert (bad.status, bad.message, bad.code, bad.param) == (400, "m", "invalid_request_error", "p")
        assert error_info_of(BodyTooLarge(limit_bytes=5), dialect).status == 413
        assert error_info_of(UpstreamUnreachable("x"), dialect).status == 502
        assert error_info_of(UpstreamTimeout("x"), dialect).status == 504
        assert error_info_of(UpstreamProtocolError("x"), dialect).status == 502
        assert error_info_of(ValueError("x"), dialect).status == 500


@pytest.mark.parametrize(
    ("exc", "status", "type_", "code"),
    [
        (InvalidRequest("m", param="p"), 400, "invalid_request_error", None),
        (BodyTooLarge(limit_bytes=5), 413, "invalid_request_error", "request_too_large"),
        (UpstreamUnreachable("x"), 502, "upstream_error", "upstream_unreachable"),
        (UpstreamTimeout("x"), 504, "upstream_error", "upstream_timeout"),
        (UpstreamProtocolError("x"), 502, "upstream_error", "upstream_protocol_error"),
        (ValueError("x"), 500, "server_error", None),
    ],
)
def test_chats_errors_are_in_openai_shape(exc: Exception, status: int, type_: str, code: str | None) -> None:
    response = render(exc, DIALECTS["chat"])
    error = json.loads(response.body)["error"]
    assert response.status_code == status
    assert list(error) == ["message", "type", "param", "code"]
    assert (error["type"], error["code"]) == (type_, code)


async def _last_resort_run(*, fail_after_start: bool, observed: bool) -> list[dict[str, Any]]:
    """Run a failing app under LastResortMiddleware (under the observability middleware when
    ``observed``) and return the messages sent to the server."""
    from app.api.errors import LastResortMiddleware
    from app.observability import ObservabilityMiddleware
    from app.observability.observer import Observability

    async def broken(scope: Any, receive: Any, send: Any) -> None:
        if fail_after_start:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("bug")

    app: Any = LastResortMiddleware(broken)
    if observed:
        observability = Observability(version="t", upstream_base_url=UPSTREAM)
        app = ObservabilityMiddleware(app, observability=observability)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    # The app's fallback dialect speaks for a request no route took (the composition root's choice).
    host = SimpleNamespace(state=SimpleNamespace(fallback_dialect=DIALECTS["chat"]))
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "app": host}
    await app(scope, receive, send)
    return sent


@pytest.mark.parametrize("observed", [False, True])
async def test_last_resort_renders_a_500_before_the_start_and_nothing_after(observed: bool) -> None:
    before = await _last_resort_run(fail_after_start=False, observed=observed)
    assert [m["type"] for m in before][:1] == ["http.response.start"] and before[0]["status"] == 500
    after = await _last_resort_run(fail_after_start=True, observed=observed)
    assert [m.get("status") for m in after] == [200]


async def test_the_413_names_the_setting() -> None:
    async with proxy(respx.Router(assert_all_called=False), max_body_bytes=100) as (client, _):
        big = {"model": "gpt-test", "messages": [{"role": "user", "content": "x" * 200}]}
        response = await client.post("/v1/chat/completions", json=big)
    assert_openai_error(response, 413)
    assert "CTXPROXY_MAX_BODY_BYTES" in response.json()["error"]["message"]


@pytest.mark.parametrize(("method", "path"), [("POST", "/chat/completions"), ("GET", "/models")])
async def test_a_path_missing_v1_gets_a_hint(method: str, path: str) -> None:
    async with proxy(respx.Router(assert_all_called=False)) as (client, _):
        response = await client.request(method, path, json=GOOD if method == "POST" else None)
    assert_openai_error(response, 404)
    message = response.json()["error"]["message"]
    assert f"Did you mean /v1{path}?" in message and "base URL must end with /v1" in message


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    return message


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_a_doubled_v1_is_our_404_in_the_owning_apis_shape_with_the_hint_and_is_not_forwarded(
    method: str,
) -> None:
    router = respx.Router(assert_all_called=False)
    anything = router.route().mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    async with proxy(router) as (client, _):
        messages = await client.request(method, "/v1/v1/messages", json=body)
        counting = await client.post("/v1/v1/messages/count_tokens", json=body)
        chat = await client.request(method, "/v1/v1/chat/completions", json=GOOD)
        responses = await client.post("/v1/v1/responses", json={"model": "gpt-test", "input": "hi"})
    assert forwarded_calls(anything) == []  # the proxy would not fit it: never forwarded
    message = assert_anthropic_error(messages, 404, "not_found_error")
    assert message == (
        f"Unknown path: {method} /v1/v1/messages. The client's base URL ends in /v1 and the client adds "
        "/v1 again: did you mean /v1/messages? Remove the trailing /v1 from the client's base URL."
    )
    counted = assert_anthropic_error(counting, 404, "not_found_error")
    assert "did you mean /v1/messages/count_tokens?" in counted
    assert_openai_error(chat, 404, code=None)
    assert "did you mean /v1/chat/completions?" in chat.json()["error"]["message"]
    assert_openai_error(responses, 404, code=None)
    assert "did you mean /v1/responses?" in responses.json()["error"]["message"]


async def test_a_missing_prefix_hint_is_in_the_shape_of_the_api_whose_route_it_would_be() -> None:
    body = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    async with proxy(respx.Router(assert_all_called=False)) as (client, _):
        messages = await client.post("/messages", json=body)
        responses = await client.post("/responses", json={"model": "gpt-test", "input": "hi"})
    message = assert_anthropic_error(messages, 404, "not_found_error")
    assert "Did you mean /v1/messages?" in message and "base URL must end with /v1" in message
    assert_openai_error(responses, 404, code=None)
    assert "Did you mean /v1/responses?" in responses.json()["error"]["message"]


async def test_the_hints_come_from_the_route_table_templated_routes_and_other_prefixes_included() -> None:
    from dataclasses import replace

    from app.core.dialects import DIALECTS, MESSAGES
    from app.core.routes import Route

    # Anthropic's error shape on a templated route under a prefix of its own: no API is named here.
    route = Route("/v9/talkers/{model}:talk", upstream="talkers/{model}")
    toy = replace(MESSAGES, name="toy", routes=(route,))
    router = respx.Router(assert_all_called=False)
    anything = router.route().mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router, dialects={**DIALECTS, "toy": toy}) as (client, _):
        doubled = await client.post("/v9/v9/talkers/m1:talk", json={})
        missing = await client.post("/talkers/m1:talk", json={})
    assert forwarded_calls(anything) == []
    assert "did you mean /v9/talkers/m1:talk?" in assert_anthropic_error(doubled, 404, "not_found_error")
    message = assert_anthropic_error(missing, 404, "not_found_error")
    assert "Did you mean /v9/talkers/m1:talk? The client's base URL must end with /v9" in message


async def test_an_unrelated_unknown_path_gets_no_hint() -> None:
    async with proxy(respx.Router(assert_all_called=False)) as (client, _):
        response = await client.get("/favicon.ico")
    assert response.json()["error"]["message"] == "Unknown path: GET /favicon.ico."


async def test_an_unreachable_upstream_is_logged_at_warning_with_the_reason(caplog: Any) -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(side_effect=httpx.ConnectError("Name or service not known"))
    with caplog.at_level("WARNING", logger="ctxproxy.errors"):
        async with proxy(router) as (client, _):
            response = await client.post("/v1/chat/completions", json=GOOD)
    assert response.status_code == 502
    (record,) = [r for r in caplog.records if r.name == "ctxproxy.errors"]
    assert record.levelname == "WARNING"
    assert (
        "Name or service not known" in record.getMessage() and "/v1/chat/completions" in record.getMessage()
    )
