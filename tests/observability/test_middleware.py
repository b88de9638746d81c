"""The app with its upstream a respx router: metrics, request IDs and the status board per request."""

from __future__ import annotations

import logging
import random
import string
from typing import Any

import httpx
import pytest
import respx
from fastapi import FastAPI

from app.core.registry import ModelSpec
from app.observability import Observability
from app.observability.context import valid_request_id
from app.observability.labels import MAX_MODEL_LABELS
from app.observability.middleware import access_record, outcome_of
from tests.api import UPSTREAM, chat_ok, openai_overflow, proxy, words

CHAT = f"{UPSTREAM}/chat/completions"


def obs(app: FastAPI) -> Observability:
    o: Observability = app.state.observability
    return o


def sample(app: FastAPI, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for family in obs(app).metrics.registry.collect():
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def long_conversation(turns: int, size: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + words(size, "q")})
        messages.append({"role": "assistant", "content": f"answer {i} " + words(size, "a")})
    messages.append({"role": "user", "content": "last question"})
    return messages


def ok_router() -> tuple[respx.Router, respx.Route]:
    router = respx.Router(assert_all_called=False)
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    return router, route


async def test_a_fitting_request_counts_once_as_ok_with_equal_tokens_and_no_action() -> None:
    router, _ = ok_router()
    async with proxy(router) as (client, app):
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hello there"}]}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        labels = {"route": "chat", "api": "chat", "model": "gpt-test", "outcome": "ok"}
        assert sample(app, "ctxproxy_requests_total", **labels) == 1
        before = sample(app, "ctxproxy_input_before_tokens_sum", model="gpt-test")
        assert before == int(response.headers["x-context-tokens-before"]) > 0
        assert sample(app, "ctxproxy_input_after_tokens_sum", model="gpt-test") == before
        assert sample(app, "ctxproxy_input_before_tokens_count", model="gpt-test") == 1
        assert sample(app, "ctxproxy_tokens_saved_total", model="gpt-test") == 0
        assert sample(app, "ctxproxy_fits_total", model="gpt-test", result="unchanged") == 1
        assert sample(app, "ctxproxy_fits_total", model="gpt-test", result="cut") == 0
        assert sample(app, "ctxproxy_actions_total", action="dropped_turns", model="gpt-test") == 0
        assert sample(app, "ctxproxy_upstream_latency_seconds_count", status="2xx") == 1
        assert sample(app, "ctxproxy_proxy_overhead_seconds_count", route="chat") == 1
        assert sample(app, "ctxproxy_emergency_retries_total", outcome="succeeded") == 0
        assert sample(app, "ctxproxy_in_flight_requests") == 0
        [entry] = obs(app).board.recent()
        assert (entry.model, entry.status, entry.outcome, entry.actions) == ("gpt-test", 200, "ok", "none")
        assert entry.upstream_ms is not None and entry.overhead_ms is not None


async def test_a_cut_request_records_its_actions_and_the_tokens_saved() -> None:
    router, _ = ok_router()
    async with proxy(router) as (client, app):
        body = {"model": "gpt-test", "messages": long_conversation(turns=8, size=150)}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        before = int(response.headers["x-context-tokens-before"])
        after = int(response.headers["x-context-tokens-after"])
        assert before > after
        assert sample(app, "ctxproxy_tokens_saved_total", model="gpt-test") == before - after
        assert sample(app, "ctxproxy_fits_total", model="gpt-test", result="cut") == 1
        assert sample(app, "ctxproxy_input_before_tokens_sum", model="gpt-test") == before
        assert sample(app, "ctxproxy_input_after_tokens_sum", model="gpt-test") == after
        kinds = [item.split("=")[0] for item in response.headers["x-context-actions"].split(",")]
        assert "dropped_turns" in kinds
        for kind in kinds:
            assert sample(app, "ctxproxy_actions_total", action=kind, model="gpt-test") == 1
        status = obs(app).status()
        assert status["counters"]["tokens_saved"] == before - after
        assert status["counters"]["changed_requests"] == 1
        assert status["counters"]["actions"]["dropped_turns"] == 1


