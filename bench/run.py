"""Run the benchmark suite: ``.venv/bin/python -m bench.run [--quick]``.

Starts the fake upstream, the three minimal forwarders and the proxy (``app.main:create_app``) as
separate uvicorn/python processes on free loopback ports (``--workers 1``), drives them from this
process with a raw aiohttp client, interleaving targets every iteration, and writes
``bench/results/results.{md,json}`` and PNG plots. Every server is stopped in ``finally``.

``--quick`` runs in about two minutes; the full run in well under fifteen. See bench/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench import load, report, routes, scenarios
from bench.forwarders import TARGETS as FORWARDER_APPS
from bench.servers import REPO, Server, ServerPool, free_port, git_state, uvicorn_argv

RESULTS_DIR = REPO / "bench" / "results"
PROXY_TARGET = "proxy"
PREFILL_TOKENS_PER_S = 10_000


@dataclass(frozen=True)
class Plan:
    """Iteration counts and time limits (seconds) of one mode."""

    mode: str
    a_iterations: int
    b_tokens: int
    b_cold: int
    b_warm: int
    c_tokens: int
    c_cold: int
    c_warm: int
    d_iterations: int
    d_drip_iterations: int
    e_tokens: int
    e_repeats: int
    f_requests: int
    f_concurrency: int
    f_rounds: int
    w2_requests: int
    g_tokens: int
    g_repeats: int
    scenario_time_limit_s: float
    r_small_iterations: int = 150
    r_session_tokens: int = 100_000
    r_session_iterations: int = 60
    r_requests: int = 1000


QUICK = Plan(
    "quick", 150, 100_000, 4, 30, 300_000, 3, 6, 100, 8, 1_000_000, 2, 1000, 32, 4, 1000, 1_000_000, 1, 20.0
)
FULL = Plan(
    "full",
    1500,
    100_000,
    20,
    300,
    300_000,
    12,
    30,
    800,
    30,
    1_000_000,
    5,
    5000,
    32,
    5,
    5000,
    1_000_000,
    4,
    150.0,
    r_small_iterations=800,
    r_session_iterations=150,
    r_requests=3000,
)


def machine_info() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "loadavg_at_start": os.getloadavg()[0],
    }


def proxy_available() -> bool:
    return importlib.util.find_spec("app.main") is not None


# ----------------------------------------------------------------------------- servers


def start_fake_upstream(pool: ServerPool, name: str = "upstream") -> Server:
    port = free_port()
    return pool.start(
        name,
        [sys.executable, "-m", "bench.fake_upstream", "--port", str(port)],
        port=port,
        ready_path="/v1/models",
    )


def start_forwarder(
    pool: ServerPool, name: str, upstream: Server, *, app: str | None = None, workers: int = 1
) -> Server:
    port = free_port()
    return pool.start(
        name,
        uvicorn_argv(app or FORWARDER_APPS[name], port, workers=workers),
        port=port,
        env={"BENCH_UPSTREAM_BASE_URL": upstream.base_url + "/v1"},
        ready_path=load.CHAT_PATH,
        ready_body=scenarios.dumps(scenarios.small_body()),
    )


def start_proxy(
    pool: ServerPool,
    name: str,
    upstream: Server,
    models_file: Path,
    *,
    transport: str = "aiohttp",
    workers: int = 1,
    extra_env: dict[str, str] | None = None,
) -> Server:
    port = free_port()
    env = {
        "CTXPROXY_UPSTREAM_BASE_URL": upstream.base_url + "/v1",
        "CTXPROXY_MODELS_FILE": str(models_file),
        "CTXPROXY_UPSTREAM_TRANSPORT": transport,
        # The fake upstream on loopback serves many requests at once: summaries need not give way
        # to client requests there (as in bench.memory and bench.cache; bench.llama measures auto).
        # Under auto, scenario (c)'s summaries wait for a pause, and then go out and are cancelled
        # in the gaps of (f), whose upstream still reads them: (f) measured that, not the proxy.
        "CTXPROXY_SUMMARY_YIELD": "never",
        **(extra_env or {}),
    }
    return pool.start(
        name,
        uvicorn_argv("app.main:create_app", port, workers=workers),
        port=port,
        env=env,
        ready_path=load.CHAT_PATH,
        ready_body=scenarios.dumps(scenarios.small_body()),
    )


# ----------------------------------------------------------------------------- in-process engine


def engine_scenario(plan: Plan) -> dict[str, Any]:
    """(e): counting throughput of the engine alone on ~1M tokens of mixed text."""
    from app.core.tokens import MessageCounter
    from app.tokenizer import counter_for

    counter = counter_for("o200k_base")
    body = scenarios.counting_corpus(approx_tokens=plan.e_tokens)
    texts = [m["content"] for m in body["messages"]]
    counter.count_text("warm up")
    warm = MessageCounter(counter)
    tokens = warm.count_request(body)
    runs: dict[str, Any] = {}

    def record(name: str, times: list[float], n_tokens: int) -> None:
        st = report.stats_ms(times)
        runs[name] = {
            "tokens": n_tokens,
            "p50_ms": st["p50_ms"],
            "min_ms": st["min_ms"],
            "tokens_per_s": n_tokens / (st["p50_ms"] / 1000),
        }

    times: dict[str, list[float]] = {"raw": [], "cold": [], "warm": []}
    raw_tokens = 0
    for _ in range(plan.e_repeats):  # interleaved, so load from elsewhere hits all three alike
        t0 = time.perf_counter()
        raw_tokens = sum(counter.count_text(t) for t in texts)
        times["raw"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        MessageCounter(counter).count_request(body)
        times["cold"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        warm.count_request(body)
        times["warm"].append(time.perf_counter() - t0)
    record("raw tokenizer (count_text per message, floor)", times["raw"], raw_tokens)
    record("cold: new MessageCounter each time", times["cold"], tokens)
    record("warm: same MessageCounter (cache)", times["warm"], tokens)
    return {
        "messages": len(texts),
        "bytes": sum(len(t.encode()) for t in texts),
        "runs": runs,
        "note": f"{len(texts)} messages, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB of text "
        "(45% prose, 25% code, 20% JSON, 10% CJK).",
    }


def fit_scenario(plan: Plan, prefill_tokens_per_s: int) -> dict[str, Any]:
    """(c) in-process: plan_request on a cold ~300K-token conversation for a 128K window."""
    from app.core.budget import Policy
    from app.core.dialects import CHAT
    from app.core.fit import plan_request
    from app.core.registry import ModelSpec
    from app.core.tokens import MessageCounter
    from app.tokenizer import counter_for

    counter = counter_for("o200k_base")
    spec = ModelSpec(scenarios.CUT_MODEL, 128_000, 16_384, "o200k_base", source="operator")
    base = scenarios.agent_messages(approx_tokens=plan.c_tokens, seed=21)
    bodies = [
        scenarios.chat_body(scenarios.salted(base, f"fit{i}"), model=scenarios.CUT_MODEL)
        for i in range(plan.c_cold)
    ]
    count_times = []
    fit_times = []
    result = None
    for body in bodies:
        t0 = time.perf_counter()
        MessageCounter(counter).count_request(body)
        count_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = plan_request(
            body, spec=spec, policy=Policy(), counter=MessageCounter(counter), dialect=CHAT
        )
        fit_times.append(time.perf_counter() - t0)
    assert result is not None
    fit = report.stats_ms(fit_times)
    count = report.stats_ms(count_times)
    forwarded = result.tokens_after if result.fits else result.budget.input_budget_tokens
    prefill_ms = forwarded / prefill_tokens_per_s * 1000
    return {
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "fits": result.fits,
        "actions": result.actions_header() if hasattr(result, "actions_header") else str(result.actions),
        "count_p50_ms": count["p50_ms"],
        "fit_p50_ms": fit["p50_ms"],
        "fit_max_ms": fit["max_ms"],
        "forwarded_tokens": forwarded,
        "prefill_tokens_per_s": prefill_tokens_per_s,
        "prefill_ms": prefill_ms,
        "breakeven_prefill_tokens_per_s": forwarded / (fit["p50_ms"] / 1000),
    }


def _safe(name: str, fn: Callable[[], Any], notes: list[str]) -> Any:
    try:
        return fn()
    except Exception as exc:  # a missing or broken piece must not sink the whole run
        notes.append(f"{name} not measured: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        return None


# ----------------------------------------------------------------------------- HTTP scenarios


def _latency_block(
    title: str, samples: dict[str, load.Samples], *, ttfb: bool = False, note: str = ""
) -> dict[str, Any]:
    stats = {
        name: report.stats_ms(s.ttfb_s if ttfb else s.latency_s, errors=s.errors, server_cpu_s=s.server_cpu_s)
        for name, s in samples.items()
    }
    errors = {name: s.error_examples for name, s in samples.items() if s.error_examples}
    block: dict[str, Any] = {"title": title, "stats": stats, "note": note}
    if errors:
        block["error_examples"] = errors
    return block


class Harness:
    """The HTTP scenarios against running servers; ``targets`` are the interleaved (a)-(d) targets,
    ``f_extra`` join them in (f) (the proxy on the plain httpx transport), ``f_w2`` run (f) with two
    workers each (direct is added to them)."""

    def __init__(
        self,
        plan: Plan,
        pool: ServerPool,
        targets: list[load.Target],
        notes: list[str],
        *,
        f_extra: list[load.Target],
        f_w2: list[load.Target],
    ) -> None:
        self.plan = plan
        self.pool = pool
        self.targets = targets
        self.notes = notes
        self.f_extra = f_extra
        self.f_w2 = f_w2
        self.memory: list[dict[str, Any]] = []
        self.proxy = next((t for t in targets if t.name == PROXY_TARGET), None)

    def cpu_of(self, target: load.Target) -> float | None:
        if target.server is None or target.server == "upstream":
            return None
        server = self.pool.servers.get(target.server)
        return server.cpu_s() if server else None

    def snapshot(self, label: str) -> None:
        server = self.pool.servers.get("proxy")
        if server is not None:
            self.memory.append({"label": label, "rss_kib": server.rss_kib()})

    async def interleaved(
        self,
        session: Any,
        body_for: Callable[[int], bytes],
        iterations: int,
        *,
        stream: bool = False,
        warmup: int = 2,
        targets: list[load.Target] | None = None,
        label: str,
    ) -> dict[str, load.Samples]:
        samples, timed_out = await load.run_interleaved(
            session,
            targets or self.targets,
            body_for,
            iterations=iterations,
            time_limit_s=self.plan.scenario_time_limit_s,
            stream=stream,
            warmup=warmup,
            cpu_of=self.cpu_of,
        )
        if timed_out:
            self.notes.append(f"{label}: stopped at the {self.plan.scenario_time_limit_s:.0f} s limit")
        self.snapshot(f"after {label}")
        return samples

    async def run(self) -> dict[str, Any]:
        plan = self.plan
        latency: dict[str, Any] = {}
        async with load.new_session() as session:
            small = scenarios.dumps(scenarios.small_body())
            s = await self.interleaved(session, lambda i: small, plan.a_iterations, warmup=20, label="(a)")
            latency["a"] = _latency_block("Small fitting request (~200 tokens), non-streaming", s)

            b_base = scenarios.agent_messages(approx_tokens=plan.b_tokens, seed=11)
            run_id = f"{time.time_ns()}"
            s = await self.interleaved(
                session,
                lambda i: scenarios.dumps(
                    scenarios.chat_body(
                        scenarios.salted(b_base, f"{run_id}-b{i}"), model=scenarios.SMALL_MODEL
                    )
                ),
                plan.b_cold,
                warmup=1,
                label="(b) cold",
            )
            latency["b_cold"] = _latency_block(
                "Large fitting request (~100K tokens), cold: a conversation the proxy has never seen", s
            )
            session_b = scenarios.AgentSession(plan.b_tokens, model=scenarios.SMALL_MODEL, seed=11)
            s = await self.interleaved(
                session, lambda i: session_b.next_body(), plan.b_warm, warmup=2, label="(b)"
            )
            latency["b_warm"] = _latency_block(
                "Large fitting request (~100K tokens), steady state: history resent + one new message", s
            )

            c_base = scenarios.agent_messages(approx_tokens=plan.c_tokens, seed=21)
            s = await self.interleaved(
                session,
                lambda i: scenarios.dumps(
                    scenarios.chat_body(scenarios.salted(c_base, f"{run_id}-c{i}"), model=scenarios.CUT_MODEL)
                ),
                plan.c_cold,
                warmup=1,
                label="(c) cold",
            )
            latency["c_cold"] = _latency_block(
                "Over-long request (~300K tokens into a 128K window), cold",
                s,
                note="Direct and the forwarders pass all ~300K tokens on (the fake upstream has no window); "
                "the proxy cuts the request and forwards the fitted one. " + _forwarded_note(s),
            )
            session_c = scenarios.AgentSession(plan.c_tokens, model=scenarios.CUT_MODEL, seed=21)
            s = await self.interleaved(
                session, lambda i: session_c.next_body(), plan.c_warm, warmup=2, label="(c)"
            )
            latency["c_warm"] = _latency_block(
                "Over-long request (~300K tokens into a 128K window), resent + one new message",
                s,
                note=_forwarded_note(s),
            )

            stream_body = scenarios.small_body(stream=True)
            stream_body["bench_chunks"] = 16
            stream_bytes = scenarios.dumps(stream_body)
            s = await self.interleaved(
                session, lambda i: stream_bytes, plan.d_iterations, stream=True, warmup=10, label="(d)"
            )
            latency["d_ttfb"] = _latency_block(
                "Streaming (16 chunks, instant upstream): time to first byte", s, ttfb=True
            )
            latency["d_total"] = _latency_block("Streaming (16 chunks, instant upstream): total", s)
            drip_body = scenarios.small_body(stream=True)
            drip_body.update(bench_chunks=10, bench_drip_ms=5)
            drip_bytes = scenarios.dumps(drip_body)
            s = await self.interleaved(
                session, lambda i: drip_bytes, plan.d_drip_iterations, stream=True, warmup=1, label="(d) drip"
            )
            latency["d_drip_ttfb"] = _latency_block(
                "Streaming, slow-drip upstream (10 chunks, 5 ms apart): time to first byte", s, ttfb=True
            )
            latency["d_drip_total"] = _latency_block("Streaming, slow-drip upstream: total", s)

            huge_base = scenarios.counting_corpus(approx_tokens=plan.g_tokens)["messages"]
            during, huge = await load.run_stall_probe(
                session,
                self.targets[1:],
                lambda r: scenarios.dumps(
                    scenarios.chat_body(
                        scenarios.salted(huge_base, f"{run_id}-g{r}"), model=scenarios.SMALL_MODEL
                    )
                ),
                small,
                repeats=plan.g_repeats,
                time_limit_s=self.plan.scenario_time_limit_s,
            )
            self.snapshot("after (g)")
            huge_p50 = {n: report.stats_ms(h.latency_s)["p50_ms"] for n, h in huge.items()}
            block = _latency_block(
                f"Small requests while one ~{plan.g_tokens // 1000}K-token request (new to the proxy, "
                "over the window) is in flight on the same target",
                during,
                note="`direct` is (a)'s direct figure, for reference. The huge request itself took (p50): "
                + ", ".join(f"{n} {v:.0f} ms" for n, v in huge_p50.items())
                + ". A server that counts on its event loop makes the small requests wait for the count.",
            )
            block["stats"] = {"direct": latency["a"]["stats"]["direct"], **block["stats"]}
            block["huge_p50_ms"] = huge_p50
            latency["g_stall"] = block

            throughput = await self.concurrency(session, small)
            out = {"latency": latency, "throughput": throughput}
            if self.proxy is not None:
                out["routes"] = await self.routes(session, self.proxy)
        return out

    async def routes(self, session: Any, proxy: load.Target) -> dict[str, Any]:
        """(r): the proxy's four routes side by side (``bench/routes.py``)."""
        plan = self.plan
        upstream = self.targets[0]
        measured = await routes.measure(
            session,
            direct_url=upstream.base_url,
            proxy_url=proxy.base_url,
            small_iterations=plan.r_small_iterations,
            session_tokens=plan.r_session_tokens,
            session_iterations=plan.r_session_iterations,
            requests=plan.r_requests,
            concurrency=plan.f_concurrency,
            rounds=plan.f_rounds,
            time_limit_s=plan.scenario_time_limit_s,
            cpu_of=self.cpu_of,
            notes=self.notes,
        )
        self.snapshot("after (r)")
        return {
            "small": _latency_block("Small fitting request on every route", measured["small"]),
            "session": _latency_block("~100K-token session resent, on every route", measured["session"]),
            "throughput": _throughput_block(
                f"{plan.r_requests} small requests per route at concurrency {plan.f_concurrency}",
                measured["throughput"],
                baseline="proxy chat",
            ),
            "fitted": measured["fitted"],
            "note": "Each request is one conversation written in each API's shape (bench/routes.py); added "
            "= proxy minus the fake upstream on the same path, same interleaved run. The concurrency "
            "rounds alternate the routes; server CPU is the proxy's per request of that route.",
        }

    async def concurrency(self, session: Any, body: bytes) -> dict[str, Any]:
        plan = self.plan
        out: dict[str, Any] = {}

        def after_round(r: int) -> None:
            self.snapshot(f"after (f) run {r + 1}")

        async with load.new_session(limit=0) as fresh:
            samples, cut = await load.run_concurrent_rounds(
                fresh,
                [*self.targets, *self.f_extra],
                body,
                requests=plan.f_requests,
                concurrency=plan.f_concurrency,
                rounds=plan.f_rounds,
                time_limit_s=plan.scenario_time_limit_s * 2,
                cpu_of=self.cpu_of,
                after_round=after_round,
            )
        if cut:
            self.notes.append("(f) workers=1: stopped at its time limit")
        out["w1"] = _throughput_block(
            f"Concurrency: {plan.f_requests} small requests per target at concurrency {plan.f_concurrency}, "
            f"--workers 1, in {plan.f_rounds} interleaved runs",
            samples,
        )
        w2 = [self.targets[0], *self.f_w2]
        if self.f_w2:
            async with load.new_session(limit=0) as fresh:
                samples, cut = await load.run_concurrent_rounds(
                    fresh,
                    w2,
                    body,
                    requests=plan.w2_requests,
                    concurrency=plan.f_concurrency,
                    rounds=max(2, plan.f_rounds // 2),
                    time_limit_s=plan.scenario_time_limit_s * 2,
                    cpu_of=self.cpu_of,
                )
            if cut:
                self.notes.append("(f) workers=2: stopped at its time limit")
            out["w2"] = _throughput_block(
                f"Concurrency with uvicorn --workers 2: {plan.w2_requests} small requests per target at "
                f"concurrency {plan.f_concurrency}",
                samples,
                baseline="fwd-httpx-w2",
            )
        return out


def _forwarded_note(samples: dict[str, load.Samples]) -> str:
    parts = []
    for name, s in samples.items():
        fp = b""
        if s.last_body:
            try:
                fp = orjson.loads(s.last_body).get("system_fingerprint", "").encode()
            except orjson.JSONDecodeError:
                fp = b""
        if fp:
            parts.append(f"{name}: upstream received {int(fp.split(b'=')[1]) / 1e6:.2f} MB")
    proxy = samples.get("proxy")
    if proxy and proxy.last_headers:
        parts.append("proxy headers: " + ", ".join(f"{k}={v}" for k, v in sorted(proxy.last_headers.items())))
    return "; ".join(parts) + ("." if parts else "")


def _throughput_block(
    title: str, samples: dict[str, load.Samples], *, baseline: str = "fwd-httpx"
) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for name, s in samples.items():
        st = report.stats_ms(s.latency_s, errors=s.errors, server_cpu_s=s.server_cpu_s)
        st["rps"] = len(s.latency_s) / s.wall_s if s.wall_s else float("nan")
        st["rps_rounds"] = statistics.median(s.round_rps) if s.round_rps else float("nan")
        st["client_cpu_pct"] = 100 * s.client_cpu_s / s.wall_s if s.wall_s else float("nan")
        stats[name] = st
    return {
        "title": title,
        "stats": stats,
        "baseline": baseline,
        "note": f"Ratios compare with {baseline} (same worker count). client CPU % is the load "
        "generator's own CPU use during that target's runs "
        "(near 100% would mean the client, not the target, is the limit).",
    }


# ----------------------------------------------------------------------------- main


def run(
    plan: Plan, *, out_dir: Path, prefill_tokens_per_s: int, proxy_env: dict[str, str], plots: bool
) -> dict[str, Any]:
    started = time.time()
    notes: list[str] = []
    results: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            "mode": plan.mode,
            "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "plan": asdict(plan),
            "proxy_env": proxy_env,
            "prefill_tokens_per_s": prefill_tokens_per_s,
            "commit": git_state(),
            "client": "aiohttp (raw), harness process, uvloop",
            "servers": "uvicorn --workers 1 (uvloop, httptools), each its own process; "
            "fake upstream aiohttp.web",
        },
        "notes": notes,
    }
    have_proxy = proxy_available()
    if not have_proxy:
        notes.append("app.main is not there yet: the proxy was not measured")

    results["engine"] = _safe("(e) engine", lambda: engine_scenario(plan), notes)
    fit = _safe("(c) in-process fit", lambda: fit_scenario(plan, prefill_tokens_per_s), notes)

    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp, ServerPool(Path(tmp)) as pool:
        models_file = Path(tmp) / "models.toml"
        models_file.write_text(scenarios.MODELS_TOML)
        upstream = start_fake_upstream(pool)
        pool.wait_ready(["upstream"], timeout_s=30)
        for name in FORWARDER_APPS:
            start_forwarder(pool, name, upstream)
        start_forwarder(pool, "fwd-httpx-w2", upstream, app=FORWARDER_APPS["fwd-httpx"], workers=2)
        if have_proxy:
            start_proxy(pool, "proxy", upstream, models_file, extra_env=proxy_env)
            start_proxy(pool, "proxy-httpx", upstream, models_file, transport="httpx", extra_env=proxy_env)
            start_proxy(pool, "proxy-w2", upstream, models_file, workers=2, extra_env=proxy_env)
        try:
            pool.wait_ready(timeout_s=90)
        except RuntimeError as exc:
            notes.append(f"a server did not start: {exc}")
            for name in [n for n, s in pool.servers.items() if not s.probe()]:
                pool.stop(name)
        names = list(pool.servers)
        main_targets = [load.Target("direct", upstream.base_url, "upstream")]
        main_targets += [load.Target(n, pool.servers[n].base_url, n) for n in FORWARDER_APPS if n in names]
        if "proxy" in names:
            main_targets.append(load.Target("proxy", pool.servers["proxy"].base_url, "proxy"))

        def targets(*wanted: str) -> list[load.Target]:
            return [load.Target(n, pool.servers[n].base_url, n) for n in wanted if n in names]

        harness = Harness(
            plan,
            pool,
            main_targets,
            notes,
            f_extra=targets("proxy-httpx"),
            f_w2=targets("fwd-httpx-w2", "proxy-w2"),
        )
        memory: dict[str, Any] = {"idle_kib": {n: s.rss_kib() for n, s in pool.servers.items()}}
        harness.snapshot("idle after start")
        if "proxy" in names:
            _warm_cl100k(pool.servers["proxy"], notes)
            harness.snapshot("idle, cl100k request served")
        http = uvloop.run(harness.run())
        results.update(http)
        memory["timeline"] = harness.memory
        memory["proxy_after_rounds_kib"] = [
            m["rss_kib"] for m in harness.memory if m["label"].startswith("after (f) run")
        ]
        memory["lines"] = _memory_lines(memory)
        results["memory"] = memory
    if fit is not None:
        c_cold = results["latency"].get("c_cold", {}).get("stats", {})
        if "proxy" in c_cold:
            fit["e2e_overhead_p50_ms"] = report.overhead(c_cold, "proxy", "p50_ms")
        fit["lines"] = _fit_lines(fit)
        results["fit"] = fit
    results["config"]["duration_s"] = time.time() - started
    results["machine"]["loadavg_at_end"] = os.getloadavg()[0]
    report.write_results(results, out_dir, plots=plots)
    return results


