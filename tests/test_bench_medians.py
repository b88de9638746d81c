"""bench.medians: medians per figure over runs, and the targets checked on the medians."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench import medians, report

TARGETS = ("direct", "fwd-httpx", "fwd-aiohttp", "fwd-httpx-aiohttp", "proxy")


def run(scale: float, *, proxy_p50: float) -> dict[str, Any]:
    """A results.json shape with direct at 1 ms, forwarders at fixed overheads (times ``scale``)."""

    def stats(proxy: float) -> dict[str, Any]:
        extra = {
            "direct": 0.0,
            "fwd-httpx": 2.0,
            "fwd-aiohttp": 1.0,
            "fwd-httpx-aiohttp": 1.5,
            "proxy": proxy,
        }
        return {
            t: {"p50_ms": 1 + extra[t] * scale, "p95_ms": 2 + extra[t] * scale, "cpu_ms_per_req": 1.0}
            for t in TARGETS
        }

    latency = {
        s: {"stats": stats(proxy_p50)} for s in ("a", "b_warm", "b_cold", "c_cold", "d_ttfb", "g_stall")
    }
    w1 = {
        t: {"rps": 100.0 * (3 if t == "proxy" else 1), "p99_ms": 100.0 / (3 if t == "proxy" else 1)}
        for t in TARGETS
    }
    w2 = {t: {"rps": 150.0, "p99_ms": 80.0} for t in ("proxy-w2", "fwd-httpx-w2")}
    return {
        "config": {"started": "2026-11-23T08:00", "commit": "abc"},
        "machine": {"loadavg_at_start": 0.5},
        "latency": latency,
        "throughput": {"w1": {"stats": w1}, "w2": {"stats": w2}},
        "fit": {
            "fit_p50_ms": 100.0,
            "prefill_ms": 8800.0,
            "forwarded_tokens": 88_000,
            "prefill_tokens_per_s": 10_000,
        },
        "memory": {"idle_kib": {"proxy": 180 * 1024}, "proxy_after_rounds_kib": [240 * 1024]},
    }


def test_medians_take_the_middle_run_of_each_figure() -> None:
    runs = [run(1.0, proxy_p50=1.8), run(1.0, proxy_p50=2.6), run(1.0, proxy_p50=1.5)]
    m = medians.medians(runs)
    assert m["(a) overhead p50, proxy (ms)"] == pytest.approx(1.8)
    assert m["(a) overhead p50, fwd-httpx"] == pytest.approx(2.0)


def test_median_results_take_the_median_of_every_number() -> None:
    runs = [run(1.0, proxy_p50=1.8), run(1.0, proxy_p50=2.6), run(1.0, proxy_p50=1.5)]
    merged = medians.median_results(runs)
    assert merged["latency"]["a"]["stats"]["proxy"]["p50_ms"] == pytest.approx(2.8)
    assert merged["memory"]["proxy_after_rounds_kib"] == [240 * 1024]
    assert merged["config"]["commit"] == "abc"  # not a number: the first run's


def test_targets_on_the_medians_pass_and_miss() -> None:
    ok = report.evaluate_targets(medians.median_results([run(1.0, proxy_p50=1.8)] * 3))
    assert len(ok) == 10 and all(c["status"] == "PASS" for c in ok)
    slow_runs = [run(1.0, proxy_p50=2.5), run(1.0, proxy_p50=2.5), run(1.0, proxy_p50=1.0)]
    slow = report.evaluate_targets(medians.median_results(slow_runs))
    failed = {c["target"] for c in slow if c["status"] != "PASS"}
    assert failed == {
        "(a) overhead p50 <= fwd-httpx",
        "(a) overhead p50 <= 2x fwd-aiohttp",
        "(a) overhead p95 <= fwd-httpx",
        "(a) overhead p95 <= 2x fwd-aiohttp",
    }


def test_cli_writes_the_table(tmp_path: Path, capsys: Any) -> None:
    dirs = []
    for i, proxy in enumerate((1.8, 1.9, 1.7)):
        d = tmp_path / f"r{i}"
        d.mkdir()
        (d / "results.json").write_text(json.dumps(run(1.0, proxy_p50=proxy)))
        dirs.append(d)
    broken = copy.deepcopy(run(1.0, proxy_p50=1.8))
    del broken["throughput"]["w2"]  # a run without the --workers 2 table: that figure is left out
    (tmp_path / "r1" / "results.json").write_text(json.dumps(broken))
    out = tmp_path / "medians.md"
    assert medians.main([str(d) for d in dirs] + ["--out", str(out)]) == 0
    text = out.read_text()
    assert "| (a) overhead p50, proxy (ms) | 1.80 | 1.80 | 1.70 | 1.80 |" in text
    assert "| (f) req/s --workers 2, proxy-w2 | 150.00 | - | 150.00 | 150.00 |" in text
    assert "| (a) overhead p50 <= fwd-httpx | PASS |" in text
    assert text in capsys.readouterr().out
