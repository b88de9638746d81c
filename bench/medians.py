"""Medians of the headline figures over several benchmark runs: ``python -m bench.medians DIR...``.

Each ``DIR`` holds a ``results.json`` written by ``python -m bench.run``. Prints a Markdown table:
one row per figure (overheads over direct, server CPU per request, throughput, memory), one
column per run, and the median; then the issue's targets (``bench.report.evaluate_targets``)
judged on a results mapping of the median of every measured number (:func:`median_results`). A single run on
a shared machine can land on either side of a line; the median of three interleaved runs is
what the README quotes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import routes
from bench.report import evaluate_targets, overhead

Results = Mapping[str, Any]
Figure = tuple[str, Callable[[Results], float]]


def _ovh(scenario: str, target: str, key: str) -> Callable[[Results], float]:
    return lambda r: overhead(r["latency"][scenario]["stats"], target, key)


def _stat(scenario: str, target: str, key: str) -> Callable[[Results], float]:
    return lambda r: float(r["latency"][scenario]["stats"][target][key])


def _rps(table: str, target: str, key: str = "rps") -> Callable[[Results], float]:
    return lambda r: float(r["throughput"][table]["stats"][target][key])


def _route_added(scenario: str, route: str) -> Callable[[Results], float]:
    return lambda r: routes.added(r["routes"][scenario]["stats"], route, "p50_ms")


def _route_cpu(scenario: str, route: str) -> Callable[[Results], float]:
    return lambda r: float(r["routes"][scenario]["stats"][f"proxy {route}"]["cpu_ms_per_req"])


def _route_rps(route: str, key: str = "rps") -> Callable[[Results], float]:
    return lambda r: float(r["routes"]["throughput"]["stats"][f"proxy {route}"][key])


def _mib(target: str) -> Callable[[Results], float]:
    return lambda r: r["memory"]["idle_kib"][target] / 1024


FIGURES: list[Figure] = [
    ("(a) overhead p50, proxy (ms)", _ovh("a", "proxy", "p50_ms")),
    ("(a) overhead p50, fwd-httpx", _ovh("a", "fwd-httpx", "p50_ms")),
    ("(a) overhead p50, fwd-aiohttp", _ovh("a", "fwd-aiohttp", "p50_ms")),
    ("(a) overhead p50, fwd-httpx-aiohttp", _ovh("a", "fwd-httpx-aiohttp", "p50_ms")),
    ("(a) overhead p95, proxy", _ovh("a", "proxy", "p95_ms")),
    ("(a) overhead p95, fwd-httpx", _ovh("a", "fwd-httpx", "p95_ms")),
    ("(a) overhead p95, fwd-aiohttp", _ovh("a", "fwd-aiohttp", "p95_ms")),
    ("(a) server CPU ms/req, proxy", _stat("a", "proxy", "cpu_ms_per_req")),
    ("(a) server CPU ms/req, fwd-httpx", _stat("a", "fwd-httpx", "cpu_ms_per_req")),
    ("(a) server CPU ms/req, fwd-aiohttp", _stat("a", "fwd-aiohttp", "cpu_ms_per_req")),
    ("(b) warm overhead p50, proxy", _ovh("b_warm", "proxy", "p50_ms")),
    ("(b) warm overhead p50, fwd-httpx", _ovh("b_warm", "fwd-httpx", "p50_ms")),
    ("(b) warm overhead p50, fwd-aiohttp", _ovh("b_warm", "fwd-aiohttp", "p50_ms")),
    ("(b) warm overhead p95, proxy", _ovh("b_warm", "proxy", "p95_ms")),
    ("(b) warm overhead p95, fwd-httpx", _ovh("b_warm", "fwd-httpx", "p95_ms")),
    ("(b) cold overhead p50, proxy", _ovh("b_cold", "proxy", "p50_ms")),
    ("(b) warm server CPU ms/req, proxy", _stat("b_warm", "proxy", "cpu_ms_per_req")),
    ("(c) whole fit in-process p50 (ms)", lambda r: float(r["fit"]["fit_p50_ms"])),
    ("(c) cold overhead p50, proxy", _ovh("c_cold", "proxy", "p50_ms")),
    ("(d) TTFB overhead p50, proxy", _ovh("d_ttfb", "proxy", "p50_ms")),
    ("(d) TTFB overhead p50, fwd-httpx", _ovh("d_ttfb", "fwd-httpx", "p50_ms")),
    ("(f) req/s, proxy", _rps("w1", "proxy")),
    ("(f) req/s, fwd-httpx", _rps("w1", "fwd-httpx")),
    ("(f) req/s, fwd-aiohttp", _rps("w1", "fwd-aiohttp")),
    ("(f) p99 ms, proxy", _rps("w1", "proxy", "p99_ms")),
    ("(f) p99 ms, fwd-httpx", _rps("w1", "fwd-httpx", "p99_ms")),
    ("(f) req/s --workers 2, proxy-w2", _rps("w2", "proxy-w2")),
    ("(f) req/s --workers 2, fwd-httpx-w2", _rps("w2", "fwd-httpx-w2")),
    ("(g) small-request p95 during a 1M-token count (ms)", _stat("g_stall", "proxy", "p95_ms")),
    *(
        (f"(r) {scenario} added p50, {route.path}", _route_added(scenario, route.name))
        for scenario in ("small", "session")
        for route in routes.ROUTES
    ),
    *(
        (f"(r) {scenario} proxy CPU ms/req, {route.path}", _route_cpu(scenario, route.name))
        for scenario in ("small", "session")
        for route in routes.ROUTES
    ),
    *((f"(r) req/s, {route.path}", _route_rps(route.name)) for route in routes.ROUTES),
    *(
        (f"(r) req/s median of rounds, {route.path}", _route_rps(route.name, "rps_rounds"))
        for route in routes.ROUTES
    ),
    ("memory idle, proxy (MiB)", _mib("proxy")),
    ("memory after all scenarios, proxy (MiB)", lambda r: r["memory"]["proxy_after_rounds_kib"][-1] / 1024),
]


def value(results: Results, fn: Callable[[Results], float]) -> float | None:
    try:
        return fn(results)
    except (KeyError, TypeError, IndexError):
        return None


def medians(runs: Sequence[Results]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, fn in FIGURES:
        values = [v for v in (value(r, fn) for r in runs) if v is not None]
        out[name] = statistics.median(values) if values else None
    return out


def median_results(runs: Sequence[Results]) -> dict[str, Any]:
    """One results mapping whose every number is the median of that number over ``runs`` (lists
    element by element, keys only where every run has them): what ``report.evaluate_targets``
    judges, so the targets are defined once, in ``bench.report``."""

    def merge(values: list[Any]) -> Any:
        first = values[0]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            return statistics.median(values)
        if all(isinstance(v, Mapping) for v in values):
            return {k: merge([v[k] for v in values]) for k in first if all(k in v for v in values)}
        if all(isinstance(v, list) and len(v) == len(first) for v in values):
            return [merge(list(column)) for column in zip(*values, strict=True)]
        return first

    merged: dict[str, Any] = merge(list(runs))
    return merged


def render(dirs: Sequence[Path], runs: Sequence[Results]) -> str:
    m = medians(runs)
    head = "| figure | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | median |"
    lines = [head, "|---" * (len(runs) + 2) + "|"]
    for name, fn in FIGURES:
        cells = [value(r, fn) for r in runs]
        text = [f"{c:.2f}" if c is not None else "-" for c in cells]
        med = m[name]
        med_text = f"{med:.2f}" if med is not None else "-"
        lines.append(f"| {name} | " + " | ".join(text) + f" | {med_text} |")
    lines += ["", "| target (on the median of each figure) | status | figures |", "|---|---|---|"]
    checks = evaluate_targets(median_results(runs))
    lines += [f"| {c['target']} | {c['status']} | {c['detail']} |" for c in checks]
    started = ", ".join(str(r["config"]["started"]) for r in runs)
    commits = sorted({str(r["config"].get("commit")) for r in runs})
    loads = ", ".join(f"{r['machine']['loadavg_at_start']:.1f}" for r in runs)
    intro = (
        f"Medians of {len(runs)} runs ({', '.join(str(d) for d in dirs)}); started {started}; "
        f"commit {', '.join(commits)}; load average at start {loads}. Overheads are target minus direct at "
        "the same percentile, in ms."
    )
    return intro + "\n\n" + "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="directories holding results.json")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown here")
    args = parser.parse_args(argv)
    runs = [json.loads((d / "results.json").read_text()) for d in args.dirs]
    text = render(args.dirs, runs)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
