"""What a cut forgets is still known: ``.venv/bin/python -m bench.memory``.

A stateless client resends its whole history every turn through a real ctxproxy (uvicorn on
127.0.0.1, **default settings**: summaries on, in-process cache) to the test suite's strict fake
upstream of the request's wire API (chat: ``tests.fake_upstream``; Responses:
``tests.fake_responses_upstream``; Anthropic Messages: ``tests.fake_anthropic_upstream``; Gemini:
``tests.fake_gemini_upstream``, every call and answer signed as Gemini 2.5/3 signs them,
``bench.memory_wire``), which refuses a prompt over its window and answers summary requests with
the extractive, capped summarizer of ``tests.fake_summarizer`` (no kinder than a real model: it
knows nothing of the planted facts). Shapes, each on each API, counted exactly and by estimate (the
model table says ``estimate``: the proxy estimates and calibrates from the upstream's usage).
Gemini's tokenizer is not public, so in production it is always counted by estimate: its
``estimate`` rows are that case (the table says ``estimate``; the fake counts its strings with
o200k, as the chat and Responses fakes do, which the proxy does not know: it calibrates from
``usageMetadata``), its ``exact`` rows the same comparison as the other APIs' (the table says
``o200k_base``, the upstream's own tokenizer: margins of an exact count; never so for a real
Gemini model). ``--gemini-tokens quarter``: the fake's own tokenizer instead (a quarter of the
characters, Google's rule of thumb: 1.38x o200k on this prose, so the same sessions are that much
longer). Gemini keeps no output reserve (its window is the input's):

* ``chat-8k``: a chat of ~600-token turns (user ~250 with one fact, reply ~350), 8K window;
* ``agent-8k``: a coding agent (a task, steps of 1-3 parallel tool calls, results of 64-512
  tokens, a third of them holding one fact: about one fact per 1K tokens; a follow-up user
  message every 15 steps, with a fact), 8K window;
* ``agent-128k``: the same agent with results of 1-8K tokens, half of them holding a fact (one
  per 5K tokens), 128K window.

Measured from what the upstream received:

* **summary calls per client request** (targets: at most 0.3 on the 8K shapes, 0.1 on 128K);
* **tokens to the summarizer / tokens forgotten**: every summary request's prompt, over the
  client's messages the last request no longer shows whole (dropped, or a tool result replaced by
  a placeholder), both counted with o200k (target: at most 1.5);
* **retention**: of the facts planted in the messages the last request no longer shows whole,
  the share it still carries (in its memory), and of every fact planted (target: at least 0.9);
* **prefix reuse**: share of forwarded prompt tokens that the previous forwarded request already
  sent as its prefix (items compared as JSON values; target 0.6 on the 8K chat counted by
  estimate), and the requests whose memory was a summary, a note, or none (``X-Context-Memory``);
* requests refused by the proxy or over the window at the upstream (must be 0).

Each figure is the median of ``--runs`` sessions (different seeds). Writes
``bench/results/memory.md`` and ``memory.json``. Loopback only; bounded (at most 90 requests a
session).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import re
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from app.core.conversation import strip_reserved
from app.core.dialects import DIALECTS
from app.core.tokens import MessageCounter
from app.main import create_app
from app.settings import Settings
from app.tokenizer import counter_for
from bench.memory_wire import as_gemini, as_messages, as_responses
from bench.scenarios import prose
from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude
from tests.fake_gemini_upstream import FakeGemini, FakeGeminiModel, Signer, is_summary
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_summarizer import is_summary_prompt
from tests.fake_upstream import FakeModel, FakeUpstream, is_summary_request, serve_app

RESULTS = Path(__file__).resolve().parent / "results"
FACT = re.compile(r"FACT-[A-Za-z0-9]+")
APIS = ("chat", "responses", "messages", "gemini")
PATHS = {
    "chat": "/v1/chat/completions",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
    "gemini": "/v1beta/models/{model}:generateContent",
}
GEMINI_SIGNER = Signer(b"bench-memory-gemini")
COUNTINGS = ("exact", "estimate")
TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    "chat-8k": {"calls": ("<=", 0.3), "tokens_ratio": ("<=", 1.5), "retention": (">=", 0.9)},
    "agent-8k": {"calls": ("<=", 0.3), "tokens_ratio": ("<=", 1.5), "retention": (">=", 0.9)},
    "agent-128k": {"calls": ("<=", 0.1), "tokens_ratio": ("<=", 1.5), "retention": (">=", 0.9)},
}
REUSE_TARGET = ("chat-8k", "estimate", 0.6)


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    window_tokens: int
    max_tokens: int
    requests: int
    agent: bool
    result_tokens: tuple[int, int] = (0, 0)
    fact_share: float = 0.0  # of the tool results that hold a fact


SHAPES: dict[str, Shape] = {
    "chat-8k": Shape("chat-8k", 8192, 1024, 40, agent=False),
    "agent-8k": Shape("agent-8k", 8192, 1024, 90, agent=True, result_tokens=(64, 512), fact_share=1 / 3),
    "agent-128k": Shape(
        "agent-128k", 128_000, 4096, 90, agent=True, result_tokens=(1000, 8000), fact_share=1 / 2
    ),
}


# -- the client's sessions (chat-shaped), then in each wire API -------------------------------


def _with_fact(rng: random.Random, text: str, fact: str) -> str:
    """``text`` with the sentence ``fact`` inserted at a sentence boundary."""
    cuts = [m.end() for m in re.finditer(r"[.?;] ", text)]
    at = rng.choice(cuts) if cuts else 0
    return f"{text[:at]}{fact} {text[at:]}"


def chat_session(rng: random.Random, shape: Shape) -> Iterator[list[dict[str, Any]]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant. " * 10}]
    for i in range(shape.requests):
        question = _with_fact(rng, prose(rng, 250), f"Please note that the code of turn {i} is FACT-t{i}.")
        history.append({"role": "user", "content": f"Question {i}: {question}"})
        yield history
        history.append({"role": "assistant", "content": f"Answer {i}: {prose(rng, 350)}"})


def agent_session(rng: random.Random, shape: Shape) -> Iterator[list[dict[str, Any]]]:
    low, high = shape.result_tokens
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent with shell and file tools. " * 20},
        {"role": "user", "content": f"Task: {prose(rng, 200)}"},
    ]
    for step in range(shape.requests):
        if step and step % 15 == 0:
            note = f"Remember that release {step} is FACT-u{step}."
            history.append(
                {"role": "user", "content": f"Follow-up {step}: {_with_fact(rng, prose(rng, 80), note)}"}
            )
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
        for j, cid in enumerate(ids):
            size = round(math.exp(rng.uniform(math.log(low), math.log(high))))
            text = prose(rng, size)
            if rng.random() < shape.fact_share:
                text = _with_fact(rng, text, f"The checksum of block {step}x{j} is FACT-r{step}x{j}.")
            history.append({"role": "tool", "tool_call_id": cid, "content": text})
        yield history


# -- one session ---------------------------------------------------------------------------------


@dataclass
class Record:
    status: int
    memory: str
    forwarded: list[Any] = field(repr=False)
    forwarded_body: dict[str, Any] = field(repr=False)
    client_body: dict[str, Any] = field(repr=False)


@dataclass
class Session:
    records: list[Record]
    summary_prompts: list[dict[str, Any]]
    refused: int
    over_window: int


class _Upstream:
    """The fake of one wire API: serve it, and read what it received."""

    def __init__(
        self, api: str, shape: Shape, model: str, *, gemini_tokens: str = "o200k", style: str = "prose"
    ) -> None:
        self.api = api
        if api == "gemini":
            text = counter_for("o200k_base").count_text if gemini_tokens == "o200k" else None
            gemini = FakeGeminiModel(model, input_token_limit=shape.window_tokens, text_tokens=text)
            self.fake = FakeGemini([gemini], signer=GEMINI_SIGNER)
        elif api == "messages":
            self.fake: Any = FakeAnthropic([FakeClaude(model, window_tokens=shape.window_tokens)])
        elif api == "responses":
            self.fake = FakeResponsesUpstream(
                [FakeModel(model, shape.window_tokens, max_output_tokens=shape.max_tokens)]
            )
        else:
            self.fake = FakeUpstream(
                [FakeModel(model, shape.window_tokens, max_output_tokens=shape.max_tokens)]
            )
        self.fake.summary_style = style

    def serve(self) -> Any:
        return self.fake.serve()

    def received(self) -> list[tuple[dict[str, Any], int]]:
        if self.api == "gemini":
            return [(r.json(), r.status) for r in self.fake.generate_requests()]
        if self.api == "messages":
            return [(r.json(), r.status) for r in self.fake.message_requests()]
        if self.api == "responses":
            return [(r.json(), r.status) for r in self.fake.responses()]
        return [(r.json(), r.status) for r in self.fake.chat_requests()]

    def is_summary(self, body: dict[str, Any]) -> bool:
        if self.api == "gemini":
            return is_summary(body)
        if self.api == "messages":
            return is_summary_prompt(body.get("system"))
        if self.api == "responses":
            return is_summary_prompt(body.get("instructions"))
        return is_summary_request(body)


def _items(api: str, body: dict[str, Any]) -> list[Any]:
    key = DIALECTS[api].items_key
    head = [body.get("instructions") or body.get("system") or body.get("systemInstruction")]
    return [*(head if api != "chat" else []), *body.get(key, [])]


def run_session(
    shape: Shape,
    *,
    api: str,
    counting: str,
    seed: int,
    think_s: float,
    summary_delay_s: float,
    settings: dict[str, Any] | None = None,
    gemini_tokens: str = "o200k",
    style: str = "prose",
) -> Session:
    rng = random.Random(seed)
    model = f"bench-{shape.name}"
    upstream = _Upstream(api, shape, model, gemini_tokens=gemini_tokens, style=style)
    if api == "chat":
        upstream.fake.summary_mode, upstream.fake.summary_delay_s = "slow", summary_delay_s
    encoding = (
        "estimate" if counting == "estimate" else ("cl100k_base" if api == "messages" else "o200k_base")
    )
    session = agent_session(rng, shape) if shape.agent else chat_session(rng, shape)
    records: list[Record] = []
    path = PATHS[api].format(model=model)
    headers = {
        "Authorization": "Bearer sk-bench",
        "x-api-key": "sk-bench",
        "anthropic-version": "2023-06-01",
        "x-goog-api-key": "sk-bench",
    }
    with tempfile.TemporaryDirectory() as tmp, upstream.serve() as upstream_url:
        models_file = Path(tmp) / "models.toml"
        models_file.write_text(
            f'[models."{model}"]\nwindow = {shape.window_tokens}\nmax_output = {shape.max_tokens}\n'
            f'encoding = "{encoding}"\n',
            encoding="utf-8",
        )
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1",
            upstream_api_key=None,
            models_file=models_file,
            discovery=False,
            # The fake on loopback stands for a hosted API (many slots): summary calls do not give
            # way to client requests there (CTXPROXY_SUMMARY_YIELD=never; bench.llama measures auto).
            summary_yield="never",
            log_level="ERROR",
            **(settings or {}),
        )
        with (
            serve_app(create_app(settings)) as proxy_url,
            httpx.Client(base_url=proxy_url, timeout=120) as client,
        ):
            for history in session:
                if api == "chat":
                    body: dict[str, Any] = {
                        "model": model,
                        "messages": history,
                        "max_tokens": shape.max_tokens,
                    }
                elif api == "responses":
                    body = as_responses(history, model=model, max_tokens=shape.max_tokens)
                elif api == "gemini":
                    body = as_gemini(history, model=model, max_tokens=shape.max_tokens, signer=GEMINI_SIGNER)
                else:
                    body = as_messages(history, model=model, max_tokens=shape.max_tokens)
                response = client.post(path, json=body, headers=headers)
                received = [b for b, _ in upstream.received() if not upstream.is_summary(b)]
                forwarded = received[-1] if received else {}
                records.append(
                    Record(
                        status=response.status_code,
                        memory=response.headers.get("x-context-memory", ""),
                        forwarded=_items(api, forwarded),
                        forwarded_body=forwarded,
                        client_body=body,
                    )
                )
                if think_s:
                    time.sleep(think_s)  # a user or an agent takes at least this long
        everything = upstream.received()
    summaries = [b for b, _ in everything if upstream.is_summary(b)]
    clients = [(b, s) for b, s in everything if not upstream.is_summary(b)]
    refused = sum(1 for r in records if r.status != 200)
    over = sum(1 for _, status in clients if status == 400)
    return Session(records, summaries, refused, over)


# -- the figures ---------------------------------------------------------------------------------

_COUNTER = MessageCounter(counter_for("o200k_base"))


def _tokens(value: Any) -> int:
    return _COUNTER.counter.count_text(
        value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    )


def _prompt_tokens(api: str, body: dict[str, Any]) -> int:
    """The text a summary request sends (every string of its prompt), counted with o200k."""
    return _tokens(json.dumps(_items(api, body), ensure_ascii=False))


def _neutral(api: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The body's messages as the engine's neutral messages (reserved keys removed)."""
    return [strip_reserved(m) for m in DIALECTS[api].parse(body).messages]


