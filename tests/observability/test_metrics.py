"""Metrics unit tests: per-API series, fit results, hooks (summaries, caches, discovery), the scrape."""

from __future__ import annotations

import builtins
from typing import Any

import pytest

from app.compaction import MemoryCache
from app.observability.labels import MAX_TOKEN_VALUES
from app.observability.metrics import Metrics, fit_result

APIS = ("chat", "responses", "messages")


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    result: Any = metrics.registry.get_sample_value(name, labels)
    return result


def test_discovery_hook_labels_are_sanitized_and_capped() -> None:
    metrics = Metrics(version="t")
    metrics.record_discovery(endpoint="/v1/models", result="Found")
    metrics.record_discovery(endpoint="/v1/models", result="Found")
    assert value(metrics, "ctxproxy_discovery_total", endpoint="v1_models", result="found") == 2
    for i in range(100):
        metrics.record_discovery(endpoint=f"endpoint {i}", result="failed")
    text = metrics.render()[0].decode()
    endpoints = {
        line.split('endpoint="')[1].split('"')[0] for line in text.splitlines() if "discovery_total{" in line
    }
    assert len(endpoints) == MAX_TOKEN_VALUES + 1 and "other" in endpoints


def test_fitted_requests_are_counted_per_api() -> None:
    metrics = Metrics(version="t", apis=APIS)
    for api, before, after in (("chat", 500, 500), ("responses", 900, 400), ("messages", 700, 300)):
        metrics.observe_request(
            route=api, api=api, model="m", outcome="ok", duration_s=0.1, tokens_before=before,
            tokens_after=after, actions={"dropped_turns": 1} if before != after else {}, retries=0,
        )  # fmt: skip
    labels = {"route": "responses", "api": "responses", "model": "m", "outcome": "ok"}
    assert value(metrics, "ctxproxy_requests_total", **labels) == 1
    assert value(metrics, "ctxproxy_input_before_tokens_sum", api="responses", model="m") == 900
    assert value(metrics, "ctxproxy_input_after_tokens_sum", api="messages", model="m") == 300
    assert value(metrics, "ctxproxy_tokens_saved_total", api="messages", model="m") == 400
    assert value(metrics, "ctxproxy_tokens_saved_total", api="chat", model="m") is None
    assert value(metrics, "ctxproxy_fits_total", api="chat", model="m", result="unchanged") == 1
    assert value(metrics, "ctxproxy_fits_total", api="responses", model="m", result="cut") == 1
    assert value(metrics, "ctxproxy_actions_total", api="messages", action="dropped_turns", model="m") == 1
    assert value(metrics, "ctxproxy_request_duration_seconds_count", route="chat", api="chat") == 1


def test_a_rejected_request_has_a_before_but_no_after_and_saves_nothing() -> None:
    metrics = Metrics(version="t", apis=APIS)
    metrics.observe_request(
        route="messages", api="messages", model="m", outcome="rejected", duration_s=0.1, tokens_before=9000,
        tokens_after=800, actions={"rejected": 1, "dropped_turns": 3}, prefix_reused_tokens=50, memory="note",
    )  # fmt: skip
    assert value(metrics, "ctxproxy_input_before_tokens_sum", api="messages", model="m") == 9000
    assert value(metrics, "ctxproxy_input_after_tokens_count", api="messages", model="m") is None
    assert value(metrics, "ctxproxy_fits_total", api="messages", model="m", result="rejected") == 1
    assert value(metrics, "ctxproxy_tokens_saved_total", api="messages", model="m") is None
    assert value(metrics, "ctxproxy_prefix_reused_tokens_total", api="messages", model="m") is None
    assert value(metrics, "ctxproxy_cut_memory_total", api="messages", kind="note") == 0
    assert value(metrics, "ctxproxy_actions_total", api="messages", action="rejected", model="m") == 1


def test_fit_results() -> None:
    assert fit_result("ok", 10, 10, {}) == "unchanged"
    assert fit_result("ok", 10, 8, {}) == "cut"
    assert fit_result("ok", 10, 10, {"pruned": 1}) == "cut"
    assert fit_result("rejected", 10, 8, {}) == "rejected"


