"""Every wire API visible: a real proxy in front of each registered API's strict fake upstream,
sent requests of every API through its official SDK (short and long, streamed or not, one
refused by policy, and the API's counting endpoint); then ``/metrics`` and ``/status.json``
agree, API by API, with each other and with the ``X-Context-*`` headers the clients received.

The APIs are the registry's (``app.core.dialects.DIALECTS``): a new dialect needs its sample in
``tests/e2e/all_apis.py`` (``SAMPLES``), and nothing here.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.core.dialects import DIALECTS
from tests.e2e.all_apis import LONG_TURNS, SAMPLES, AllApis, Reply, serve_all_apis

REJECT = {"X-Context-Policy": "reject"}


@dataclass(frozen=True)
class Traffic:
    """What each API's client got: its fitted requests' replies (``fitted``) and its counting
    endpoint's reply (``counted``, None when the API has none)."""

    fitted: Mapping[str, list[Reply]]
    counted: Mapping[str, Reply | None]

    def requests(self, api: str) -> int:
        return len(self.fitted[api]) + (self.counted[api] is not None)


@pytest.fixture(scope="module")
def all_apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AllApis]:
    with serve_all_apis(list(DIALECTS), tmp_path_factory.mktemp("all-apis")) as stack:
        yield stack


@pytest.fixture(scope="module")
def traffic(all_apis: AllApis) -> Traffic:
    fitted: dict[str, list[Reply]] = {}
    counted: dict[str, Reply | None] = {}
    url = all_apis.url
    for api, sample in all_apis.samples.items():
        fitted[api] = [
            sample.send(url, turns=1),
            sample.send(url, turns=1, stream=True),
            sample.send(url, turns=LONG_TURNS),
            sample.send(url, turns=LONG_TURNS + 2, stream=True),
            sample.send(url, turns=LONG_TURNS, headers=REJECT),
        ]
        counted[api] = sample.count(url) if sample.count is not None else None
    return Traffic(fitted=fitted, counted=counted)


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s series whose labels include ``labels`` (Prometheus text)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


def observed(url: str, traffic: Traffic) -> tuple[str, dict[str, Any]]:
    """``/metrics`` and ``/status.json`` once every request of ``traffic`` is recorded (a request
    is recorded after its last byte went out, so just after the client has it)."""
    expected = sum(traffic.requests(api) for api in traffic.fitted)
    deadline = time.monotonic() + 10
    while True:
        status = httpx.get(f"{url}/status.json", timeout=10).json()
        text = httpx.get(f"{url}/metrics", timeout=10).text
        recorded = metric_sum(text, "ctxproxy_requests_total", route="count") + sum(
            metric_sum(text, "ctxproxy_requests_total", route=api, api=api) for api in traffic.fitted
        )
        if (
            recorded == expected and status["counters"]["requests"] == expected
        ) or time.monotonic() > deadline:
            return text, status
        time.sleep(0.05)


def test_every_registered_api_has_a_sample_and_was_served(all_apis: AllApis, traffic: Traffic) -> None:
    assert set(SAMPLES) >= set(DIALECTS)
    for api in DIALECTS:
        statuses = [r.status for r in traffic.fitted[api]]
        assert statuses == [200, 200, 200, 200, 400], (api, statuses)
        short, _, long, longer, refused = traffic.fitted[api]
        assert int(short.headers["x-context-tokens-before"]) == int(short.headers["x-context-tokens-after"])
        for cut in (long, longer):  # cut to fit
            assert int(cut.headers["x-context-tokens-before"]) > int(cut.headers["x-context-tokens-after"]), (
                api
            )
        assert "rejected" in refused.headers["x-context-actions"]
        counted = traffic.counted[api]
        assert counted is None or counted.status == 200