async def test_an_emergency_retry_is_counted_with_its_outcome() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(
        side_effect=[
            httpx.Response(400, json=openai_overflow(limit=600, prompt=900)),
            httpx.Response(200, json=chat_ok("saved")),
        ]
    )
    async with proxy(router) as (client, app):
        body = {"model": "gpt-test", "messages": long_conversation(turns=2, size=150)}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.headers["x-context-retries"] == "1"
        assert sample(app, "ctxproxy_emergency_retries_total", outcome="succeeded") == 1
        assert sample(app, "ctxproxy_emergency_retries_total", outcome="failed") == 0
        assert sample(app, "ctxproxy_upstream_latency_seconds_count", status="4xx") == 1
        assert sample(app, "ctxproxy_upstream_latency_seconds_count", status="2xx") == 1
        assert sample(app, "ctxproxy_requests_total", route="chat", model="gpt-test", outcome="ok") == 1
        [entry] = obs(app).board.recent()
        assert entry.retries == 1
        assert obs(app).status()["counters"]["emergency_retries"] == 1


async def test_exhausted_retries_count_as_overflowed_again_then_failed() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(400, json=openai_overflow(limit=560, prompt=700)))
    async with proxy(router) as (client, app):
        body = {"model": "gpt-test", "messages": long_conversation(turns=12, size=20)}
        response = await client.post("/v1/chat/completions", json=body, headers={"X-Context-Keep-Turns": "0"})
        assert response.headers["x-context-retries"] == "2"
        assert sample(app, "ctxproxy_emergency_retries_total", outcome="overflowed_again") == 1
        assert sample(app, "ctxproxy_emergency_retries_total", outcome="failed") == 1
        assert sample(app, "ctxproxy_emergency_retries_total", outcome="succeeded") == 0
        labels = {"route": "chat", "model": "gpt-test", "outcome": "upstream_error"}
        assert sample(app, "ctxproxy_requests_total", **labels) == 1


async def test_a_request_the_proxy_refuses_counts_as_rejected_with_its_model() -> None:
    router, route = ok_router()
    async with proxy(router, policy_mode="reject") as (client, app):
        body = {"model": "gpt-test", "messages": long_conversation(turns=8, size=150)}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        assert route.call_count == 0
        assert sample(app, "ctxproxy_requests_total", route="chat", model="gpt-test", outcome="rejected") == 1
        assert sample(app, "ctxproxy_actions_total", action="rejected", model="gpt-test") == 1
        assert sample(app, "ctxproxy_fits_total", model="gpt-test", result="rejected") == 1
        assert sample(app, "ctxproxy_tokens_saved_total", model="gpt-test") == 0
        [entry] = obs(app).board.recent()
        assert entry.outcome == "rejected" and entry.model == "gpt-test"


async def test_bad_input_and_unreachable_upstream_have_their_outcomes() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(side_effect=httpx.ConnectError("refused"))
    async with proxy(router) as (client, app):
        bad = await client.post("/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400
        down = await client.post(
            "/v1/chat/completions", json={"model": "gpt-test", "messages": [{"role": "user", "content": "x"}]}
        )
        assert down.status_code == 502
        assert sample(app, "ctxproxy_requests_total", route="chat", model="none", outcome="invalid") == 1
        # The service raises before it returns a plan: the model is not known to the recorder.
        labels = {"route": "chat", "model": "none", "outcome": "upstream_failed"}
        assert sample(app, "ctxproxy_requests_total", **labels) == 1
        assert sample(app, "ctxproxy_upstream_latency_seconds_count", status="error") == 1
        assert obs(app).status()["upstream"]["health"]["errors"] == 1


def random_model(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_lowercase + string.digits + "-./", k=rng.randint(3, 40)))


