"""This tree's proxy against other trees' proxies, interleaved request by request.

``.venv/bin/python -m bench.ab --tree base=/tmp/base [--rounds 5] [--out FILE]``

Where ``bench.run`` compares two commits by alternating whole runs (before, after, before, ...),
this puts every proxy in one run: the fake upstream, the raw-aiohttp forwarder, the stack floor
(``bench.forwarders.ctxproxy_floor``: this tree's app with its service bypassed; ``--forwarders``
picks others), this tree's proxy
(``proxy``) and one proxy per ``--tree NAME=DIR`` (``DIR``: a checkout with its own ``.venv``, e.g.
``git worktree add /tmp/base COMMIT && (cd /tmp/base && bash .ci/setup)``), each its own process,
and every iteration sends the same bytes to all of them in a rotated order. Each round measures:

* **small**: scenario (a)'s small chat request: added latency (target minus direct, p50 and p95)
  and the server's CPU per request (``schedstat`` of its process, around the whole batch);
* **route small** / **route session**: scenario (r)'s small request and ~100K-token resent
  session on each ``--routes`` route (default chat and gemini), for every proxy whose tree serves
  that route (probed first; a tree without it is left out of that route's rows); CPU per request
  read around every request (one process serves all routes);
* **route rps** (unless ``--no-rps``): small requests at concurrency 32 per proxy and route,
  ``2 x targets`` rounds of one batch of ``--rps-requests`` per target, the order rotated round by
  round so that each target leads two rounds (requests/s of each batch; the table's median is over
  all of them) and the server's CPU per request over all its batches.

The table gives each figure's median over the rounds (a round's p50 is one sample), and the
ratios the issues ask: the proxy's added p50 over the raw-aiohttp forwarder's, over each other
tree's, and a route's over chat's on the same proxy. Every server is stopped in ``finally``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from bench import load, report, routes, scenarios
from bench.forwarders import STACK_FLOOR, TARGETS
from bench.servers import REPO, Server, ServerPool, free_port, git_state, process_tree, uvicorn_argv

FORWARDER = "fwd-aiohttp"  # the floor the ratios are taken against
FORWARDER_APPS = {**TARGETS, **STACK_FLOOR}
HEAD = "proxy"
Figures = dict[str, list[float]]


def start_proxy(pool: ServerPool, name: str, tree: Path, upstream: Server, models: Path) -> Server:
    """A proxy from ``tree`` (its own ``.venv``), configured as ``bench.run`` configures its own."""
    port = free_port()
    python = tree / ".venv" / "bin" / "python"
    env = {
        "CTXPROXY_UPSTREAM_BASE_URL": upstream.base_url + "/v1",
        "CTXPROXY_MODELS_FILE": str(models),
        "CTXPROXY_UPSTREAM_TRANSPORT": "aiohttp",
    }
    return pool.start(
        name,
        uvicorn_argv("app.main:create_app", port, python=str(python)),
        port=port,
        env=env,
        cwd=tree,
        ready_path=load.CHAT_PATH,
        ready_body=scenarios.dumps(scenarios.small_body()),
    )


def _add(figures: Figures, key: str, value: float | None) -> None:
    if value is not None:
        figures.setdefault(key, []).append(value)


async def _serves(session: Any, target: load.Target) -> bool:
    """True when ``target`` fits the route's small request (answers 200 with ``X-Context-*``)."""
    probe = load.Samples()
    route = next(r for r in routes.ROUTES if r.path == target.path)
    await load.request_once(session, target, routes.small(route.name), probe, stream=False)
    return bool(probe.latency_s) and bool(probe.last_headers)


