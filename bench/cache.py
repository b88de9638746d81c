"""Upstream prompt-cache reuse of cut conversations: ``.venv/bin/python -m bench.cache``.

A stateless client resends its whole history every turn through a real ctxproxy (uvicorn on
127.0.0.1) to the project's fake upstream (``tests.fake_upstream``: exact tiktoken count, refuses a
prompt over its window, plays the summarizer). Three growing sessions, each with summaries off and
on:

* ``chat-8k``: a chat of ~600-token turns (user ~250, assistant ~350) on an 8K window;
* ``agent-128k``: a coding-agent session (a task, then steps of 1-3 parallel tool calls, weights
  6:3:1, with 1-8K-token results, log-uniform so most are small; a new user message every 15
  steps) on a 128K window;
* ``agent-8k``: the same shape scaled to an 8K window (results of 64-512 tokens).

Measured from what the upstream received (forwarded messages, compared as JSON values):

* **prefix stability**: share of consecutive trimmed requests whose forwarded messages start with
  the previous request's forwarded messages;
* **prompt-cache reuse**: share of forwarded prompt tokens (per-message counts) that are a prefix
  the previous forwarded request already sent (the whole messages up to the first difference);
* **summary calls per client request** (summaries on);
* **utilization**: median over trimmed requests of forwarded prompt tokens / (window - max_tokens);
* requests over the window that reached the upstream (must be 0), and the proxy's own
  ``X-Context-Prefix-Reuse`` when it sends one.

Each figure is the median of ``--runs`` sessions (different seeds). ``--cut-targets`` sweeps the
proxy's ``CTXPROXY_CUT_TARGET`` (the choice of the default); ``--baseline`` runs without setting it
(for a tree that predates it); ``--recall off,on`` runs each row with ``CTXPROXY_RECALL`` off and
on (recall ids in the placeholders and the ``ctx_recall`` tool offered; the fake never calls it:
what offering it costs the cache), default: the proxy's default (on). Writes
``bench/results/cache.md``, ``cache.json`` and ``cache.png``.
Loopback only; bounded (each session at most ~90 requests).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.core.tokens import MessageCounter
from app.main import create_app
from app.settings import Settings
from app.tokenizer import counter_for
from bench.scenarios import prose
from tests.fake_upstream import FakeModel, FakeUpstream, serve_app

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    # metric -> (comparison, value), per shape (from issue 12)
    "chat-8k": {
        "stability": (">=", 0.65),
        "reuse": (">=", 0.6),
        "calls": ("<=", 0.3),
        "utilization": (">=", 0.55),
    },
    "agent-128k": {
        "stability": (">=", 0.65),
        "reuse": (">=", 0.85),
        "calls": ("<=", 0.1),
        "utilization": (">=", 0.65),
    },
    "agent-8k": {"stability": (">=", 0.65), "reuse": (">=", 0.55), "utilization": (">=", 0.55)},
}


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    window_tokens: int
    max_tokens: int
    requests: int
    agent: bool
    result_tokens: tuple[int, int] = (0, 0)


SHAPES: dict[str, Shape] = {
    "chat-8k": Shape("chat-8k", 8192, 1024, 40, agent=False),
    "agent-128k": Shape("agent-128k", 128_000, 4096, 90, agent=True, result_tokens=(1000, 8000)),
    "agent-8k": Shape("agent-8k", 8192, 1024, 90, agent=True, result_tokens=(64, 512)),
}


@dataclass
class Record:
    """One client request and what reached the upstream."""

    trimmed: bool
    prompt_tokens: int
    forwarded: list[dict[str, Any]] = field(repr=False)
    message_tokens: list[int] = field(repr=False)
    status: int = 200
    proxy_reuse: float | None = None
    actions: str = ""


def _chat_session(rng: random.Random, shape: Shape) -> Iterator[list[dict[str, Any]]]:
    """The growing history a chat client sends, request by request (user ~250, reply ~350)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant. " * 10}]
    for i in range(shape.requests):
        history.append({"role": "user", "content": f"Question {i}: {prose(rng, 250)}"})
        yield history
        history.append({"role": "assistant", "content": f"Answer {i}: {prose(rng, 350)}"})


def _agent_session(rng: random.Random, shape: Shape) -> Iterator[list[dict[str, Any]]]:
    """A coding agent's growing history: a request after every step's tool results."""
    low, high = shape.result_tokens
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent with shell and file tools. " * 20},
        {"role": "user", "content": f"Task: {prose(rng, 200)}"},
    ]
    for step in range(shape.requests):
        if step and step % 15 == 0:
            history.append({"role": "user", "content": f"Follow-up {step}: {prose(rng, 80)}"})
        ids = [f"call_{step}_{j}" for j in range(rng.choices((1, 2, 3), weights=(6, 3, 1))[0])]
        calls = [
            {
                "id": cid,
                "type": "function",
                "function": {
                    "name": rng.choice(["read_file", "run_shell", "grep"]),
                    "arguments": json.dumps({"path": f"src/module_{rng.randint(0, 99)}.py", "q": cid}),
                },
            }
            for cid in ids
        ]
        history.append({"role": "assistant", "content": prose(rng, 40), "tool_calls": calls})
        for cid in ids:
            size = round(math.exp(rng.uniform(math.log(low), math.log(high))))  # most results small
            history.append({"role": "tool", "tool_call_id": cid, "content": prose(rng, size)})
        yield history


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Session:
    """One session's records and what the fake upstream counted."""

    records: list[Record]
    summary_calls: int = 0
    over_window: int = 0


