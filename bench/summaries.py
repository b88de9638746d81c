"""LLM summaries over a long session: ``.venv/bin/python -m bench.summaries [--turns 60]``.

A stateless client resends its whole history every turn, through a real ctxproxy (uvicorn on
127.0.0.1, summaries on, in-process cache) to the project's fake upstream (``tests.fake_upstream``,
real tokenizer, a window that the session outgrows), which also plays the summarizer: it answers
summary requests after ``--summary-delay-s`` with its extractive, capped summary
(``tests/fake_summarizer.py``). ``bench.memory`` measures the memory across APIs and shapes. Each user turn
carries one fact. Between turns the client "thinks" for ``--think-s`` (a real user or agent takes at
least that long), which gives ahead-of-time compaction its chance to run.

Measured, per session: extra upstream calls (summary requests) per client request; facts from cut
turns present in what was forwarded; requests that had to wait for a summary although no background
summary was running when they were sent (ahead of time had its time: target 0); and whether each
forwarded request extends the previous one (a stable prefix) except when a new block was cut.
Writes ``bench/results/summaries.md``. Bounded: one session, loopback only, about half a minute.
"""

from __future__ import annotations

import argparse
import itertools
import random
import re
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.main import create_app
from app.settings import Settings
from bench.scenarios import prose
from tests.fake_upstream import FakeModel, FakeUpstream, serve_app

RESULTS = Path(__file__).resolve().parent / "results" / "summaries.md"
MODEL = "bench-summarized"
FACT = re.compile(r"FACT-\w+")
SUMMARY_HEAD = re.compile(r"^\[ctxproxy: summary of ([0-9,]+) earlier messages?\]\n")
INDEX_HEAD = re.compile(r"^\[ctxproxy: index of ([0-9,]+) earlier messages?")
NOTE_HEAD = re.compile(r"^\[ctxproxy: ([0-9,]+) earlier messages? (?:\(|was|were)")


@dataclass
class Turn:
    """One client request and what the proxy did with it."""

    index: int
    latency_s: float
    actions: str
    waited: bool
    ahead_idle: bool
    cut_messages: int
    cut_facts: int
    kept_facts: int
    forwarded: list[dict[str, Any]] = field(repr=False)


def _facts(messages: Sequence[dict[str, Any]]) -> set[str]:
    return {f for m in messages if isinstance(m.get("content"), str) for f in FACT.findall(m["content"])}


def _summary(messages: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and (match := SUMMARY_HEAD.match(content)):
            return int(match.group(1).replace(",", "")), content
    return None


def _noted(messages: Sequence[dict[str, Any]]) -> int:
    """Messages cut and replaced by the deterministic note (0 when there is no note)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and (match := NOTE_HEAD.match(content)):
            return int(match.group(1).replace(",", ""))
    return 0


def _dropped(actions: str) -> int:
    """Messages the cut dropped (``dropped_messages=N`` of ``X-Context-Actions``; 0 when none)."""
    found = re.search(r"dropped_messages=([0-9]+)", actions)
    return int(found.group(1)) if found else 0


def _wait_idle(summaries: Any, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for background summaries to finish; True when none is running."""
    deadline = time.monotonic() + timeout_s
    while summaries.stats()["in_flight"]:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def run_session(
    *,
    turns: int = 60,
    window_tokens: int = 8192,
    user_tokens: int = 110,
    think_s: float = 0.3,
    summary_delay_s: float = 0.2,
    seed: int = 11,
    recall: bool | None = None,
    style: str = "prose",
) -> dict[str, Any]:
    """Drive one session and return the raw per-turn records plus the proxy's counters
    (``recall``: ``CTXPROXY_RECALL``, None for the proxy's default)."""
    rng = random.Random(seed)
    fake = FakeUpstream([FakeModel(MODEL, window_tokens, max_output_tokens=1024)])
    fake.summary_mode, fake.summary_delay_s = "slow", summary_delay_s
    fake.summary_style = style
    records: list[Turn] = []
    with tempfile.TemporaryDirectory() as tmp, fake.serve() as upstream_url:
        models_file = Path(tmp) / "models.toml"
        models_file.write_text(fake.models_toml(), encoding="utf-8")
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1",
            upstream_api_key=None,
            models_file=models_file,
            summarize=True,
            log_level="WARNING",
            # The fake serves any number of requests at once: summary calls need not give way to
            # client requests there (CTXPROXY_SUMMARY_YIELD=never; bench.llama measures auto).
            summary_yield="never",
            **({} if recall is None else {"recall": recall}),
        )
        app = create_app(settings)
        with serve_app(app) as proxy_url, httpx.Client(base_url=proxy_url, timeout=60) as client:
            summaries = app.state.service.summaries
            history: list[dict[str, Any]] = [
                {"role": "system", "content": "You are a coding agent. Keep every FACT you are told."}
            ]
            for i in range(turns):
                history.append(
                    {"role": "user", "content": f"Turn {i}: note FACT-t{i}. {prose(rng, user_tokens)}"}
                )
                idle = summaries.stats()["in_flight"] == 0
                waited_before = summaries.stats()["waited"]
                started = time.perf_counter()
                response = client.post(
                    "/v1/chat/completions",
                    json={"model": MODEL, "messages": history},
                    headers={"Authorization": "Bearer sk-bench"},
                )
                latency = time.perf_counter() - started
                response.raise_for_status()
                forwarded = fake.client_requests()[-1].json()["messages"]
                own = [m for m in forwarded if _summary([m]) is None]
                cut = _facts(history) - _facts(own)
                found = _summary(forwarded)
                records.append(
                    Turn(
                        index=i,
                        latency_s=latency,
                        actions=response.headers.get("x-context-actions", ""),
                        waited=summaries.stats()["waited"] > waited_before,
                        ahead_idle=idle,
                        cut_messages=_dropped(response.headers.get("x-context-actions", "")),
                        cut_facts=len(cut),
                        kept_facts=len(cut & _facts([{"content": found[1]}])) if found else 0,
                        forwarded=forwarded,
                    )
                )
                history.append(response.json()["choices"][0]["message"])
                time.sleep(think_s)
                _wait_idle(summaries, 0.0)
            _wait_idle(summaries, 10.0)
            stats = summaries.stats()
    return {
        "turns": records,
        "summary_calls": fake.summary_calls,
        "client_requests": len(records),
        "stats": stats,
        "params": {
            "turns": turns,
            "window_tokens": window_tokens,
            "user_tokens": user_tokens,
            "think_s": think_s,
            "summary_delay_s": summary_delay_s,
            "style": style,
        },
    }