class AB:
    def __init__(self, pool: ServerPool, proxies: Sequence[str], args: argparse.Namespace) -> None:
        self.pool = pool
        self.proxies = list(proxies)
        self.args = args
        self.figures: Figures = {}

    def cpu_of(self, target: load.Target) -> float | None:
        server = self.pool.servers.get(target.server or "")
        return None if server is None or target.server == "upstream" else server.cpu_s()

    def target(
        self, name: str, path: str = load.CHAT_PATH, headers: tuple[tuple[str, str], ...] = ()
    ) -> load.Target:
        server = self.pool.servers[name]
        return load.Target(name, server.base_url, server=name, path=path, headers=headers)

    async def route_targets(self, session: Any) -> dict[str, list[load.Target]]:
        """Per route: direct, then each proxy that fits it."""
        out: dict[str, list[load.Target]] = {}
        for name in self.args.routes:
            route = routes.BY_NAME[name]
            up = self.pool.servers["upstream"]
            targets = [
                load.Target(
                    f"direct {name}", up.base_url, server="upstream", path=route.path, headers=route.headers
                )
            ]
            for proxy in self.proxies:
                t = self.target(proxy, route.path, route.headers)
                t = load.Target(
                    f"{proxy} {name}", t.base_url, server=proxy, path=route.path, headers=route.headers
                )
                if await _serves(session, t):
                    targets.append(t)
            out[name] = targets
        return out

    def record(self, scenario: str, samples: dict[str, load.Samples], direct: str) -> None:
        stats = {
            n: report.stats_ms(s.latency_s, errors=s.errors, server_cpu_s=s.server_cpu_s)
            for n, s in samples.items()
        }
        for name, st in stats.items():
            if name == direct:
                continue
            for q in ("p50_ms", "p95_ms"):
                _add(self.figures, f"{scenario}|{name}|added {q[:3]}", st[q] - stats[direct][q])
            _add(self.figures, f"{scenario}|{name}|cpu", st["cpu_ms_per_req"])
            _add(self.figures, f"{scenario}|{name}|errors", float(st["errors"]))

    async def run(self) -> None:
        args = self.args
        small = scenarios.dumps(scenarios.small_body())
        async with load.new_session() as session:
            up = self.pool.servers["upstream"]
            a_targets = [load.Target("direct", up.base_url, server="upstream")]
            a_targets += [self.target(name) for name in (*self.args.forwarders, *self.proxies)]
            per_route = await self.route_targets(session)
            for r in range(args.rounds):
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
                s, _ = await load.run_interleaved(
                    session, a_targets, lambda i: small, iterations=args.small, time_limit_s=120,
                    warmup=20, cpu_of=self.cpu_of,
                )  # fmt: skip
                self.record("small", s, "direct")
                for name, targets in per_route.items():
                    body = routes.small(name)
                    s, _ = await load.run_interleaved(
                        session, targets, lambda i, b=body: b, iterations=args.small, time_limit_s=120,
                        warmup=10, cpu_of=self.cpu_of, cpu_per_request=True,
                    )  # fmt: skip
                    self.record(f"route small {name}", s, f"direct {name}")
                if args.session:
                    await self.sessions(session, per_route)
                if not args.no_rps:
                    await self.rps(per_route)

    async def sessions(self, session: Any, per_route: dict[str, list[load.Target]]) -> None:
        route_session = routes.RouteSession(100_000)
        everything = [t for targets in per_route.values() for t in targets]

        def bodies(i: int) -> dict[str, bytes]:
            return {routes.BY_NAME[n].path: raw for n, raw in route_session.next_bodies().items()}

        s, _ = await load.run_interleaved(
            session, everything, bodies, iterations=self.args.session, time_limit_s=180, warmup=2,
            cpu_of=self.cpu_of, cpu_per_request=True,
        )  # fmt: skip
        for name, targets in per_route.items():
            self.record(f"route session {name}", {t.name: s[t.name] for t in targets}, f"direct {name}")

    async def rps(self, per_route: dict[str, list[load.Target]]) -> None:
        proxies = [t for targets in per_route.values() for t in targets if not t.name.startswith("direct")]
        bodies = {routes.BY_NAME[n].path: routes.small(n) for n in per_route}
        # Every target leads a round twice (the rounds rotate the order): none always follows the
        # same other target, whose leftovers (its process's deferred work, a collection) would
        # then always fall on the same one.
        rounds = 2 * len(proxies)
        async with load.new_session(limit=0) as fresh:
            s, _ = await load.run_concurrent_rounds(
                fresh, proxies, bodies, requests=self.args.rps_requests * rounds, concurrency=32,
                rounds=rounds, time_limit_s=180, cpu_of=self.cpu_of,
            )  # fmt: skip
        for name, samples in s.items():
            for value in samples.round_rps:
                _add(self.figures, f"rps|{name}|req/s", value)
            if samples.server_cpu_s is not None and samples.latency_s:
                _add(self.figures, f"rps|{name}|cpu", 1000 * samples.server_cpu_s / len(samples.latency_s))


