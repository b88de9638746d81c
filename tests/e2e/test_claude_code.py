"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``) through ctxproxy, offline.

``claude -p ... --output-format json`` runs headless with ``ANTHROPIC_BASE_URL`` at the proxy (or,
for the baseline, straight at the fake) and non-essential traffic off, in front of the strict fake
Anthropic upstream acting as a scripted model: it reads ``FILES`` project files one by one with
Claude Code's own ``Read`` tool (each about 13K tokens, one ``FACT-...`` line in the middle),
restating in each message every fact it has seen so far (as a model keeping notes does), then
answers with every fact it was sent.
The fake's window (``WINDOW_TOKENS``) holds Claude Code's ~18K tokens of system prompt and tools,
its 32K ``max_tokens`` and about three files, so the session overflows.

Direct, the upstream refuses requests and Claude Code's own compaction cannot save the session.
Through the proxy the session completes, no request the upstream receives is over its window, and
every fact is in the final answer. The baseline runs with thinking off (``MAX_THINKING_TOKENS=0``),
so the proxy may prune old file contents; with thinking on (Claude Code's default) the whole
session is one tool loop bound to its signed thinking, which the proxy may only shorten by whole
calls from its oldest end: the fake checks every signature and binding on every request.

Needs the CLI: ``bash .ci/install-claude-code`` (``.ci/run`` does it); skipped otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from app.settings import Settings
from tests.fake_anthropic_upstream import FACT_RE, FakeAnthropic, FakeClaude, loop_start
from tests.fake_upstream import serve_app

ROOT = Path(__file__).resolve().parents[2]
CLI_DIR = ROOT / ".claude-code-cli" / "node_modules" / "@anthropic-ai"
MODEL = "claude-sonnet-4-5-20250929"
WINDOW_TOKENS = 100_000
FILES = 6
TIMEOUT_S = 120
# Direct, Claude Code compacts and starts over again and again (until it detects that its
# compaction is thrashing, or forever): the baseline is cut off after this long.
DIRECT_TIMEOUT_S = 60


def claude_binary() -> Path | None:
    found = sorted(CLI_DIR.glob("claude-code-*/claude")) if CLI_DIR.is_dir() else []
    return found[0] if found else None


# Under CI (.ci/run installs the CLI) a missing CLI fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(
    claude_binary() is None and not os.environ.get("CI"),
    reason="Claude Code CLI not installed (bash .ci/install-claude-code)",
)


def write_project(root: Path) -> list[Path]:
    files = []
    for k in range(FILES):
        lines = [
            f"line {i} of part {k}: the quick brown fox jumps over the lazy dog {i * 7 + k}"
            for i in range(600)
        ]
        lines[300] = f"The secret of part {k} is FACT-part{k}-{k * 1111 + 7}."
        path = root / f"part{k}.txt"
        path.write_text("\n".join(lines), encoding="utf-8")
        files.append(path)
    return files