def _warm_cl100k(server: Server, notes: list[str]) -> None:
    body = scenarios.dumps(scenarios.small_body(model=scenarios.CL100K_MODEL))
    status = server.request("POST", load.CHAT_PATH, body)
    if status != 200:
        notes.append(f"the cl100k_base warm-up request to the proxy answered {status}")


def _memory_lines(memory: dict[str, Any]) -> list[str]:
    idle = memory["idle_kib"]
    lines = ["Idle after start (MiB): " + ", ".join(f"{n} {kib / 1024:.1f}" for n, kib in idle.items()) + "."]
    for m in memory["timeline"]:
        lines.append(f"proxy {m['label']}: {m['rss_kib'] / 1024:.1f} MiB")
    return lines


def _fit_lines(fit: dict[str, Any]) -> list[str]:
    lines = [
        f"Request: {fit['tokens_before']:,} tokens (exact, o200k_base) into a 128,000-token window; "
        f"plan fits={fit['fits']}, {fit['tokens_after']:,} tokens after, "
        f"actions: {fit['actions'] or 'none'}.",
        f"Counting alone (cold cache): {fit['count_p50_ms']:.0f} ms p50. Whole fit in-process (count + plan, "
        f"cold): {fit['fit_p50_ms']:.0f} ms p50, {fit['fit_max_ms']:.0f} ms max.",
    ]
    if fit.get("e2e_overhead_p50_ms") is not None:
        lines.append(
            f"End to end through the proxy (cold): {fit['e2e_overhead_p50_ms']:.0f} ms added over direct "
            "(p50)."
        )
    lines.append(
        f"Assumption: the upstream reads (prefills) the prompt at {fit['prefill_tokens_per_s']:,} "
        "tokens/s, a typical figure for a 70B-class model on one modern GPU server; reading the "
        f"{fit['forwarded_tokens']:,} forwarded tokens takes {fit['prefill_ms']:,.0f} ms. The fit stays "
        f"under the prompt reading for any prefill rate below "
        f"{fit['breakeven_prefill_tokens_per_s']:,.0f} tokens/s."
    )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="ctxproxy benchmark suite (see bench/README.md)")
    parser.add_argument("--quick", action="store_true", help="small counts, about two minutes")
    parser.add_argument(
        "--out", type=Path, default=RESULTS_DIR, help="output directory (default bench/results)"
    )
    parser.add_argument("--prefill-tokens-per-s", type=int, default=PREFILL_TOKENS_PER_S)
    parser.add_argument("--proxy-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment for the proxy processes (repeatable)")  # fmt: skip
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    proxy_env = dict(kv.split("=", 1) for kv in args.proxy_env)
    plan = QUICK if args.quick else FULL
    results = run(plan, out_dir=args.out, prefill_tokens_per_s=args.prefill_tokens_per_s, proxy_env=proxy_env,
                  plots=not args.no_plots)  # fmt: skip
    print((args.out / "results.md").read_text())
    print(f"written to {args.out} in {results['config']['duration_s']:.0f} s")


if __name__ == "__main__":
    main()