def test_what_stands_in_for_a_cut_and_the_retries_are_per_api() -> None:
    metrics = Metrics(version="t", apis=APIS)
    for api, memory in (("chat", "summary"), ("chat", "note"), ("responses", "note"), ("messages", "bogus")):
        metrics.observe_request(
            route=api, api=api, model="m", outcome="ok", duration_s=0.1, tokens_before=10, tokens_after=5,
            actions={"dropped_turns": 1}, retries=1, final_upstream_status=200, memory=memory,
        )  # fmt: skip
    assert value(metrics, "ctxproxy_cut_memory_total", api="chat", kind="summary") == 1
    assert value(metrics, "ctxproxy_cut_memory_total", api="chat", kind="note") == 1
    assert value(metrics, "ctxproxy_cut_memory_total", api="responses", kind="note") == 1
    assert value(metrics, "ctxproxy_cut_memory_total", api="messages", kind="note") == 0
    assert value(metrics, "ctxproxy_emergency_retries_total", api="chat", outcome="succeeded") == 2
    assert value(metrics, "ctxproxy_emergency_retries_total", api="messages", outcome="failed") == 0


def test_every_registered_api_has_its_series_from_the_start() -> None:
    text = Metrics(version="t", apis=APIS).render()[0].decode()
    for api in APIS:
        assert f'ctxproxy_emergency_retries_total{{api="{api}",outcome="succeeded"}} 0.0' in text
        assert f'ctxproxy_summary_calls_total{{api="{api}",outcome="ok"}} 0.0' in text
        assert f'ctxproxy_cut_memory_total{{api="{api}",kind="summary"}} 0.0' in text


def test_summary_calls_and_tokens_per_api() -> None:
    metrics = Metrics(version="t", apis=APIS)
    metrics.record_summary(api="messages", outcome="ok", tokens_in=6000, tokens_out=300)
    metrics.record_summary(api="messages", outcome="Not Found", tokens_in=6000)
    metrics.record_summary(api="responses", outcome="timeout", tokens_in=100, tokens_out=0)
    metrics.record_summary(api="made-up", outcome="ok", tokens_in=1)
    assert value(metrics, "ctxproxy_summary_calls_total", api="messages", outcome="ok") == 1
    assert value(metrics, "ctxproxy_summary_calls_total", api="messages", outcome="not_found") == 1
    assert value(metrics, "ctxproxy_summary_calls_total", api="responses", outcome="timeout") == 1
    assert value(metrics, "ctxproxy_summary_tokens_total", api="messages", direction="in") == 12000
    assert value(metrics, "ctxproxy_summary_tokens_total", api="messages", direction="out") == 300
    assert value(metrics, "ctxproxy_summary_tokens_total", api="responses", direction="out") == 0
    assert value(metrics, "ctxproxy_summary_calls_total", api="made_up", outcome="ok") == 1


def test_summary_hooks_never_raise() -> None:
    metrics = Metrics(version="t", apis=APIS)
    metrics.record_summary(api=None, outcome=None, tokens_in="x", tokens_out=None)  # type: ignore[arg-type]
    metrics.record_summary_cache(api=object(), hit=True)  # type: ignore[arg-type]
    assert metrics.render()[0]


async def test_summary_cache_hooks_per_api_and_watched_caches_add_up() -> None:
    metrics = Metrics(version="t", apis=APIS)
    cache = MemoryCache(max_entries=8)
    metrics.watch_summary_cache(cache.stats)
    await cache.set("k", "summary")
    assert await cache.get("k") == "summary"
    assert await cache.get("missing") is None
    metrics.record_summary_cache(api="messages", hit=True)
    metrics.record_summary_cache(api="messages", hit=False)
    metrics.record_summary_cache(api="chat", hit=False, error=True)
    metrics.record_summary_cache(hit=True)
    name = "ctxproxy_summary_cache_requests_total"
    assert value(metrics, name, api="messages", result="hit") == 1
    assert value(metrics, name, api="messages", result="miss") == 1
    assert value(metrics, name, api="chat", result="error") == 1
    assert value(metrics, name, api="none", result="hit") == 2  # the watched cache and the unattributed hook
    assert value(metrics, name, api="none", result="miss") == 1
    assert value(metrics, "ctxproxy_summary_cache_entries") == 1
    assert metrics.summary_cache_totals() == {"hit": 3, "miss": 2, "error": 1, "entries": 1}


