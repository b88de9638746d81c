"""Memory with a real small local model: ``python -m bench.llama --server BIN --model GGUF``.

llama.cpp's own server (``BIN``: a ``llama-server`` binary; ``GGUF``: e.g. Gemma 3 270M Q4_K_M) on
127.0.0.1, CPU, is the only upstream and the only summarizer, as a user with one local model has
it. Neither is built or downloaded here (CI never runs this). A recorder (aiohttp, in this
process) sits between the proxy and the server: it forwards every request and keeps what went
and came back, so the figures come from what the model really received and answered.

Two sessions of the same growing chat (``--turns`` turns, each user message carrying one access
code such as ``QXV-4821``; the assistant's side is fixed text, so both sessions send the same
turns whatever the model answers; ``temperature`` 0, ``max_tokens`` ``--max-tokens``):

* **proxied**: through a ctxproxy (its defaults: summaries on, discovery of the window from
  ``/props``; ``--tree DIR`` runs another checkout's proxy, for the figures before a change) to a
  one-slot server with a ``--ctx``-token window;
* **direct**: the same turns straight to a larger instance (``--direct-ctx`` tokens, one slot),
  which holds the whole chat.

Measured, proxied: every turn answered (HTTP 200); each summary the model wrote and the proxy's
checks' verdict on it (``app.compaction.checks``, this tree's); every summary placed in a
forwarded request checked again (control tokens, the prompt echoed, repeated lines, transcript
labels: none may be degenerate); of the codes in the messages the last request no longer shows
whole, the share it still carries (target 0.8). Timing: the turns the proxy cut against the same
turns direct (median ratio, target 1.5x), the whole session (sum, target 1.3x), and the time each
proxied request spent besides the model's own work on it (the client's latency less the server's
``timings.prompt_ms + predicted_ms``: waits on summaries, in line or for the slot; target at most
the proxy's ``CTXPROXY_SUMMARY_TIMEOUT_S``), with, for each proxied turn, the upstream exchanges
in flight during it (cancelled ones too) and the proxy's ``X-Context-*`` headers (the JSON; the
worst turn in the markdown). ``--runs N`` alternates the order of the sessions. ``--pause-s S``:
the client pauses ``S`` seconds after each answer, as a person reading it would (the default, 0,
is a script or an agent that sends its next request at once: on a one-slot server the proxy's
summary calls wait for a pause). ``--logs DIR`` keeps the servers' logs.

``--fixtures FILE`` saves every summary answer with its request's size and verdict as JSON (the
bad answers of a real small model: ``tests/fixtures/summaries/``). ``--capture N``: instead of the
sessions, N summary requests of the chat's first 4, 8, 12... turns, built by ``--tree``'s own
prompts (``app/compaction/prompts.py`` of that checkout: the prompt before a change, or this one),
sent straight to the server with ``--capture-tokens`` as their cap and no time limit: what the model
writes when nothing else competes for it. Writes ``--out`` (markdown and JSON). The machine may be
shared: timings are ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import signal
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from aiohttp import web

from app.compaction.checks import check_summary
from app.compaction.prompts import SYSTEM_MARKER
from app.tokenizer import counter_for
from bench.servers import REPO, ServerPool, free_port, git_state, uvicorn_argv
from tests.fake_summarizer import prompt_text

RESULTS = Path(__file__).resolve().parent / "results"
CODE = re.compile(r"\b[A-Z]{3}-[0-9]{4}\b")
CONTROL = re.compile(r"<\|[A-Za-z0-9_]+\|>|<(?:start|end)_of_turn>|</?s>|\[/?INST\]")
LABEL = re.compile(r"^\s*\[(?:user|assistant|system|tool[^\]]*)\]:", re.MULTILINE)
SUMMARY_HEAD = re.compile(r"^\[ctxproxy: summary of [0-9,]+ earlier messages?\]\n")
INDEX_HEAD = "\n[ctxproxy: exact strings from them]\n"
SYSTEM = "You are a helpful assistant for a small software team. Answer briefly."
TOPICS = (
    ("the release checklist", "We ship on Thursdays after the smoke tests pass on staging."),
    ("the database migration", "The orders table gets a new index before the schema change lands."),
    ("the on-call rota", "Nadia covers weekends this month and Tom takes the nights."),
    ("the flaky login test", "It fails when the session cookie expires during the redirect."),
    ("the budget review", "Cloud costs rose because the nightly batch jobs doubled."),
    ("the API rate limits", "Clients above two hundred requests a minute get a retry header."),
    ("the mobile build", "The signing certificate expires at the end of the quarter."),
    ("the support backlog", "Most open tickets are about password resets and invoices."),
    ("the search feature", "Results are ranked by recency first, then by how often they are opened."),
    ("the office move", "Desks move to the third floor; the printers stay where they are."),
    ("the hiring plan", "Two backend engineers join in spring, one designer in summer."),
    ("the logging pipeline", "Logs older than thirty days go to cold storage automatically."),
)


# -- the chat ------------------------------------------------------------------------------------


def codes(seed: int, turns: int) -> list[str]:
    rng = random.Random(seed)
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return [
        f"{''.join(rng.choice(letters) for _ in range(3))}-{rng.randint(1000, 9999)}" for _ in range(turns)
    ]


def chat_turns(seed: int, turns: int) -> Iterator[list[dict[str, Any]]]:
    """The growing chat: the history of every request (the last message the new user turn)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for k, code in enumerate(codes(seed, turns)):
        topic, fact = TOPICS[k % len(TOPICS)]
        question = (
            f"Turn {k + 1}. Let's talk about {topic}. {fact} Please keep in mind that the access code "
            f"for vault {k + 1} is {code}; I will ask for it later. What should we watch out for with "
            f"{topic}, in one or two sentences?"
        )
        history.append({"role": "user", "content": question})
        yield list(history)
        history.append(
            {
                "role": "assistant",
                "content": f"Noted. For {topic}, the main risk is doing it in a hurry: {fact.lower()} "
                "Plan it, tell the team, and check the result the day after.",
            }
        )