def analyse(session: dict[str, Any]) -> dict[str, Any]:
    turns: list[Turn] = session["turns"]
    requests = session["client_requests"]
    cut = [t for t in turns if t.cut_messages]
    summarized = [t for t in turns if _summary(t.forwarded) is not None]
    first_cut = cut[0].index if cut else None
    stable = unstable = new_cuts = 0
    for before, after in itertools.pairwise(turns):
        if before.cut_messages != after.cut_messages:
            new_cuts += 1
        elif after.forwarded[: len(before.forwarded)] == before.forwarded:
            stable += 1
        else:
            unstable += 1
    idle_waits = [t for t in turns if t.waited and t.ahead_idle]
    cut_facts = sum(t.cut_facts for t in cut)
    kept_facts = sum(t.kept_facts for t in cut)
    overflow_requests = requests - first_cut if first_cut is not None else 0
    return {
        "requests": requests,
        "summary_calls": session["summary_calls"],
        "calls_per_request": session["summary_calls"] / requests if requests else 0.0,
        "first_cut": first_cut,
        "cut_requests": len(cut),
        "summarized_requests": len(summarized),
        "indexed_requests": sum(
            any(isinstance(m.get("content"), str) and INDEX_HEAD.match(m["content"]) for m in t.forwarded)
            for t in turns
        ),
        "calls_per_overflowing_request": session["summary_calls"] / overflow_requests
        if overflow_requests
        else 0.0,
        "summary_failed": sum("summary_failed" in t.actions for t in turns),
        "notes": sum(_noted(t.forwarded) > 0 for t in turns),
        "cut_facts": cut_facts,
        "kept_facts": kept_facts,
        "final_cut_facts": turns[-1].cut_facts if turns else 0,
        "final_kept_facts": turns[-1].kept_facts if turns else 0,
        "waited": sum(t.waited for t in turns),
        "waited_with_ahead_idle": len(idle_waits),
        "ahead_idle_requests": sum(t.ahead_idle for t in turns),
        "stable_pairs": stable,
        "unstable_pairs": unstable,
        "new_cut_pairs": new_cuts,
        "median_ms_uncut": _median_ms([t for t in turns if not t.cut_messages]),
        "median_ms_cut": _median_ms([t for t in summarized if not t.waited]),
        "median_ms_waited": _median_ms([t for t in turns if t.waited]),
        "stats": session["stats"],
        "params": session["params"],
    }


