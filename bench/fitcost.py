"""Fit at the cost of counting (issue 29): ``.venv/bin/python -m bench.fitcost``.

What a fit of a large, cold request costs, as a ratio to counting it: each fit's time over the
time single-thread tiktoken (``encode_ordinary``, o200k) takes to encode every string of every
message of the same body, both measured in the same run, in alternating order. Every run salts
every message (a new prefix tag): no cache or memo of the engine or the proxy has seen the text.

The bodies are agent sessions (``agent_session``): a system prompt and a task, then steps of an
assistant message (a few words, or an explanation with a code block) with 1-3 tool calls, each
answered by a tool result of 64-6K tokens (log-uniform: code, JSON, prose, CJK; one in 16 a
large file of 10-30K tokens), then the assistant's answer (1-4K tokens) and the user's next
message (six in ten a pasted file, log or document of 1.5-8K tokens, else a few words). Chat
Completions, an o200k model (``gpt-4o`` with the window set by the caller).

In process (``ctxproxy.fit``, the engine's default policy):

* ``resumed``: a resumed session, cold: ~364K tokens into a 128K window;
* ``switched``: a long session switched to a small model: the same into 4,096;
* ``1m``: ~1.2M tokens (about a million words) into 8,192.

Through the HTTP route (``--http``, default on): a ~2M-token body (~9 MB) into a 4,096-token model
through a real proxy (uvicorn on 127.0.0.1, ``bench.fake_upstream`` behind it: an instant
upstream); the proxy's added latency (proxy minus the upstream alone, the same bytes) over the
single-thread count of the body's messages. ``X-Context-Summarize: off`` unless ``--summaries``
(the fit's cost alone; with summaries on the proxy also asks the upstream for a summary of what
the cut forgot). The proxy's peak resident set (``VmHWM``) after the first request and after the
runs (the proxy keeps recent bodies and counts: ``BodyMemo``, the count cache).

Peak memory of the 2M-token fit in process: ``tracemalloc``'s peak above what the body itself
holds (one run, after the timed ones).

Medians of ``--runs`` (5). Writes ``bench/results/fitcost.md`` and ``fitcost.json``.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench import scenarios
from bench.run import start_fake_upstream, start_proxy
from bench.scenarios import agent_opening, cjk, code, json_text, prose
from bench.servers import REPO, ServerPool, git_state

RESULTS = REPO / "bench" / "results"
MODEL = "gpt-4o"
HTTP_MODEL = "bench-4k"
# The benchmark's models (the proxy's readiness probe asks for one) and a 4K one.
MODELS_TOML = f"""{scenarios.MODELS_TOML}
[models."{HTTP_MODEL}"]
window = 4096
max_output = 1024
encoding = "o200k_base"
"""
Message = dict[str, Any]
PATH_WORDS = ("api", "core", "service", "handler", "parser", "cache", "config", "session", "stream")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    title: str
    approx_tokens: int
    window_tokens: int


CASES = (
    Case("resumed", "a resumed session, cold: into a 128K window", 364_000, 128_000),
    Case("switched", "a long session switched to a small model: into 4,096", 364_000, 4_096),
    Case("1m", "1M words into 8,192", 1_200_000, 8_192),
)
HTTP_TOKENS = 2_080_000
HTTP_WINDOW = 4_096


# ----------------------------------------------------------------------------- bodies


def _result_text(rng: random.Random, tokens: int) -> str:
    kind = rng.random()
    if kind < 0.35:
        return code(rng, tokens)
    if kind < 0.6:
        return json_text(rng, tokens)
    return prose(rng, tokens) if kind < 0.93 else cjk(rng, tokens)


def agent_session(*, approx_tokens: int, seed: int = 29) -> list[Message]:
    """An agent session of about ``approx_tokens`` o200k tokens ending with a user message (see
    the module docstring); every tool call is answered right after its assistant message."""
    rng = random.Random(seed)
    messages = agent_opening(rng, system_tokens=1200, task_tokens=300)
    total = 1500
    call = 0
    while total < approx_tokens:
        if rng.random() < 0.3:  # an explanation with the code it wrote
            size = rng.randint(800, 5000)
            content = prose(rng, size // 3) + "\n\n```python\n" + code(rng, size - size // 3) + "```"
        else:
            size = rng.randint(20, 120)
            content = prose(rng, size)
        calls = []
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            call += 1
            name = rng.choice(("read_file", "run_query", "grep"))
            arguments = orjson.dumps(
                {"path": f"src/{rng.choice(PATH_WORDS)}/{rng.choice(PATH_WORDS)}.py"}
            ).decode()
            function = {"name": name, "arguments": arguments}
            calls.append({"id": f"call_{call:05d}", "type": "function", "function": function})
        messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        total += size
        for tool_call in calls:
            tokens = int(2 ** rng.uniform(6, 12.5)) if rng.random() > 1 / 16 else rng.randint(10_000, 30_000)
            result = _result_text(rng, tokens)
            messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": result})
            total += tokens + 30
        reply = rng.randint(1000, 4000)
        asked = rng.randint(1500, 8000) if rng.random() < 0.6 else rng.randint(20, 200)
        messages.append({"role": "assistant", "content": prose(rng, reply)})
        text = _result_text(rng, asked) if asked > 1000 else prose(rng, asked)
        messages.append({"role": "user", "content": text})
        total += reply + asked
    return messages


def salted(messages: Sequence[Message], salt: str) -> list[Message]:
    """A copy whose every message's content starts with ``[salt]``: new to every cache."""
    return [{**m, "content": f"[{salt}] {m['content']}"} for m in messages]


