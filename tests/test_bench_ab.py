"""bench.ab's report: the ratios the issues ask, from the rounds' figures (no server started)."""

from __future__ import annotations

import os
from pathlib import Path

from bench import ab, run
from bench.servers import ServerPool


def _meta() -> dict[str, object]:
    return {"rounds": 2, "date": "today", "machine": "2 CPUs", "load_start": 0.1, "load_end": 0.2}


def _figures(*, floor: bool) -> dict[str, list[float]]:
    figures = {
        "small|fwd-aiohttp|added p50": [0.40, 0.50],
        "small|fwd-aiohttp|added p95": [0.60, 0.60],
        "small|fwd-aiohttp|cpu": [0.4, 0.4],
        "small|proxy|added p50": [0.60, 0.70],
        "small|proxy|added p95": [0.90, 0.90],
        "small|proxy|cpu": [0.7, 0.7],
    }
    if floor:
        figures |= {
            "small|stack-floor|added p50": [0.40, 0.50],
            "small|stack-floor|added p95": [0.60, 0.50],
            "small|stack-floor|cpu": [0.5, 0.5],
        }
    return figures


def test_the_report_splits_the_proxy_added_latency_into_stack_and_fitting() -> None:
    text = ab.markdown(
        _figures(floor=True),
        proxies=["proxy"],
        forwarders=["fwd-aiohttp", "stack-floor"],
        trees={"proxy": "HEAD"},
        meta=_meta(),
    )
    assert "| stack-floor | 0.450 | 0.550 | 0.500 | 1.00x | 0.92x |" in text
    assert "| proxy | 0.650 | 0.900 | 0.700 | 1.44x | 1.50x |" in text
    assert "`proxy` / fwd-aiohttp added p50, per round: 1.50, 1.40." in text
    assert (
        "`stack-floor` (the proxy's own stack, service bypassed) / fwd-aiohttp added p50: 1.00x; "
        "`proxy` - `stack-floor`: 0.200 ms, 0.44x fwd-aiohttp's added p50 (the fitting's share)."
    ) in text


def test_without_the_floor_there_is_no_split() -> None:
    text = ab.markdown(
        _figures(floor=False),
        proxies=["proxy"],
        forwarders=["fwd-aiohttp"],
        trees={"proxy": "HEAD"},
        meta=_meta(),
    )
    assert "stack-floor" not in text
    assert "| proxy | 0.650 |" in text


def test_the_floor_is_a_default_forwarder() -> None:
    assert "stack-floor" in ab.FORWARDER_APPS


def test_a_pinned_run_says_where_the_upstream_ran() -> None:
    meta = {**_meta(), "pinned": "the fake upstream on CPU 1, the client and the servers under test on CPU 0"}
    text = ab.markdown(
        _figures(floor=False),
        proxies=["proxy"],
        forwarders=["fwd-aiohttp"],
        trees={"proxy": "HEAD"},
        meta=meta,
    )
    assert "Pinned: the fake upstream on CPU 1, the client and the servers under test on CPU 0." in text
    assert "Pinned" not in ab.markdown(
        _figures(floor=False),
        proxies=["proxy"],
        forwarders=["fwd-aiohttp"],
        trees={"proxy": "HEAD"},
        meta=_meta(),
    )


def test_pinning_puts_the_upstream_alone_on_the_last_cpu(tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        assert ab.pin_upstream(ServerPool(tmp_path), None) is None  # type: ignore[arg-type]
        return
    with ServerPool(tmp_path) as pool:
        upstream = run.start_fake_upstream(pool)
        pool.wait_ready(["upstream"], timeout_s=20)
        try:
            described = ab.pin_upstream(pool, upstream)
            assert os.sched_getaffinity(upstream.pid) == {cpus[-1]}
            assert os.sched_getaffinity(0) == set(cpus[:-1])
        finally:
            os.sched_setaffinity(0, cpus)  # the rest of the test run keeps every CPU
    assert described is not None and f"the fake upstream on CPU {cpus[-1]}" in described
