"""GET /metrics, GET /status.json and GET / through the app (upstream: a respx router)."""

from __future__ import annotations

import re

import httpx
import orjson
import respx

from app.core.dialects import DIALECTS
from app.core.dialects.chat import ChatDialect
from app.core.routes import Route
from tests.api import UPSTREAM, chat_ok, openai_overflow, proxy, words

CHAT = f"{UPSTREAM}/chat/completions"
PLANTED = "PLANTED-SECRET-PROMPT-7f3a9c"


async def test_status_json_has_the_request_figures_and_never_its_content() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(
        side_effect=[
            httpx.Response(200, json=chat_ok(f"reply {PLANTED}")),
            httpx.Response(400, json=openai_overflow(limit=600, prompt=900)),
            httpx.Response(200, json=chat_ok()),
        ]
    )
    long = [
        {"role": "system", "content": f"system {PLANTED}"},
        *[
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"{PLANTED} " + words(150)}
            for i in range(10)
        ],
        {"role": "user", "content": f"last {PLANTED}"},
    ]
    async with proxy(router) as (client, _):
        first = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-test", "messages": [{"role": "user", "content": PLANTED}]},
            headers={"Authorization": f"Bearer sk-{PLANTED}", "X-Request-ID": "first-1"},
        )
        second = await client.post("/v1/chat/completions", json={"model": "gpt-test", "messages": long})
        response = await client.get("/status.json")
    assert first.status_code == 200 and second.status_code == 200
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert PLANTED.encode() not in response.content
    data = orjson.loads(response.content)
    newest, oldest = data["recent"]
    assert oldest["request_id"] == "first-1"
    assert oldest["model"] == "gpt-test" and oldest["status"] == 200 and oldest["outcome"] == "ok"
    assert oldest["tokens_before"] == oldest["tokens_after"] == int(first.headers["x-context-tokens-after"])
    assert newest["retries"] == 1
    assert newest["tokens_before"] == int(second.headers["x-context-tokens-before"])
    assert newest["tokens_after"] == int(second.headers["x-context-tokens-after"]) < newest["tokens_before"]
    assert newest["actions"] == second.headers["x-context-actions"]
    assert newest["latency_ms"] > 0 and newest["upstream_ms"] is not None
    assert data["counters"]["requests"] == 2 and data["counters"]["fitted_requests"] == 2
    assert data["counters"]["emergency_retries"] == 1
    assert data["counters"]["by_outcome"] == {"ok": 2}
    assert data["upstream"]["base_url"] == UPSTREAM
    assert data["upstream"]["health"]["calls"] == 3
    assert data["version"] and data["uptime_s"] >= 0 and data["in_flight"] == 0


async def test_the_status_board_only_lists_proxied_requests() -> None:
    router = respx.Router(assert_all_called=False)
    async with proxy(router) as (client, _):
        for path in ("/", "/status.json", "/metrics", "/healthz", "/nope"):
            await client.get(path)
        data = (await client.get("/status.json")).json()
    assert data["recent"] == [] and data["counters"]["requests"] == 0


async def test_upstream_urls_are_shown_without_credentials_or_query() -> None:
    router = respx.Router(assert_all_called=False)
    url = "http://user:hunter2@upstream.test:8000/v1?api-key=hunter2"
    routes = {"llama": "https://bob:pw@llama.test/v1?key=hunter2"}
    async with proxy(router, upstream_base_url=url, upstream_routes=routes) as (client, _):
        response = await client.get("/status.json")
    assert b"hunter2" not in response.content and b"bob" not in response.content
    assert response.json()["upstream"]["base_url"] == "http://upstream.test:8000/v1"
    assert response.json()["upstream"]["routes"] == {"llama": "https://llama.test/v1"}


async def test_metrics_is_prometheus_text_with_every_family() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router) as (client, _):
        await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-test", "messages": [{"role": "user", "content": PLANTED}]},
        )
        response = await client.get("/metrics")
        openmetrics = await client.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    text = response.text
    assert PLANTED not in text
    families = {
        name.removesuffix("_total") for name in re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE)
    }
    expected = {
        "ctxproxy_requests",
        "ctxproxy_request_duration_seconds",
        "ctxproxy_input_before_tokens",
        "ctxproxy_input_after_tokens",
        "ctxproxy_tokens_saved",
        "ctxproxy_fits",
        "ctxproxy_cut_memory",
        "ctxproxy_summary_calls",
        "ctxproxy_summary_tokens",
        "ctxproxy_actions",
        "ctxproxy_emergency_retries",
        "ctxproxy_summary_cache_requests",
        "ctxproxy_summary_cache_entries",
        "ctxproxy_upstream_latency_seconds",
        "ctxproxy_proxy_overhead_seconds",
        "ctxproxy_discovery",
        "ctxproxy_in_flight_requests",
        "ctxproxy_build_info",
    }
    assert expected <= families, expected - families
    assert not [name for name in families if name.endswith("_created")]
    assert 'ctxproxy_requests_total{api="chat",model="gpt-test",outcome="ok",route="chat"} 1.0' in text


