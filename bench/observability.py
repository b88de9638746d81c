"""What observability costs per request: ``.venv/bin/python -m bench.observability``.

Calls a trivial ASGI app (a 200 with a small JSON body) in process, directly and wrapped in
``ObservabilityMiddleware`` (request ID, contextvar, in-flight gauge, timings, Prometheus metrics,
the status board), interleaved in rounds, and prints the median per call of each and the
difference; also the median time of one ``GET /metrics`` render after the run. No network.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from app.core.dialects import CHAT, DIALECTS
from app.observability import Observability, ObservabilityMiddleware
from app.observability.context import DIALECT_SCOPE_KEY


async def _plain(scope: Any, receive: Any, send: Any) -> None:
    fields = {"model": "gpt-4o", "tokens_before": 120, "tokens_after": 120, "actions": "none", "retries": 0}
    scope[DIALECT_SCOPE_KEY] = CHAT  # what the fitted route records first
    scope.setdefault("ctxproxy.access", {}).update(fields, upstream_status=200)
    await receive()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
    )
    await send({"type": "http.response.body", "body": b'{"ok":true}', "more_body": False})


async def _call(app: Any, path: str) -> None:
    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"x-request-id", b"bench-1")]}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        return None

    await app(scope, receive, send)


async def measure(rounds: int, per_round: int) -> dict[str, float]:
    observability = Observability(
        version="bench", upstream_base_url="http://upstream.test/v1", apis=tuple(DIALECTS)
    )
    wrapped = ObservabilityMiddleware(_plain, observability=observability)
    times: dict[str, list[float]] = {"plain": [], "observed": []}
    for _ in range(rounds):
        for name, app in (("plain", _plain), ("observed", wrapped)):
            started = time.perf_counter()
            for _ in range(per_round):
                await _call(app, "/v1/chat/completions")
            times[name].append((time.perf_counter() - started) / per_round)
    renders = []
    for _ in range(20):
        started = time.perf_counter()
        observability.metrics.render()
        renders.append(time.perf_counter() - started)
    plain, observed = statistics.median(times["plain"]), statistics.median(times["observed"])
    return {
        "plain_us": plain * 1e6,
        "observed_us": observed * 1e6,
        "added_us": (observed - plain) * 1e6,
        "metrics_render_ms": statistics.median(renders) * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-round", type=int, default=2000)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.rounds, args.per_round))
    print("| | median per call |")
    print("| --- | --- |")
    print(f"| trivial ASGI app | {result['plain_us']:.1f} µs |")
    print(f"| same, inside ObservabilityMiddleware | {result['observed_us']:.1f} µs |")
    print(f"| added by observability | {result['added_us']:.1f} µs |")
    print(f"| GET /metrics render (after the run) | {result['metrics_render_ms']:.2f} ms |")


if __name__ == "__main__":
    main()
