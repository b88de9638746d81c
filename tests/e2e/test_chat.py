"""Non-streaming chat through a real ctxproxy server with the official openai SDK."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from app.core.tokens import MessageCounter
from tests.e2e.conftest import SYSTEM_PROMPT, WINDOW_TOKENS, Stack, conversation


def test_a_request_that_fits_is_forwarded_byte_for_byte(e2e: Stack, client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="fake-openai",
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "Hello there"}],
        temperature=0,
    )
    completion = raw.parse()
    assert completion.choices[0].message.content.startswith("Fake reply to 2 messages")
    assert completion.choices[0].finish_reason == "stop"
    (received,) = e2e.fake.client_requests()
    (sent,) = e2e.sent
    assert received.body == sent
    # The proxy's exact count is the upstream's own count of the prompt.
    assert raw.headers["x-context-tokens-before"] == str(completion.usage.prompt_tokens)
    assert raw.headers["x-context-tokens-after"] == str(completion.usage.prompt_tokens)
    assert raw.headers["x-context-window"] == str(WINDOW_TOKENS)
    assert raw.headers["x-context-count"] == "exact"
    assert raw.headers["x-context-actions"] == "none"
    assert raw.headers["x-context-retries"] == "0"
    assert int(raw.headers["x-context-budget"]) < WINDOW_TOKENS


def test_auth_is_forwarded_and_context_headers_are_not(e2e: Stack, client: openai.OpenAI) -> None:
    client.chat.completions.create(
        model="fake-vllm",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Context-Keep-Turns": "3", "X-Context-Policy": "truncate"},
    )
    (received,) = e2e.fake.client_requests()
    assert received.headers["authorization"] == "Bearer test"
    assert not [name for name in received.headers if name.startswith("x-context-")]


def test_over_long_conversation_fails_directly_and_succeeds_through_the_proxy(
    e2e: Stack, client: openai.OpenAI, direct: openai.OpenAI, counter: MessageCounter
) -> None:
    messages = conversation(counter, at_least_tokens=2 * WINDOW_TOKENS)

    with pytest.raises(openai.BadRequestError) as refused:
        direct.chat.completions.create(model="fake-openai", messages=messages)
    assert refused.value.code == "context_length_exceeded"
    e2e.fake.clear()

    raw = client.chat.completions.with_raw_response.create(model="fake-openai", messages=messages)
    completion = raw.parse()
    assert completion.choices[0].message.content.startswith("Fake reply")
    assert int(raw.headers["x-context-tokens-before"]) > WINDOW_TOKENS
    assert int(raw.headers["x-context-tokens-after"]) < WINDOW_TOKENS
    assert raw.headers["x-context-actions"] != "none"
    assert raw.headers["x-context-retries"] == "0"
    (received,) = e2e.fake.client_requests()
    forwarded = received.json()["messages"]
    assert len(forwarded) < len(messages)
    assert forwarded[0] == messages[0]
    assert forwarded[-1] == messages[-1]
    assert completion.usage.prompt_tokens == int(raw.headers["x-context-tokens-after"])


def test_reject_policy_returns_context_length_exceeded(
    e2e: Stack, client: openai.OpenAI, counter: MessageCounter
) -> None:
    messages = conversation(counter, at_least_tokens=2 * WINDOW_TOKENS)
    with pytest.raises(openai.BadRequestError) as rejected:
        client.chat.completions.create(
            model="fake-openai", messages=messages, extra_headers={"X-Context-Policy": "reject"}
        )
    assert rejected.value.status_code == 400
    assert rejected.value.code == "context_length_exceeded"
    assert rejected.value.type == "invalid_request_error"
    assert e2e.fake.client_requests() == []


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
        ({"messages": "hello"}, "messages"),
        (
            {"messages": [{"role": "user", "content": "hi"}], "extra_headers": {"X-Context-Budget": "lots"}},
            None,
        ),
    ],
)
def test_bad_input_is_an_openai_shaped_400(
    e2e: Stack, client: openai.OpenAI, kwargs: dict[str, object], param: str | None
) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="fake-openai", **kwargs)
    error = bad.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    else:
        assert "X-Context-Budget" in error["message"]
    assert e2e.fake.client_requests() == []
    # The proxy keeps serving after bad input.
    assert client.chat.completions.create(model="fake-openai", messages=[{"role": "user", "content": "ok?"}])


def test_malformed_json_is_a_400_not_a_500(e2e: Stack) -> None:
    response = httpx.post(
        f"{e2e.proxy_url}/v1/chat/completions",
        content=b'{"model": "fake-openai", "messages": [',
        headers={"Content-Type": "application/json", "Authorization": "Bearer test"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_models_are_passed_through(e2e: Stack, client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids == [m.name for m in e2e.fake.models.values()]
    assert [r.path for r in e2e.fake.requests] == ["/v1/models"]


def test_health_and_readiness(e2e: Stack) -> None:
    assert httpx.get(f"{e2e.proxy_url}/healthz").status_code == 200
    ready = httpx.get(f"{e2e.proxy_url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


@pytest.mark.parametrize("label", ["text/plain", "application/x-www-form-urlencoded", None])
def test_json_with_another_label_is_forwarded_as_json(e2e: Stack, label: str | None) -> None:
    body = json.dumps({"model": "fake-openai", "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Authorization": "Bearer test"} | ({"Content-Type": label} if label else {})
    with httpx.Client() as http:
        request = http.build_request(
            "POST", f"{e2e.proxy_url}/v1/chat/completions", content=body, headers=headers
        )
        if label is None and "Content-Type" in request.headers:
            del request.headers["Content-Type"]
        assert request.headers.get("Content-Type") == label
        response = http.send(request)
    assert response.status_code == 200, response.text
    (forwarded,) = e2e.fake.client_requests()
    assert forwarded.headers["content-type"] == "application/json"
    assert forwarded.body == body  # the bytes themselves untouched


@pytest.mark.parametrize("label", ["text/plain", None])
def test_a_body_that_is_not_json_is_a_400_whatever_its_label(e2e: Stack, label: str | None) -> None:
    headers = {"Authorization": "Bearer test"} | ({"Content-Type": label} if label else {})
    response = httpx.post(
        f"{e2e.proxy_url}/v1/chat/completions", content=b"model=x&messages=y", headers=headers
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert e2e.fake.client_requests() == []


@pytest.mark.parametrize("stream", [False, True])
def test_date_and_server_come_once(e2e: Stack, stream: bool) -> None:
    body = {"model": "fake-openai", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = httpx.post(
        f"{e2e.proxy_url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer t"}
    )
    assert response.status_code == 200
    assert len(response.headers.get_list("date")) == 1
    assert len(response.headers.get_list("server")) == 1


def test_listing_stored_completions_on_an_upstream_without_them_is_our_405_in_openais_shape(
    e2e: Stack, client: openai.OpenAI, direct: openai.OpenAI
) -> None:
    """``GET /v1/chat/completions`` (the SDK's ``chat.completions.list()``) goes to the upstream,
    whose method it is to refuse; this fake (like the demo's and FastAPI servers) refuses it in
    plain text, and the client gets a 405 it can read, with ``Allow: POST``."""
    with pytest.raises(openai.APIStatusError) as plain:
        direct.chat.completions.list()
    assert plain.value.status_code == 405 and plain.value.body == "Method Not Allowed"  # plain text
    with pytest.raises(openai.APIStatusError) as ours:
        client.chat.completions.list()
    error = ours.value
    assert error.status_code == 405 and error.response.headers["allow"] == "POST"
    assert "GET is not allowed on /v1/chat/completions" in error.message  # the SDK shows ours
    assert error.body == {
        "message": "GET is not allowed on /v1/chat/completions: this route takes POST.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