def run_session(
    shape: Shape,
    *,
    summaries: bool,
    seed: int,
    cut_target: float | None,
    think_s: float,
    recall: bool | None = None,
) -> Session:
    """One session through a fresh proxy and fake upstream; the per-request records."""
    rng = random.Random(seed)
    model = f"bench-{shape.name}"
    fake = FakeUpstream([FakeModel(model, shape.window_tokens, max_output_tokens=shape.max_tokens)])
    fake.summary_mode, fake.summary_delay_s = "slow", 0.02
    counter = MessageCounter(counter_for("o200k_base"))
    records: list[Record] = []
    session = _agent_session(rng, shape) if shape.agent else _chat_session(rng, shape)
    with tempfile.TemporaryDirectory() as tmp, fake.serve() as upstream_url:
        models_file = Path(tmp) / "models.toml"
        models_file.write_text(fake.models_toml(), encoding="utf-8")
        options: dict[str, Any] = {"cut_target": cut_target} if cut_target is not None else {}
        if recall is not None:
            options["recall"] = recall
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1",
            upstream_api_key=None,
            models_file=models_file,
            summarize=summaries,
            discovery=False,
            # The fake on loopback stands for a hosted API (many slots): summary calls do not give
            # way to client requests there (CTXPROXY_SUMMARY_YIELD=never; bench.llama measures auto).
            summary_yield="never",
            log_level="WARNING",
            **options,
        )
        app = create_app(settings)
        with serve_app(app) as proxy_url, httpx.Client(base_url=proxy_url, timeout=120) as client:
            for history in session:
                body = {"model": model, "messages": history, "max_tokens": shape.max_tokens}
                response = client.post("/v1/chat/completions", json=body)
                sent = fake.client_requests()[-1]
                forwarded = sent.json()["messages"]
                reuse = response.headers.get("x-context-prefix-reuse")
                records.append(
                    Record(
                        trimmed=response.headers.get("x-context-actions", "none") != "none",
                        prompt_tokens=sent.prompt_tokens or 0,
                        forwarded=forwarded,
                        message_tokens=list(counter.count_messages(forwarded)),
                        status=response.status_code,
                        proxy_reuse=float(reuse) if reuse else None,
                        actions=response.headers.get("x-context-actions", ""),
                    )
                )
                if think_s:
                    time.sleep(think_s)  # a user or an agent takes at least this long
            summary_calls = fake.summary_calls
            over_window = sum(1 for r in fake.client_requests() if r.status == 400)
    return Session(records, summary_calls=summary_calls, over_window=over_window)