def test_a_broken_watched_cache_does_not_break_the_scrape() -> None:
    metrics = Metrics(version="t")

    def broken() -> Any:
        raise ConnectionError("redis down")

    metrics.watch_summary_cache(broken)
    metrics.record_summary_cache(hit=True)
    assert value(metrics, "ctxproxy_summary_cache_requests_total", api="none", result="hit") == 1


def test_the_scrape_has_no_created_series_in_either_format() -> None:
    metrics = Metrics(version="t", apis=APIS)
    metrics.observe_request(
        route="chat", api="chat", model="m", outcome="ok", duration_s=0.1, overhead_s=0.01, tokens_before=10,
        tokens_after=5, actions={"pruned": 1},
    )  # fmt: skip
    metrics.observe_upstream(0.1, 200, api="chat", upstream="http://u/v1")
    text, _ = metrics.render()
    openmetrics, content_type = metrics.render("application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert b"_created" not in text and b"_created" not in openmetrics
    assert b'ctxproxy_requests_total{api="chat",model="m",outcome="ok",route="chat"} 1.0' in text
    assert b"# UNIT ctxproxy_input_before_tokens tokens" in openmetrics
    # The live registry still has them (only this app's scrape leaves them out).
    assert any(s.name.endswith("_created") for f in metrics.registry.collect() for s in f.samples)


def test_upstream_latency_is_labelled_by_api_and_upstream() -> None:
    metrics = Metrics(version="t", apis=APIS)
    metrics.observe_upstream(0.2, 200, api="messages", upstream="http://a/v1")
    metrics.observe_upstream(0.2, None, upstream="http://b/v1")
    name = "ctxproxy_upstream_latency_seconds_count"
    assert value(metrics, name, api="messages", upstream="http://a/v1", status="2xx") == 1
    assert value(metrics, name, api="none", upstream="http://b/v1", status="error") == 1


def test_unknown_action_kinds_are_counted_as_other() -> None:
    metrics = Metrics(version="t")
    metrics.observe_request(
        route="chat", api="chat", model="m", outcome="ok", duration_s=0.1, actions={"pruned": 2, "<x>": 1}
    )
    assert value(metrics, "ctxproxy_actions_total", api="chat", action="pruned", model="m") == 1
    assert value(metrics, "ctxproxy_actions_total", api="chat", action="other", model="m") == 1


def test_without_prometheus_client_metrics_record_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_prometheus(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("prometheus_client"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    metrics = Metrics(version="t", apis=APIS)
    assert not metrics.available
    metrics.request_started()
    metrics.observe_request(route="chat", api="chat", model="m", outcome="ok", duration_s=0.1, retries=1)
    metrics.observe_upstream(0.1, 200)
    metrics.record_discovery(endpoint="models", result="found")
    metrics.record_summary(api="chat", outcome="ok", tokens_in=5)
    metrics.record_summary_cache(api="chat", hit=True)
    with pytest.raises(RuntimeError):
        metrics.render()


def test_prefix_reused_tokens_are_counted_per_api_and_model() -> None:
    metrics = Metrics(version="test")
    assert metrics.available
    for reused in (100, 250):
        metrics.observe_request(
            route="responses", api="responses", model="m", outcome="ok", duration_s=0.01, tokens_before=500,
            tokens_after=400, prefix_reused_tokens=reused,
        )  # fmt: skip
    text = metrics.render()[0].decode()
    assert 'ctxproxy_prefix_reused_tokens_total{api="responses",model="m"} 350.0' in text
