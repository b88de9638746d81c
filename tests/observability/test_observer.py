"""The observability hub: discovery classification, what stands in for a cut, the summary hooks,
request labels from the scope, upstream calls."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from app.observability import Observability
from app.observability.context import DIALECT_SCOPE_KEY, RequestContext, current_request
from app.observability.observer import discovery_call, memory_of

APIS = ("chat", "responses", "messages")


def hub(**options: Any) -> Observability:
    return Observability(
        version="t",
        upstream_base_url="http://main.test/v1",
        apis=APIS,
        counting={"/v1/messages/count_tokens"},
        **options,
    )


def value(o: Observability, name: str, **labels: str) -> float | None:
    result: Any = o.metrics.registry.get_sample_value(name, labels)
    return result


def test_discovery_calls_are_told_from_client_traffic() -> None:
    assert discovery_call("GET", "http://u/v1/models", route=None) == "models"
    assert discovery_call("GET", "http://u/api/v0/models", route=None) == "lmstudio_models"
    assert discovery_call("GET", "http://u/props/", route=None) == "props"
    assert discovery_call("POST", "http://u/api/show", route=None) == "show"
    assert discovery_call("POST", "http://u/v1/models", route=None) is None
    assert discovery_call("GET", "http://u/v1/models", route="messages", api="messages") == "models"
    # The gateway engine plans on a model too: a new model's discovery during its request counts.
    assert discovery_call("GET", "http://u/v1/models", route="engine", api="chat") == "models"
    assert discovery_call("GET", "http://u/v1/models", route="plan", api="chat") is None
    assert discovery_call("GET", "http://u/v1/models", route="passthrough") is None  # a client's listing
    assert discovery_call("GET", "http://u/v1/models", route="count", api="messages") is None
    assert discovery_call("GET", "http://u/v1/models", route="health") is None  # the readiness probe


def test_what_stands_in_for_a_cut() -> None:
    assert memory_of({"summarized": 1, "dropped_turns": 2}) == "summary"
    assert memory_of({"dropped_turns": 2, "summary_failed": 1}) == "note"
    assert memory_of({"dropped_turns": 2}) == "note"
    assert memory_of({"pruned": 3}) is None
    assert memory_of({"dropped_turns": 2}, "Summary") == "summary"  # the response header wins
    assert memory_of({"dropped_turns": 2}, "none") is None
    assert memory_of({"dropped_turns": 2}, "garbage") == "note"


def test_summary_hooks_reach_the_metrics_and_the_board() -> None:
    o = hub()
    o.record_summary(api="messages", outcome="ok", tokens_in=3000, tokens_out=150)
    o.record_summary(api="messages", outcome="Failed", tokens_in=3000)
    o.record_summary_cache(api="messages", hit=True)
    o.record_summary_cache(api="responses", hit=False)
    o.record_summary_cache(api="responses", hit=False, error=True)
    assert value(o, "ctxproxy_summary_calls_total", api="messages", outcome="ok") == 1
    assert value(o, "ctxproxy_summary_calls_total", api="messages", outcome="failed") == 1
    assert value(o, "ctxproxy_summary_tokens_total", api="messages", direction="in") == 6000
    assert value(o, "ctxproxy_summary_cache_requests_total", api="responses", result="miss") == 1
    by_api = o.status()["counters"]["by_api"]
    assert by_api["messages"]["summaries"]["calls"] == 2 and by_api["messages"]["summaries"]["failures"] == 1
    assert by_api["messages"]["summaries"]["tokens_out"] == 150
    assert by_api["responses"]["summaries"]["cache_miss"] == 1
    assert by_api["responses"]["summaries"]["cache_error"] == 1


def test_recall_hook_reaches_the_metrics_and_the_board() -> None:
    o = hub()
    o.record_recall(api="messages", calls=2, bytes_=5000, rounds=1, misses=1)
    o.record_recall(api="messages", calls=1, bytes_=700, rounds=1, misses=0)
    assert value(o, "ctxproxy_recall_total", api="messages", event="calls") == 3
    assert value(o, "ctxproxy_recall_total", api="messages", event="rounds") == 2
    assert value(o, "ctxproxy_recall_total", api="messages", event="misses") == 1
    assert value(o, "ctxproxy_recall_bytes_total", api="messages") == 5700
    counters = o.status()["counters"]
    assert counters["by_api"]["messages"]["recall"] == {"calls": 3, "bytes": 5700, "rounds": 2, "misses": 1}
    assert counters["recall"]["calls"] == 3  # the totals sum every API
    o.record_recall(api=None, calls="x", bytes_=None, rounds=1, misses=0)  # type: ignore[arg-type]  # never raises


def test_summary_hooks_never_raise() -> None:
    o = hub()
    o.record_summary(api=None, outcome=None, tokens_in=None, tokens_out="x")  # type: ignore[arg-type]
    o.record_summary_cache(api=None, hit=True)
    assert o.status()["counters"]["by_api"]["none"]["summaries"]["cache_hit"] == 1


def test_request_labels_come_from_what_the_route_recorded() -> None:
    o = hub()
    dialect = SimpleNamespace(name="messages")
    assert o.labels({"path": "/v1/messages", DIALECT_SCOPE_KEY: dialect}) == ("messages", "messages")
    counting = {"path": "/v1/messages/count_tokens", DIALECT_SCOPE_KEY: dialect}
    assert o.labels(counting) == ("count", "messages")
    assert o.labels({"path": "/v1/context/plan", DIALECT_SCOPE_KEY: dialect}) == ("plan", "messages")
    assert o.labels({"path": "/v1/models"}) == ("passthrough", None)
    assert o.labels({"path": "/healthz"}) == ("health", None)


def test_upstream_calls_are_labelled_by_the_requests_api_and_the_upstream() -> None:
    o = hub(upstream_routes={"big": "http://big.test/v1"}, summary_base_url="http://sum.test/v1")
    o.upstream_call("GET", "http://main.test/v1/models", 0.01, 200)  # outside any request
    scope = {"path": "/v1/responses", DIALECT_SCOPE_KEY: SimpleNamespace(name="responses")}
    ctx = RequestContext(request_id="r", started_s=0.0, scope=scope)
    token = current_request.set(ctx)
    try:
        o.upstream_call("POST", "http://big.test/v1/responses", 0.2, 200)
        o.upstream_call("POST", "http://sum.test/v1/chat/completions", 0.3, None)
    finally:
        current_request.reset(token)
    name = "ctxproxy_upstream_latency_seconds_count"
    assert value(o, name, api="none", upstream="http://main.test/v1", status="2xx") == 1
    assert value(o, name, api="responses", upstream="http://big.test/v1", status="2xx") == 1
    assert value(o, name, api="responses", upstream="http://sum.test/v1", status="error") == 1
    assert value(o, "ctxproxy_discovery_total", endpoint="models", result="answered") == 1
    assert ctx.upstream_calls == 2 and abs(ctx.upstream_s - 0.5) < 1e-9


def test_use_knowledge_gives_reported_models_their_label() -> None:
    o = hub()
    o.use_registry(SimpleNamespace(resolve=lambda m: SimpleNamespace(matched=None, guessed=True)))
    assert o.metrics.model_labels.label("served") == "other"
    o.use_knowledge(lambda m: m == "served")
    assert o.metrics.model_labels.label("served") == "served"


def test_a_requests_upstream_calls_are_recorded_when_it_flushes_and_later_ones_at_once() -> None:
    o = hub()
    scope = {"path": "/v1/chat/completions", DIALECT_SCOPE_KEY: SimpleNamespace(name="chat")}
    ctx = RequestContext(request_id="r", started_s=0.0, scope=scope, deferred=[])
    token = current_request.set(ctx)
    name = "ctxproxy_upstream_latency_seconds_count"
    try:
        o.upstream_call("POST", "http://main.test/v1/chat/completions", 0.2, 200)
        assert ctx.upstream_calls == 1 and abs(ctx.upstream_s - 0.2) < 1e-9  # the request's sum: now
        assert value(o, name, api="chat", upstream="http://main.test/v1", status="2xx") is None
        o.flush_upstream(ctx)
        assert value(o, name, api="chat", upstream="http://main.test/v1", status="2xx") == 1
        o.upstream_call("POST", "http://main.test/v1/chat/completions", 0.1, 200)  # after: at once
        assert value(o, name, api="chat", upstream="http://main.test/v1", status="2xx") == 2
    finally:
        current_request.reset(token)
