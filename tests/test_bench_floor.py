"""bench.forwarders.ctxproxy_floor: the proxy's own stack with its service bypassed.

Real processes on loopback (the fake upstream and the floor), as ``bench.ab`` starts them: the
floor relays the upstream's answer, whole or streamed, with none of the fitting's headers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import uvloop

from bench import load, run, scenarios
from bench.forwarders import STACK_FLOOR, TARGETS
from bench.servers import ServerPool

pytestmark = pytest.mark.timeout(60)


def test_the_floor_is_started_by_bench_ab_only() -> None:
    assert set(STACK_FLOOR) == {"stack-floor"}
    assert not set(STACK_FLOOR) & set(TARGETS)  # bench.run starts every TARGETS entry


def test_the_floor_relays_the_upstream_answer_without_fitting(tmp_path: Path) -> None:
    with ServerPool(tmp_path) as pool:
        upstream = run.start_fake_upstream(pool)
        pool.wait_ready(["upstream"], timeout_s=20)
        floor = run.start_forwarder(pool, "stack-floor", upstream, app=STACK_FLOOR["stack-floor"])
        pool.wait_ready(timeout_s=30)
        targets = [
            load.Target("direct", upstream.base_url, "upstream"),
            load.Target("stack-floor", floor.base_url, "stack-floor"),
        ]
        body = scenarios.dumps(scenarios.small_body())
        stream_body = scenarios.dumps({**scenarios.small_body(stream=True), "bench_chunks": 3})

        async def go() -> tuple[dict[str, load.Samples], dict[str, load.Samples]]:
            async with load.new_session() as session:
                plain, _ = await load.run_interleaved(
                    session, targets, lambda i: body, iterations=3, time_limit_s=20, warmup=1
                )
                streamed, _ = await load.run_interleaved(
                    session, targets, lambda i: stream_body, iterations=2, time_limit_s=20, stream=True
                )
            return plain, streamed

        plain, streamed = uvloop.run(go())
    assert {name: (s.errors, len(s.latency_s)) for name, s in plain.items()} == {
        "direct": (0, 3),
        "stack-floor": (0, 3),
    }
    assert b'"chat.completion"' in plain["stack-floor"].last_body
    assert plain["stack-floor"].last_headers == {}  # no X-Context-*: nothing was counted or planned
    assert streamed["stack-floor"].errors == 0
    assert streamed["stack-floor"].last_body.endswith(b"data: [DONE]\n\n")
    assert streamed["stack-floor"].last_body == streamed["direct"].last_body