def measure(shape: Shape, session: Session | list[Record]) -> dict[str, Any]:
    """The issue's figures for one session."""
    if not isinstance(session, Session):
        session = Session(session)
    records = session.records
    pairs = stable = 0
    reused_all = total_all = reused_trim = total_trim = 0
    per_turn: list[tuple[int, int]] = []
    for i, record in enumerate(records):
        total = sum(record.message_tokens)
        shared = _common_prefix(record.forwarded, records[i - 1].forwarded) if i else 0
        reused = sum(record.message_tokens[:shared])
        per_turn.append((total, reused))
        if i:
            reused_all += reused
            total_all += total
            if record.trimmed:
                reused_trim += reused
                total_trim += total
            if record.trimmed and records[i - 1].trimmed:
                pairs += 1
                previous = records[i - 1].forwarded
                stable += record.forwarded[: len(previous)] == previous
    room = shape.window_tokens - shape.max_tokens
    trimmed = [r.prompt_tokens / room for r in records if r.trimmed]
    return {
        "requests": len(records),
        "trimmed": sum(r.trimmed for r in records),
        "stability": stable / pairs if pairs else None,
        "reuse": reused_all / total_all if total_all else None,
        "reuse_trimmed": reused_trim / total_trim if total_trim else None,
        "calls": session.summary_calls / len(records) if records else 0.0,
        "utilization": statistics.median(trimmed) if trimmed else None,
        "over_window": session.over_window,
        "errors": sum(1 for r in records if r.status != 200),
        "proxy_reuse": _mean([r.proxy_reuse for r in records[1:] if r.proxy_reuse is not None]),
        "per_turn": per_turn,
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _target(value: float | None) -> str:
    return "default" if value is None else str(value)


def _verdict(shape: str, metric: str, value: float | None, summaries: bool) -> str:
    target = TARGETS.get(shape, {}).get(metric)
    if target is None or value is None or (metric == "calls" and not summaries):
        return ""
    op, bound = target
    ok = value >= bound if op == ">=" else value <= bound
    return f" ({'PASS' if ok else 'FAIL'} {op} {bound})"


def render(results: list[dict[str, Any]], *, runs: int, note: str) -> str:
    lines = [
        "# Prompt-cache reuse of cut conversations",
        "",
        f"`python -m bench.cache`: median of {runs} sessions per row (seeds 1..{runs}). Proxy and fake "
        "upstream on 127.0.0.1 (uvicorn), exact tiktoken counts, in-process summary cache, fake "
        "summarizer (20 ms). " + note,
        "",
        "| shape | summaries | recall | cut target | requests | trimmed | prefix stability | cache reuse "
        "(all / trimmed) | summary calls / request | utilization | over window |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in results:
        s, on = row["shape"], row["summaries"]
        recall = row.get("recall")
        lines.append(
            f"| {s} | {'on' if on else 'off'} | {'default' if recall is None else 'on' if recall else 'off'} "
            f"| {_target(row['cut_target'])} "
            f"| {row['requests']} | {row['trimmed']} "
            f"| {_fmt(row['stability'])}{_verdict(s, 'stability', row['stability'], on)} "
            f"| {_fmt(row['reuse'])}{_verdict(s, 'reuse', row['reuse'], on)} / {_fmt(row['reuse_trimmed'])} "
            f"| {_fmt(row['calls'], 3) if on else '-'}{_verdict(s, 'calls', row['calls'], on)} "
            f"| {_fmt(row['utilization'])}{_verdict(s, 'utilization', row['utilization'], on)} "
            f"| {row['over_window']} |"
        )
    return "\n".join([*lines, ""])


def plot(results: list[dict[str, Any]], out: Path) -> Path | None:
    """Forwarded and reused tokens per request, one panel per shape (summaries off, first run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = [r for r in results if not r["summaries"] and r.get("per_turn")]
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(rows), figsize=(5.2 * len(rows), 4.2), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=True):
        forwarded = [f for f, _ in row["per_turn"]]
        reused = [r for _, r in row["per_turn"]]
        xs = list(range(1, len(forwarded) + 1))
        ax.plot(xs, forwarded, label="forwarded prompt tokens", color="tab:blue")
        ax.fill_between(xs, reused, color="tab:green", alpha=0.45, label="reused (previous request's prefix)")
        ax.set_title(f"{row['shape']} (cut target {row['cut_target'] or 'default'})")
        ax.set_xlabel("request")
        ax.set_ylabel("tokens")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--summaries", default="off,on", help="off, on or off,on")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cut-targets", default="", help="comma-separated CTXPROXY_CUT_TARGET values")
    parser.add_argument("--baseline", action="store_true", help="do not set CTXPROXY_CUT_TARGET")
    parser.add_argument("--think-s", type=float, default=0.03)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="cache")
    parser.add_argument("--note", default="")
    parser.add_argument("--recall", default="", help="off, on or off,on (default: the proxy's default)")
    args = parser.parse_args(argv)
    recalls: list[bool | None] = [m == "on" for m in args.recall.split(",")] if args.recall else [None]
    targets: list[float | None] = (
        [None] if args.baseline or not args.cut_targets else [float(t) for t in args.cut_targets.split(",")]
    )
    results: list[dict[str, Any]] = []
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        for mode in args.summaries.split(","):
            for target, recall in [(t, r) for t in targets for r in recalls]:
                runs = [
                    measure(
                        shape,
                        run_session(
                            shape,
                            summaries=mode == "on",
                            seed=seed,
                            cut_target=target,
                            think_s=args.think_s,
                            recall=recall,
                        ),
                    )
                    for seed in range(1, args.runs + 1)
                ]
                row: dict[str, Any] = {
                    "shape": shape.name,
                    "summaries": mode == "on",
                    "cut_target": target,
                    "recall": recall,
                }
                for key in (
                    "requests",
                    "trimmed",
                    "stability",
                    "reuse",
                    "reuse_trimmed",
                    "calls",
                    "utilization",
                ):
                    row[key] = _median([r[key] for r in runs])
                row["over_window"] = max(r["over_window"] for r in runs)
                row["errors"] = max(r["errors"] for r in runs)
                row["proxy_reuse"] = _median([r["proxy_reuse"] for r in runs])
                row["per_turn"] = runs[0]["per_turn"]
                row["runs"] = [{k: v for k, v in r.items() if k != "per_turn"} for r in runs]
                results.append(row)
                print(render([row], runs=args.runs, note="").splitlines()[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(results, runs=args.runs, note=args.note)
    (args.out / f"{args.name}.md").write_text(text, encoding="utf-8")
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    picture = plot(results, args.out / f"{args.name}.png")
    print(text)
    print(f"written to {args.out / args.name}.md" + (f" and {picture}" if picture else ""))


if __name__ == "__main__":
    main()
