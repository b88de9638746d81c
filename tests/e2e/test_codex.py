"""The real Codex CLI (``codex exec``, npm ``@openai/codex``) through ctxproxy, offline: what it
reads and the proxy has to cut is still known at the end.

Codex speaks only the Responses API. A scripted fake model (the strict fake Responses upstream,
``tests/e2e/reading_agent.py``'s ``reading_script``) makes it read ``FILES`` files of about 3K
tokens (one fact each, in the part of the output Codex itself keeps) with its shell tool
(``exec_command``), each step with a sealed reasoning item, never restating what it read, then
answers with every fact it can still see in its input. The 32K model cannot hold the session:
straight at the fake Codex dies at the first refused request (exit code 1 on
``context_length_exceeded``); through the proxy, with default settings (summaries on, asked with
``/v1/responses``), the session completes, nothing over the window or invalid reaches the upstream
(it checks every pairing and every sealed item), the proxy refuses nothing, and the final answer
holds at least ``MIN_FACTS`` of the ``FILES`` facts.

The binary is installed by ``bash .ci/install-codex`` (``.ci/run`` does it) under ``.codex-cli/``;
without it these tests are skipped with that reason (a skip, never a pass).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.main import create_app
from app.settings import Settings
from tests.e2e.reading_agent import (
    DONE,
    FACT,
    StatusRecorder,
    fact_of,
    reading_script,
    recalling,
    write_fact_files,
    write_models_file,
)
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_summarizer import is_summary_prompt
from tests.fake_upstream import FakeModel, serve_app

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / ".codex-cli" / "node_modules" / ".bin" / "codex"
MODEL = FakeModel("fake-codex", 32_000, max_output_tokens=1024)
FILES = 12
MIN_FACTS = 10

# Under CI (.ci/run installs the CLI) a missing CLI fails the tests instead of skipping them.
pytestmark = pytest.mark.skipif(
    not CODEX.exists() and not os.environ.get("CI"),
    reason=f"the Codex CLI is not installed (run: bash .ci/install-codex; looked for {CODEX})",
)


@dataclass
class Codex:
    fake: FakeResponsesUpstream
    upstream_url: str
    proxy_url: str
    proxy_statuses: StatusRecorder
    home: Path
    work: Path
    facts: set[str]

    def run(self, base_url: str) -> subprocess.CompletedProcess[str]:
        """``codex exec`` with a model provider at ``base_url`` (a fake key, no sandbox, no approvals)."""
        config = (
            f'model = "{MODEL.name}"\nmodel_provider = "under_test"\napproval_policy = "never"\n'
            'sandbox_mode = "danger-full-access"\n\n[model_providers.under_test]\nname = "under test"\n'
            f'base_url = "{base_url}/v1"\nenv_key = "CODEX_TEST_KEY"\nwire_api = "responses"\n'
        )
        (self.home / "config.toml").write_text(config, encoding="utf-8")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "CODEX_HOME": str(self.home),
            "CODEX_TEST_KEY": "sk-fake",
            "NO_COLOR": "1",
        }
        prompt = f"Read file0.txt to file{FILES - 1}.txt, one at a time, and tell me every secret."
        return subprocess.run(
            [str(CODEX), "exec", "--skip-git-repo-check", prompt],
            cwd=self.work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Codex]:
    base = tmp_path_factory.mktemp("codex")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    # Codex cuts the middle of a long command output itself (about 2.5K of its tokens kept): the
    # fact sits where it keeps it.
    paths = write_fact_files(work, files=FILES, fact_line=20)
    models_file = write_models_file(base / "models.toml", MODEL)
    fake = FakeResponsesUpstream([MODEL])
    fake.responder = reading_script(
        files=FILES,
        tool="exec_command",
        arguments=lambda k: {"cmd": f"cat file{k}.txt"},
        file_of=lambda arguments: int(arguments["cmd"].removeprefix("cat file").removesuffix(".txt")),
    )
    with fake.serve() as upstream_url:
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1",
            upstream_api_key=None,
            models_file=models_file,
            log_level="WARNING",
            summary_yield="never",  # the fake serves many requests at once: not a few-slot server
        )
        recorder = StatusRecorder(create_app(settings), path_prefix="/v1/responses")
        with serve_app(recorder) as proxy_url:
            yield Codex(fake, upstream_url, proxy_url, recorder, home, work, {fact_of(p) for p in paths})


def answer_facts(stdout: str, facts: set[str]) -> set[str]:
    return {f.rstrip(".") for f in FACT.findall(stdout)} & facts


def test_codex_dies_at_the_window_when_it_talks_to_the_model_directly(codex: Codex) -> None:
    codex.fake.clear()
    result = codex.run(codex.upstream_url)
    assert result.returncode == 1, result.stderr[-3000:]
    statuses = [r.status for r in codex.fake.responses()]
    assert statuses[-1] == 400 and all(s == 200 for s in statuses[:-1])
    assert DONE not in result.stdout and not answer_facts(result.stdout, codex.facts)  # 0 facts


def test_codex_keeps_what_it_read_through_the_proxy(codex: Codex) -> None:
    codex.fake.clear()
    result = codex.run(codex.proxy_url)
    found = answer_facts(result.stdout, codex.facts)
    where = (
        f"direct: exit 1 at the first refused request, 0 of {FILES} facts; proxy: exit {result.returncode}, "
        f"{len(found)} of {FILES} facts, {codex.fake.summary_calls} summary calls"
    )
    assert result.returncode == 0, (result.stderr[-3000:], where)
    assert DONE in result.stdout, where
    received = codex.fake.responses()
    client = [r for r in received if not is_summary_prompt(r.json().get("instructions"))]
    kinds = [json.loads(r.headers.get("x-codex-turn-metadata", "{}")).get("request_kind") for r in client]
    assert len(client) == FILES + 1 and all(r.status == 200 for r in received), (kinds, where)
    assert all(r.prompt_tokens is not None and r.prompt_tokens <= MODEL.window_tokens for r in received), (
        where
    )
    statuses = codex.proxy_statuses.statuses
    assert statuses and all(s == 200 for s in statuses), (statuses, where)  # the proxy refused nothing
    assert codex.fake.summary_calls >= 1, where  # summaries asked with /v1/responses, on its upstream
    summaries = [r for r in received if is_summary_prompt(r.json().get("instructions"))]
    assert all(
        r.json()["store"] is False and r.headers.get("authorization") == "Bearer sk-fake" for r in summaries
    )
    first = client[0]
    assert first.headers.get("originator") == "codex_exec"
    assert first.json()["store"] is False and first.json()["include"] == ["reasoning.encrypted_content"]
    last = client[-1].json()["input"]
    assert sum(1 for item in last if item.get("type") == "reasoning") >= 1  # sealed items went through
    assert re.search(r"\[ctxproxy: summary of \d+ earlier messages(; recall id \w+)?\]", json.dumps(last)), (
        where
    )
    assert len(found) >= MIN_FACTS, where


def test_codex_never_sees_the_recall_tool_the_model_uses_through_the_proxy(codex: Codex) -> None:
    codex.fake.clear()
    reading = codex.fake.responder
    assert reading is not None
    codex.fake.responder = recalling(reading, recalls=2)
    try:
        result = codex.run(codex.proxy_url)
    finally:
        codex.fake.responder = reading
    assert result.returncode == 0 and DONE in result.stdout, result.stderr[-3000:]
    assert "ctx_recall" not in result.stdout + result.stderr
    client = [r.json() for r in codex.fake.responses() if not is_summary_prompt(r.json().get("instructions"))]
    rounds = [
        body
        for body in client
        if body["input"][-1].get("type") == "function_call_output"
        and str(body["input"][-1].get("output")).startswith("[ctxproxy: recalled")
    ]
    own = [body for body in client if body not in rounds]
    assert 1 <= len(rounds) <= 2 and len(own) == FILES + 1  # Codex sent what it sends without recall
    assert all("ctx_recall" not in json.dumps(body["input"]) for body in own)  # no trace of the tool
    assert all(body["tools"][-1]["name"] == "ctx_recall" for body in rounds)
    recalled = {f.rstrip(".") for body in rounds for f in FACT.findall(json.dumps(body["input"][-1]))}
    assert recalled and recalled <= answer_facts(result.stdout, codex.facts)
    assert all(r.status == 200 for r in codex.fake.responses())
    assert all(
        r.prompt_tokens is not None and r.prompt_tokens <= MODEL.window_tokens for r in codex.fake.responses()
    )