async def test_model_label_cardinality_is_capped_for_1000_random_names() -> None:
    router, _ = ok_router()
    rng = random.Random(7)
    async with proxy(router) as (client, _app):  # this test registry accepts every name as known
        for _ in range(1000):
            body = {"model": random_model(rng), "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
        text = (await client.get("/metrics")).text
    series = {line.split(" ")[0] for line in text.splitlines() if line.startswith("ctxproxy_requests_total{")}
    models = {s.split('model="', 1)[1].split('"', 1)[0] for s in series}
    assert len(models) <= MAX_MODEL_LABELS + 1
    assert "other" in models
    total = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ctxproxy_requests_total{")
    )
    assert total >= 1000


class TableRegistry:
    """A two-entry table: names resolve to a key by prefix, anything else is guessed."""

    keys = ("gpt-4o", "llama-3")

    def resolve(self, model: str, /) -> ModelSpec:
        key = next((k for k in self.keys if model.startswith(k)), None)
        return ModelSpec(
            name=model, window_tokens=1000, max_output_tokens=200, encoding="o200k_base",
            source="test" if key else "default", matched=key, guessed=key is None,
        )  # fmt: skip


async def test_model_labels_are_table_keys_or_other_for_a_real_table() -> None:
    router, _ = ok_router()
    rng = random.Random(11)
    names = ["gpt-4o-2024-08-06", "gpt-4o", "llama-3-70b"] + [random_model(rng) for _ in range(300)]
    async with proxy(router, registry=TableRegistry()) as (client, _app):
        for name in names:
            await client.post(
                "/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hi"}]}
            )
        text = (await client.get("/metrics")).text
    models = {
        line.split('model="', 1)[1].split('"', 1)[0]
        for line in text.splitlines()
        if line.startswith("ctxproxy_requests_total{") and 'route="chat"' in line
    }
    assert models <= {"gpt-4o", "llama-3", "other"}
    assert {"gpt-4o", "llama-3", "other"} <= models


async def test_a_valid_client_request_id_is_reused_on_the_response_and_upstream() -> None:
    router, route = ok_router()
    async with proxy(router) as (client, app):
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(
            "/v1/chat/completions", json=body, headers={"X-Request-ID": "abc.DEF_1-2"}
        )
        assert response.headers["x-request-id"] == "abc.DEF_1-2"
        assert route.calls[0].request.headers.get_list("x-request-id") == ["abc.DEF_1-2"]
        assert obs(app).board.recent()[0].request_id == "abc.DEF_1-2"


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", ""])
async def test_an_invalid_client_request_id_is_replaced_everywhere(bad: str) -> None:
    router, route = ok_router()
    async with proxy(router) as (client, _):
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(
            "/v1/chat/completions", json=body, headers=[("X-Request-ID", bad.encode("utf-8"))]
        )
        ours = response.headers["x-request-id"]
        assert ours != bad and valid_request_id(ours) and len(ours) == 32
        assert route.calls[0].request.headers.get_list("x-request-id") == [ours]