def pin_upstream(pool: ServerPool, upstream: Server) -> str | None:
    """``--pin``: the fake upstream's threads on the last CPU, everything else here (this client,
    every other server) on the rest, as if the upstream were another machine: its work no longer
    competes for a CPU with what a target does while it waits. A description, or None with fewer
    than two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    own, rest = {cpus[-1]}, set(cpus[:-1])

    def pin(pid: int, where: set[int]) -> None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), where)

    for server in pool.servers.values():
        for pid in process_tree(server.pid):
            pin(pid, own if server is upstream else rest)
    pin(os.getpid(), rest)
    others = f"{min(rest)}-{max(rest)}" if len(rest) > 1 else f"{min(rest)}"
    return f"the fake upstream on CPU {cpus[-1]}, the client and the servers under test on CPU {others}"


def _median(values: list[float] | None) -> float:
    return statistics.median(values) if values else float("nan")


def markdown(
    figures: Figures,
    *,
    proxies: Sequence[str],
    forwarders: Sequence[str],
    trees: dict[str, str],
    meta: dict[str, Any],
) -> str:
    def med(key: str) -> float:
        return _median(figures.get(key))

    lines = [
        f"# bench.ab: {', '.join(proxies)} interleaved, {meta['rounds']} rounds",
        "",
        f"{meta['date']}, {meta['machine']}; load average {meta['load_start']:.2f} at the start, "
        f"{meta['load_end']:.2f} at the end. Trees: "
        + "; ".join(f"`{n}` = {trees[n]}" for n in proxies)
        + ". Medians over the rounds of each round's figure (ms; CPU = the server process's own CPU "
        "per request)." + (f" Pinned: {meta['pinned']}." if meta.get("pinned") else ""),
        "",
        "## Small chat request (scenario (a))",
        "",
        f"| target | added p50 | added p95 | CPU ms/req | p50 / {FORWARDER}'s | p95 / {FORWARDER}'s |",
        "|---|---|---|---|---|---|",
    ]
    f50, f95 = med(f"small|{FORWARDER}|added p50"), med(f"small|{FORWARDER}|added p95")
    for name in (*forwarders, *proxies):
        a50, a95 = med(f"small|{name}|added p50"), med(f"small|{name}|added p95")
        cpu = med(f"small|{name}|cpu")
        lines.append(f"| {name} | {a50:.3f} | {a95:.3f} | {cpu:.3f} | {a50 / f50:.2f}x | {a95 / f95:.2f}x |")
    per_round = [
        f"{p / f:.2f}"
        for p, f in zip(
            figures.get(f"small|{HEAD}|added p50", []),
            figures.get(f"small|{FORWARDER}|added p50", []),
            strict=False,
        )
    ]
    lines += ["", f"`{HEAD}` / {FORWARDER} added p50, per round: {', '.join(per_round)}."]
    floor = next(iter(STACK_FLOOR))
    if floor in forwarders:
        # The stack alone (the proxy's app with its service bypassed): what is left of the
        # proxy's added latency is what the fitting costs on the critical path.
        h50, s50 = med(f"small|{HEAD}|added p50"), med(f"small|{floor}|added p50")
        lines.append(
            f"`{floor}` (the proxy's own stack, service bypassed) / {FORWARDER} added p50: "
            f"{s50 / f50:.2f}x; `{HEAD}` - `{floor}`: {h50 - s50:.3f} ms, "
            f"{(h50 - s50) / f50:.2f}x {FORWARDER}'s added p50 (the fitting's share)."
        )
    for other in proxies[1:]:
        ratios = [
            f"{p / o:.2f}"
            for p, o in zip(
                figures.get(f"small|{HEAD}|added p50", []),
                figures.get(f"small|{other}|added p50", []),
                strict=False,
            )
        ]
        lines.append(f"`{HEAD}` / `{other}` added p50, per round: {', '.join(ratios)}.")
    for scenario, title in (
        ("route small", "small request"),
        ("route session", "~100K-token session resent"),
    ):
        keys = sorted({k.split("|")[1] for k in figures if k.startswith(scenario)})
        if not keys:
            continue
        lines += [
            "",
            f"## Routes: {title} (scenario (r))",
            "",
            "| proxy route | added p50 | added p95 | CPU ms/req | added p50 / chat's |",
            "|---|---|---|---|---|",
        ]
        for key in keys:
            proxy, route = key.rsplit(" ", 1)
            chat = med(f"{scenario} chat|{proxy} chat|added p50")
            a50 = med(f"{scenario} {route}|{key}|added p50")
            a95, cpu = med(f"{scenario} {route}|{key}|added p95"), med(f"{scenario} {route}|{key}|cpu")
            lines.append(f"| {key} | {a50:.3f} | {a95:.3f} | {cpu:.3f} | {a50 / chat:.2f}x |")
    rps_keys = sorted({k.split("|")[1] for k in figures if k.startswith("rps|")})
    if rps_keys:
        lines += [
            "",
            "## Routes: small requests at concurrency 32",
            "",
            "| proxy route | req/s (median of batches) | / chat's | CPU ms/req | / chat's |",
            "|---|---|---|---|---|",
        ]
        for key in rps_keys:
            proxy = key.rsplit(" ", 1)[0]
            value, cpu = med(f"rps|{key}|req/s"), med(f"rps|{key}|cpu")
            chat_cpu = med(f"rps|{proxy} chat|cpu")
            lines.append(
                f"| {key} | {value:.0f} | {value / med(f'rps|{proxy} chat|req/s'):.2f}x | {cpu:.3f} "
                f"| {cpu / chat_cpu:.2f}x |"
            )
    errors = {k: sum(v) for k, v in figures.items() if k.endswith("|errors") and sum(v)}
    if errors:
        lines += ["", "Errors: " + ", ".join(f"{k.rsplit('|', 1)[0]} {v:.0f}" for k, v in errors.items())]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=DIR", help="another proxy's checkout"
    )
    parser.add_argument(
        "--forwarders", type=lambda s: s.split(","), default=[FORWARDER, *STACK_FLOOR],
        help=f"forwarders beside the proxies ({FORWARDER} always; also: {', '.join(FORWARDER_APPS)})",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=200, help="small requests per target and round")
    parser.add_argument("--session", type=int, default=20, help="session turns per round (0: none)")
    parser.add_argument("--routes", type=lambda s: s.split(","), default=["chat", "gemini"])
    parser.add_argument(
        "--rps-requests", type=int, default=500, help="requests per proxy route and batch (rps rounds)"
    )
    parser.add_argument("--no-rps", action="store_true")
    parser.add_argument(
        "--pin", action="store_true",
        help="the fake upstream alone on the last CPU, the client and the servers under test on the others",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.forwarders = list(dict.fromkeys([FORWARDER, *args.forwarders]))
    trees = {HEAD: REPO}
    for spec in args.tree:
        name, _, where = spec.partition("=")
        trees[name] = Path(where).resolve()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ctxproxy-ab-") as tmp, ServerPool(Path(tmp)) as pool:
        models = Path(tmp) / "models.toml"
        models.write_text(scenarios.MODELS_TOML)
        from bench.run import start_fake_upstream, start_forwarder

        upstream = start_fake_upstream(pool)
        pool.wait_ready(["upstream"])
        for name in args.forwarders:
            start_forwarder(pool, name, upstream, app=FORWARDER_APPS[name])
        for name, tree in trees.items():
            start_proxy(pool, name, tree, upstream, models)
        pool.wait_ready(timeout_s=90)
        pinned = pin_upstream(pool, upstream) if args.pin else None
        ab = AB(pool, list(trees), args)
        started = time.perf_counter()
        uvloop.run(ab.run())
        took_s = time.perf_counter() - started
    meta = {
        "rounds": args.rounds,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC") + f" ({took_s:.0f} s)",
        "machine": f"{os.cpu_count()} CPUs",
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "pinned": pinned,
    }
    described = {n: git_state(t, subject=True) for n, t in trees.items()}
    text = markdown(ab.figures, proxies=list(trees), forwarders=args.forwarders, trees=described, meta=meta)
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