async def test_two_apps_in_one_process_keep_separate_metrics() -> None:
    router = respx.Router(assert_all_called=False)
    router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    async with proxy(router) as (one, _), proxy(router) as (two, _):
        for _ in range(3):
            await one.post("/v1/chat/completions", json=body)
        await two.post("/v1/chat/completions", json=body)
        line = 'ctxproxy_requests_total{api="chat",model="gpt-test",outcome="ok",route="chat"}'
        assert f"{line} 3.0" in (await one.get("/metrics")).text
        assert f"{line} 1.0" in (await two.get("/metrics")).text


async def test_the_status_page_is_self_contained_html() -> None:
    router = respx.Router(assert_all_called=False)
    async with proxy(router) as (client, _):
        response = await client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    csp = response.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    html = response.text
    assert "<canvas" in html and "status.json" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # no external asset
    assert "innerHTML" not in html  # client-supplied model names are rendered as text


async def test_summary_cache_hits_and_misses_and_the_summarized_action_are_in_metrics() -> None:
    from tests.summaries_kit import chat, conversation, fake_upstream
    from tests.summaries_kit import proxy as summaries_proxy

    fake = fake_upstream()
    first = conversation(12)
    grown = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and?"}]
    async with summaries_proxy(fake, summary_ahead_ratio=1.0) as (client, _):
        one = await client.post("/v1/chat/completions", json=chat(first), headers={"X-Request-ID": "sum-1"})
        two = await client.post("/v1/chat/completions", json=chat(grown))
        text = (await client.get("/metrics")).text
    assert "summarized=" in one.headers["x-context-actions"] == two.headers["x-context-actions"]
    assert fake.summary_calls >= 1
    assert all(r.headers["x-request-id"] == "sum-1" for r in fake.summary_requests())
    lookups = r'^ctxproxy_summary_cache_requests_total\{api="chat",result="%s"\} (\S+)$'
    hits = re.search(lookups % "hit", text, re.MULTILINE)
    misses = re.search(lookups % "miss", text, re.MULTILINE)
    assert hits and float(hits.group(1)) == 1  # the second request found the summary
    assert misses and float(misses.group(1)) == 1  # the first one made it
    assert 'ctxproxy_actions_total{action="summarized",api="chat",model="m"} 2.0' in text
    assert 'ctxproxy_cut_memory_total{api="chat",kind="summary"} 2.0' in text


async def test_status_json_lists_what_was_discovered_at_run_time() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(
        return_value=httpx.Response(200, json={"data": [{"id": "unknown-served", "max_model_len": 777}]})
    )
    async with proxy(router) as (client, app):
        await app.state.service.learner.discovery.wait_idle()
        data = (await client.get("/status.json")).json()
    [row] = [m for m in data["models"]["learned"] if m["name"] == "unknown-served"]  # not in the table
    assert row["window_tokens"] == 777 and row["source"] == "discovered"
    assert row["sources"]["window"] == "discovered" and row["correction"] == 1.0


async def test_every_registered_api_is_in_status_json_and_the_page_names_none() -> None:
    router = respx.Router(assert_all_called=False)
    async with proxy(router) as (client, _):
        data = (await client.get("/status.json")).json()
        html = (await client.get("/")).text
    assert data["apis"] == list(DIALECTS)
    for api in DIALECTS:
        assert data["counters"]["by_api"][api]["requests"] == 0
        assert f'"{api}"' not in html  # the page's API list comes from status.json
    assert 'id="apis"' in html and 'id="summaries"' in html and 'id="api-filter"' in html


async def test_a_new_dialect_is_labelled_and_counted_with_no_edit_in_observability() -> None:
    toy = ChatDialect(name="toy", routes=(Route("/v1/toy/complete", upstream="toy/complete"),))
    router = respx.Router(assert_all_called=False)
    route = router.post(f"{UPSTREAM}/toy/complete").mock(return_value=httpx.Response(200, json=chat_ok()))
    long = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(150)} for i in range(11)]
    async with proxy(router, dialects={**DIALECTS, "toy": toy}) as (client, _):
        response = await client.post("/v1/toy/complete", json={"model": "gpt-test", "messages": long})
        text = (await client.get("/metrics")).text
        data = (await client.get("/status.json")).json()
    assert response.status_code == 200 and route.call_count == 1
    saved = int(response.headers["x-context-tokens-before"]) - int(response.headers["x-context-tokens-after"])
    assert saved > 0
    assert 'ctxproxy_requests_total{api="toy",model="gpt-test",outcome="ok",route="toy"} 1.0' in text
    assert f'ctxproxy_tokens_saved_total{{api="toy",model="gpt-test"}} {float(saved)}' in text
    assert data["apis"] == [*DIALECTS, "toy"] and data["counters"]["by_api"]["toy"]["tokens_saved"] == saved


async def test_the_model_report_has_its_own_route_label_not_passthrough() -> None:
    router = respx.Router(assert_all_called=False)
    router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    async with proxy(router) as (client, _):
        assert (await client.get("/v1/context/models")).status_code == 200
        metrics = (await client.get("/metrics")).text
    lines = [line for line in metrics.splitlines() if line.startswith("ctxproxy_requests_total{")]
    assert any('route="models"' in line for line in lines), lines
    assert not any('route="passthrough"' in line for line in lines), lines
    assert not router.calls or all(call.request.url.path.endswith("/models") for call in router.calls)
