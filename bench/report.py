"""Turn benchmark measurements into statistics, a Markdown report, JSON and PNG plots.

The *overhead* of a target is its latency minus the direct latency at the same percentile
(``p50(target) - p50(direct)``, the same for p95), all measured in the same interleaved run.
The ratio columns divide the target's overhead by each minimal forwarder's overhead: ``1.0`` means
"adds as much as that forwarder", below 1 less.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import routes

DIRECT = "direct"
FORWARDERS = ("fwd-httpx", "fwd-aiohttp", "fwd-httpx-aiohttp")
PROXY = "proxy"

COLUMNS = (
    "target",
    "n",
    "p50 ms",
    "p95 ms",
    "min-max ms",
    "x direct (p50)",
    "overhead p50 / p95 ms",
    "/ fwd-httpx overhead",
    "/ fwd-aiohttp overhead",
    "/ fwd-httpx-aiohttp overhead",
    "server CPU ms/req",
)

THROUGHPUT_COLUMNS = (
    "target",
    "requests",
    "errors",
    "req/s",
    "p50 ms",
    "p99 ms",
    "x baseline req/s",
    "p99 / baseline p99",
    "server CPU ms/req",
    "client CPU %",
)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 100]) of already sorted values."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stats_ms(
    values_s: Iterable[float], *, errors: int = 0, server_cpu_s: float | None = None
) -> dict[str, Any]:
    """Median, p95, p99, min, max and mean in milliseconds, plus the count and CPU per request."""
    ordered = sorted(v * 1000 for v in values_s)
    n = len(ordered)
    out: dict[str, Any] = {"n": n, "errors": errors}
    for key, q in (("p50_ms", 50), ("p95_ms", 95), ("p99_ms", 99)):
        out[key] = percentile(ordered, q)
    out["min_ms"] = ordered[0] if ordered else math.nan
    out["max_ms"] = ordered[-1] if ordered else math.nan
    out["mean_ms"] = sum(ordered) / n if n else math.nan
    out["cpu_ms_per_req"] = (server_cpu_s * 1000 / n) if server_cpu_s is not None and n else None
    return out


def overhead(stats: Mapping[str, Mapping[str, Any]], target: str, key: str) -> float:
    """``stats[target][key] - stats[direct][key]`` (NaN when either is missing)."""
    if target not in stats or DIRECT not in stats:
        return math.nan
    return float(stats[target][key]) - float(stats[DIRECT][key])


def ratio(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return math.nan
    return a / b


def _f(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def latency_rows(stats: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """One row per target of one latency table (columns ``COLUMNS``)."""
    rows: list[dict[str, str]] = []
    for name, s in stats.items():
        row = {
            "target": name,
            "n": str(s["n"]) + (f" ({s['errors']} err)" if s.get("errors") else ""),
            "p50 ms": _f(s["p50_ms"]),
            "p95 ms": _f(s["p95_ms"]),
            "min-max ms": f"{_f(s['min_ms'])}-{_f(s['max_ms'])}",
            "x direct (p50)": _f(
                ratio(s["p50_ms"], stats[DIRECT]["p50_ms"]) if DIRECT in stats else math.nan
            ),
            "overhead p50 / p95 ms": "-"
            if name == DIRECT
            else f"{_f(overhead(stats, name, 'p50_ms'))} / {_f(overhead(stats, name, 'p95_ms'))}",
            "server CPU ms/req": _f(s.get("cpu_ms_per_req"), 3),
        }
        for fwd in FORWARDERS:
            col = f"/ {fwd} overhead"
            if name in (DIRECT, fwd) or fwd not in stats:
                row[col] = "-"
            else:
                r50 = ratio(overhead(stats, name, "p50_ms"), overhead(stats, fwd, "p50_ms"))
                r95 = ratio(overhead(stats, name, "p95_ms"), overhead(stats, fwd, "p95_ms"))
                row[col] = f"{_f(r50)} / {_f(r95)}"
        rows.append(row)
    return rows


def throughput_rows(
    stats: Mapping[str, Mapping[str, Any]], *, baseline: str = "fwd-httpx"
) -> list[dict[str, str]]:
    """One row per target of the concurrency table (columns ``THROUGHPUT_COLUMNS``); the ratio
    columns compare with ``baseline`` (the plain-httpx forwarder with the same worker count)."""
    base = stats.get(baseline)
    rows = []
    for name, s in stats.items():
        rows.append(
            {
                "target": name,
                "requests": str(s["n"]),
                "errors": str(s["errors"]),
                "req/s": _f(s["rps"], 0),
                "p50 ms": _f(s["p50_ms"]),
                "p99 ms": _f(s["p99_ms"]),
                "x baseline req/s": _f(ratio(s["rps"], base["rps"])) if base else "-",
                "p99 / baseline p99": _f(ratio(s["p99_ms"], base["p99_ms"])) if base else "-",
                "server CPU ms/req": _f(s.get("cpu_ms_per_req"), 3),
                "client CPU %": _f(s.get("client_cpu_pct"), 0),
            }
        )
    return rows


def markdown_table(rows: Sequence[Mapping[str, str]], columns: Sequence[str] = COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(row.get(c, "-") for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def check(name: str, ok: bool | None, detail: str) -> dict[str, Any]:
    return {"target": name, "status": "n/a" if ok is None else ("PASS" if ok else "MISS"), "detail": detail}


def evaluate_targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, judged on this run's figures."""
    out: list[dict[str, Any]] = []
    lat = results.get("latency", {})

    def ovh(scenario: str, target: str, key: str) -> float:
        return overhead(lat.get(scenario, {}).get("stats", {}), target, key)

    if PROXY in lat.get("a", {}).get("stats", {}):
        for key in ("p50_ms", "p95_ms"):
            p, h, a = ovh("a", PROXY, key), ovh("a", "fwd-httpx", key), ovh("a", "fwd-aiohttp", key)
            out.append(check(f"(a) overhead {key[:3]} <= fwd-httpx", p <= h, f"{p:.2f} ms vs {h:.2f} ms"))
            out.append(
                check(f"(a) overhead {key[:3]} <= 2x fwd-aiohttp", p <= 2 * a, f"{p:.2f} ms vs 2x{a:.2f} ms")
            )
    if PROXY in lat.get("b_warm", {}).get("stats", {}):
        for key in ("p50_ms", "p95_ms"):
            p, h = ovh("b_warm", PROXY, key), ovh("b_warm", "fwd-httpx", key)
            cold = ovh("b_cold", PROXY, key)
            out.append(
                check(
                    f"(b) overhead {key[:3]} <= 1.5x fwd-httpx",
                    p <= 1.5 * h,
                    f"warm {p:.2f} ms vs 1.5x{h:.2f} ms (cold first request: {cold:.2f} ms)",
                )
            )
    fit = results.get("fit")
    if fit and fit.get("fit_p50_ms") is not None:
        out.append(
            check(
                "(c) whole fit < upstream prompt reading",
                fit["fit_p50_ms"] < fit["prefill_ms"],
                f"fit p50 {fit['fit_p50_ms']:.0f} ms"
                f" (e2e added p50 {fit.get('e2e_overhead_p50_ms', math.nan):.0f} ms)"
                f" vs {fit['prefill_ms']:.0f} ms to read {fit['forwarded_tokens']} tokens at"
                f" {fit['prefill_tokens_per_s']:,} tokens/s",
            )
        )
    if PROXY in lat.get("d_ttfb", {}).get("stats", {}):
        s = lat["d_ttfb"]["stats"]
        d = s[PROXY]["p50_ms"] - s["fwd-httpx"]["p50_ms"]
        out.append(
            check("(d) TTFB within 1 ms of fwd-httpx", d <= 1.0, f"proxy - fwd-httpx = {d:.2f} ms (p50)")
        )
    if PROXY in lat.get("d_drip_ttfb", {}).get("stats", {}):
        s = lat["d_drip_ttfb"]["stats"]
        total = lat["d_drip_total"]["stats"][PROXY]["p50_ms"]
        ttfb = s[PROXY]["p50_ms"]
        out.append(
            check(
                "(d) no buffering (drip stream: first byte long before the end)",
                ttfb < total / 4,
                f"TTFB p50 {ttfb:.1f} ms, total p50 {total:.1f} ms",
            )
        )
    g = lat.get("g_stall", {})
    if PROXY in g.get("stats", {}) and PROXY in g.get("huge_p50_ms", {}):
        small95, huge50 = g["stats"][PROXY]["p95_ms"], g["huge_p50_ms"][PROXY]
        out.append(
            check(
                "(g) a huge count does not stall other requests",
                small95 < huge50 / 2,
                f"small-request p95 {small95:.1f} ms while the huge request took {huge50:.0f} ms (p50);"
                " a stalled loop would make them about equal",
            )
        )
    f = results.get("throughput", {}).get("w1", {}).get("stats", {})
    if PROXY in f and "fwd-httpx" in f:
        rps = ratio(f[PROXY]["rps"], f["fwd-httpx"]["rps"])
        p99 = ratio(f[PROXY]["p99_ms"], f["fwd-httpx"]["p99_ms"])
        out.append(check("(f) req/s >= 1.5x fwd-httpx", rps >= 1.5, f"{rps:.2f}x"))
        out.append(check("(f) p99 <= 0.5x fwd-httpx", p99 <= 0.5, f"{p99:.2f}x"))
    for name, ok, detail in routes.checks(results.get("routes", {})):
        out.append(check(name, ok, detail))
    mem = results.get("memory", {})
    rounds = mem.get("proxy_after_rounds_kib") or []
    if len(rounds) >= 2:
        growth = rounds[-1] - rounds[0]
        out.append(
            check(
                "memory: no growth across repeated (f) runs",
                growth <= max(2048, rounds[0] * 0.02),
                f"RSS after each run (MiB): {', '.join(f'{r / 1024:.1f}' for r in rounds)}",
            )
        )
    return out


