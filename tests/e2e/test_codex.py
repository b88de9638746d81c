"""The real Codex CLI (``codex exec``, npm ``@openai/codex``) through ctxproxy, offline.

Codex speaks only the Responses API. A scripted fake model (the strict fake Responses upstream)
makes it read large files with its shell tool (``exec_command``), each step with a sealed
reasoning item, until the conversation no longer fits the model's window. Straight at the fake the
session dies at the window (Codex ends with exit code 1 on ``context_length_exceeded``); through
the proxy it completes, because every request is fitted before it is sent.

The binary is installed by ``bash .ci/install-codex`` (``.ci/run`` does it) under ``.codex-cli/``;
without it these tests are skipped with that reason (a skip, never a pass).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.reading_agent import DONE, reading_script, write_files, write_models_file
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, serve_proxy

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / ".codex-cli" / "node_modules" / ".bin" / "codex"
MODEL = FakeModel("fake-codex", 24_000, max_output_tokens=1024)
FILES = 6
FILE_LINES = 400  # ~3,600 tokens a file: the sixth read no longer fits the window

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
    home: Path
    work: Path

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
        return subprocess.run(
            [str(CODEX), "exec", "--skip-git-repo-check", "Read file0.txt to file5.txt, one at a time."],
            cwd=self.work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )


@pytest.fixture(scope="module")
def codex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Codex]:
    base = tmp_path_factory.mktemp("codex")
    home, work = base / "home", base / "work"
    home.mkdir()
    work.mkdir()
    write_files(work, files=FILES, lines=FILE_LINES)
    models_file = write_models_file(base / "models.toml", MODEL)
    fake = FakeResponsesUpstream([MODEL])
    fake.responder = reading_script(
        files=FILES,
        tool="exec_command",
        arguments=lambda k: {"cmd": f"cat file{k}.txt"},
        file_of=lambda arguments: int(arguments["cmd"].removeprefix("cat file").removesuffix(".txt")),
    )
    with fake.serve() as upstream_url, serve_proxy(upstream_url, models_file=models_file) as proxy_url:
        yield Codex(fake=fake, upstream_url=upstream_url, proxy_url=proxy_url, home=home, work=work)


def test_codex_dies_at_the_window_when_it_talks_to_the_model_directly(codex: Codex) -> None:
    codex.fake.clear()
    result = codex.run(codex.upstream_url)
    assert result.returncode == 1, result.stderr[-3000:]
    statuses = [r.status for r in codex.fake.responses()]
    assert statuses[-1] == 400 and all(s == 200 for s in statuses[:-1])
    assert DONE not in result.stdout


def test_codex_completes_the_session_through_the_proxy(codex: Codex) -> None:
    codex.fake.clear()
    result = codex.run(codex.proxy_url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert DONE in result.stdout
    received = codex.fake.responses()
    kinds = [json.loads(r.headers.get("x-codex-turn-metadata", "{}")).get("request_kind") for r in received]
    assert len(received) == FILES + 1 and all(r.status == 200 for r in received), (
        kinds,
        [r.status for r in received],
        [r.prompt_tokens for r in received],
        [[i.get("type") for i in r.json()["input"]][-3:] for r in received],
    )
    assert all(r.prompt_tokens is not None and r.prompt_tokens <= MODEL.window_tokens for r in received)
    assert any("[ctxproxy:" in r.body.decode() for r in received)  # the proxy did fit the session
    first = received[0]
    assert first.headers.get("originator") == "codex_exec"
    assert first.json()["store"] is False and first.json()["include"] == ["reasoning.encrypted_content"]
    last = received[-1].json()["input"]
    assert sum(1 for item in last if item.get("type") == "reasoning") >= 1  # sealed items went through
