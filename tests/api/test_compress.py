"""The gateway engine's routes against the gateways' own contracts, on the app ``create_app`` builds
(the engine's routes ahead of the pass-through).

agentgateway (``yuval-k/compression-extension-point``, ``crates/agentgateway/src/llm/policy/``):
``POST /v1/compress`` ``{messages, model}``; it takes only a 200 whose JSON has a ``messages``
array, and discards one that is empty for a non-empty input, holds a non-object, or breaks the tool
pairing that was intact (``webhook.rs`` ``validate_replacement``; :func:`agentgateway_accepts`
re-states it). llm-d's request-inline compaction (context-guru's ``examples/llm-d-service``): the
whole body in, and only a 200 with a non-empty JSON object replaces it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import respx

from app.api.compress import ASIDE, COMPRESS_PATH, compact_path
from app.core.dialects import DIALECTS
from tests.api import proxy
from tests.service.test_compress import anthropic_history, chat_history, responses_history
from tests.summaries_kit import conversation, fake_upstream, settle, summary_message
from tests.summaries_kit import proxy as summaries_proxy


@asynccontextmanager
async def engine(**settings: Any) -> AsyncIterator[tuple[httpx.AsyncClient, respx.Router]]:
    upstream = respx.Router(assert_all_called=False)
    async with proxy(upstream, **settings) as (client, _app):
        yield client, upstream


def pairing_violations(messages: Sequence[Any]) -> set[str]:
    """Tool-call ids on one side only, as agentgateway's ``pairing_violations`` finds them."""
    calls: set[str] = set()
    results: set[str] = set()
    for m in messages:
        calls |= {c["id"] for c in m.get("tool_calls") or [] if "id" in c}
        if "tool_call_id" in m:
            results.add(m["tool_call_id"])
        for part in m.get("content") if isinstance(m.get("content"), list) else []:
            if part.get("type") == "tool_use":
                calls.add(part["id"])
            elif part.get("type") == "tool_result":
                results.add(part["tool_use_id"])
        if m.get("type") == "function_call":
            calls.add(m["call_id"])
        elif m.get("type") == "function_call_output":
            results.add(m["call_id"])
    return calls ^ results


def agentgateway_accepts(original: Sequence[Any], response: httpx.Response) -> bool:
    """What agentgateway applies: a 200, a ``messages`` array, not empty for a non-empty input, all
    objects, no tool pairing broken that the input had intact."""
    if response.status_code != 200:
        return False
    replacement = response.json().get("messages")
    if not isinstance(replacement, list) or (not replacement and original):
        return False
    if not all(isinstance(m, Mapping) for m in replacement):
        return False
    return not (pairing_violations(replacement) - pairing_violations(original))


def llm_d_accepts(response: httpx.Response) -> bool:
    """llm-d's step: a 200 with a non-empty JSON object replaces the body."""
    if response.status_code != 200:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and bool(body)


async def test_each_apis_messages_come_back_as_agentgateway_accepts_them() -> None:
    cases = [
        ("chat", chat_history(12), {}),
        ("messages", anthropic_history(10), {"anthropic-version": "2023-06-01"}),
        ("responses", responses_history(10), {}),
    ]
    async with engine() as (client, upstream):
        for api, messages, headers in cases:
            response = await client.post(
                COMPRESS_PATH, json={"messages": messages, "model": "gpt-x"}, headers=headers
            )
            assert agentgateway_accepts(messages, response), (api, response.text)
            answer = response.json()
            assert answer["api"] == api and response.headers["x-context-api"] == api
            assert answer["tokens_saved"] > 0 and answer["messages"] != messages
            before = int(response.headers["x-context-tokens-before"])
            after = int(response.headers["x-context-tokens-after"])
            assert answer["tokens_saved"] == before - after
            assert (
                DIALECTS[api].problems({"model": "gpt-x", DIALECTS[api].items_key: answer["messages"]}) == []
            )
    assert not upstream.calls  # an engine: nothing is forwarded


