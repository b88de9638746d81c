"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``) through ctxproxy, offline: what it
reads and the proxy has to cut is still known at the end.

``claude -p ... --output-format json`` runs headless with ``ANTHROPIC_BASE_URL`` at the proxy (or,
for the baseline, straight at the fake) and non-essential traffic off, in front of the strict fake
Anthropic upstream acting as a scripted model (``tests/e2e/reading_agent.py``'s ``ReadingClaude``):
it reads ``FILES`` project files one by one with Claude Code's own ``Read`` tool (about 3K tokens
each, one ``FACT-...`` line in the middle), never restating what it read (a real model's facts live
in the tool results, or in what the proxy remembers of them), then answers with every fact it can
still see in its input. The fake's window (``WINDOW_TOKENS``, 60K) holds Claude Code's ~18K tokens
of system prompt and tools, its default 32K ``max_tokens`` and about three files.

Default proxy settings (summaries on): the session completes, no request the upstream receives is
over its window or invalid (it checks every structural rule and every thinking signature), the
proxy refuses none of Claude Code's requests, and the final answer holds at least ``MIN_FACTS`` of
the ``FILES`` facts: the proxy's summaries, asked of the same upstream with ``/v1/messages``, carry
the facts of the files it had to cut. The same session sent directly is the baseline, reported in
the assertion messages (Claude Code 2.1.330: the upstream refuses it, Claude Code compacts, the
scripted model cannot know what it had read and starts over, until it is cut off).

Needs the CLI: ``bash .ci/install-claude-code`` (``.ci/run`` does it); skipped otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from app.settings import Settings
from tests.e2e.reading_agent import ReadingClaude, StatusRecorder, fact_of, write_fact_files
from tests.fake_anthropic_upstream import FACT_RE, FakeAnthropic, FakeClaude
from tests.fake_summarizer import is_summary_prompt
from tests.fake_upstream import serve_app

ROOT = Path(__file__).resolve().parents[2]
CLI_DIR = ROOT / ".claude-code-cli" / "node_modules" / "@anthropic-ai"
MODEL = "claude-sonnet-4-5-20250929"
WINDOW_TOKENS = 60_000
MAX_OUTPUT_TOKENS = 32_000  # Claude Code's default max_tokens for this model
FILES = 12
MIN_FACTS = 10
TIMEOUT_S = 180
# Direct, Claude Code compacts and starts over again and again: the baseline is cut off after this.
DIRECT_TIMEOUT_S = 45


def claude_binary() -> Path | None:
    found = sorted(CLI_DIR.glob("claude-code-*/claude")) if CLI_DIR.is_dir() else []
    return found[0] if found else None


# Under CI (.ci/run installs the CLI) a missing CLI fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(
    claude_binary() is None and not os.environ.get("CI"),
    reason="Claude Code CLI not installed (bash .ci/install-claude-code)",
)


def run_claude(
    base_url: str, project: Path, home: Path, *, timeout_s: float = TIMEOUT_S, thinking: bool = False
) -> dict[str, Any]:
    """One headless session; a session cut off by ``timeout_s`` is an error result."""
    binary = claude_binary()
    assert binary is not None
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "sk-e2e",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    if not thinking:
        env["MAX_THINKING_TOKENS"] = "0"
    prompt = f"Read part0.txt to part{FILES - 1}.txt one by one and tell me the secret of every part."
    command = [
        str(binary),
        "-p",
        prompt,
        "--output-format",
        "json",
        "--model",
        MODEL,
        "--allowedTools",
        "Read",
    ]
    try:
        done = subprocess.run(
            command, env=env, cwd=project, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"is_error": True, "result": f"cut off after {timeout_s} s", "returncode": None}
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        result = {"is_error": True, "result": done.stdout[-2000:] + done.stderr[-2000:]}
    result["returncode"] = done.returncode
    return result


@dataclass
class Session:
    fake: FakeAnthropic
    upstream_url: str
    proxy_url: str
    project: Path
    proxy_statuses: StatusRecorder
    facts: set[str]


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    project = tmp_path / "project"
    project.mkdir()
    files = write_fact_files(project, files=FILES, name="part{k}.txt")
    fake = FakeAnthropic([FakeClaude(MODEL, window_tokens=WINDOW_TOKENS)], script=ReadingClaude(files))
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        f'[models]\n"{MODEL}" = {{ window = {WINDOW_TOKENS}, max_output = {MAX_OUTPUT_TOKENS}, '
        'encoding = "estimate" }\n',
        encoding="utf-8",
    )
    with fake.serve() as upstream_url:
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1",
            models_file=models_file,
            log_level="WARNING",
            summary_yield="never",  # the fake serves many requests at once: not a few-slot server
        )
        recorder = StatusRecorder(create_app(settings), path_prefix="/v1/messages")
        with serve_app(recorder) as proxy_url:
            yield Session(fake, upstream_url, proxy_url, project, recorder, {fact_of(f) for f in files})


def over_window(fake: FakeAnthropic) -> list[int]:
    """The fake's counts of the requests it received (summaries included) over its window."""
    out = []
    for request in fake.message_requests():
        body = request.json()
        tokens = fake.count(body)
        if tokens + int(body.get("max_tokens", 0)) > WINDOW_TOKENS:
            out.append(tokens)
    return out