async def test_every_response_gets_a_fresh_request_id_and_the_upstreams_is_kept_aside() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(
        return_value=httpx.Response(200, json=chat_ok(), headers={"x-request-id": "req_up"})
    )
    router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    async with proxy(router) as (client, _):
        ids = set()
        for method, path in [
            ("GET", "/healthz"),
            ("GET", "/nope"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
        ]:
            response = await client.request(method, path)
            assert valid_request_id(response.headers.get("x-request-id"))
            ids.add(response.headers["x-request-id"])
        assert len(ids) == 4
        body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.headers.get_list("x-request-id") != ["req_up"]
        assert response.headers["x-upstream-request-id"] == "req_up"


async def test_the_request_id_is_in_every_log_line_of_the_request() -> None:
    router, _ = ok_router()
    async with proxy(router) as (client, _app):
        handler = next(
            h for h in logging.getLogger("ctxproxy").handlers if getattr(h, "_ctxproxy_handler", False)
        )
        lines: list[str] = []

        class Capture(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                lines.append(handler.format(record))

        capture = Capture()
        for f in handler.filters:
            capture.addFilter(f)
        logging.getLogger("ctxproxy").addHandler(capture)
        try:
            body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
            response = await client.post(
                "/v1/chat/completions", json=body, headers={"X-Request-ID": "trace-42"}
            )
            logging.getLogger("ctxproxy.test").warning("inside nothing")
        finally:
            logging.getLogger("ctxproxy").removeHandler(capture)
    access = [line for line in lines if "ctxproxy.access" in line]
    assert response.headers["x-request-id"] == "trace-42"
    assert access and all("request_id=trace-42" in line for line in access)
    assert "request_id=" not in lines[-1]  # outside a request there is none


def test_outcome_classification() -> None:
    assert outcome_of(200, {"upstream_status": 200}, {}) == "ok"
    assert outcome_of(429, {"upstream_status": 429}, {}) == "upstream_error"
    gone = {"upstream_status": 200, "client_disconnected": True}
    assert outcome_of(200, gone, {}, completed=False) == "client_closed"
    assert outcome_of(200, gone, {}, completed=True) == "ok"
    assert outcome_of(400, {}, {"tokens_before": "9"}) == "rejected"
    assert outcome_of(400, {}, {}) == "invalid"
    assert outcome_of(413, {}, {}) == "invalid"
    assert outcome_of(504, {}, {}) == "upstream_failed"
    assert outcome_of(503, {}, {}) == "unavailable"
    assert outcome_of(503, {"upstream_status": 503}, {}) == "upstream_error"
    assert outcome_of(500, {}, {}) == "error"
    assert outcome_of(None, {}, {}) == "error"
    assert outcome_of(200, {}, {}) == "ok"


async def test_discovery_calls_are_counted_but_client_model_listings_and_probes_are_not() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    router.get("http://upstream.test/props").mock(return_value=httpx.Response(404))
    router.post("http://upstream.test/api/show").mock(side_effect=httpx.ConnectError("refused"))
    # The app's own discovery is off: this counts the calls made below, and only those.
    async with proxy(router, discovery=False) as (client, app):
        upstream = app.state.service.upstream
        # what model discovery does, outside any client request (start-up, background tasks)
        await upstream.send("GET", "models", content=None, headers=[], stream=False)
        await upstream.send(
            "GET", "props", content=None, headers=[], stream=False, base_url="http://upstream.test"
        )
        with pytest.raises(Exception, match="unreachable"):
            await upstream.send(
                "POST", "api/show", content=b"{}", headers=[], base_url="http://upstream.test"
            )
        assert (await client.get("/v1/models")).status_code == 200  # a client's listing
        await client.get("/readyz")  # the readiness probe
        assert sample(app, "ctxproxy_discovery_total", endpoint="models", result="answered") == 1
        assert sample(app, "ctxproxy_discovery_total", endpoint="props", result="not_found") == 1
        assert sample(app, "ctxproxy_discovery_total", endpoint="show", result="unreachable") == 1
        assert sample(app, "ctxproxy_upstream_latency_seconds_count", status="2xx") == 3


async def test_the_apps_own_start_up_discovery_is_counted() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(
        return_value=httpx.Response(200, json={"data": [{"id": "gpt-test", "max_model_len": 1000}]})
    )
    router.get("http://upstream.test/props").mock(return_value=httpx.Response(404))
    router.get("http://upstream.test/api/v0/models").mock(return_value=httpx.Response(404))
    async with proxy(router) as (_client, app):
        discovery = app.state.service.learner.discovery
        assert discovery is not None
        await discovery.wait_idle()
        assert sample(app, "ctxproxy_discovery_total", endpoint="models", result="answered") >= 1
        assert sample(app, "ctxproxy_discovery_total", endpoint="props", result="not_found") == 1


def responses_user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def responses_ok() -> dict[str, Any]:
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]}
    return {"id": "resp_1", "object": "response", "status": "completed", "output": [said],
            "usage": {"input_tokens": 10, "output_tokens": 1, "total_tokens": 11}}  # fmt: skip