def _median_ms(turns: Sequence[Turn]) -> float | None:
    return statistics.median(t.latency_s for t in turns) * 1000 if turns else None


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _pct(part: int, whole: int) -> str:
    return "n/a" if not whole else f"{100 * part / whole:.1f}% ({part}/{whole})"


def render(result: dict[str, Any]) -> str:
    p = result["params"]
    rows = [
        ("client requests", str(result["requests"]), ""),
        ("first request with a cut", str(result["first_cut"]), ""),
        ("requests with cut turns", str(result["cut_requests"]), ""),
        ("... with a summary in their place", str(result["summarized_requests"]), "all"),
        ("... with the index alone in their place", str(result.get("indexed_requests", 0)), ""),
        ("summary calls (extra upstream requests)", str(result["summary_calls"]), ""),
        ("extra upstream calls per client request", f"{result['calls_per_request']:.3f}", "well under 0.1"),
        (
            "... per client request from the first cut on",
            f"{result['calls_per_overflowing_request']:.3f}",
            "",
        ),
        (
            "facts from cut turns present in the forwarded request (all cut requests)",
            _pct(result["kept_facts"], result["cut_facts"]),
            "100%",
        ),
        (
            "... in the last request",
            _pct(result["final_kept_facts"], result["final_cut_facts"]),
            "100%",
        ),
        (
            "requests that waited for a summary while no background summary was running",
            f"{result['waited_with_ahead_idle']} of {result['ahead_idle_requests']}",
            "0",
        ),
        ("requests that waited for a summary (any)", str(result["waited"]), ""),
        ("requests forwarded with the note (summary_failed)", str(result["notes"]), "0"),
        (
            "consecutive forwarded requests with a stable prefix (no new cut between them)",
            _pct(result["stable_pairs"], result["stable_pairs"] + result["unstable_pairs"]),
            "100%",
        ),
        ("consecutive pairs where a new block was cut", str(result["new_cut_pairs"]), ""),
        ("median client latency, no cut (ms)", _ms(result["median_ms_uncut"]), ""),
        ("median client latency, cut, summary ready (ms)", _ms(result["median_ms_cut"]), ""),
        ("median client latency, waited for a summary (ms)", _ms(result["median_ms_waited"]), ""),
    ]
    lines = [
        "# LLM summaries over a long session",
        "",
        f"`python -m bench.summaries`: {p['turns']} turns, window {p['window_tokens']} tokens, user turns of "
        f"about {p['user_tokens']} tokens (one FACT each), think time {p['think_s']} s, fake summarizer "
        f"latency {p['summary_delay_s']} s, style `{p.get('style', 'prose')}`. Proxy and fake upstream on "
        "127.0.0.1 (uvicorn), real tokenizer, in-process summary cache.",
        "",
        "| Metric | Value | Target |",
        "| --- | --- | --- |",
        *[f"| {name} | {value} | {target} |" for name, value, target in rows],
        "",
        "Summary calls grow with the tokens cut, not with the requests: once a session overflows, each "
        "memory step (at least four summaries' worth of messages) costs one summary call folding the "
        "previous summary, written in the background before the overflow that needs it. The fake "
        "summarizer is extractive and capped (`tests/fake_summarizer.py`): it keeps what only one "
        "sentence says, wrapped in prose that costs its share of the cap (style `prose`), or answers "
        "as small models do (`--style echo|template|repeat|requote|invent|empty|real`: every such "
        "answer is refused and the index of the memory stands alone). `python -m bench.memory` "
        "measures the memory across APIs and shapes.",
        "",
        *(
            [
                f"{result['stats']['too_large']} summaries did not fit the room their cut left (the engine "
                "chooses the cut by the size of the short note, then uses the summary only if it fits): "
                "those requests went out with the note (facts of those turns lost for that request, and "
                "a prefix change). Fixing it needs the drop step to cut one more block when the summary "
                "does not fit (app/core/strategies.py).",
                "",
            ]
            if result["stats"].get("too_large")
            else []
        ),
        f"Proxy counters: `{result['stats']}`",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--window-tokens", type=int, default=8192)
    parser.add_argument("--user-tokens", type=int, default=110)
    parser.add_argument("--think-s", type=float, default=0.3)
    parser.add_argument("--summary-delay-s", type=float, default=0.2)
    parser.add_argument(
        "--style", default="prose", help="the fake summarizer's style (tests.fake_summarizer)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    session = run_session(
        turns=args.turns,
        window_tokens=args.window_tokens,
        user_tokens=args.user_tokens,
        think_s=args.think_s,
        summary_delay_s=args.summary_delay_s,
        style=args.style,
    )
    text = render(analyse(session))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