class Reader:
    """The scripted model: reads the files in order with ``Read``, noting each file's facts."""

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self._ids = itertools.count(1)

    def __call__(self, body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        if "Read" not in {t.get("name") for t in body.get("tools") or [] if isinstance(t, Mapping)}:
            return None  # a compaction or side request: the fake's default answer
        messages = body["messages"]
        loop = messages[loop_start(messages) :]
        # The files it has asked for: the newest Read call tells (a proxy may drop the oldest ones).
        paths = [str(f) for f in self.files]
        asked = [
            paths.index(b["input"]["file_path"])
            for m in loop
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for b in m["content"]
            if b.get("type") == "tool_use" and b.get("input", {}).get("file_path") in paths
        ]
        reads = max(asked) + 1 if asked else 0
        if reads >= len(self.files):
            return None  # done: the fake answers with every fact it was sent
        # Like a model keeping notes: every fact it has seen so far, restated in each message.
        facts = " ".join(dict.fromkeys(FACT_RE.findall(json.dumps(messages))))
        note = f"Noted so far: {facts}. " if facts else ""
        call = {
            "type": "tool_use",
            "id": f"toolu_cc{next(self._ids):05d}",
            "name": "Read",
            "input": {"file_path": str(self.files[reads])},
        }
        return [{"type": "text", "text": f"{note}Reading part {reads}."}, call]


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
    try:
        done = subprocess.run(
            [
                str(binary),
                "-p",
                prompt,
                "--output-format",
                "json",
                "--model",
                MODEL,
                "--allowedTools",
                "Read",
            ],
            env=env,
            cwd=project,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"is_error": True, "result": f"cut off after {timeout_s} s", "returncode": None}
    try:
        result: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        result = {"is_error": True, "result": done.stdout[-2000:] + done.stderr[-2000:]}
    result["returncode"] = done.returncode
    return result


@pytest.fixture
def session(tmp_path: Path) -> Iterator[tuple[FakeAnthropic, str, str, Path]]:
    project = tmp_path / "project"
    project.mkdir()
    files = write_project(project)
    fake = FakeAnthropic([FakeClaude(MODEL, window_tokens=WINDOW_TOKENS)], script=Reader(files))
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        f'[models]\n"{MODEL}" = {{ window = {WINDOW_TOKENS}, max_output = 64_000, encoding = "estimate" }}\n',
        encoding="utf-8",
    )
    with fake.serve() as upstream_url:
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1", models_file=models_file, log_level="WARNING"
        )
        with serve_app(create_app(settings)) as proxy_url:
            yield fake, upstream_url, proxy_url, project


def over_window(fake: FakeAnthropic) -> list[int]:
    """The fake's counts of the requests it received that did not fit its window."""
    out = []
    for request in fake.message_requests():
        body = request.json()
        tokens = fake.count(body)
        if tokens + int(body.get("max_tokens", 0)) > WINDOW_TOKENS:
            out.append(tokens)
    return out


@pytest.mark.timeout(TIMEOUT_S + DIRECT_TIMEOUT_S + 60)
def test_claude_code_fails_direct_and_completes_through_the_proxy(
    session: tuple[FakeAnthropic, str, str, Path], tmp_path: Path
) -> None:
    fake, upstream_url, proxy_url, project = session
    direct = run_claude(upstream_url, project, tmp_path / "home-direct", timeout_s=DIRECT_TIMEOUT_S)
    refused = [r for r in fake.message_requests() if r.status == 400]
    assert refused, "the baseline must overflow the fake's window"
    facts = {f"FACT-part{k}-{k * 1111 + 7}" for k in range(FILES)}
    assert direct["is_error"] or not facts <= set(FACT_RE.findall(str(direct.get("result"))))

    fake.requests.clear()
    proxied = run_claude(proxy_url, project, tmp_path / "home-proxy")
    assert proxied["returncode"] == 0 and proxied["is_error"] is False, proxied.get("result")
    assert over_window(fake) == []
    assert all(r.status == 200 for r in fake.requests)
    assert facts <= set(FACT_RE.findall(str(proxied["result"])))
    final = fake.message_requests()[-1].json()["messages"]
    results = [
        b for m in final if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"
    ]
    assert results, "the final request still carries the session's tool results (pruned or whole)"


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_claude_code_with_signed_thinking_completes_through_the_proxy(
    session: tuple[FakeAnthropic, str, str, Path], tmp_path: Path
) -> None:
    fake, _upstream_url, proxy_url, project = session
    proxied = run_claude(proxy_url, project, tmp_path / "home-thinking", thinking=True)
    assert proxied["returncode"] == 0 and proxied["is_error"] is False, proxied.get("result")
    bodies = [r.json() for r in fake.message_requests()]
    assert all(r.status == 200 for r in fake.requests)  # every signature and binding held
    assert over_window(fake) == []
    assert all(b["thinking"]["type"] != "disabled" for b in bodies)
    assistants = [m for b in bodies for m in b["messages"] if m["role"] == "assistant"]
    assert assistants and all(m["content"][0]["type"] == "thinking" for m in assistants)
    assert max(len(b["messages"]) for b in bodies) > len(bodies[-1]["messages"])  # the loop was cut
    facts = {f"FACT-part{k}-{k * 1111 + 7}" for k in range(FILES)}
    assert facts <= set(FACT_RE.findall(str(proxied["result"])))
