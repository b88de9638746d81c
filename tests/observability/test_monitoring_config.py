"""The shipped monitoring config matches the metrics: Grafana dashboard, Prometheus, compose profile."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from app.observability.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]


def exposed_series() -> set[str]:
    metrics = Metrics(version="t", apis=["chat"])
    metrics.observe_request(
        route="chat", api="chat", model="m", outcome="ok", duration_s=0.1, overhead_s=0.01, tokens_before=10,
        tokens_after=5, actions={"dropped_turns": 1}, retries=1, final_upstream_status=200,
        prefix_reused_tokens=3, memory="note",
    )  # fmt: skip
    metrics.observe_upstream(0.1, 200, api="chat", upstream="http://u/v1")
    metrics.record_discovery(endpoint="models", result="found")
    metrics.record_summary(api="chat", outcome="ok", tokens_in=10, tokens_out=2)
    metrics.record_summary_cache(api="chat", hit=True)
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


# Series that are not about a request of an API: the dashboard need not break them down by API.
NOT_PER_API = {"ctxproxy_in_flight_requests", "ctxproxy_discovery_total", "ctxproxy_summary_cache_entries"}


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads((REPO / "config" / "grafana-dashboard.json").read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = dashboard["panels"]
    return found


def test_every_dashboard_query_uses_a_metric_the_app_exposes() -> None:
    series = exposed_series()
    used: set[str] = set()
    for panel in panels():
        for target in panel.get("targets", []):
            names = set(re.findall(r"\bctxproxy_\w+", target["expr"]))
            assert names, target["expr"]
            used |= names
    assert used and used <= series, used - series
    families = {re.sub(r"_(bucket|sum|count|total)$", "", name) for name in used}
    for wanted in ("requests", "input_before_tokens", "input_after_tokens", "actions", "emergency_retries",
                   "summary_cache_requests", "upstream_latency_seconds", "proxy_overhead_seconds",
                   "discovery", "in_flight_requests", "fits", "tokens_saved", "prefix_reused_tokens",
                   "cut_memory", "summary_calls", "summary_tokens"):  # fmt: skip
        assert f"ctxproxy_{wanted}" in families, wanted


def test_the_dashboard_breaks_every_request_metric_down_or_filters_it_by_api() -> None:
    dashboard = json.loads((REPO / "config" / "grafana-dashboard.json").read_text(encoding="utf-8"))
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert "api" in names
    by_api = 0
    for panel in panels():
        for target in panel.get("targets", []):
            expr = target["expr"]
            if set(re.findall(r"\bctxproxy_\w+", expr)) <= NOT_PER_API:
                continue
            assert re.search(r"\bapi\b", expr), expr  # "by (api ...)" or an api=~"$api" filter
            by_api += "by (api" in expr or "le, api)" in expr
    assert by_api >= 10


def test_dashboard_panels_use_the_datasource_variable_and_unique_ids() -> None:
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


def test_compose_monitoring_profile_adds_prometheus_and_grafana_only_on_request() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert services["prometheus"]["profiles"] == ["monitoring"]
    assert services["grafana"]["profiles"] == ["monitoring"]
    assert "profiles" not in services["ctxproxy"]
    for name, config in compose["configs"].items():
        if "file" in config:
            assert (REPO / config["file"]).is_file(), name
    prometheus = yaml.safe_load((REPO / "config" / "prometheus.yml").read_text(encoding="utf-8"))
    [job] = prometheus["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["ctxproxy:8080"]
    datasource = yaml.safe_load(compose["configs"]["grafana-datasource"]["content"])
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
