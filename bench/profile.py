"""Profile the proxy under one benchmark scenario with py-spy (sampling, all threads).

``.venv/bin/python -m bench.profile --scenario b`` starts the fake upstream and the proxy (the
proxy under ``py-spy record``), drives the scenario sequentially, stops both, and prints where the
proxy's samples went: the top functions by inclusive and by self samples. py-spy is a tool for
this command only (``.venv/bin/pip install py-spy``), not a project dependency.

Scenarios: ``a`` small request, ``b`` ~100K-token session resent with one new message (warm),
``b_cold`` the same conversation new every time, ``c`` ~300K tokens into a 128K window (cold),
``f`` small requests at concurrency 32. ``--route gemini`` (or ``responses``, ``messages``) sends
``a`` and ``f`` as that wire API's small request (``bench.routes``).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench import load, routes, run, scenarios
from bench.servers import ServerPool

IDLE_LEAVES = ("Condition.wait (threading.py", "Runner.run (asyncio/runners.py", "select (selectors.py")


def summarize(raw: Path, *, top: int = 25) -> str:
    """Where the busy samples of a py-spy ``raw`` file went: top functions (inclusive, self) and
    the project's own functions (``app/``). Idle stacks (waiting executor threads, the event loop
    waiting for I/O) are left out of the shares."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if frames[-1].startswith(IDLE_LEAVES):
            idle += count
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return "no busy samples"
    lines = [f"{total} busy samples ({idle} idle left out)", "", "inclusive %  function"]
    lines += [f"{100 * n / total:10.1f}  {f}" for f, n in inclusive.most_common(top)]
    lines += ["", "inclusive %  project function (app/)"]
    ours = [(f, n) for f, n in inclusive.most_common() if "(app/" in f][:top]
    lines += [f"{100 * n / total:10.1f}  {f}" for f, n in ours]
    lines += ["", "self %  function"]
    lines += [f"{100 * n / total:6.1f}  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines)


async def drive(scenario: str, url: str, n: int, *, route: str = "chat") -> None:
    r = routes.BY_NAME[route]
    target = [load.Target("proxy", url, path=r.path, headers=r.headers)]
    async with load.new_session() as session:
        if scenario == "f":
            body = routes.small(route)
            await load.run_concurrent_rounds(
                session, target, body, requests=n, concurrency=32, rounds=1, time_limit_s=120
            )
            return
        if scenario == "a":
            body = routes.small(route)

            def body_for(i: int) -> bytes:
                return body

        elif scenario == "b":
            session_b = scenarios.AgentSession(100_000, model=scenarios.SMALL_MODEL, seed=11)

            def body_for(i: int) -> bytes:
                return session_b.next_body()

        else:
            tokens, model = (
                (100_000, scenarios.SMALL_MODEL) if scenario == "b_cold" else (300_000, scenarios.CUT_MODEL)
            )
            base = scenarios.agent_messages(approx_tokens=tokens, seed=21)

            def body_for(i: int) -> bytes:
                return scenarios.dumps(scenarios.chat_body(scenarios.salted(base, f"p{i}"), model=model))

        samples, _ = await load.run_interleaved(session, target, body_for, iterations=n, time_limit_s=120)
        s = samples["proxy"]
        print(f"{len(s.latency_s)} requests, {s.errors} errors", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["a", "b", "b_cold", "c", "f"], default="b")
    parser.add_argument("-n", type=int, default=200, help="requests")
    parser.add_argument(
        "--route", choices=[r.name for r in routes.ROUTES], default="chat",
        help="the wire API of scenarios a and f (bench.routes: the same small request in each shape)",
    )  # fmt: skip
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, default=None, help="keep the raw py-spy output here")
    parser.add_argument("--summarize", type=Path, default=None, help="only summarize this raw file")
    args = parser.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        sys.exit("py-spy not found: .venv/bin/pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="ctxproxy-profile-") as tmp, ServerPool(Path(tmp)) as pool:
        models = Path(tmp) / "models.toml"
        models.write_text(scenarios.MODELS_TOML)
        raw = args.raw or Path(tmp) / "proxy.raw"
        upstream = run.start_fake_upstream(pool)
        pool.wait_ready(["upstream"])
        proxy = run.start_proxy(pool, "proxy", upstream, models)
        pool.wait_ready(["proxy"], timeout_s=60)
        # Attach after start-up, so imports and vocabulary loading are not in the profile.
        spy = subprocess.Popen(
            [py_spy, "record", "--format", "raw", "--threads", "--rate", str(args.rate),
             "--output", str(raw), "--pid", str(proxy.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(1.0)
            started = time.perf_counter()
            uvloop.run(drive(args.scenario, proxy.base_url, args.n, route=args.route))
            print(f"driven in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
        print(summarize(raw) if raw.exists() else "py-spy wrote nothing (ptrace not permitted?)")


if __name__ == "__main__":
    main()
