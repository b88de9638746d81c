"""Fit to the last token, never refuse what can be served (issue 21): ``python -m bench.boundary``.

The real app runs in process (its ASGI app, no sockets) in front of a strict fake upstream
(``bench.boundary_upstream``, an ``httpx.MockTransport``) that counts every prompt with a tokenizer
of its own, refuses what is over its window in its API's words (Chat Completions, Anthropic and
Gemini with numbers, OpenAI Responses without: "Your input exceeds the context window of this
model"), answers its counting endpoints (``/v1/messages/count_tokens``,
``/v1/responses/input_tokens``, Gemini's ``:countTokens``) and reports ``usage``
(``usageMetadata``). Counts, not timings, decide every figure but the last column, so the runs
differ only by their seeds. Gemini is the fourth API: its requests go to the client's own
``/v1beta/models/{model}:generateContent`` at the upstream's origin; its window limits the input
alone, so a request *fits* when its true count is at most 99% of the window (its
``maxOutputTokens`` is not counted, and no output reserve is kept). Its tokenizer is not public,
so in production it is always counted by estimate: its ``exact`` and ``encrypted`` rows are the
same comparison as the other APIs' (the table configured with the fake's own o200k), its
``claude-like`` and ``gemma-like`` rows the real case.

Pricings (the fake's count of a request):

* ``exact``: the proxy's own accounting over o200k (the model's table encoding);
* ``claude-like``: 1.15x the accounting over cl100k, for a model the proxy counts by estimate;
* ``gemma-like``: a different tokenizer (word pieces, ``bench.calibration.word_pieces``, 0.8x),
  for a model the proxy counts by estimate;
* ``encrypted``: exact, except encrypted reasoning (Responses ``encrypted_content``, Anthropic
  ``redacted_thinking``, Gemini ``thoughtSignature``), which the upstream counts at 6 characters a
  token where the proxy prices 4 (an over-count: requests that fit look over).

Sessions (``bench.boundary_sessions``): a growing chat (16K window, ``max_tokens`` 1,000) and an
agent loop (32K window, 2,000; encrypted reasoning before each call in the ``encrypted`` pricing)
on each API, past the boundary. For every client request: its true count (the fake's count of the
client's own body); whether it fits (true + ``max_tokens`` <= 99% of the window; Gemini: true
alone); whether the upstream's first copy of it was the client's bytes; every upstream call
(refused over the window or not, counting calls). Two modes in each run: ``new`` (the settings'
defaults) and ``baseline`` (``CTXPROXY_BOUNDARY_EXACT``, ``UPSTREAM_COUNT`` and ``LOWER_OUTPUT``
off: the fixed margins of before, in the same run).

Also: the Claude-Code-shaped session (``messages``, ~18K tokens of system and tools, ``max_tokens``
32,000, 60K window, claude-like, signed thinking before every call, 75 requests): requests the
proxy refused; and the no-number errors (``responses``, a table window of 131,072 and a real one
of 4,096, errors without numbers, a first request of ~34K tokens and 10 more): failed upstream
calls on the first request and after, errors to the client; with it, the numbers case of the issue
(chat, the same windows, an OpenAI error with numbers, no ``max_tokens``).

``--runs N`` (default 3) seeds; every figure is the median over them. ``--write`` writes
``bench/results/boundary.md``. ``--quick``: 1 run, shorter sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.core.dialects import DIALECTS
from app.main import create_app
from app.settings import Settings
from bench.boundary_sessions import Session
from bench.boundary_upstream import Model, Upstream, output_cap, route_of

RESULTS = Path(__file__).resolve().parent / "results" / "boundary.md"
UPSTREAM = "http://bench.upstream/v1"
APIS = ("chat", "responses", "messages", "gemini")
PRICINGS = ("exact", "claude-like", "gemma-like", "encrypted")
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "gemini": "/v1beta/models/{model}:generateContent",
}
FIT_SHARE = 0.99
BASELINE = {"boundary_exact": False, "upstream_count": False, "lower_output": False}


@dataclass
class Row:
    """One client request as measured."""

    true_tokens: int
    output_tokens: int  # the output cap counted against the window (0 where it is not: Gemini)
    window_tokens: int
    status: int
    identical: bool  # the upstream's first copy was the client's bytes
    forwarded_true: int | None  # the fake's count of what it finally took (None: nothing taken)
    forwarded_output: int  # the output cap it carried against the window (the client's, or lowered)
    failed: int  # upstream calls refused over the window
    counted: int  # counting calls
    lowered: bool
    last_resort: bool
    refused_by_proxy: bool
    proxy_ms: float
    window_header: int
    summaries: int = 0  # summary calls that reached the upstream while this request was served

    @property
    def fits(self) -> bool:
        return self.true_tokens + self.output_tokens <= FIT_SHARE * self.window_tokens

    @property
    def trimmed(self) -> bool:
        return self.forwarded_true is not None and not self.identical


async def run_session(
    models: list[Model],
    model: str,
    session: Session,
    *,
    api: str,
    requests: int,
    max_tokens: int | None,
    settings: Mapping[str, Any],
    grow_first: bool = True,
) -> list[Row]:
    """Send ``requests`` requests of ``session`` (growing it before each) through a fresh app."""
    upstream = Upstream({m.name: m for m in models})
    dialect = DIALECTS[api]
    path = PATHS[api].format(model=model)
    # Gemini's window limits the input alone: its output cap is not counted against it.
    in_window = dialect.output_in_window
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        table = Path(tmp) / "models.toml"
        table.write_text(
            "".join(
                f'[models."{m.name}"]\nwindow = {m.table_window_tokens or m.window_tokens}\n'
                f'max_output = {m.table_window_tokens or m.window_tokens}\nencoding = "{m.encoding}"\n'
                for m in models
            ),
            encoding="utf-8",
        )
        config = Settings(
            upstream_base_url=UPSTREAM,
            upstream_transport="httpx",
            discovery=False,
            log_level="ERROR",
            models_file=table,
            **settings,
        )
        app = create_app(config, upstream_transport=httpx.MockTransport(upstream.handler))
        spec = upstream.models[model]
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=60) as client:
                for n in range(requests):
                    if grow_first or n > 0:
                        session.grow()
                    body = session.body(api, model=model, max_tokens=max_tokens)
                    raw = json.dumps(body).encode()
                    true = upstream.count(route_of(path)[0], body, model=model)
                    before, spent = len(upstream.calls), upstream.spent_s
                    started = time.perf_counter()
                    response = await client.post(
                        path, content=raw, headers={"content-type": "application/json"}
                    )
                    elapsed = time.perf_counter() - started - (upstream.spent_s - spent)
                    calls = upstream.calls[before:]
                    # The client's request as sent upstream (and its retries): not the counting
                    # calls, not the summary calls of the memory (on by default), which may come
                    # first (one written ahead of time during an earlier request).
                    sends = [c for c in calls if not c.counting and not c.summary]
                    taken = [c for c in sends if c.status == 200]
                    rows.append(
                        Row(
                            true_tokens=true,
                            output_tokens=(max_tokens or 0) if in_window else 0,
                            window_tokens=spec.window_tokens,
                            status=response.status_code,
                            identical=bool(sends) and sends[0].body == raw,
                            forwarded_true=taken[-1].tokens if taken else None,
                            forwarded_output=output_cap(taken[-1].body) if taken and in_window else 0,
                            failed=sum(1 for c in sends if c.status == 400),
                            counted=sum(1 for c in calls if c.counting),
                            lowered="x-context-output-lowered" in response.headers,
                            last_resort="last_resort" in response.headers.get("x-context-actions", ""),
                            refused_by_proxy=not sends and response.status_code >= 400,
                            proxy_ms=elapsed * 1000,
                            window_header=int(response.headers.get("x-context-window", "0")),
                            summaries=sum(1 for c in calls if c.summary),
                        )
                    )
                    if any(c.status == 422 for c in sends):
                        raise AssertionError(f"the upstream refused a broken structure: {sends[-1].status}")
    return rows


# -- the scenarios ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    window_tokens: int
    max_tokens: int
    requests: int


SHAPES = (Shape("chat", 16_384, 1_000, 70), Shape("agent", 32_768, 2_000, 60))


def fits_models() -> list[Model]:
    encodings = {
        "exact": "o200k_base",
        "claude-like": "estimate",
        "gemma-like": "estimate",
        "encrypted": "o200k_base",
    }
    return [
        Model(f"{pricing}-{shape.name}", shape.window_tokens, pricing, encodings[pricing])
        for pricing in PRICINGS
        for shape in SHAPES
    ]


@dataclass
class Summary:
    requests: int = 0
    fits: int = 0
    fits_identical: int = 0
    over_reached: int = 0
    counted: int = 0
    trimmed: int = 0
    utilization: float | None = None
    errors: int = 0
    lowered: int = 0
    lowered_output: float | None = None
    last_resort: int = 0
    proxy_ms: float = 0.0
    summaries: int = 0


def summarize(rows: list[Row]) -> Summary:
    trimmed = [r for r in rows if r.trimmed]
    used = [(r.forwarded_true or 0) + r.forwarded_output for r in trimmed]
    lowered = [r.forwarded_output for r in rows if r.lowered]
    return Summary(
        requests=len(rows),
        fits=sum(1 for r in rows if r.fits),
        fits_identical=sum(1 for r in rows if r.fits and r.identical),
        over_reached=sum(r.failed for r in rows),
        counted=sum(r.counted for r in rows),
        trimmed=len(trimmed),
        utilization=statistics.median(u / r.window_tokens for u, r in zip(used, trimmed, strict=True))
        if trimmed
        else None,
        errors=sum(1 for r in rows if r.status != 200),
        lowered=len(lowered),
        lowered_output=statistics.median(lowered) if lowered else None,
        last_resort=sum(1 for r in rows if r.last_resort),
        proxy_ms=statistics.median(r.proxy_ms for r in rows),
        summaries=sum(r.summaries for r in rows),
    )


def _share(row: Row) -> float:
    """What the upstream was given, input and output cap, as a share of the window."""
    return ((row.forwarded_true or 0) + row.forwarded_output) / row.window_tokens


@dataclass
class Pair:
    """One session in both modes, and the utilization of the requests the baseline trimmed."""

    new: Summary
    baseline: Summary
    same_new: float | None
    same_baseline: float | None


async def fits_scenario(*, seed: int, quick: bool) -> dict[tuple[str, str, str], Pair]:
    out: dict[tuple[str, str, str], Pair] = {}
    models = fits_models()
    for api in APIS:
        for pricing in PRICINGS:
            for shape in SHAPES:
                rows: dict[str, list[Row]] = {}
                for mode, settings in (("new", {}), ("baseline", BASELINE)):
                    session = Session(
                        shape.name, seed=seed, reasoning=pricing == "encrypted" and api != "chat"
                    )
                    rows[mode] = await run_session(
                        models,
                        f"{pricing}-{shape.name}",
                        session,
                        api=api,
                        requests=shape.requests * 2 // 3 if quick else shape.requests,
                        max_tokens=shape.max_tokens,
                        settings=settings,
                    )
                # The same client requests in both modes (a session does not depend on the answers).
                same = [i for i, r in enumerate(rows["baseline"]) if r.trimmed]
                out[(api, pricing, shape.name)] = Pair(
                    new=summarize(rows["new"]),
                    baseline=summarize(rows["baseline"]),
                    same_new=statistics.median(_share(rows["new"][i]) for i in same) if same else None,
                    same_baseline=statistics.median(_share(rows["baseline"][i]) for i in same)
                    if same
                    else None,
                )
    return out


async def claude_code_scenario(*, seed: int, quick: bool) -> dict[str, Summary]:
    model = Model("claude-code-60k", 60_000, "claude-like", "estimate")
    out = {}
    for mode, settings in (("new", {}), ("baseline", BASELINE)):
        rows = await run_session(
            [model],
            model.name,
            Session("claude_code", seed=seed),
            api="messages",
            requests=40 if quick else 75,
            max_tokens=32_000,
            settings=settings,
        )
        summary = summarize(rows)
        summary.errors = sum(1 for r in rows if r.refused_by_proxy)
        out[mode] = summary
    return out


@dataclass
class NoNumbers:
    first_failed: int
    later_failed: int
    client_errors: int
    first_window: int
    later_windows: list[int]


async def no_numbers_scenario(*, seed: int, api: str, numbers: bool) -> NoNumbers:
    model = Model("wrong-table", 4_096, "exact", "o200k_base", table_window_tokens=131_072, numbers=numbers)
    rows = await run_session(
        [model],
        model.name,
        Session("history", seed=seed, turns=60),
        api=api,
        requests=11,
        max_tokens=None,
        settings={},
        grow_first=False,
    )
    return NoNumbers(
        first_failed=rows[0].failed,
        later_failed=sum(r.failed for r in rows[1:]),
        client_errors=sum(1 for r in rows if r.status != 200),
        first_window=rows[0].window_header,
        later_windows=[r.window_header for r in rows[1:]],
    )


# -- the report ---------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _fmt(values: list[float | None], spec: str = ".3f") -> str:
    known = [v for v in values if v is not None]
    return format(_med(known), spec) if known else "-"


def report(
    fits: list[dict[tuple[str, str, str], Pair]],
    claude: list[dict[str, Summary]],
    no_numbers: list[tuple[NoNumbers, NoNumbers]],
    *,
    runs: int,
) -> str:
    lines = [
        "# Fit to the last token (issue 21): `python -m bench.boundary`",
        "",
        f"Medians over {runs} run(s) (seeds 1..{runs}); counts decide every figure but `proxy ms` (the",
        "proxy's own time per request in process, the fake upstream's time taken out). `new`: the",
        "defaults; `base`: `CTXPROXY_BOUNDARY_EXACT`, `UPSTREAM_COUNT`, `LOWER_OUTPUT` off (the fixed",
        "margins of before), the same client requests in the same run.",
        "",
        "## Fits forwarded whole",
        "",
        "`fits`: requests whose true count + max_tokens <= 99% of the window; `whole`: of those, forwarded",
        "byte-identical (must be all); `over`: upstream calls refused over the window (must be 0);",
        "`counts/req`: counting calls per client request (<= 0.1); `util trimmed`: median over the",
        "requests each mode trimmed of (true forwarded + max_tokens) / window; `util same`: the same",
        "median over the requests the baseline trimmed, in each mode (the new mode forwards some of",
        "them whole, so its own trimmed set starts later and differs). Gemini's window limits the input",
        "alone: its `fits` and `util` leave `maxOutputTokens` out (no output reserve is kept for it);",
        "its tokenizer is not public, so its `exact` and `encrypted` rows (the table naming the fake's",
        "o200k) are for comparison, its `claude-like` and `gemma-like` rows the case of production.",
        "",
        "| API | pricing | session | requests | fits | whole new / base | over new / base | counts/req "
        "| util trimmed new / base | util same new / base | proxy ms new / base |",
        "|---|---|---|---:|---:|---|---|---:|---|---|---|",
    ]
    for key in fits[0]:
        pairs = [f[key] for f in fits]
        new, base = [p.new for p in pairs], [p.baseline for p in pairs]
        api, pricing, shape = key
        lines.append(
            f"| {api} | {pricing} | {shape} | {_med([s.requests for s in new]):.0f} "
            f"| {_med([s.fits for s in new]):.0f} "
            f"| {_med([s.fits_identical for s in new]):.0f} / {_med([s.fits_identical for s in base]):.0f} "
            f"| {_med([s.over_reached for s in new]):.0f} / {_med([s.over_reached for s in base]):.0f} "
            f"| {_med([s.counted / s.requests for s in new]):.3f} "
            f"| {_fmt([s.utilization for s in new])} / {_fmt([s.utilization for s in base])} "
            f"| {_fmt([p.same_new for p in pairs])} / {_fmt([p.same_baseline for p in pairs])} "
            f"| {_med([s.proxy_ms for s in new]):.2f} / {_med([s.proxy_ms for s in base]):.2f} |"
        )
    lines += ["", "Totals over every session of the table (medians of the runs' totals):", ""]
    for mode in ("new", "baseline"):
        totals = []
        for f in fits:
            summaries = [p.new if mode == "new" else p.baseline for p in f.values()]
            totals.append(
                (
                    sum(s.fits for s in summaries),
                    sum(s.fits_identical for s in summaries),
                    sum(s.over_reached for s in summaries),
                    sum(s.counted for s in summaries) / sum(s.requests for s in summaries),
                    max(s.counted / s.requests for s in summaries),
                    sum(s.errors for s in summaries),
                )
            )
        lines.append(
            f"- `{mode}`: {_med([t[1] for t in totals]):.0f} of {_med([t[0] for t in totals]):.0f} "
            "fitting requests "
            f"forwarded whole, {_med([t[2] for t in totals]):.0f} over-window requests reached the upstream, "
            f"{_med([t[3] for t in totals]):.3f} counting calls per request (at most "
            f"{_med([t[4] for t in totals]):.3f} in one session), {_med([t[5] for t in totals]):.0f} errors."
        )
    same = [
        (p.same_new, p.same_baseline)
        for f in fits
        for p in f.values()
        if p.same_new is not None and p.same_baseline is not None
    ]
    better = sum(1 for n, b in same if n >= b - 1e-9)
    lines.append(
        f"- Utilization over the requests the baseline trimmed: the new mode's at least the baseline's in "
        f"{better} of {len(same)} sessions (all runs); median of the differences "
        f"{_med([n - b for n, b in same]):+.3f} of the window."
    )
    lines += [
        "",
        "## The Claude-Code-shaped session",
        "",
        "Messages API, ~18K tokens of system and tools, `max_tokens` 32,000, a 60K window, claude-like",
        "counts, signed thinking before every call.",
        "",
        "| mode | requests | refused by the proxy | last resort (pinned or newest messages cut) "
        "| output cap lowered "
        "| lowered cap (median) | over | counts/req | summary calls/req | util | proxy ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in ("new", "baseline"):
        runs_of = [c[mode] for c in claude]
        caps = [s.lowered_output for s in runs_of if s.lowered_output is not None]
        util = [s.utilization for s in runs_of if s.utilization is not None]
        lines.append(
            f"| {mode} | {_med([s.requests for s in runs_of]):.0f} | {_med([s.errors for s in runs_of]):.0f} "
            f"| {_med([s.last_resort for s in runs_of]):.0f} | {_med([s.lowered for s in runs_of]):.0f} "
            f"| {(f'{_med(caps):,.0f}' if caps else '-')} | {_med([s.over_reached for s in runs_of]):.0f} "
            f"| {_med([s.counted / s.requests for s in runs_of]):.3f} "
            f"| {_med([s.summaries / s.requests for s in runs_of]):.3f} "
            f"| {(_med(util) if util else float('nan')):.3f} | {_med([s.proxy_ms for s in runs_of]):.2f} |"
        )
    lines += [
        "",
        "## A wrong table and errors without numbers",
        "",
        "The table says 131,072; the upstream's window is 4,096. A first request of ~34K tokens (no output",
        "cap), then 10 more of the same conversation. `failed`: upstream calls refused over the window.",
        "",
        "| case | failed, first request | failed, later requests | errors to the client "
        "| X-Context-Window (first; later) |",
        "|---|---:|---:|---:|---|",
    ]
    for label, index in (("Responses, errors without numbers", 0), ("Chat, errors with numbers", 1)):
        runs_of = [n[index] for n in no_numbers]
        later = sorted({w for n in runs_of for w in n.later_windows})
        lines.append(
            f"| {label} | {_med([n.first_failed for n in runs_of]):.0f} "
            f"| {_med([n.later_failed for n in runs_of]):.0f} "
            f"| {_med([n.client_errors for n in runs_of]):.0f} "
            f"| {_med([n.first_window for n in runs_of]):.0f}; "
            f"{', '.join(str(w) for w in later)} |"
        )
    return "\n".join(lines)


async def main_async(runs: int, quick: bool) -> str:
    fits, claude, no_numbers = [], [], []
    for seed in range(1, runs + 1):
        fits.append(await fits_scenario(seed=seed, quick=quick))
        claude.append(await claude_code_scenario(seed=seed, quick=quick))
        no_numbers.append(
            (
                await no_numbers_scenario(seed=seed, api="responses", numbers=False),
                await no_numbers_scenario(seed=seed, api="chat", numbers=True),
            )
        )
    return report(fits, claude, no_numbers, runs=runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="also write bench/results/boundary.md")
    args = parser.parse_args()
    text = asyncio.run(main_async(1 if args.quick else args.runs, args.quick))
    print(text)
    if args.write:
        RESULTS.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
