"""Load generation with a raw aiohttp client, from the harness process.

Two shapes, both bounded by a fixed count *and* a time limit:

* ``run_interleaved``: one request at a time; each iteration sends the same body to every target,
  in an order rotated every iteration, so slow phases of this noisy machine hit all targets alike.
* ``run_concurrent``: a fixed number of requests at a fixed concurrency against one target,
  split into rounds that alternate between targets (``run_concurrent_rounds``).

Latencies are wall-clock seconds around the whole exchange (request sent, whole body read); for
streams also the time to the first body byte. The client's own CPU time is recorded so a run can
tell when the client, not the target, was the bottleneck.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Target:
    """Something that answers ``POST {base_url}{path}`` (chat completions unless told); ``server``
    names its process; ``headers`` are sent beside ``HEADERS`` (an API's own, such as
    ``anthropic-version``)."""

    name: str
    base_url: str
    server: str | None = None
    path: str = CHAT_PATH
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def url(self) -> str:
        return self.base_url + self.path


# What a scenario sends: the same bytes to every target, or bytes per target path (the same
# request written in each wire API's shape).
Body = bytes | Mapping[str, bytes]


def body_for_target(body: Body, target: Target) -> bytes:
    return body if isinstance(body, bytes) else body[target.path]


@dataclass
class Samples:
    """Measurements of one target in one scenario (seconds)."""

    latency_s: list[float] = field(default_factory=list)
    ttfb_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_examples: list[str] = field(default_factory=list)
    last_headers: dict[str, str] = field(default_factory=dict)
    last_body: bytes = b""
    wall_s: float = 0.0
    # Requests/s of each batch of ``run_concurrent_rounds`` (their median shrugs off one batch
    # that shared the two cores with something else).
    round_rps: list[float] = field(default_factory=list)
    client_cpu_s: float = 0.0
    server_cpu_s: float | None = None

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_examples) < 3:
            self.error_examples.append(text[:300])


def new_session(*, limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        timeout=aiohttp.ClientTimeout(total=120),
        skip_auto_headers=("User-Agent",),
    )


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def request_once(
    session: aiohttp.ClientSession, target: Target, body: bytes, samples: Samples, *, stream: bool
) -> None:
    """One exchange, recorded into ``samples`` (a non-200 answer counts as an error, not a sample)."""
    start = time.perf_counter()
    try:
        headers = {**HEADERS, **dict(target.headers)} if target.headers else HEADERS
        async with session.post(target.url, data=body, headers=headers) as resp:
            if stream:
                first = await resp.content.readany()
                first_at = time.perf_counter()
                parts = [first]
                while chunk := await resp.content.readany():
                    parts.append(chunk)
                data = b"".join(parts)
            else:
                data = await resp.read()
                first_at = None
            end = time.perf_counter()
            if resp.status != 200:
                samples.error(f"{resp.status}: {data[:200]!r}")
                return
            samples.last_headers = {
                k: v for k, v in resp.headers.items() if k.lower().startswith("x-context")
            }
    except (TimeoutError, aiohttp.ClientError) as exc:
        samples.error(f"{type(exc).__name__}: {exc}")
        return
    samples.latency_s.append(end - start)
    if first_at is not None:
        samples.ttfb_s.append(first_at - start)
    samples.last_body = data


CpuReader = Callable[[Target], float | None]


async def run_interleaved(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    body_for: Callable[[int], Body],
    *,
    iterations: int,
    time_limit_s: float,
    stream: bool = False,
    warmup: int = 2,
    cpu_of: CpuReader | None = None,
    cpu_per_request: bool = False,
) -> tuple[dict[str, Samples], bool]:
    """``iterations`` rounds of one request per target; returns samples and whether time ran out.

    ``cpu_per_request``: read the server's CPU around every request instead of around the run, so
    targets served by one process (a proxy's routes) each get their own CPU time (work a server
    does after its answer lands in the next request's reading).

    ``body_for(i)`` is called once per iteration (``i`` < 0 for warm-up rounds) and the same bytes
    go to every target (or each target its path's bytes). ``cpu_of`` reads a target's server CPU
    seconds (before/after the run).
    """
    results = {t.name: Samples() for t in targets}
    for w in range(warmup):
        body = body_for(-1 - w)
        for t in targets:
            await request_once(session, t, body_for_target(body, t), Samples(), stream=stream)
    cpu_before = {t.name: cpu_of(t) if cpu_of else None for t in targets}
    started = time.perf_counter()
    client_before = _client_cpu_s()
    deadline = started + time_limit_s
    timed_out = False
    for i in range(iterations):
        if time.perf_counter() > deadline:
            timed_out = True
            break
        body = body_for(i)
        k = i % len(targets)
        for t in [*targets[k:], *targets[:k]]:
            if cpu_per_request and cpu_of is not None:
                before = cpu_of(t)
                await request_once(session, t, body_for_target(body, t), results[t.name], stream=stream)
                after = cpu_of(t)
                if before is not None and after is not None:
                    own = results[t.name]
                    own.server_cpu_s = (own.server_cpu_s or 0.0) + after - before
            else:
                await request_once(session, t, body_for_target(body, t), results[t.name], stream=stream)
    wall = time.perf_counter() - started
    client_cpu = _client_cpu_s() - client_before
    await asyncio.sleep(0.2)  # let work a server finishes after its answer land in its CPU time
    for t in targets:
        s = results[t.name]
        s.wall_s = wall
        s.client_cpu_s = client_cpu
        if cpu_per_request:
            continue
        before = cpu_before[t.name]
        after = cpu_of(t) if cpu_of else None
        s.server_cpu_s = None if before is None or after is None else after - before
    return results, timed_out


async def run_stall_probe(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    huge_for: Callable[[int], bytes],
    small: bytes,
    *,
    repeats: int,
    time_limit_s: float,
) -> tuple[dict[str, Samples], dict[str, Samples]]:
    """Small requests, one after another, while one huge request is in flight on the same target.

    Returns the small requests' samples (only those sent while the huge one was running) and the
    huge requests' samples. A server that counts the huge request on its event loop answers the
    small ones only after it: their latency then approaches the huge request's own.
    """
    small_samples = {t.name: Samples() for t in targets}
    huge_samples = {t.name: Samples() for t in targets}
    deadline = time.perf_counter() + time_limit_s
    for r in range(repeats):
        if time.perf_counter() > deadline:
            break
        body = huge_for(r)
        k = r % len(targets)
        for t in [*targets[k:], *targets[:k]]:
            huge = asyncio.create_task(request_once(session, t, body, huge_samples[t.name], stream=False))
            await asyncio.sleep(0.002)  # let the huge request go out first
            while not huge.done():
                probe = Samples()
                await request_once(session, t, small, probe, stream=False)
                if not huge.done() or probe.latency_s:
                    s = small_samples[t.name]
                    s.latency_s += probe.latency_s
                    s.errors += probe.errors
            await huge
    return small_samples, huge_samples


async def _concurrent_batch(
    session: aiohttp.ClientSession,
    target: Target,
    body: Body,
    samples: Samples,
    *,
    requests: int,
    concurrency: int,
    deadline: float,
) -> bool:
    """``requests`` requests with ``concurrency`` in flight; False if the deadline cut it short."""
    remaining = requests
    cut = False
    data = body_for_target(body, target)

    async def worker() -> None:
        nonlocal remaining, cut
        while remaining > 0:
            if time.perf_counter() > deadline:
                cut = True
                return
            remaining -= 1
            await request_once(session, target, data, samples, stream=False)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return not cut


async def run_concurrent_rounds(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    body: Body,
    *,
    requests: int,
    concurrency: int,
    rounds: int,
    time_limit_s: float,
    cpu_of: CpuReader | None = None,
    after_round: Callable[[int], None] | None = None,
) -> tuple[dict[str, Samples], bool]:
    """``requests`` per target at ``concurrency``, in ``rounds`` batches alternating targets.

    Each target's ``wall_s`` is the sum of its own batches, so requests/s = samples / wall_s;
    ``round_rps`` has each batch's own requests/s.
    ``after_round(r)`` runs after every round (memory snapshots).
    """
    results = {t.name: Samples() for t in targets}
    per_round = max(1, requests // rounds)
    deadline = time.perf_counter() + time_limit_s
    complete = True
    for t in targets:  # warm the connection pools
        await _concurrent_batch(
            session, t, body, Samples(), requests=concurrency, concurrency=concurrency, deadline=deadline
        )
    for r in range(rounds):
        k = r % len(targets)
        for t in [*targets[k:], *targets[:k]]:
            s = results[t.name]
            cpu0 = cpu_of(t) if cpu_of else None
            client0 = _client_cpu_s()
            t0 = time.perf_counter()
            before = len(s.latency_s)
            complete &= await _concurrent_batch(
                session, t, body, s, requests=per_round, concurrency=concurrency, deadline=deadline
            )
            took_s = time.perf_counter() - t0
            s.wall_s += took_s
            if took_s > 0:
                s.round_rps.append((len(s.latency_s) - before) / took_s)
            s.client_cpu_s += _client_cpu_s() - client0
            cpu1 = cpu_of(t) if cpu_of else None
            if cpu0 is not None and cpu1 is not None:
                s.server_cpu_s = (s.server_cpu_s or 0.0) + cpu1 - cpu0
        if after_round is not None:
            after_round(r)
    return results, not complete