# -- the recorder between the proxy and the server ------------------------------------------------


@dataclass
class Exchange:
    path: str
    request: dict[str, Any]
    response: dict[str, Any]
    status: int
    started_s: float
    ended_s: float
    method: str = "POST"
    cancelled: bool = False  # the proxy dropped it before the answer came

    @property
    def kind(self) -> str:
        """``client`` (a chat request the proxy forwarded), ``summary`` or ``other`` (window
        discovery, counting, tokenizing)."""
        if self.summary:
            return "summary"
        return "client" if self.method == "POST" and self.path.endswith("/completions") else "other"

    def brief(self, origin_s: float) -> dict[str, Any]:
        """This exchange for a turn's breakdown, its times relative to ``origin_s`` (the turn's
        start)."""
        return {
            "path": self.path,
            "kind": self.kind,
            "start_s": round(self.started_s - origin_s, 3),
            "end_s": round(self.ended_s - origin_s, 3),
            "status": self.status,
            "cancelled": self.cancelled,
            "model_s": round(_model_s(self.response), 3),
        }

    @property
    def summary(self) -> bool:
        messages = self.request.get("messages") or []
        first = messages[0] if messages and isinstance(messages[0], dict) else {}
        content = first.get("content")
        return (
            first.get("role") == "system" and isinstance(content, str) and content.startswith(SYSTEM_MARKER)
        )

    @property
    def answer(self) -> str:
        try:
            return str(self.response["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            return ""


@dataclass
class Recorder:
    """Forwards every request to ``target`` and keeps the JSON exchanges."""

    target: str
    exchanges: list[Exchange] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        started = time.perf_counter()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        raw, status = b"", 0
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session,
                session.request(
                    request.method, self.target + request.path_qs, data=body, headers=headers
                ) as answer,
            ):
                raw = await answer.read()
                status = answer.status
                kind = answer.headers.get("Content-Type", "application/json")
        finally:  # a request the proxy dropped (this handler cancelled) is kept too, marked
            sent, got = _json(body), _json(raw)
            self.exchanges.append(
                Exchange(
                    request.path, sent, got, status, started, time.perf_counter(),
                    method=request.method, cancelled=status == 0,
                )
            )  # fmt: skip
        return web.Response(body=raw, status=status, content_type=kind.split(";")[0])


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- one session ---------------------------------------------------------------------------------


@dataclass
class Turn:
    status: int
    latency_s: float
    model_s: float
    memory: str
    forwarded: dict[str, Any] = field(repr=False)
    client: list[dict[str, Any]] = field(repr=False)
    started_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)  # the proxy's X-Context-* headers
    upstream: list[dict[str, Any]] = field(default_factory=list)  # Exchange.brief of each overlapping

    @property
    def besides_model_s(self) -> float:
        return self.latency_s - self.model_s

    def breakdown(self) -> dict[str, Any]:
        return {
            "latency_s": round(self.latency_s, 3),
            "model_s": round(self.model_s, 3),
            "besides_model_s": round(self.besides_model_s, 3),
            "memory": self.memory,
            "headers": self.headers,
            "upstream": self.upstream,
        }