def _machine_md(machine: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in machine.items())


def render_markdown(results: Mapping[str, Any]) -> str:
    """The whole report: machine, every latency table, throughput, engine, fit, memory, targets."""
    parts = [
        "# ctxproxy benchmark results",
        "",
        f"Mode: **{results['config']['mode']}**, run at {results['config']['started']}"
        f" in {results['config'].get('duration_s', 0):.0f} s.",
        "",
        f"Machine: {_machine_md(results['machine'])}.",
        "",
        "Overhead = target latency - direct latency at the same percentile, same interleaved run. "
        "`/ fwd-X overhead` = target overhead divided by forwarder X's overhead (p50 / p95). "
        "Server CPU = CPU time of the target's own process (not the upstream's) per request.",
    ]
    for key, block in results.get("latency", {}).items():
        parts += ["", f"## ({key}) {block['title']}", ""]
        if block.get("note"):
            parts += [block["note"], ""]
        parts.append(markdown_table(latency_rows(block["stats"])))
    tp = results.get("throughput", {})
    for block in tp.values():
        parts += ["", f"## (f) {block['title']}", ""]
        if block.get("note"):
            parts += [block["note"], ""]
        rows = throughput_rows(block["stats"], baseline=block.get("baseline", "fwd-httpx"))
        parts.append(markdown_table(rows, THROUGHPUT_COLUMNS))
    if results.get("routes"):
        parts += ["", "## (r) The proxy's routes: chat, /v1/responses, /v1/messages"]
        parts += routes.markdown(results["routes"])
    engine = results.get("engine")
    if engine:
        parts += ["", "## (e) Engine counting throughput (in-process, no HTTP)", ""]
        parts += ["| measure | tokens | p50 ms | min ms | tokens/s (p50) |", "|---|---|---|---|---|"]
        for name, e in engine["runs"].items():
            parts.append(
                f"| {name} | {e['tokens']:,} | {e['p50_ms']:.1f} | {e['min_ms']:.1f} |"
                f" {e['tokens_per_s']:,.0f} |"
            )
        if engine.get("note"):
            parts += ["", engine["note"]]
    fit = results.get("fit")
    if fit:
        parts += ["", "## (c) The fit of an over-long request vs the upstream's prompt reading", ""]
        parts += [f"- {line}" for line in fit.get("lines", [])]
    mem = results.get("memory")
    if mem:
        parts += ["", "## Memory (resident set of the proxy process)", ""]
        parts += [f"- {line}" for line in mem.get("lines", [])]
    checks = results.get("checks", [])
    if checks:
        parts += [
            "",
            "## The issue's targets on this run",
            "",
            "| target | status | figures |",
            "|---|---|---|",
        ]
        parts += [f"| {c['target']} | {c['status']} | {c['detail']} |" for c in checks]
    notes = results.get("notes", [])
    if notes:
        parts += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(parts) + "\n"


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def plot(results: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """PNG plots: latency p50/p95 per scenario, throughput, memory. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    lat = results.get("latency", {})
    if lat:
        keys = list(lat)
        cols = 3
        rows = math.ceil(len(keys) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
        for ax, key in zip(axes.flat, keys, strict=False):
            s = lat[key]["stats"]
            names = list(s)
            p50 = [s[n]["p50_ms"] for n in names]
            p95 = [s[n]["p95_ms"] for n in names]
            xs = range(len(names))
            ax.bar([x - 0.2 for x in xs], p50, width=0.4, label="p50")
            ax.bar([x + 0.2 for x in xs], p95, width=0.4, label="p95")
            ax.set_xticks(list(xs))
            ax.set_xticklabels(names, rotation=30, ha="right", fontsize=7)
            ax.set_title(f"({key}) {lat[key]['title']}"[:60], fontsize=8)
            ax.set_ylabel("ms")
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(keys) :]:
            ax.axis("off")
        fig.tight_layout()
        path = out_dir / "latency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    tp = results.get("throughput", {})
    if tp:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
        labels, rps, p99 = [], [], []
        for key, block in tp.items():
            for name, s in block["stats"].items():
                labels.append(f"{name} ({key})")
                rps.append(s["rps"])
                p99.append(s["p99_ms"])
        ax1.bar(labels, rps)
        ax1.set_title("(f) requests/s (higher is better)", fontsize=9)
        ax2.bar(labels, p99, color="tab:orange")
        ax2.set_title("(f) p99 latency ms (lower is better)", fontsize=9)
        for ax in (ax1, ax2):
            ax.tick_params(axis="x", labelrotation=35, labelsize=7)
            for label in ax.get_xticklabels():
                label.set_ha("right")
        fig.tight_layout()
        path = out_dir / "throughput.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    timeline = results.get("memory", {}).get("timeline", [])
    if timeline:
        fig, ax = plt.subplots(figsize=(8, 3.4))
        ax.plot([t["label"] for t in timeline], [t["rss_kib"] / 1024 for t in timeline], marker="o")
        ax.set_ylabel("RSS MiB")
        ax.set_title("proxy resident memory over the run", fontsize=9)
        ax.tick_params(axis="x", labelrotation=35, labelsize=7)
        for label in ax.get_xticklabels():
            label.set_ha("right")
        fig.tight_layout()
        path = out_dir / "memory.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_results(results: dict[str, Any], out_dir: Path, *, plots: bool = True) -> list[Path]:
    """Write results.md, results.json and the PNG plots into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results["checks"] = evaluate_targets(results)
    md = out_dir / "results.md"
    md.write_text(render_markdown(results))
    js = out_dir / "results.json"
    js.write_text(json.dumps(_json_safe(results), indent=2, sort_keys=False) + "\n")
    written = [md, js]
    if plots:
        written += plot(results, out_dir)
        from bench.plots import write_plots  # overhead against size, tokens before vs after

        written += write_plots(results, out_dir)
    return written