def chat_body(messages: Sequence[Message], model: str) -> dict[str, Any]:
    return {"model": model, "messages": list(messages), "max_tokens": 1024}


# ----------------------------------------------------------------------------- measures


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def baseline_s(messages: Sequence[Message]) -> tuple[float, int]:
    """Seconds single-thread ``encode_ordinary`` takes over every string of every message, and
    the tokens it found."""
    from app.tokenizer import load_encoding

    encode = load_encoding("o200k_base").encode_ordinary
    started = time.perf_counter()
    tokens = sum(len(encode(text)) for message in messages for text in _strings(message))
    return time.perf_counter() - started, tokens


def pool_s(messages: Sequence[Message]) -> float:
    """Seconds the proxy's counting pool (``app.tokenizer.counting_pool``, every usable CPU)
    takes to count every string of every message: the floor of a fit that counts the whole body
    (``X-Context-Tokens-Before`` is exact) on this machine."""
    from app.tokenizer import counter_for, counting_pool

    count = counter_for("o200k_base").count_text
    texts = [text for message in messages for text in _strings(message)]
    started = time.perf_counter()
    counting_pool().counts(count, texts)
    return time.perf_counter() - started


def fit_s(body: Mapping[str, Any], window_tokens: int) -> tuple[float, Any]:
    import ctxproxy

    started = time.perf_counter()
    result = ctxproxy.fit(body, window_tokens=window_tokens)
    return time.perf_counter() - started, result


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def in_process(case: Case, *, runs: int) -> dict[str, Any]:
    messages = agent_session(approx_tokens=case.approx_tokens)
    fits: list[float] = []
    bases: list[float] = []
    ratios: list[float] = []
    pools: list[float] = []
    result: Any = None
    tokens = 0
    for run in range(runs):
        fresh = salted(messages, f"{case.name}-{run}-{random.random():.6f}")
        body = chat_body(fresh, MODEL)
        gc.collect()
        if run % 2:
            fit, result = fit_s(body, case.window_tokens)
            base, tokens = baseline_s(fresh)
        else:
            base, tokens = baseline_s(fresh)
            fit, result = fit_s(body, case.window_tokens)
        fits.append(fit)
        bases.append(base)
        ratios.append(fit / base)
        pools.append(pool_s(salted(messages, f"{case.name}-pool-{run}-{random.random():.6f}")) / base)
        print(
            f"  {case.name} run {run + 1}: fit {fit:.3f} s, counting {base:.3f} s, {fit / base:.2f}x "
            f"(the pool alone {pools[-1]:.2f}x)"
        )
    return {
        "title": case.title,
        "messages": len(messages),
        "window_tokens": case.window_tokens,
        "encoded_tokens": tokens,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "actions": list(result.actions),
        "fit_s": fits,
        "baseline_s": bases,
        "ratio": ratios,
        "fit_median_s": _median(fits),
        "baseline_median_s": _median(bases),
        "ratio_median": _median(ratios),
        "pool_ratio": pools,
        "pool_ratio_median": _median(pools),
    }


