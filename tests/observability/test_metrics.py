"""Metrics unit tests: bounded labels, retry outcomes, hooks, the summary cache collector."""

from __future__ import annotations

import builtins
import random
import string
from dataclasses import dataclass
from typing import Any

import pytest

from app.compaction import MemoryCache
from app.observability.metrics import (
    MAX_TOKEN_VALUES,
    Metrics,
    ModelLabels,
    retry_outcomes,
    route_label,
    status_class,
)


@dataclass(frozen=True)
class Spec:
    matched: str | None
    guessed: bool


def table(model: str) -> Spec:
    for key in ("gpt-4o", "claude-"):
        if model.lower().startswith(key):
            return Spec(key, False)
    return Spec(None, True)


def test_model_labels_are_table_keys_route_keys_other_or_none() -> None:
    labels = ModelLabels(table, routes=["local/"])
    assert labels.label("gpt-4o-2024-08-06") == "gpt-4o"
    assert labels.label("claude-sonnet-4") == "claude-"
    assert labels.label("local/qwen") == "local/"
    assert labels.label("my secret prompt") == "other"
    assert labels.label(None) == "none" and labels.label("") == "none"


def test_model_labels_are_capped_even_when_every_name_is_known() -> None:
    labels = ModelLabels(lambda m: Spec(m, False), max_labels=50)
    rng = random.Random(3)
    seen = {labels.label("".join(rng.choices(string.ascii_letters, k=12))) for _ in range(1000)}
    assert len(seen) == 51 and "other" in seen


def test_a_failing_resolver_gives_other() -> None:
    def broken(model: str) -> Spec:
        raise ValueError(model)

    assert ModelLabels(broken).label("x") == "other"


def test_route_labels_are_a_closed_set() -> None:
    assert route_label("/v1/chat/completions") == "chat"
    assert route_label("/v1/context/plan") == "plan"
    assert route_label("/v1/embeddings") == "passthrough"
    assert route_label("/readyz") == "health"
    assert route_label("/metrics") == route_label("/") == "observability"
    assert route_label("/wp-admin/" + "x" * 50) == "other"


def test_retry_outcomes() -> None:
    assert retry_outcomes(0, 200) == []
    assert retry_outcomes(1, 200) == ["succeeded"]
    assert retry_outcomes(2, 400) == ["overflowed_again", "failed"]
    assert retry_outcomes(1, None) == ["failed"]
    assert status_class(None) == "error" and status_class(503) == "5xx"


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


async def test_summary_cache_hooks_and_watched_caches_add_up() -> None:
    metrics = Metrics(version="t")
    cache = MemoryCache(max_entries=8)
    metrics.watch_summary_cache(cache.stats)
    await cache.set("k", "summary")
    assert await cache.get("k") == "summary"
    assert await cache.get("missing") is None
    metrics.record_summary_cache(hit=True)
    metrics.record_summary_cache(hit=False)
    metrics.record_summary_cache(hit=False, error=True)
    assert value(metrics, "ctxproxy_summary_cache_requests_total", result="hit") == 2
    assert value(metrics, "ctxproxy_summary_cache_requests_total", result="miss") == 2
    assert value(metrics, "ctxproxy_summary_cache_requests_total", result="error") == 1
    assert value(metrics, "ctxproxy_summary_cache_entries") == 1


def test_a_broken_watched_cache_does_not_break_the_scrape() -> None:
    metrics = Metrics(version="t")

    def broken() -> Any:
        raise ConnectionError("redis down")

    metrics.watch_summary_cache(broken)
    metrics.record_summary_cache(hit=True)
    assert value(metrics, "ctxproxy_summary_cache_requests_total", result="hit") == 1


def test_unknown_action_kinds_are_counted_as_other() -> None:
    metrics = Metrics(version="t")
    metrics.observe_request(
        route="chat", model="m", outcome="ok", duration_s=0.1, actions={"pruned": 2, "<script>": 1}
    )
    assert value(metrics, "ctxproxy_actions_total", action="pruned", model="m") == 1
    assert value(metrics, "ctxproxy_actions_total", action="other", model="m") == 1


def test_without_prometheus_client_metrics_record_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_prometheus(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("prometheus_client"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    metrics = Metrics(version="t")
    assert not metrics.available
    metrics.request_started()
    metrics.observe_request(route="chat", model="m", outcome="ok", duration_s=0.1, retries=1)
    metrics.observe_upstream(0.1, 200)
    metrics.record_discovery(endpoint="models", result="found")
    with pytest.raises(RuntimeError):
        metrics.render()


def test_prefix_reused_tokens_are_counted_per_model() -> None:
    metrics = Metrics(version="test")
    assert metrics.available
    for reused in (100, 250):
        metrics.observe_request(
            route="chat", model="m", outcome="ok", duration_s=0.01, tokens_before=500, tokens_after=400,
            prefix_reused_tokens=reused,
        )  # fmt: skip
    text = metrics.render()[0].decode()
    assert 'ctxproxy_prefix_reused_tokens_total{model="m"} 350.0' in text