async def test_a_request_that_fits_comes_back_unchanged_with_nothing_saved() -> None:
    messages = chat_history(2, size=10)
    async with engine() as (client, _):
        response = await client.post(COMPRESS_PATH, json={"messages": messages, "model": "gpt-x"})
    assert agentgateway_accepts(messages, response)
    assert response.json()["messages"] == messages and response.json()["tokens_saved"] == 0
    assert response.headers["x-context-actions"] == "none"


async def test_the_aside_header_shapes_the_budget_and_the_api_can_be_named() -> None:
    messages = chat_history(12)
    async with engine() as (client, _):
        light = await client.post(
            COMPRESS_PATH, json={"messages": messages, "model": "m"}, headers={ASIDE: "0"}
        )
        heavy = await client.post(
            f"{COMPRESS_PATH}?api=chat", json={"messages": messages, "model": "m"}, headers={ASIDE: "300"}
        )
        default = await client.post(COMPRESS_PATH, json={"messages": messages, "model": "m"})
        bad = await client.post(
            COMPRESS_PATH, json={"messages": messages, "model": "m"}, headers={ASIDE: "-1"}
        )
    assert light.headers[ASIDE.lower()] == "0" and heavy.headers[ASIDE.lower()] == "300"
    assert default.headers[ASIDE.lower()] == "100"  # 10% of the test model's 1,000-token window
    assert heavy.json()["tokens_saved"] > light.json()["tokens_saved"]
    assert bad.status_code == 400 and bad.json()["error"]["param"] == ASIDE


async def test_what_cannot_fit_or_is_malformed_is_a_4xx_in_the_apis_own_shape() -> None:
    async with engine() as (client, _):
        too_big = await client.post(
            COMPRESS_PATH,
            json={"messages": anthropic_history(10), "model": "claude-x"},
            headers={"anthropic-version": "2023-06-01", ASIDE: "5000"},
        )
        not_json = await client.post(
            COMPRESS_PATH, content=b"{", headers={"Content-Type": "application/json"}
        )
        no_array = await client.post(COMPRESS_PATH, json={"messages": {"role": "user"}, "model": "m"})
        no_model = await client.post(COMPRESS_PATH, json={"messages": chat_history(1)})
        mixed = await client.post(
            COMPRESS_PATH, json={"messages": [*chat_history(1), *anthropic_history(1)], "model": "m"}
        )
        unknown = await client.post(f"{COMPRESS_PATH}?api=nope", json={"messages": [], "model": "m"})
    assert too_big.status_code == 400
    assert too_big.json()["type"] == "error"  # Anthropic's error shape
    assert too_big.json()["error"]["type"] == "invalid_request_error"
    assert "exceed context limit" in too_big.json()["error"]["message"]  # Anthropic's own wording
    for response in (not_json, no_array, no_model, mixed, unknown):
        assert response.status_code == 400, response.text
        assert not agentgateway_accepts([], response)  # the gateway fails open: the original goes
    # Anthropic's blocks are a mark only that API has: the chat message among them is refused by
    # its parse, naming the field.
    assert "messages.2.content" in mixed.json()["error"]["message"]


async def test_with_proxy_keys_on_the_engine_needs_a_key_too() -> None:
    messages = chat_history(3)
    async with engine(api_keys="gw-key-1", upstream_api_key="sk-up") as (client, _):
        refused = await client.post(COMPRESS_PATH, json={"messages": messages, "model": "m"})
        allowed = await client.post(
            COMPRESS_PATH,
            json={"messages": messages, "model": "m"},
            headers={"Authorization": "Bearer gw-key-1"},
        )
    assert refused.status_code == 401 and allowed.status_code == 200