def measure(api: str, session: Session) -> dict[str, Any]:
    records = session.records
    last = records[-1]
    client = _neutral(api, last.client_body)
    shown = (
        {json.dumps(m, sort_keys=True) for m in _neutral(api, last.forwarded_body)}
        if last.forwarded_body
        else set()
    )
    forgotten = [m for m in client if json.dumps(m, sort_keys=True) not in shown]
    forgotten_tokens = sum(_COUNTER.count_message(m) for m in forgotten)
    planted = set(FACT.findall(json.dumps(client)))
    old = set(FACT.findall(json.dumps(forgotten)))
    carried = set(FACT.findall(json.dumps(last.forwarded_body)))
    reused = total = 0
    for before, after in itertools.pairwise(records):
        sizes = [_tokens(item) for item in after.forwarded]
        shared = 0
        while (
            shared < min(len(before.forwarded), len(after.forwarded))
            and before.forwarded[shared] == after.forwarded[shared]
        ):
            shared += 1
        reused += sum(sizes[:shared])
        total += sum(sizes)
    sent = sum(_prompt_tokens(api, body) for body in session.summary_prompts)
    kinds = [r.memory for r in records]
    return {
        "requests": len(records),
        "cut": sum(1 for k in kinds if k in ("summary", "index", "note")),
        "summary": kinds.count("summary"),
        "index": kinds.count("index"),
        "note": kinds.count("note"),
        "calls": len(session.summary_prompts) / len(records) if records else 0.0,
        "sent_tokens": sent,
        "forgotten_tokens": forgotten_tokens,
        "tokens_ratio": sent / forgotten_tokens if forgotten_tokens else None,
        "retention": len(old & carried) / len(old) if old else None,
        "retention_all": len(planted & carried) / len(planted) if planted else None,
        "old_facts": len(old),
        "reuse": reused / total if total else None,
        "refused": session.refused,
        "over_window": session.over_window,
    }


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _verdict(shape: str, metric: str, value: float | None) -> str:
    target = TARGETS.get(shape, {}).get(metric)
    if target is None or value is None:
        return ""
    op, bound = target
    ok = value >= bound if op == ">=" else value <= bound
    return f" ({'PASS' if ok else 'FAIL'} {op} {bound})"