def test_metrics_and_status_agree_api_by_api_and_with_what_the_clients_got(
    all_apis: AllApis, traffic: Traffic
) -> None:
    text, status = observed(all_apis.url, traffic)
    assert "_created" not in text
    assert status["apis"][: len(DIALECTS)] == list(DIALECTS)
    by_api = status["counters"]["by_api"]
    for api in DIALECTS:
        mine, replies = by_api[api], traffic.fitted[api]
        forwarded = [r for r in replies if r.status == 200]
        before = sum(int(r.headers["x-context-tokens-before"]) for r in replies)
        after = sum(int(r.headers["x-context-tokens-after"]) for r in forwarded)
        saved = (
            before
            - after
            - sum(int(r.headers["x-context-tokens-before"]) for r in replies if r.status != 200)
        )
        retries = sum(int(r.headers["x-context-retries"]) for r in replies)
        actions = Counter(
            item.split("=")[0]
            for r in replies
            for item in r.headers["x-context-actions"].split(",")
            if item != "none"
        )

        def both(name: str, key: str, **labels: str) -> tuple[float, Any]:
            return metric_sum(text, name, api=api, **labels), mine[key]  # noqa: B023 (called at once)

        figures = {
            "requests": (*both("ctxproxy_requests_total", "requests"), traffic.requests(api)),
            "fitted": (*both("ctxproxy_fits_total", "fitted_requests"), len(replies)),
            "tokens before": (*both("ctxproxy_input_before_tokens_sum", "tokens_before"), before),
            "tokens after": (*both("ctxproxy_input_after_tokens_sum", "tokens_after"), after),
            "tokens saved": (*both("ctxproxy_tokens_saved_total", "tokens_saved"), saved),
            "retries": (*both("ctxproxy_emergency_retries_total", "emergency_retries"), retries),
            "cut": (*both("ctxproxy_fits_total", "changed_requests", result="cut"), 2),
        }
        rejected = metric_sum(text, "ctxproxy_fits_total", api=api, result="rejected")
        figures["rejected"] = (rejected, mine["by_outcome"].get("rejected", 0), 1)
        for figure, (from_metrics, from_status, from_clients) in figures.items():
            assert from_metrics == from_status == from_clients, (api, figure, figures[figure])
        assert saved > 0, api
        assert dict(actions) == mine["actions"], api
        for kind, count in actions.items():
            assert metric_sum(text, "ctxproxy_actions_total", api=api, action=kind) == count, (api, kind)
        memory = sum(mine["memory"][kind] for kind in ("summary", "index", "note"))
        dropped = sum("dropped_turns=" in r.headers["x-context-actions"] for r in forwarded)
        assert metric_sum(text, "ctxproxy_cut_memory_total", api=api) == memory == dropped >= 1, api
        assert metric_sum(text, "ctxproxy_upstream_latency_seconds_count", api=api) >= len(replies) - 1
        if traffic.counted[api] is not None:
            assert metric_sum(text, "ctxproxy_requests_total", api=api, route="count") == 1
    totals = status["counters"]
    for name, key in (
        ("ctxproxy_tokens_saved_total", "tokens_saved"),
        ("ctxproxy_fits_total", "fitted_requests"),
        ("ctxproxy_input_before_tokens_sum", "tokens_before"),
    ):
        assert metric_sum(text, name) == totals[key] == sum(by_api[api][key] for api in DIALECTS), name


def test_each_api_went_to_its_own_upstream(all_apis: AllApis, traffic: Traffic) -> None:
    text, _ = observed(all_apis.url, traffic)
    series = re.compile(
        r'^ctxproxy_upstream_latency_seconds_count\{api="(\w+)",status="\w+",upstream="([^"]+)"\}',
        re.MULTILINE,
    )
    upstreams: dict[str, set[str]] = {api: set() for api in DIALECTS}
    for match in series.finditer(text):
        upstreams.setdefault(match.group(1), set()).add(match.group(2))
    for api in DIALECTS:
        assert len(upstreams[api]) == 1 and "other" not in upstreams[api], (api, upstreams[api])
    assert len({next(iter(upstreams[api])) for api in DIALECTS}) == len(DIALECTS)
