"""``ctxproxy demo``: the proxy and a small-window upstream on loopback, one growing agent conversation.

Nothing leaves the machine and no API key is needed: the demo starts the local upstream of
:mod:`app.demo_upstream` (a 4,096-token window by default, exact counting; the model is named
after its window, ``demo-4k``) and a real ctxproxy server in front
of it (both uvicorn servers on free 127.0.0.1 ports, in background threads), then plays an
agent-style conversation (the user asks, the assistant calls a tool, the tool returns a big file)
that grows by about a thousand tokens a turn. Each turn is sent twice, directly to the upstream and
through ctxproxy, and the table shows what happened. Both servers are stopped before it returns.
"""

from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import uvicorn

DEMO_WINDOW_TOKENS = 4096
DEMO_MODEL = "demo-4k"  # demo_model(DEMO_WINDOW_TOKENS)
DEMO_TURNS = 8
DEMO_MAX_OUTPUT_TOKENS = 1024
SYSTEM_PROMPT = "You are a careful coding agent. Read files with the read_file tool before answering."
READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}


def demo_model(window_tokens: int) -> str:
    """The demo model's name, from its window: ``demo-4k`` for 4,096 tokens, ``demo-1000`` for
    1,000 (so the header and the table say which window the demo upstream has)."""
    if window_tokens % 1024 == 0:
        return f"demo-{window_tokens // 1024}k"
    return f"demo-{window_tokens}"


def demo_max_output_tokens(window_tokens: int) -> int:
    """The demo model's max output: 1,024 tokens, at most a quarter of a smaller window (a model
    table refuses a max output over the window)."""
    return max(1, min(DEMO_MAX_OUTPUT_TOKENS, window_tokens // 4))


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One row of the demo table; token figures are exact ``o200k_base`` counts."""

    turn: int
    tokens_sent: int
    direct: str
    proxied: str
    tokens_forwarded: int | None
    actions: str
    retries: str


def fake_file(turn: int, *, lines: int = 22) -> str:
    """Deterministic source-like text (about 35 tokens a line) standing in for a tool result."""
    return "\n".join(
        f"def step_{turn}_{i}(request):  # handles case {i} of module {turn}\n"
        f"    return compute(request, limit={i * 7 + turn}, label='m{turn}-{i}')"
        for i in range(lines)
    )


def agent_requests(turns: int, *, model: str = DEMO_MODEL) -> Iterator[dict[str, Any]]:
    """The request of each turn (to ``model``): the history so far, ending with a new tool result.

    The caller appends the assistant's answer to ``request["messages"]`` before asking for the next
    turn, as an agent loop does.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for turn in range(1, turns + 1):
        path = f"src/module_{turn}.py"
        call_id = f"call_{turn}"
        messages += [
            {"role": "user", "content": f"Step {turn}: read {path} and tell me what it does."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"path": path})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": fake_file(turn)},
        ]
        yield {"model": model, "messages": messages, "tools": [READ_FILE_TOOL]}


@contextmanager
def serve_in_thread(
    app: Any, *, lifespan: Literal["auto", "on", "off"] = "on", timeout_s: float = 20.0
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free 127.0.0.1 port in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan=lifespan, log_config=None, log_level="warning", access_log=False, ws="none"
    )
    server = uvicorn.Server(config)

    def run() -> None:
        # uvicorn raises SystemExit when start-up fails; the caller sees it as "did not start".
        with suppress(SystemExit):
            server.run(sockets=[sock])

    thread = threading.Thread(target=run, daemon=True, name=f"ctxproxy-demo:{port}")
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the demo server on 127.0.0.1:{port} did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


def _direct_outcome(response: httpx.Response) -> str:
    if response.status_code == 200:
        return "ok"
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    return "context error" if code == "context_length_exceeded" else f"error {response.status_code}"


def run_demo(
    *, turns: int = DEMO_TURNS, window_tokens: int = DEMO_WINDOW_TOKENS, on_row: Callable[[TurnResult], None]
) -> list[TurnResult]:
    """Start both servers, play ``turns`` turns, stop the servers; ``on_row`` sees each row as it comes."""
    from .core.tokens import MessageCounter
    from .demo_upstream import create_demo_upstream
    from .main import create_app
    from .settings import Settings
    from .tokenizer import counter_for

    counter = MessageCounter(counter_for("o200k_base"))
    model = demo_model(window_tokens)
    upstream_app = create_demo_upstream(model=model, window_tokens=window_tokens, counter=counter)
    rows: list[TurnResult] = []
    with tempfile.TemporaryDirectory(prefix="ctxproxy-demo-") as tmp:
        models_file = Path(tmp) / "models.toml"
        models_file.write_text(
            f'[models."{model}"]\nwindow = {window_tokens}\n'
            f'max_output = {demo_max_output_tokens(window_tokens)}\nencoding = "o200k_base"\n',
            encoding="utf-8",
        )
        with serve_in_thread(upstream_app, lifespan="off") as upstream_url:
            # The demo model cannot write a summary (it answers every request with one line), so
            # summaries are off: what a cut forgets is remembered by its index of exact strings
            # (``indexed``), not reported as a summary that failed on every cut.
            settings = Settings(
                upstream_base_url=f"{upstream_url}/v1",
                models_file=models_file,
                log_level="WARNING",
                summarize=False,
            )
            with serve_in_thread(create_app(settings)) as proxy_url, httpx.Client(timeout=30) as http:
                for turn, request in enumerate(agent_requests(turns, model=model), start=1):
                    direct = http.post(f"{upstream_url}/v1/chat/completions", json=request)
                    proxied = http.post(
                        f"{proxy_url}/v1/chat/completions",
                        json=request,
                        headers={"Authorization": "Bearer demo"},
                    )
                    after = proxied.headers.get("x-context-tokens-after")
                    row = TurnResult(
                        turn=turn,
                        tokens_sent=counter.count_request(request),
                        direct=_direct_outcome(direct),
                        proxied=_direct_outcome(proxied),
                        tokens_forwarded=int(after) if after is not None and after.isdigit() else None,
                        actions=proxied.headers.get("x-context-actions", "-"),
                        retries=proxied.headers.get("x-context-retries", "-"),
                    )
                    rows.append(row)
                    on_row(row)
                    if proxied.status_code == 200:
                        request["messages"].append(proxied.json()["choices"][0]["message"])
    return rows


COLUMNS = (
    ("turn", 4),
    ("tokens sent", 11),
    ("direct", 13),
    ("through ctxproxy", 16),
    ("tokens forwarded", 16),
    ("actions (X-Context-Actions)", 0),
)


def header_line() -> str:
    return "  ".join(name.ljust(width) for name, width in COLUMNS).rstrip()


def format_row(row: TurnResult) -> str:
    forwarded = "-" if row.tokens_forwarded is None else f"{row.tokens_forwarded:,}"
    cells = (str(row.turn), f"{row.tokens_sent:,}", row.direct, row.proxied, forwarded, row.actions)
    return "  ".join(cell.ljust(width) for cell, (_, width) in zip(cells, COLUMNS, strict=True)).rstrip()