def overlapping(exchanges: list[Exchange], turn: Turn) -> list[dict[str, Any]]:
    """The exchanges in flight at some moment of ``turn`` (started before it ended, ended after
    it started), relative to its start."""
    end = turn.started_s + turn.latency_s
    return [
        e.brief(turn.started_s)
        for e in sorted(exchanges, key=lambda e: e.started_s)
        if e.started_s < end and e.ended_s > turn.started_s
    ]


def _model_s(answer: dict[str, Any]) -> float:
    timings = answer.get("timings") if isinstance(answer, dict) else None
    if not isinstance(timings, dict):
        return 0.0
    return (float(timings.get("prompt_ms") or 0) + float(timings.get("predicted_ms") or 0)) / 1000


async def run_session(
    base_url: str,
    *,
    seed: int,
    turns: int,
    max_tokens: int,
    recorder: Recorder | None,
    pause_s: float = 0.0,
) -> list[Turn]:
    out: list[Turn] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=1800) as client:
        for history in chat_turns(seed, turns):
            if out and pause_s:
                await asyncio.sleep(pause_s)  # a person reading the answer (outside every latency)
            body = {"model": "local", "messages": history, "max_tokens": max_tokens, "temperature": 0}
            before = len(recorder.exchanges) if recorder is not None else 0
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            latency = time.perf_counter() - started
            answer = (
                response.json()
                if response.headers.get("content-type", "").startswith("application/json")
                else {}
            )
            forwarded: dict[str, Any] = body
            if recorder is not None:
                mine = [e for e in recorder.exchanges[before:] if e.kind == "client"]
                forwarded = mine[-1].request if mine else {}
            out.append(
                Turn(
                    status=response.status_code,
                    latency_s=latency,
                    model_s=_model_s(answer),
                    memory=response.headers.get("x-context-memory", "none"),
                    forwarded=forwarded,
                    client=history,
                    started_s=started,
                    headers={k: v for k, v in response.headers.items() if k.lower().startswith("x-context-")},
                )
            )
    return out


def start_llama(pool: ServerPool, name: str, args: argparse.Namespace, *, ctx: int) -> str:
    port = free_port()
    argv = [
        args.server, "-m", args.model, "-c", str(ctx), "-np", "1", "--host", "127.0.0.1",
        "--port", str(port), "-t", str(args.threads), "--jinja",
    ]  # fmt: skip
    pool.start(name, argv, port=port, ready_path="/health")
    pool.wait_ready([name], timeout_s=300)
    return f"http://127.0.0.1:{port}"


