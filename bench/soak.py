"""Load and soak: a fixed number of mixed requests through a real ctxproxy, then leak checks.

``python -m bench.soak`` (20,000 requests at concurrency 64) or ``python -m bench.soak --quick``
(2,000 at 32). Loopback only; it starts its own fake upstream (``bench.fake_upstream``) and a
ctxproxy (uvicorn, one worker) as child processes, and stops both however it ends. It stops by
itself: after ``--requests`` requests, or at ``--max-duration-s`` (then the run counts as failed).

The mix, by request number (deterministic): 40% fitting requests, 15% over-long ones (the
proxy must fit them: 200 with ``X-Context-Actions`` other than ``none``), 30% streaming (200, and
the stream ends with its API's last event: ``data: [DONE]``, ``response.completed``,
``message_stop``), 15% bad requests (malformed JSON, a bad ``X-Context-Budget``, an unknown role,
a body over ``CTXPROXY_MAX_BODY_BYTES``: each must get its 4xx with an error body). Any other
answer, or no answer, is an *unexpected error*. Every kind goes to every route of ``--routes``
(default all four: chat completions, ``/v1/responses``, ``/v1/messages``, Gemini's
``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent?alt=sse``, whose last
chunk carries ``finishReason``; request ``n`` goes to route ``n % len(routes)``), the same
conversations written in each API's shape (``bench/routes.py``).

Memory is measured the way a leak shows: resident memory (``VmRSS``) of the proxy after a warm-up
that sends every distinct body once (so the bounded token cache and the allocator pools are
filled), then after the run; file descriptors of the proxy when it is ready, and when idle again
after the warm-up and after the run (client connections closed, upstream keep-alive connections
expired: ``CTXPROXY_UPSTREAM_KEEPALIVE_S`` is 2 s here); they must be back to the first count.
The bodies come from a fixed pool (``--distinct`` per kind) so that the comparison measures what
requests leave behind, not cache fill.

``--churn`` (issue 27: bounded per-key state): every request is another client's, for another
model, with another output cap: its own key (in every key slot), its own model name
(``soak-small-c<n>``, which the model table resolves by its prefix, so the window and the cuts are
the same), its own ``max_tokens`` (32 to 511); the over-long ones are cut and summarized (summaries
are on by default), so the summarizers, the summary cache, the learned knowledge, the anchors, the
discovery's and the labels' memos all see a new key each time. The warm-up then sends
``CHURN_WARMUP`` such requests (more than any per-key map holds, so every bound is reached; the
recall store's, in megabytes of removed text, is set to ``CHURN_RECALL_MAX_MB`` for that) before
the run (unless ``--warmup`` says otherwise), and the run passes when the resident memory grew by
at most ``CHURN_RSS_TOLERANCE``.

Writes the table to ``bench/results/soak.md`` (``--churn``: ``soak-churn.md``); ``--readme`` also
puts it in README.md between the ``<!-- SOAK:START -->`` and ``<!-- SOAK:END -->`` markers
(``--churn``: ``SOAK-CHURN``). Exit code 0 when every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import routes
from bench.servers import REPO, Server, ServerPool, free_port, uvicorn_argv

MODEL = "soak-small"
WINDOW_TOKENS = 4096
MAX_BODY_BYTES = 1024 * 1024
# One cycle of the mix: 8 fitting, 6 streaming, 3 over-long, 3 bad (40/30/15/15 %), interleaved.
KINDS = (
    "fit", "stream", "fit", "long", "fit", "stream", "bad", "fit", "stream", "fit",
    "long", "stream", "fit", "bad", "fit", "stream", "fit", "long", "stream", "bad",
)  # fmt: skip
BAD_VARIANTS = ("json", "budget", "role", "too_large")
RSS_TOLERANCE = 0.05
# --churn: every per-key map is bounded (the largest hold 4,096 keys): a warm-up past that fills
# them all, after which the resident memory may grow by at most this share.
CHURN_RECALL_MAX_MB = 4
CHURN_WARMUP = 6000
CHURN_RSS_TOLERANCE = 0.10
KEY_HEADERS = ("Authorization", "x-api-key", "x-goog-api-key")
FD_TOLERANCE = 2
KEEPALIVE_S = 2.0
SETTLE_S = KEEPALIVE_S + 3.0
IDLE_MAX_S = 60.0


# What the last event of a good stream holds, per route.
STREAM_ENDS = {
    "chat": b"data: [DONE]",
    "responses": b'"type":"response.completed"',
    "messages": b"message_stop",
    # Gemini's last chunk (CRLF-framed SSE; no [DONE]) carries the finish reason.
    "gemini": b'"finishReason":"STOP"',
}


@dataclass
class Expect:
    body: bytes
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    fitted: bool = False
    path: str = "/v1/chat/completions"
    stream_end: bytes = b"data: [DONE]"


def words(n: int, seed: int) -> str:
    return " ".join(f"w{(seed * 7919 + i) % 997}" for i in range(n))


def build_pool(distinct: int) -> dict[str, list[Expect]]:
    """``distinct`` chat bodies per kind (bad requests: per variant)."""
    pool: dict[str, list[Expect]] = {"fit": [], "stream": [], "long": [], "bad": []}
    for i in range(distinct):
        short = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"Question {i}: {words(40, i)}"},
        ]
        pool["fit"].append(Expect(json.dumps({"model": MODEL, "messages": short}).encode(), 200))
        body = {"model": MODEL, "messages": short, "stream": True, "bench_chunks": 8}
        pool["stream"].append(Expect(json.dumps(body).encode(), 200, stream=True))
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
        for turn in range(12):
            history.append({"role": "user", "content": f"Turn {turn} of {i}: {words(250, i + turn)}"})
            history.append({"role": "assistant", "content": f"Noted {turn}. {words(250, i - turn)}"})
        history.append({"role": "user", "content": f"Final question {i}?"})
        long_body = json.dumps({"model": MODEL, "messages": history}).encode()
        pool["long"].append(Expect(long_body, 200, fitted=True))
        variant = BAD_VARIANTS[i % len(BAD_VARIANTS)]
        if variant == "json":
            pool["bad"].append(Expect(b'{"model": "soak-small", "messages": [' + str(i).encode(), 400))
        elif variant == "budget":
            pool["bad"].append(
                Expect(
                    json.dumps({"model": MODEL, "messages": short}).encode(),
                    400,
                    {"X-Context-Budget": f"-{i}"},
                )
            )
        elif variant == "role":
            pool["bad"].append(
                Expect(
                    json.dumps({"model": MODEL, "messages": [{"role": f"r{i}", "content": "x"}]}).encode(),
                    400,
                )
            )
        else:
            pool["bad"].append(
                Expect(b'{"model": "soak-small", "pad": "' + b"x" * (MAX_BODY_BYTES + i) + b'"}', 413)
            )
    return pool


def in_route(expect: Expect, route: routes.Route, *, model: str = MODEL) -> Expect:
    """``expect`` (a chat request) sent to ``route``: its body written in that API's shape (a body
    that is not a chat request is sent as is: malformed JSON, an over-limit pad), its headers."""
    headers = {**dict(route.headers), **expect.headers}
    stream_end = STREAM_ENDS[route.name]
    try:
        chat = json.loads(expect.body)
    except ValueError:
        chat = None
    body = expect.body
    if route.name != "chat" and isinstance(chat, dict) and "messages" in chat:
        if any(m["role"] not in ("system", "user", "assistant", "tool") for m in chat["messages"]):
            # An unknown role, in the shape the route's API would carry it.
            if route.name == "gemini":
                contents = [{"role": m["role"], "parts": [{"text": m["content"]}]} for m in chat["messages"]]
                body = json.dumps({"contents": contents}).encode()
            else:
                key = "input" if route.name == "responses" else "messages"
                body = json.dumps({"model": MODEL, key: chat["messages"], "max_tokens": 64}).encode()
        else:
            body = routes.in_shape(route.name, chat)
    path = route.path
    if route.name == "gemini":
        # The model is in Gemini's path, and so is streaming (an event stream with alt=sse).
        path = f"/v1beta/models/{model}:" + (
            "streamGenerateContent?alt=sse" if expect.stream else "generateContent"
        )
    return Expect(
        body, expect.status, headers, expect.stream, expect.fitted, path=path, stream_end=stream_end
    )


def build_route_pool(distinct: int, names: list[str]) -> dict[str, list[list[Expect]]]:
    """Per kind, per route (in ``names`` order): the ``distinct`` bodies of ``build_pool``."""
    chat_pool = build_pool(distinct)
    return {
        kind: [[in_route(e, routes.BY_NAME[name]) for e in bodies] for name in names]
        for kind, bodies in chat_pool.items()
    }


def churned(expect: Expect, route: routes.Route, n: int) -> Expect:
    """Request ``n`` of ``--churn``: ``expect`` (a chat request of the pool) as another client's, for
    another model name with another output cap (a bad request keeps its body: only its key is new)."""
    key = f"sk-soak-churn-{n}"
    try:
        chat = json.loads(expect.body)
    except ValueError:
        chat = None
    if expect.status == 200 and isinstance(chat, dict):
        model = f"{MODEL}-c{n}"
        changed = Expect(
            json.dumps({**chat, "model": model, "max_tokens": 32 + (n * 7) % 480}).encode(),
            expect.status,
            expect.headers,
            expect.stream,
            expect.fitted,
        )
        done = in_route(changed, route, model=model)
    else:
        done = in_route(expect, route)
    headers = {
        **done.headers,
        **{name: (f"Bearer {key}" if name == "Authorization" else key) for name in KEY_HEADERS},
    }
    return Expect(done.body, done.status, headers, done.stream, done.fitted, done.path, done.stream_end)


@dataclass
class Tally:
    sent: Counter[str] = field(default_factory=Counter)
    ok: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    routes: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)

    def bad(self, kind: str, text: str) -> None:
        self.unexpected[kind] += 1
        if len(self.examples) < 5:
            self.examples.append(f"{kind}: {text[:200]}")


async def one(session: aiohttp.ClientSession, base_url: str, kind: str, expect: Expect, tally: Tally) -> None:
    tally.sent[kind] += 1
    # A churned model in the path (Gemini's) is counted under one name, not 20,000.
    tally.routes[re.sub(rf"/{MODEL}-c\d+:", f"/{MODEL}-c<n>:", expect.path)] += 1
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-soak", **expect.headers}
    started = time.perf_counter()
    try:
        async with session.post(base_url + expect.path, data=expect.body, headers=headers) as resp:
            data = await resp.read()
            if resp.status != expect.status:
                tally.bad(kind, f"{expect.path} status {resp.status}: {data[:150]!r}")
                return
            last_event = data.replace(b"\r\n", b"\n").rstrip().rsplit(b"\n\n", 1)[-1]  # CRLF: Gemini
            if expect.stream and expect.stream_end not in last_event:
                tally.bad(
                    kind, f"{expect.path} stream did not end with {expect.stream_end!r}: {data[-150:]!r}"
                )
                return
            if expect.fitted and resp.headers.get("X-Context-Actions", "none") == "none":
                tally.bad(kind, "over-long request was not fitted")
                return
            if expect.status >= 400 and b'"error"' not in data:
                tally.bad(kind, f"{expect.path}: error without an error body: {data[:150]!r}")
                return
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.bad(kind, f"{type(exc).__name__}: {exc}")
        return
    tally.latency_s.append(time.perf_counter() - started)
    tally.ok[kind] += 1


async def drive(
    base_url: str,
    pool: dict[str, list[list[Expect]]],
    *,
    start: int,
    count: int,
    concurrency: int,
    deadline: float,
    churn: dict[str, list[Expect]] | None = None,
    names: list[str] | None = None,
) -> Tally:
    """Requests ``start .. start+count-1`` of the mix, ``concurrency`` at a time, until the deadline;
    with ``churn`` (the chat pool) and ``names`` (the routes), each as ``churned`` makes it."""
    tally = Tally()
    counter = iter(range(start, start + count))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for n in counter:
                if time.monotonic() > deadline:
                    return
                kind = KINDS[n % len(KINDS)]
                per_route = pool[kind]
                bodies = per_route[n % len(per_route)]
                expect = bodies[(n // len(KINDS)) % len(bodies)]
                if churn is not None and names is not None:
                    chat = churn[kind][(n // len(KINDS)) % len(bodies)]
                    expect = churned(chat, routes.BY_NAME[names[n % len(names)]], n)
                await one(session, base_url, kind, expect, tally)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def settle(server: Server, seconds: float = SETTLE_S, *, idle_fds: int | None = None) -> tuple[int, int]:
    """RSS and file descriptors after ``seconds``; with ``idle_fds``, and then until the proxy is
    back to that many descriptors (``FD_TOLERANCE`` more) or ``IDLE_MAX_S`` more have passed: with
    ``--churn`` its background summaries (a bounded backlog, ``summary_concurrency`` at a time)
    still hold upstream connections for a while after the last answer."""
    time.sleep(seconds)
    deadline = time.monotonic() + IDLE_MAX_S
    while (
        idle_fds is not None
        and fd_count(server.pid) > idle_fds + FD_TOLERANCE
        and time.monotonic() < deadline
    ):
        time.sleep(1.0)
    return server.rss_kib(), fd_count(server.pid)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def render(result: dict[str, Any]) -> str:
    t: Tally = result["tally"]
    rows = [
        ("requests sent / answered as expected", f"{sum(t.sent.values()):,} / {sum(t.ok.values()):,}"),
        *(
            (f"  {kind}", f"{t.sent[kind]:,} sent, {t.ok[kind]:,} ok, {t.unexpected[kind]} unexpected")
            for kind in ("fit", "long", "stream", "bad")
        ),
        ("routes", ", ".join(f"{path} {n:,}" for path, n in sorted(t.routes.items()))),
        ("unexpected errors", str(sum(t.unexpected.values()))),
        ("concurrency", str(result["concurrency"])),
        ("duration (s)", f"{result['duration_s']:.1f}"),
        ("throughput (req/s)", f"{result['rps']:.0f}"),
        (
            "latency p50 / p99 (ms)",
            f"{percentile(t.latency_s, 0.5) * 1000:.1f} / {percentile(t.latency_s, 0.99) * 1000:.1f}",
        ),
        (
            "proxy RSS after warm-up / after run (MiB)",
            f"{result['rss_warm_kib'] / 1024:.1f} / {result['rss_after_kib'] / 1024:.1f}"
            f" ({result['rss_change']:+.1%}; limit {result.get('tolerance', RSS_TOLERANCE):.0%})",
        ),
        (
            "proxy file descriptors idle: start / after warm-up / after run",
            f"{result['fd_start']} / {result['fd_warm']} / {result['fd_after']}",
        ),
        ("verdict", "PASS" if result["passed"] else "FAIL: " + "; ".join(result["failures"])),
    ]
    lines = ["| measure | value |", "| --- | --- |"]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def update_readme(table: str, header: str, *, marker: str = "SOAK") -> None:
    readme = REPO / "README.md"
    text = readme.read_text(encoding="utf-8")
    start, end = f"<!-- {marker}:START -->", f"<!-- {marker}:END -->"
    if start not in text or end not in text:
        raise SystemExit(f"README.md has no {start} / {end} markers")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    readme.write_text(f"{before}{start}\n{header}\n\n{table}\n{end}{after}", encoding="utf-8")


def run(args: argparse.Namespace) -> dict[str, Any]:
    names = list(getattr(args, "routes", None) or [r.name for r in routes.ROUTES])
    pool_bodies = build_route_pool(args.distinct, names)
    churn = build_pool(args.distinct) if getattr(args, "churn", False) else None
    tolerance = CHURN_RSS_TOLERANCE if churn is not None else RSS_TOLERANCE
    with tempfile.TemporaryDirectory(prefix="ctxproxy-soak-") as tmp, ServerPool(Path(tmp)) as servers:
        models = Path(tmp) / "models.toml"
        models.write_text(
            f'[models."{MODEL}"]\nwindow = {WINDOW_TOKENS}\nmax_output = 512\nencoding = "o200k_base"\n',
            encoding="utf-8",
        )
        up_port = free_port()
        servers.start(
            "upstream",
            [sys.executable, "-m", "bench.fake_upstream", "--port", str(up_port)],
            port=up_port,
            ready_path="/v1/models",
        )
        servers.wait_ready(["upstream"])
        port = free_port()
        proxy = servers.start(
            "ctxproxy",
            uvicorn_argv("app.main:create_app", port),
            port=port,
            env={
                "CTXPROXY_UPSTREAM_BASE_URL": f"http://127.0.0.1:{up_port}/v1",
                "CTXPROXY_MODELS_FILE": str(models),
                "CTXPROXY_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
                "CTXPROXY_LOG_LEVEL": "WARNING",
                # Idle upstream connections close after 2 s, so that "idle" is reached quickly.
                "CTXPROXY_UPSTREAM_KEEPALIVE_S": str(KEEPALIVE_S),
                # The fake upstream serves many requests at once: summaries need not give way to
                # client requests there (on loopback ``auto`` would make them wait for pauses
                # this steady traffic never has, and the soak would hold no summaries).
                "CTXPROXY_SUMMARY_YIELD": "never",
                # The recall store is bounded in megabytes of memory (64 by default), more
                # than the warm-up's cuts fill: with churn, a bound the warm-up reaches.
                **({"CTXPROXY_RECALL_MAX_MB": str(CHURN_RECALL_MAX_MB)} if churn is not None else {}),
            },
            ready_path="/healthz",
        )
        servers.wait_ready(["ctxproxy"])
        url = proxy.base_url
        _, fd_start = settle(proxy, 0.5)  # ready, before any chat request
        deadline = time.monotonic() + args.max_duration_s
        # Every distinct body of every route once (request n: kind n % 20, route n % routes); with
        # --churn, more new keys than any bounded map holds.
        warmup = args.warmup or (CHURN_WARMUP if churn is not None else 0)
        warm_count = max(warmup, len(KINDS) * args.distinct * len(names))
        warm = asyncio.run(
            drive(
                url,
                pool_bodies,
                start=0,
                count=warm_count,
                concurrency=args.concurrency,
                deadline=deadline,
                churn=churn,
                names=names,
            )
        )
        idle = fd_start if churn is not None else None
        rss_warm, fd_warm = settle(proxy, idle_fds=idle)
        began = time.monotonic()
        tally = asyncio.run(
            drive(
                url,
                pool_bodies,
                start=warm_count,
                count=args.requests,
                concurrency=args.concurrency,
                deadline=deadline,
                churn=churn,
                names=names,
            )
        )
        duration_s = time.monotonic() - began
        rss_after, fd_after = settle(proxy, idle_fds=idle)
        alive = proxy.proc.poll() is None
    failures: list[str] = []
    sent = sum(tally.sent.values())
    if sent < args.requests:
        failures.append(f"only {sent} of {args.requests} requests sent before --max-duration-s")
    if sum(tally.unexpected.values()) or sum(warm.unexpected.values()):
        failures.append(f"{sum(tally.unexpected.values()) + sum(warm.unexpected.values())} unexpected errors")
    good = ("fit", "long", "stream")
    if any(tally.ok[k] != tally.sent[k] for k in good):
        failures.append("a good request was not answered")
    rss_change = (rss_after - rss_warm) / rss_warm if rss_warm else float("nan")
    if not rss_change <= tolerance:
        failures.append(f"RSS grew {rss_change:+.1%} (limit {tolerance:.0%})")
    if fd_after > fd_start + FD_TOLERANCE or fd_warm > fd_start + FD_TOLERANCE:
        failures.append(f"file descriptors {fd_start} -> {fd_warm} -> {fd_after}")
    if not alive:
        failures.append("the proxy died")
    return {
        "tally": tally,
        "warm": warm,
        "concurrency": args.concurrency,
        "duration_s": duration_s,
        "rps": sent / duration_s if duration_s else 0.0,
        "rss_warm_kib": rss_warm,
        "rss_after_kib": rss_after,
        "rss_change": rss_change,
        "fd_start": fd_start,
        "fd_warm": fd_warm,
        "fd_after": fd_after,
        "passed": not failures,
        "failures": failures,
        "churn": churn is not None,
        "tolerance": tolerance,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 requests at concurrency 32")
    parser.add_argument("--requests", type=int, help="requests after the warm-up (default 20,000)")
    parser.add_argument("--concurrency", type=int, help="requests in flight (default 64)")
    parser.add_argument(
        "--warmup", type=int, default=0, help="warm-up requests (at least every distinct body once)"
    )
    parser.add_argument("--distinct", type=int, default=50, help="distinct bodies per kind")
    parser.add_argument(
        "--churn",
        action="store_true",
        help="every request another client's (key), model name and output cap; memory within 10%%",
    )
    parser.add_argument(
        "--routes",
        type=lambda text: [name for name in text.split(",") if name],
        default=[r.name for r in routes.ROUTES],
        help="comma-separated routes to mix (default chat,responses,messages)",
    )
    parser.add_argument("--max-duration-s", type=float, default=900.0, help="hard stop (the run then fails)")
    parser.add_argument(
        "--out", type=Path, help="the table (default bench/results/soak.md, or soak-churn.md)"
    )
    parser.add_argument("--readme", action="store_true", help="also write the table into README.md")
    args = parser.parse_args(argv)
    args.requests = args.requests or (2000 if args.quick else 20000)
    args.concurrency = args.concurrency or (32 if args.quick else 64)
    result = run(args)
    table = render(result)
    flags = (" --quick" if args.quick else "") + (" --churn" if args.churn else "")
    header = (
        f"`python -m bench.soak{flags}` on {platform.machine()}, "
        f"{os.cpu_count()} cores shared with the load generator and the fake upstream, "
        f"{time.strftime('%Y-%m-%d')}: {args.requests:,} requests after a warm-up of "
        f"{sum(result['warm'].sent.values()):,}."
    )
    print(header)
    print(table)
    for example in result["tally"].examples + result["warm"].examples:
        print("  example:", example)
    out = args.out or REPO / "bench" / "results" / ("soak-churn.md" if args.churn else "soak.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    title = "Soak: a new client, model and output cap on every request" if args.churn else "Soak"
    out.write_text(f"# {title}\n\n{header}\n\n{table}\n", encoding="utf-8")
    if args.readme:
        update_readme(table, header, marker="SOAK-CHURN" if args.churn else "SOAK")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