def render(rows: list[dict[str, Any]], *, runs: int, note: str = "") -> str:
    lines = [
        "# What a cut forgets is still known",
        "",
        f"`python -m bench.memory`: median of {runs} sessions per row (seeds 1..{runs}), default settings "
        "(summaries on, in-process cache). Proxy and the fake upstream of each API on 127.0.0.1 "
        "(uvicorn); the fakes refuse a prompt over their window and summarize extractively under a "
        "hard cap (`tests/fake_summarizer.py`). " + note,
        "",
        "| shape | API | counting | summarizer | requests | cut (summary / index / note) | summary calls / "
        "request | tokens to summarizer / forgotten | retention (forgotten / all) | prefix reuse | refused / "
        "over window |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        s = row["shape"]
        reuse = _fmt(row["reuse"])
        if (s, row["counting"], row["api"]) in ((REUSE_TARGET[0], REUSE_TARGET[1], a) for a in APIS):
            ok = row["reuse"] is not None and row["reuse"] >= REUSE_TARGET[2]
            reuse += f" ({'PASS' if ok else 'FAIL'} >= {REUSE_TARGET[2]})"
        lines.append(
            f"| {s} | {row['api']} | {row['counting']} | {row.get('style', 'prose')} "
            f"| {_fmt(row['requests'], 0)} "
            f"| {_fmt(row['cut'], 0)} ({_fmt(row['summary'], 0)} / {_fmt(row['index'], 0)} / "
            f"{_fmt(row['note'], 0)}) "
            f"| {_fmt(row['calls'], 3)}{_verdict(s, 'calls', row['calls'])} "
            f"| {_fmt(row['tokens_ratio'])}{_verdict(s, 'tokens_ratio', row['tokens_ratio'])} "
            f"| {_fmt(row['retention'])}{_verdict(s, 'retention', row['retention'])} "
            f"/ {_fmt(row['retention_all'])} "
            f"| {reuse} | {_fmt(row['refused'], 0)} / {_fmt(row['over_window'], 0)} |"
        )
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--apis", default=",".join(APIS))
    parser.add_argument("--countings", default=",".join(COUNTINGS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--styles",
        default="prose",
        help="the fake summarizer's styles, comma-separated (tests.fake_summarizer.STYLES): a row each",
    )
    parser.add_argument("--think-s", type=float, default=0.03)
    parser.add_argument("--summary-delay-s", type=float, default=0.02)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="memory")
    parser.add_argument("--note", default="")
    parser.add_argument(
        "--gemini-tokens",
        choices=("o200k", "quarter"),
        default="o200k",
        help="how the fake Gemini counts strings (quarter: a quarter of the characters)",
    )
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    combos = itertools.product(
        args.shapes.split(","), args.apis.split(","), args.countings.split(","), args.styles.split(",")
    )
    for shape_name, api, counting, style in combos:
        shape = SHAPES[shape_name]
        runs = [
            measure(
                api,
                run_session(
                    shape,
                    api=api,
                    counting=counting,
                    seed=seed,
                    think_s=args.think_s,
                    summary_delay_s=args.summary_delay_s,
                    gemini_tokens=args.gemini_tokens,
                    style=style,
                ),
            )
            for seed in range(1, args.runs + 1)
        ]
        row: dict[str, Any] = {"shape": shape.name, "api": api, "counting": counting, "style": style}
        for key in runs[0]:
            row[key] = _median([r[key] for r in runs])
        row["refused"] = max(r["refused"] for r in runs)
        row["over_window"] = max(r["over_window"] for r in runs)
        row["runs"] = runs
        rows.append(row)
        print(render([row], runs=args.runs).splitlines()[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    text = render(rows, runs=args.runs, note=args.note)
    (args.out / f"{args.name}.md").write_text(text, encoding="utf-8")
    (args.out / f"{args.name}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(text)
    print(f"written to {args.out / args.name}.md")


if __name__ == "__main__":
    main()