def start_proxy(pool: ServerPool, tree: Path, upstream: str, env: dict[str, str]) -> str:
    port = free_port()
    python = tree / ".venv" / "bin" / "python"
    extra = {} if python.exists() else {"PYTHONPATH": str(tree)}  # a bare checkout: this venv
    pool.start(
        "proxy",
        uvicorn_argv("app.main:create_app", port, python=str(python) if python.exists() else None),
        port=port,
        env={"CTXPROXY_UPSTREAM_BASE_URL": f"{upstream}/v1", "CTXPROXY_LOG_LEVEL": "WARNING", **extra, **env},
        ready_path="/healthz",
        cwd=tree,
    )
    pool.wait_ready(["proxy"], timeout_s=120)
    return f"http://127.0.0.1:{port}"


async def serve_recorder(recorder: Recorder) -> tuple[web.AppRunner, str]:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    # A request the proxy gives up (a summary cancelled by a client request, a timeout) is given
    # up at the server too, as it would be without the recorder in between.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


# -- the figures ---------------------------------------------------------------------------------


def placed_summaries(forwarded: dict[str, Any]) -> list[str]:
    """The summaries a forwarded request carries (the memory's summary part, index aside)."""
    out = []
    for message in forwarded.get("messages") or []:
        text = prompt_text(message.get("content"))
        head = SUMMARY_HEAD.match(text)
        if head:
            out.append(text[head.end() :].split(INDEX_HEAD, 1)[0])
    return out


def degenerate(summary: str) -> str | None:
    """An independent look at a placed summary (not the proxy's checks): what makes it garbage."""
    if CONTROL.search(summary):
        return "control tokens"
    if SYSTEM_MARKER[:40] in summary or "handoff summar" in summary.lower():
        return "the prompt echoed"
    if len(LABEL.findall(summary)) >= 2:
        return "transcript labels"
    lines = [line.strip() for line in summary.splitlines() if line.strip()]
    if lines and max(lines.count(line) for line in lines) >= 3:
        return "a repeated line"
    if len(summary.split()) < 3:
        return "empty"
    return None


def verdicts(exchanges: list[Exchange]) -> list[dict[str, Any]]:
    count = counter_for("o200k_base").count_text
    out = []
    for e in exchanges:
        if not e.summary or e.cancelled:  # a call the proxy dropped: the model wrote nothing
            continue
        cap = int(e.request.get("max_tokens") or e.request.get("max_completion_tokens") or 1024)
        # Overrun is the proxy's to judge with the model's own count; o200k here: twice the cap.
        rejection = check_summary(
            e.answer, request=e.request["messages"], cap_tokens=2 * cap, count_text=count
        )
        out.append(
            {
                "answer": e.answer,
                "status": e.status,
                "seconds": round(e.ended_s - e.started_s, 2),
                "prompt_chars": sum(len(prompt_text(m.get("content"))) for m in e.request["messages"]),
                "max_tokens": cap,
                "verdict": "ok" if rejection is None else rejection.cause,
                "detail": "" if rejection is None else rejection.detail,
                "request": e.request["messages"],
            }
        )
    return out


def retention(turns: list[Turn]) -> dict[str, Any]:
    last = turns[-1]
    shown = {json.dumps(m, sort_keys=True) for m in last.forwarded.get("messages") or []}
    forgotten = [m for m in last.client if json.dumps(m, sort_keys=True) not in shown]
    old = set(CODE.findall(json.dumps(forgotten)))
    carried = set(CODE.findall(json.dumps(last.forwarded)))
    return {
        "forgotten_codes": len(old),
        "kept_codes": len(old & carried),
        "share": len(old & carried) / len(old) if old else None,
    }


def timing(proxied: list[Turn], direct: list[Turn]) -> dict[str, Any]:
    cut = [k for k, t in enumerate(proxied) if t.memory != "none"]
    cut_ratio = (
        statistics.median(proxied[k].latency_s for k in cut)
        / statistics.median(direct[k].latency_s for k in cut)
        if cut
        else None
    )
    return {
        "cut_turns": len(cut),
        "cut_median_s": statistics.median(proxied[k].latency_s for k in cut) if cut else None,
        "cut_direct_median_s": statistics.median(direct[k].latency_s for k in cut) if cut else None,
        "cut_ratio": cut_ratio,
        "session_s": sum(t.latency_s for t in proxied),
        "session_direct_s": sum(t.latency_s for t in direct),
        "session_ratio": sum(t.latency_s for t in proxied) / sum(t.latency_s for t in direct),
    }