def messages_ok() -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "gpt-test",
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 1}}  # fmt: skip


def every_api_router() -> respx.Router:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    router.post(f"{UPSTREAM}/responses").mock(return_value=httpx.Response(200, json=responses_ok()))
    router.post(f"{UPSTREAM}/messages").mock(return_value=httpx.Response(200, json=messages_ok()))
    router.post(f"{UPSTREAM}/messages/count_tokens").mock(return_value=httpx.Response(404))
    return router


async def test_every_api_is_labelled_by_its_name_and_the_board_agrees() -> None:
    long = long_conversation(turns=8, size=150)
    async with proxy(every_api_router()) as (client, app):
        chat = await client.post("/v1/chat/completions", json={"model": "gpt-test", "messages": long})
        items = [responses_user(m["content"]) for m in long if m["role"] == "user"]
        responses = await client.post("/v1/responses", json={"model": "gpt-test", "input": items})
        anthropic_body = {"model": "gpt-test", "max_tokens": 50, "messages": long[1:]}
        messages = await client.post("/v1/messages", json=anthropic_body)
        counted = await client.post("/v1/messages/count_tokens", json=anthropic_body)
        dry_run = {"model": "gpt-test", "input": "x"}
        planned = await client.post("/v1/context/plan?api=responses", json=dry_run)
        status = obs(app).status()
    assert [r.status_code for r in (chat, responses, messages, counted, planned)] == [200] * 5
    for api, response in (("chat", chat), ("responses", responses), ("messages", messages)):
        before = int(response.headers["x-context-tokens-before"])
        after = int(response.headers["x-context-tokens-after"])
        assert before > after, api  # every one of them was cut
        assert sample(app, "ctxproxy_requests_total", route=api, api=api, outcome="ok") == 1
        assert sample(app, "ctxproxy_input_before_tokens_sum", api=api) == before
        assert sample(app, "ctxproxy_input_after_tokens_sum", api=api) == after
        assert sample(app, "ctxproxy_tokens_saved_total", api=api) == before - after
        assert sample(app, "ctxproxy_fits_total", api=api, result="cut") == 1
        assert sample(app, "ctxproxy_actions_total", api=api, action="dropped_turns") == 1
        assert sample(app, "ctxproxy_cut_memory_total", api=api, kind="note") == 1
        assert sample(app, "ctxproxy_proxy_overhead_seconds_count", route=api, api=api) == 1
        assert sample(app, "ctxproxy_upstream_latency_seconds_count", api=api, upstream=UPSTREAM) >= 1
        mine = status["counters"]["by_api"][api]
        assert (mine["tokens_before"], mine["tokens_after"]) == (before, after)
        assert mine["tokens_saved"] == before - after
        assert mine["actions"]["dropped_turns"] == 1
        assert mine["memory"] == {"summary": 0, "index": 0, "note": 1}
    # The counting endpoint and the dry run are requests of their API, not fitted ones.
    assert sample(app, "ctxproxy_requests_total", route="count", api="messages") == 1
    assert sample(app, "ctxproxy_requests_total", route="plan", api="responses") == 1
    assert sample(app, "ctxproxy_input_before_tokens_count", api="messages") == 1
    assert sample(app, "ctxproxy_input_before_tokens_count", api="responses") == 1
    assert status["counters"]["by_api"]["messages"]["requests"] == 2
    assert status["counters"]["by_api"]["messages"]["fitted_requests"] == 1
    assert status["counters"]["by_api"]["responses"]["requests"] == 2
    assert status["apis"][:3] == ["chat", "responses", "messages"]
    assert status["counters"]["fitted_requests"] == 3
    assert status["counters"]["tokens_saved"] == sample(app, "ctxproxy_tokens_saved_total")
    routes = {r["route"]: r["api"] for r in status["recent"]}
    assert routes == {"chat": "chat", "responses": "responses", "messages": "messages", "count": "messages",
                      "plan": "responses"}  # fmt: skip