def fit_memory(messages: Sequence[Message], window_tokens: int) -> dict[str, Any]:
    """tracemalloc's peak while fitting a body already built, above what it held before."""
    body = chat_body(salted(messages, f"mem-{random.random():.6f}"), MODEL)
    raw_bytes = len(orjson.dumps(body))
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        _, result = fit_s(body, window_tokens)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {
        "body_json_bytes": raw_bytes,
        "peak_above_body_bytes": peak - before,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
    }


def _vm_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _post(port: int, body: bytes, headers: Mapping[str, str]) -> tuple[float, int, dict[str, str]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        started = time.perf_counter()
        connection.request("POST", "/v1/chat/completions", body=body, headers=dict(headers))
        response = connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        found = {k.lower(): v for k, v in response.getheaders() if k.lower().startswith("x-context-")}
        return elapsed, response.status, found
    finally:
        connection.close()


def through_http(*, runs: int, summaries: bool) -> dict[str, Any]:
    messages = agent_session(approx_tokens=HTTP_TOKENS, seed=31)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    if not summaries:
        headers["X-Context-Summarize"] = "off"
    direct: list[float] = []
    proxied: list[float] = []
    bases: list[float] = []
    ratios: list[float] = []
    found: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ctxproxy-fitcost-") as tmp, ServerPool() as pool:
        models_file = Path(tmp) / "models.toml"
        models_file.write_text(MODELS_TOML)
        upstream = start_fake_upstream(pool)
        proxy = start_proxy(pool, "proxy", upstream, models_file)
        pool.wait_ready()
        idle_kib = _vm_kib(proxy.pid, "VmRSS")
        body_bytes = first_kib = 0
        for run in range(runs):
            fresh = salted(messages, f"http-{run}-{random.random():.6f}")
            raw = orjson.dumps(chat_body(fresh, HTTP_MODEL))
            body_bytes = len(raw)
            base, _ = baseline_s(fresh)
            upstream_s, status, _ = _post(upstream.port, raw, headers)
            proxy_s, status, found = _post(proxy.port, raw, headers)
            if status != 200:
                raise RuntimeError(f"the proxy answered {status}:\n{proxy.log_tail()}")
            if run == 0:
                first_kib = _vm_kib(proxy.pid, "VmHWM")
            direct.append(upstream_s)
            proxied.append(proxy_s)
            bases.append(base)
            ratios.append((proxy_s - upstream_s) / base)
            print(
                f"  http run {run + 1}: proxy {proxy_s:.3f} s, upstream alone {upstream_s:.3f} s, "
                f"counting {base:.3f} s, added {ratios[-1]:.2f}x",
                flush=True,
            )
        peak_kib = _vm_kib(proxy.pid, "VmHWM")
    added = [p - d for p, d in zip(proxied, direct, strict=True)]
    return {
        "messages": len(messages),
        "body_bytes": body_bytes,
        "summaries": summaries,
        "headers": found,
        "proxy_s": proxied,
        "upstream_s": direct,
        "baseline_s": bases,
        "added_s": added,
        "ratio": ratios,
        "added_median_s": _median(added),
        "baseline_median_s": _median(bases),
        "ratio_median": _median(ratios),
        "proxy_idle_rss_kib": idle_kib,
        "proxy_first_peak_rss_kib": first_kib,
        "proxy_peak_rss_kib": peak_kib,
    }


# ----------------------------------------------------------------------------- report


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def report(results: Mapping[str, Any]) -> str:
    lines = [
        "# Fit at the cost of counting (`python -m bench.fitcost`)",
        "",
        f"{results['when']} UTC, commit `{results['commit']}`, {results['machine']}, load average "
        f"{results['load_start']} at the start, {results['load_end']} at the end; medians of "
        f"{results['runs']} runs. Ratio: the fit's time over single-thread `encode_ordinary` of every "
        "string of every message of the same body, in the same run (target: at most 0.7x in "
        "process, 1.0x added through the HTTP route). The pool alone: the proxy's counting pool "
        "counting every string of the same body (another salt), over the same single-thread count: "
        "what counting the whole body costs at best on this machine's threads.",
        "",
        "| case | messages | tokens before -> after | actions | fit | counting | ratio | per run "
        "| the pool alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, case in results["cases"].items():
        runs = ", ".join(f"{r:.2f}" for r in case["ratio"])
        lines.append(
            f"| {name}: {case['title']} | {case['messages']} | {case['tokens_before']:,} -> "
            f"{case['tokens_after']:,} | {', '.join(case['actions'])} | {case['fit_median_s']:.3f} s | "
            f"{case['baseline_median_s']:.3f} s | **{case['ratio_median']:.2f}x** | {runs} | "
            f"{case['pool_ratio_median']:.2f}x |"
        )
    memory = results.get("memory")
    if memory:
        lines += [
            "",
            f"Peak memory of the in-process fit of the {memory['tokens_before']:,}-token body "
            f"({memory['body_json_bytes'] / 1e6:.1f} MB of JSON) into {HTTP_WINDOW:,}: "
            f"{_mib(memory['peak_above_body_bytes'])} above what the parsed body holds (tracemalloc).",
        ]
    http = results.get("http")
    if http:
        h = http["headers"]
        runs = ", ".join(f"{r:.2f}" for r in http["ratio"])
        lines += [
            "",
            f"Through the HTTP route: {http['messages']} messages, {http['body_bytes'] / 1e6:.1f} MB, "
            f"into {HTTP_WINDOW:,} (summaries {'on' if http['summaries'] else 'off'}): tokens "
            f"{h.get('x-context-tokens-before', '?')} -> {h.get('x-context-tokens-after', '?')}, "
            f"actions `{h.get('x-context-actions', '?')}`.",
            "",
            "| proxy | upstream alone | added | counting | ratio | per run | RSS: idle / peak, one / all |",
            "|---|---|---|---|---|---|---|",
            f"| {_median(http['proxy_s']):.3f} s | {_median(http['upstream_s']):.3f} s | "
            f"{http['added_median_s']:.3f} s | {http['baseline_median_s']:.3f} s | "
            f"**{http['ratio_median']:.2f}x** | {runs} | {http['proxy_idle_rss_kib'] / 1024:,.0f} / "
            f"{http['proxy_first_peak_rss_kib'] / 1024:,.0f} / "
            f"{http['proxy_peak_rss_kib'] / 1024:,.0f} MiB |",
        ]
    return "\n".join(lines) + "\n"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fitcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cases", default=",".join(c.name for c in CASES), help="comma-separated case names")
    parser.add_argument("--no-http", dest="http", action="store_false", help="skip the HTTP route")
    parser.add_argument("--no-memory", dest="memory", action="store_false", help="skip the tracemalloc run")
    parser.add_argument("--summaries", action="store_true", help="LLM summaries on (the proxy's default)")
    parser.add_argument("--out", type=Path, default=RESULTS / "fitcost.md")
    args = parser.parse_args(argv)
    import ctxproxy

    ctxproxy.fit(chat_body([{"role": "user", "content": "warm up"}], MODEL), window_tokens=4096)
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "commit": git_state(subject=False),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_start": _load(),
        "runs": args.runs,
        "cases": {},
    }
    wanted = set(args.cases.split(","))
    for case in CASES:
        if case.name in wanted:
            print(f"{case.name}: {case.title}", flush=True)
            results["cases"][case.name] = in_process(case, runs=args.runs)
    if args.memory:
        print("memory: the 2M-token body in process", flush=True)
        results["memory"] = fit_memory(agent_session(approx_tokens=HTTP_TOKENS, seed=31), HTTP_WINDOW)
    if args.http:
        print("http: the 2M-token body through the proxy", flush=True)
        results["http"] = through_http(runs=args.runs, summaries=args.summaries)
    results["load_end"] = _load()
    text = report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