def baseline(session: Session, home: Path) -> str:
    """The same session straight at the fake, in words (the fake's record is cleared after)."""
    direct = run_claude(session.upstream_url, session.project, home, timeout_s=DIRECT_TIMEOUT_S)
    statuses = [r.status for r in session.fake.message_requests()]
    found = set(FACT_RE.findall(str(direct.get("result")))) & session.facts
    words = (
        f"direct: {len(found)} of {FILES} facts, {statuses.count(400)} of {len(statuses)} requests "
        f"refused by the upstream ({direct.get('result')!s:.60})"
    )
    assert statuses.count(400) > 0, f"the baseline must overflow the window; {words}"
    session.fake.requests.clear()
    return words


def check_proxied(session: Session, proxied: dict[str, Any], direct: str) -> set[str]:
    """What every session through the proxy must show; returns the facts of its final answer."""
    fake = session.fake
    found = set(FACT_RE.findall(str(proxied.get("result")))) & session.facts
    where = f"{direct}; proxy: {len(found)} of {FILES} facts, {fake.summary_calls} summary calls"
    assert proxied["returncode"] == 0 and proxied["is_error"] is False, (proxied.get("result"), where)
    assert over_window(fake) == [], where
    assert all(r.status == 200 for r in fake.requests), ([r.status for r in fake.requests], where)
    statuses = session.proxy_statuses.statuses
    assert statuses and all(s == 200 for s in statuses), (statuses, where)  # the proxy refused nothing
    client = [r.json() for r in fake.message_requests() if not is_summary_prompt(r.json().get("system"))]
    assert all(b["max_tokens"] == MAX_OUTPUT_TOKENS for b in client), where  # never lowered after a 400
    assert fake.summary_calls >= 1, where  # summaries in the request's own API, on its upstream
    summaries = [r for r in fake.message_requests() if is_summary_prompt(r.json().get("system"))]
    assert all(r.headers.get("x-api-key") == "sk-e2e" for r in summaries), where
    assert len(found) >= MIN_FACTS, where
    return found


@pytest.mark.timeout(TIMEOUT_S + DIRECT_TIMEOUT_S + 60)
def test_claude_code_keeps_what_it_read_through_the_proxy(session: Session, tmp_path: Path) -> None:
    direct = baseline(session, tmp_path / "home-direct")
    proxied = run_claude(session.proxy_url, session.project, tmp_path / "home-proxy")
    check_proxied(session, proxied, direct)
    final = [
        b
        for b in (r.json() for r in session.fake.message_requests())
        if not is_summary_prompt(b.get("system"))
    ]
    last = json.dumps(final[-1]["messages"])
    assert "[ctxproxy: summary of" in last  # the facts of the cut files come from the memory
    assert max(len(b["messages"]) for b in final) < 2 * FILES + 1  # the session was cut


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_claude_code_with_signed_thinking_keeps_what_it_read_through_the_proxy(
    session: Session, tmp_path: Path
) -> None:
    proxied = run_claude(session.proxy_url, session.project, tmp_path / "home-thinking", thinking=True)
    check_proxied(session, proxied, "direct: not run")
    bodies = [
        r.json() for r in session.fake.message_requests() if not is_summary_prompt(r.json().get("system"))
    ]
    assert all(b["thinking"]["type"] != "disabled" for b in bodies)
    assistants = [m for b in bodies for m in b["messages"] if m["role"] == "assistant"]
    assert assistants and all(m["content"][0]["type"] == "thinking" for m in assistants)  # signed, kept
    assert max(len(b["messages"]) for b in bodies) > len(bodies[-1]["messages"])  # the loop was cut


def recall_rounds(bodies: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests the proxy sent to continue an answer that called ``ctx_recall`` (their last
    message answers it) and the client's own (which must hold no trace of the tool)."""
    rounds, own = [], []
    for body in bodies:
        last = body["messages"][-1]
        blocks = last["content"] if isinstance(last["content"], list) else []
        if blocks and all(
            b.get("type") == "tool_result" and str(b.get("content", "")).startswith("[ctxproxy: recalled")
            for b in blocks
        ):
            rounds.append(body)
        else:
            own.append(body)
    return rounds, own


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_claude_code_never_sees_the_recall_tool_the_model_uses_through_the_proxy(
    session: Session, tmp_path: Path
) -> None:
    reader = session.fake.script
    assert isinstance(reader, ReadingClaude)
    session.fake.script = ReadingClaude([Path(p) for p in reader.paths], recalls=2)
    proxied = run_claude(session.proxy_url, session.project, tmp_path / "home-recall")
    check_proxied(session, proxied, "direct: not run")
    bodies = [
        r.json() for r in session.fake.message_requests() if not is_summary_prompt(r.json().get("system"))
    ]
    rounds, own = recall_rounds(bodies)
    # The model fetched cut content back (one id a round, at most two a client request: a later
    # cut request may fetch again, the client never holds the rounds), the proxy answered.
    assert 1 <= len(rounds) <= 2 * len(own)
    assert all("ctx_recall" not in json.dumps(body["messages"]) for body in own)  # Claude Code never saw it
    assert all(body["tools"][-1]["name"] == "ctx_recall" for body in rounds)
    recalled = {f for body in rounds for f in FACT_RE.findall(json.dumps(body["messages"][-1]))}
    assert recalled and recalled <= set(FACT_RE.findall(str(proxied.get("result"))))
    assert "ctx_recall" not in str(proxied.get("result"))