async def test_a_model_the_upstream_reported_gets_its_own_label() -> None:
    router, _ = ok_router()
    router.get(f"{UPSTREAM}/models").mock(
        return_value=httpx.Response(200, json={"data": [{"id": "unknown-served", "max_model_len": 900}]})
    )
    async with proxy(router) as (client, app):
        await app.state.service.learner.discovery.wait_idle()
        for model in ("unknown-served", "unknown-typed-by-a-client"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert sample(app, "ctxproxy_requests_total", route="chat", model="unknown-served") == 1
    assert sample(app, "ctxproxy_requests_total", route="chat", model="other") == 1
    assert sample(app, "ctxproxy_requests_total", model="unknown-typed-by-a-client") == 0


async def test_routed_upstreams_are_told_apart() -> None:
    router, _ = ok_router()
    llama = router.post("http://llama.test/v1/chat/completions").mock(
        return_value=httpx.Response(200, json=chat_ok())
    )
    routes = {"llama": "http://key:secret@llama.test/v1"}
    async with proxy(router, upstream_routes=routes) as (client, app):
        for model in ("gpt-test", "llama-3", "llama-3"):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
        text = (await client.get("/metrics")).text
    assert llama.call_count == 2
    name = "ctxproxy_upstream_latency_seconds_count"
    assert sample(app, name, api="chat", upstream="http://llama.test/v1", status="2xx") == 2
    assert sample(app, name, api="chat", upstream=UPSTREAM, status="2xx") == 1
    assert "secret" not in text


async def test_lm_studio_discovery_has_its_own_endpoint_label() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    router.get("http://upstream.test/props").mock(return_value=httpx.Response(404))
    router.get("http://upstream.test/api/v0/models").mock(
        return_value=httpx.Response(200, json={"data": [{"id": "q", "max_context_length": 8192}]})
    )
    async with proxy(router) as (_client, app):
        await app.state.service.learner.discovery.wait_idle()
    assert sample(app, "ctxproxy_discovery_total", endpoint="lmstudio_models", result="answered") == 1
    assert sample(app, "ctxproxy_discovery_total", endpoint="models", result="answered") == 1


def test_an_access_record_is_the_record_the_logger_makes_with_its_own_time() -> None:
    access = logging.getLogger("ctxproxy.access")
    import app.observability.middleware as middleware

    made = access.makeRecord(
        access.name, logging.INFO, middleware.__file__, 0, "request", (), None, extra={"access": {"a": 1}}
    )
    ours = access_record({"a": 1})
    ours_again = access_record({"b": 2})
    assert ours is not ours_again and ours_again.access == {"b": 2} and ours.access == {"a": 1}
    moving = {"created", "msecs", "relativeCreated"}
    assert {k: v for k, v in vars(ours).items() if k not in moving} == {
        k: v for k, v in vars(made).items() if k not in moving
    }
    assert made.created <= ours.created <= ours_again.created
    assert abs((ours.relativeCreated - made.relativeCreated) - (ours.created - made.created) * 1000) < 1
    assert ours.getMessage() == "request" and ours.levelname == "INFO"


def test_a_custom_record_factory_makes_the_access_record() -> None:
    class Custom(logging.LogRecord):
        pass

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return Custom(*args, **kwargs)

    original = logging.getLogRecordFactory()
    logging.setLogRecordFactory(factory)
    try:
        record = access_record({"a": 1})
    finally:
        logging.setLogRecordFactory(original)
    assert type(record) is Custom and record.access == {"a": 1}