async def test_each_apis_whole_body_comes_back_in_its_shape_as_llm_d_accepts_it() -> None:
    bodies = {
        "chat": {"model": "m", "messages": chat_history(12), "max_tokens": 50, "stream": True},
        "responses": {
            "model": "m",
            "input": responses_history(16, size=80),
            "max_output_tokens": 50,
            "store": False,
        },
        "messages": {
            "model": "m",
            "max_tokens": 50,
            "system": "be careful",
            "messages": anthropic_history(16, size=80),
        },
    }
    async with engine() as (client, upstream):
        for api, body in bodies.items():
            dialect = DIALECTS[api]
            response = await client.post(compact_path(dialect), json=body)
            assert llm_d_accepts(response), (api, response.text)
            out = response.json()
            items = dialect.items_key
            assert {k: v for k, v in out.items() if k != items} == {
                k: v for k, v in body.items() if k != items
            }
            assert out[items] != body[items] and dialect.problems(out) == []
            before = int(response.headers["x-context-tokens-before"])
            assert int(response.headers["x-context-tokens-after"]) < before
            assert response.headers["x-context-api"] == api
        small = json.dumps({"model": "m", "messages": chat_history(1, size=5)}, indent=2).encode()
        same = await client.post(compact_path(DIALECTS["chat"]), content=small)
    assert same.content == small and same.headers["x-context-actions"] == "none"
    assert not upstream.calls


async def test_summaries_when_on_take_the_place_of_the_cut_turns() -> None:
    fake = fake_upstream()
    history = conversation(turns=14, size=40)
    async with summaries_proxy(fake, discovery=False) as (client, _app):
        response = await client.post(
            COMPRESS_PATH, json={"messages": history, "model": "m"}, headers={ASIDE: "0"}
        )
    assert agentgateway_accepts(history, response)
    answer = response.json()
    assert "summarized" in answer["actions"]
    assert summary_message(answer["messages"]) is not None
    assert not fake.client_requests()  # only the summary call reached the upstream


async def test_what_the_engine_sends_upstream_is_the_summary_call_with_the_operators_key() -> None:
    fake = fake_upstream()
    history = conversation(turns=14, size=40)
    async with summaries_proxy(fake, discovery=False, upstream_api_key="sk-operator") as (client, app):
        response = await client.post(
            COMPRESS_PATH, json={"messages": history, "model": "m"}, headers={ASIDE: "0"}
        )
        await settle(app)
        sent = list(fake.requests)
        off = await client.post(
            COMPRESS_PATH,
            json={"messages": conversation(turns=15, size=40), "model": "m"},
            headers={ASIDE: "0", "X-Context-Summarize": "off"},
        )
    assert response.status_code == off.status_code == 200
    assert sent and sent == fake.summary_requests()  # the README's list: nothing else went
    for request in sent:
        body = request.json()
        assert (request.method, request.path) == ("POST", "/v1/chat/completions")
        assert request.headers["authorization"] == "Bearer sk-operator"
        assert body["model"] == "m" and body["stream"] is False
    assert "summarized" not in off.json()["actions"] and list(fake.requests) == sent  # off: none sent


async def test_the_engines_requests_have_their_own_route_label_and_are_no_fitted_requests() -> None:
    async with engine() as (client, _):
        messages = await client.post(
            COMPRESS_PATH,
            json={"messages": anthropic_history(10), "model": "m"},
            headers={"anthropic-version": "2023-06-01"},
        )
        whole = await client.post(
            compact_path(DIALECTS["responses"]), json={"model": "m", "input": responses_history(10)}
        )
        metrics = (await client.get("/metrics")).text
        status = (await client.get("/status.json")).json()
    assert messages.status_code == whole.status_code == 200
    requests = [line for line in metrics.splitlines() if line.startswith("ctxproxy_requests_total{")]
    engine_lines = [line for line in requests if 'route="engine"' in line]
    assert any('api="messages"' in line for line in engine_lines), requests
    assert any('api="responses"' in line for line in engine_lines), requests
    assert not any('route="passthrough"' in line or 'route="other"' in line for line in requests)
    counters = status["counters"]
    assert counters["by_route"].get("engine") == 2
    assert counters["fitted_requests"] == 0  # a compression is no request the proxy forwarded
    assert [r["route"] for r in status["recent"][:2]] == ["engine", "engine"]