async def one_run(args: argparse.Namespace, seed: int, order: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {"seed": seed, "order": order}
    env = dict(kv.split("=", 1) for kv in args.proxy_env)
    timeout_s = float(env.get("CTXPROXY_SUMMARY_TIMEOUT_S", "4"))
    logs = args.logs / f"run-{seed}" if args.logs is not None else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    session = partial(
        run_session, seed=seed, turns=args.turns, max_tokens=args.max_tokens, pause_s=args.pause_s
    )
    with ServerPool(log_dir=logs) as pool:
        for which in order:
            if which == "direct":
                large = start_llama(pool, "direct", args, ctx=args.direct_ctx)
                result["direct"] = await session(large, recorder=None)
                pool.stop("direct")
                continue
            small = start_llama(pool, "small", args, ctx=args.ctx)
            recorder = Recorder(small)
            runner, recorder_url = await serve_recorder(recorder)
            try:
                proxy = start_proxy(pool, args.tree, recorder_url, env)
                turns = await session(proxy, recorder=recorder)
                await asyncio.sleep(args.settle_s)  # a summary still running: let it land in the recorder
                pool.stop("proxy")
                for t in turns:
                    t.upstream = overlapping(recorder.exchanges, t)
            finally:
                await runner.cleanup()
                pool.stop("small")
            result["proxied"] = turns
            result["summaries"] = verdicts(recorder.exchanges)
            result["cancelled"] = sum(1 for e in recorder.exchanges if e.summary and e.cancelled)
    proxied: list[Turn] = result["proxied"]
    placed = [s for t in proxied for s in placed_summaries(t.forwarded)]
    figures = {
        "answered": sum(1 for t in proxied if t.status == 200),
        "turns": len(proxied),
        "summary_calls": len(result["summaries"]),
        "summary_cancelled": result["cancelled"],
        "rejected": sum(1 for s in result["summaries"] if s["verdict"] != "ok"),
        "placed": len(placed),
        "placed_degenerate": sum(1 for s in placed if degenerate(s)),
        "memory": {
            kind: sum(1 for t in proxied if t.memory == kind) for kind in ("summary", "index", "note", "none")
        },
        **retention(proxied),
        "besides_model_max_s": max(t.besides_model_s for t in proxied),
        "besides_model_median_s": statistics.median(t.besides_model_s for t in proxied),
    }
    if "direct" in result:
        figures |= timing(proxied, result["direct"])
        figures["direct_answered"] = sum(1 for t in result["direct"] if t.status == 200)
    figures["summary_timeout_s"] = timeout_s
    result["figures"] = figures
    return result


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary call's record without its request (the fixtures keep the requests)."""
    return {k: v for k, v in summary.items() if k != "request"}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def render(runs: list[dict[str, Any]], args: argparse.Namespace) -> str:
    f = [r["figures"] for r in runs]

    def med(key: str) -> Any:
        known = [x[key] for x in f if x.get(key) is not None]
        return statistics.median(known) if known else None

    share = med("share")
    proxy = args.tree_name or git_state(args.tree, subject=True)
    lines = [
        "# Memory with a real small local model (issue 28)",
        "",
        f"`python -m bench.llama`: {os.path.basename(args.model)} on llama.cpp's `llama-server` (CPU, "
        f"{args.threads} threads, one slot), {args.turns} turns, `max_tokens` {args.max_tokens}, "
        f"{len(runs)} run(s) (median where several). Proxy: `{proxy}` (its "
        f"defaults{'; ' + ', '.join(args.proxy_env) if args.proxy_env else ''}); proxied to a "
        f"{args.ctx}-token server, direct to a {args.direct_ctx}-token one. The machine was shared "
        "(2 cores, several engineers): timings are ratios within a run.",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        f"| client turns answered (proxied) | {med('answered')} of {med('turns')} | all |",
        f"| summaries the model wrote / refused by the checks (summary calls the proxy cancelled) | "
        f"{med('summary_calls')} / {med('rejected')} ({med('summary_cancelled')}) | |",
        f"| summaries placed in a request / degenerate among them | {med('placed')} / "
        f"{med('placed_degenerate')} | - / 0 |",
        f"| forgotten codes still in the last request | {med('kept_codes')} of {med('forgotten_codes')} "
        f"({_fmt(share)}) | >= 0.8 |",
        f"| cut turns: proxied / direct median (s) | {_fmt(med('cut_median_s'))} / "
        f"{_fmt(med('cut_direct_median_s'))} = {_fmt(med('cut_ratio'))}x ({med('cut_turns')} turns) "
        "| <= 1.5x |",
        f"| whole session: proxied / direct (s) | {_fmt(med('session_s'), 1)} / "
        f"{_fmt(med('session_direct_s'), 1)} = {_fmt(med('session_ratio'))}x | <= 1.3x |",
        f"| time besides the model's own work per proxied request: max / median (s) | "
        f"{_fmt(med('besides_model_max_s'))} / {_fmt(med('besides_model_median_s'))} | <= "
        f"{_fmt(med('summary_timeout_s'), 1)} (the summary timeout) |",
        "",
        "Memory of the proxied requests by run (`X-Context-Memory`): "
        + "; ".join(json.dumps(x["memory"]) for x in f),
        "",
        "Summaries the model wrote (first run), the checks' verdict:",
        "",
    ]
    for s in runs[0]["summaries"][:12]:
        answer = " ".join(s["answer"].split())
        lines.append(f"- `{s['verdict']}` ({s['seconds']} s): {answer[:160]!r}")
    return "\n".join([*lines, *worst_turn(runs), ""])


def worst_turn(runs: list[dict[str, Any]]) -> list[str]:
    """The markdown of the proxied turn that spent the longest besides the model's own work."""
    found = [(t.besides_model_s, n, k, t) for n, r in enumerate(runs) for k, t in enumerate(r["proxied"])]
    if not found:
        return []
    _, n, k, t = max(found, key=lambda x: x[0])
    headers = ", ".join(f"{name}: {value}" for name, value in sorted(t.headers.items()))
    lines = [
        "",
        f"The proxied turn with the most time besides the model's own work: run {n + 1}, turn {k + 1}, "
        f"{t.latency_s:.2f} s, the model {t.model_s:.2f} s of it ({headers or 'no X-Context headers'}). "
        "The upstream exchanges in flight during it (seconds from the turn's start):",
        "",
        "| kind | path | start | end | status | model (s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for e in t.upstream:
        status = "cancelled" if e["cancelled"] else e["status"]
        times = f"{e['start_s']:.2f} | {e['end_s']:.2f}"
        lines.append(f"| {e['kind']} | {e['path']} | {times} | {status} | {e['model_s']:.2f} |")
    return lines


async def amain(args: argparse.Namespace) -> None:
    runs = []
    for run in range(args.runs):
        order = ["direct", "proxied"] if run % 2 == 0 else ["proxied", "direct"]
        if args.no_direct:
            order = ["proxied"]
        runs.append(await one_run(args, args.seed + run, order))
        print(json.dumps(runs[-1]["figures"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(runs, args)
    (args.out / f"{args.name}.md").write_text(text, encoding="utf-8")
    (args.out / f"{args.name}.json").write_text(
        json.dumps(
            [
                {
                    "figures": r["figures"],
                    "summaries": [_brief(s) for s in r["summaries"]],
                    # Each proxied turn: its latency, the model's own time on it, its memory, the
                    # proxy's headers and the upstream exchanges in flight during it.
                    "turns": [t.breakdown() for t in r["proxied"]],
                }
                for r in runs
            ],
            indent=1,
        ),
        encoding="utf-8",
    )
    if args.fixtures is not None:
        answers = [s for r in runs for s in r["summaries"]]
        args.fixtures.parent.mkdir(parents=True, exist_ok=True)
        args.fixtures.write_text(
            json.dumps(
                {"model": os.path.basename(args.model), "answers": answers}, indent=1, ensure_ascii=False
            ),
            encoding="utf-8",
        )
    print(text)


def tree_prompts(tree: Path) -> Any:
    """``tree``'s own ``app/compaction/prompts.py`` (standalone: it imports the standard library
    only)."""
    path = tree / "app" / "compaction" / "prompts.py"
    spec = importlib.util.spec_from_file_location(f"prompts_of_{abs(hash(str(tree)))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def capture(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The model's answers to summary requests of the chat (see ``--capture``)."""
    prompts = tree_prompts(args.tree)
    histories = list(chat_turns(args.seed, args.turns))
    out: list[dict[str, Any]] = []
    count = counter_for("o200k_base").count_text
    with ServerPool() as pool:
        server = start_llama(pool, "capture", args, ctx=args.ctx)
        async with httpx.AsyncClient(base_url=server, timeout=3600) as client:
            for n in range(args.capture):
                turns = 4 * (n + 1)
                span = histories[min(turns, len(histories)) - 1][
                    1:-1
                ]  # the system prompt and the new turn aside
                transcript = "\n\n".join(prompts.render_messages(span))
                try:
                    request = prompts.summarize_messages(transcript, reply_tokens=args.capture_tokens)
                except TypeError:  # a prompt of before issue 28: no size in it
                    request = prompts.summarize_messages(transcript)
                body = {"model": "local", "messages": request, "max_tokens": args.capture_tokens}
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=body)
                answer = str(response.json()["choices"][0]["message"]["content"] or "")
                rejection = check_summary(
                    answer, request=request, cap_tokens=2 * args.capture_tokens, count_text=count
                )
                out.append(
                    {
                        "prompt_version": prompts.PROMPT_VERSION,
                        "turns": turns,
                        "answer": answer,
                        "status": response.status_code,
                        "seconds": round(time.perf_counter() - started, 1),
                        "prompt_chars": sum(len(m["content"]) for m in request),
                        "max_tokens": args.capture_tokens,
                        "verdict": "ok" if rejection is None else rejection.cause,
                        "detail": "" if rejection is None else rejection.detail,
                        "request": request,
                    }
                )
                print(json.dumps(_brief(out[-1]))[:400], flush=True)
    return out


def _stop_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C: every server this run started is stopped on the way out."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--server", required=True, help="the llama-server binary")
    parser.add_argument("--model", required=True, help="the GGUF model file")
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--direct-ctx", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument(
        "--pause-s", type=float, default=0.0, help="a person's pause between an answer and the next turn"
    )
    parser.add_argument("--no-direct", action="store_true", help="the proxied session alone (no timing)")
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout whose proxy runs")
    parser.add_argument(
        "--tree-name", default="", help="what to call it in the report (default: its git head)"
    )
    parser.add_argument("--proxy-env", action="append", default=[], metavar="CTXPROXY_X=V")
    parser.add_argument("--fixtures", type=Path, default=None, help="save the summary answers (JSON)")
    parser.add_argument("--capture", type=int, default=0, help="N summary requests straight to the server")
    parser.add_argument("--capture-tokens", type=int, default=160)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="llama")
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    args = parser.parse_args(argv)
    _stop_on_sigterm()
    if args.capture:
        answers = asyncio.run(capture(args))
        if args.fixtures is not None:
            data = {"model": os.path.basename(args.model), "answers": answers}
            if args.fixtures.exists():  # answers to another prompt saved before: kept beside
                data["answers"] = json.loads(args.fixtures.read_text(encoding="utf-8"))["answers"] + answers
            args.fixtures.parent.mkdir(parents=True, exist_ok=True)
            args.fixtures.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
        return
    asyncio.run(amain(args))


if __name__ == "__main__":
    main()
