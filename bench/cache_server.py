"""Prompt-cache reuse as time, on a real server: ``python -m bench.cache_server --model PATH``.

llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``, CPU, 127.0.0.1) keeps
the previous prompt's KV cache and only prefills what follows the common prefix. A 20-turn chat
whose history outgrows a 2048-token context is sent turn by turn (streaming, ``max_tokens`` 16,
temperature 0; the client appends the same fixed assistant reply each turn, so every run sends the
same conversation) three ways, each against a freshly started server:

* ``direct``: straight to a server with an 8192-token context (no cut needed);
* ``before``: through ctxproxy from another source tree (``--before-tree``, e.g. an export of the
  commit before headroom cuts) to a 2048-token server;
* ``after``: through this tree's ctxproxy to a 2048-token server.

Reported per turn: time to first token (first streamed chunk), and the totals. The model's
tokenizer is not tiktoken's, so the proxy plans with its labelled estimate (``encoding =
"estimate"``) and retries once if the server still refuses. Every process is stopped in
``finally``. Writes ``bench/results/cache_server.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cache_server.md"
MODEL = "gemma-3-270m"
WORDS = [
    "river",
    "stone",
    "garden",
    "window",
    "paper",
    "lamp",
    "orange",
    "silver",
    "music",
    "winter",
    "harbor",
    "forest",
    "candle",
    "mirror",
    "bridge",
    "letter",
    "valley",
    "engine",
    "thunder",
    "meadow",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _text(turn: int, words: int, salt: str) -> str:
    """Plain English of about ``words`` words, the same for a given turn and salt (the proxy plans
    a non-OpenAI tokenizer with its estimate, which is made for ordinary text)."""
    rng = random.Random(f"{turn}-{salt}")
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "."


@contextlib.contextmanager
def _process(args: list[str], *, cwd: Path, env: dict[str, str], ready_url: str, log: Path) -> Iterator[None]:
    """Start ``args`` in its own process group; wait until ``ready_url`` answers; stop it after."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{args[:4]} exited with {proc.returncode}; see {log}")
                try:
                    if httpx.get(ready_url, timeout=2).status_code < 500:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args[:4]} did not start; see {log}")
                time.sleep(0.5)
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)


@contextlib.contextmanager
def llama_server(model_path: Path, *, n_ctx: int, threads: int, workdir: Path) -> Iterator[str]:
    port = _free_port()
    args = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", MODEL,
        "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with _process(
        args,
        cwd=workdir,
        env=dict(os.environ),
        ready_url=f"{url}/v1/models",
        log=workdir / f"llama-{n_ctx}.log",
    ):
        yield url


@contextlib.contextmanager
def proxy(tree: Path, upstream: str, *, workdir: Path, name: str) -> Iterator[str]:
    port = _free_port()
    table = workdir / "models.toml"
    table.write_text(f'[models]\n"{MODEL}" = {{ window = 2048, max_output = 256, encoding = "estimate" }}\n')
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "CTXPROXY_UPSTREAM_BASE_URL": f"{upstream}/v1",
        "CTXPROXY_MODELS_FILE": str(table),
        "CTXPROXY_DISCOVERY": "false",
        "CTXPROXY_LOG_LEVEL": "WARNING",
    }
    args = [
        sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host", "127.0.0.1",
        "--port", str(port), "--workers", "1", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with _process(args, cwd=tree, env=env, ready_url=f"{url}/healthz", log=workdir / f"proxy-{name}.log"):
        yield url


def chat(base_url: str, *, turns: int, user_words: int, reply_words: int) -> list[dict[str, Any]]:
    """Send the growing chat turn by turn; per turn: TTFT, total, proxy headers."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are a terse assistant."}]
    rows: list[dict[str, Any]] = []
    with httpx.Client(base_url=base_url, timeout=600) as client:
        for turn in range(turns):
            history.append({"role": "user", "content": f"Turn {turn}. {_text(turn, user_words, 'u')}"})
            body = {"model": MODEL, "messages": history, "max_tokens": 16, "temperature": 0, "stream": True}
            started = time.perf_counter()
            first: float | None = None
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                for chunk in response.iter_bytes():
                    if first is None and chunk.strip():
                        first = time.perf_counter() - started
                status = response.status_code
                headers = response.headers
            total = time.perf_counter() - started
            rows.append(
                {
                    "turn": turn + 1,
                    "status": status,
                    "ttft_s": first if first is not None else total,
                    "total_s": total,
                    "actions": headers.get("x-context-actions", ""),
                    "reuse": headers.get("x-context-prefix-reuse", ""),
                }
            )
            history.append({"role": "assistant", "content": f"Noted {turn}. {_text(turn, reply_words, 'a')}"})
    return rows


def render(results: dict[str, list[dict[str, Any]]], *, params: str) -> str:
    names = list(results)
    lines = [
        "# Prompt-cache reuse on a real server (llama-cpp-python, CPU)",
        "",
        params,
        "",
        "| turn | " + " | ".join(f"{n} TTFT s" for n in names) + " | after: actions | after: prefix reuse |",
        "| --- | " + " | ".join("---" for _ in names) + " | --- | --- |",
    ]
    after = results.get("after", [])
    for i in range(max(len(rows) for rows in results.values())):
        cells = [f"{results[n][i]['ttft_s']:.2f}" if i < len(results[n]) else "" for n in names]
        extra = [after[i]["actions"], after[i]["reuse"]] if i < len(after) else ["", ""]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + f" | {extra[0]} | {extra[1]} |")
    totals = [f"{sum(r['total_s'] for r in results[n]):.1f}" for n in names]
    ttfts = [f"{sum(r['ttft_s'] for r in results[n]):.1f}" for n in names]
    lines.append(
        "| **total (TTFT sum / wall)** | "
        + " | ".join(f"{t} / {w}" for t, w in zip(ttfts, totals, strict=True))
        + " | | |"
    )
    errors = {n: sum(1 for r in rows if r["status"] != 200) for n, rows in results.items()}
    lines += ["", f"Non-200 answers per run: {errors}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", type=Path, required=True, help="a GGUF file")
    parser.add_argument("--before-tree", type=Path, default=None)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--user-words", type=int, default=40)
    parser.add_argument("--reply-words", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        size = {"turns": args.turns, "user_words": args.user_words, "reply_words": args.reply_words}
        with llama_server(args.model, n_ctx=8192, threads=args.threads, workdir=work) as url:
            results["direct"] = chat(url, **size)
        trees = ([("before", args.before_tree)] if args.before_tree else []) + [("after", ROOT)]
        for name, tree in trees:
            with (
                llama_server(args.model, n_ctx=2048, threads=args.threads, workdir=work) as url,
                proxy(tree, url, workdir=work, name=name) as proxy_url,
            ):
                results[name] = chat(proxy_url, **size)
    params = (
        f"`python -m bench.cache_server`: model `{args.model.name}`, {args.turns} turns (user "
        f"~{args.user_words} words, fixed reply ~{args.reply_words} words), streaming, max_tokens 16, "
        f"{args.threads} threads, each run on a freshly started server; `direct` = 8192-token context "
        "without the proxy, `before`/`after` = 2048-token context through the proxy before/after "
        "headroom cuts."
    )
    text = render(results, params=params)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
