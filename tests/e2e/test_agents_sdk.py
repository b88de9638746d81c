"""The OpenAI Agents SDK (PyPI ``openai-agents``) through ctxproxy, offline.

The SDK runs an agent loop on the Responses API: a function tool reads files, and every turn the
SDK resends the whole history (its items, reasoning included) as ``input``. A scripted fake model
(the strict fake Responses upstream) reads one large file per step until the history no longer
fits the window. Straight at the fake, the run dies with the SDK's ``BadRequestError`` on
``context_length_exceeded``; through the proxy it completes, and nothing over the window reaches
the upstream.

The agent runs in the SDK's own interpreter (``.agents-sdk/``, installed by
``bash .ci/install-agents-sdk``; ``.ci/run`` does it) from ``tests/e2e/agents_sdk_agent.py``;
without it these tests are skipped with that reason (a skip, never a pass), except under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, serve_proxy

ROOT = Path(__file__).resolve().parents[2]
SDK_PYTHON = ROOT / ".agents-sdk" / "bin" / "python"
AGENT = Path(__file__).with_name("agents_sdk_agent.py")
MODEL = FakeModel("fake-agent", 24_000, max_output_tokens=1024)
FILES = 6
FILE_LINES = 400  # ~6,900 tokens a file: the fifth read no longer fits the window
DONE = "I have read all the files."

pytestmark = pytest.mark.skipif(
    not SDK_PYTHON.exists() and not os.environ.get("CI"),
    reason=f"the Agents SDK is not installed (run: bash .ci/install-agents-sdk; looked for {SDK_PYTHON})",
)


def script(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Read ``file0.txt`` ... one per step (each with a reasoning item), then say so. The next file
    follows the newest call in the input (what a model sees even when older steps were cut)."""
    calls = [i for i in body.get("input", []) if isinstance(i, dict) and i.get("type") == "function_call"]
    done = (
        int(json.loads(calls[-1]["arguments"])["name"].removeprefix("file").removesuffix(".txt")) + 1
        if calls
        else 0
    )
    if done < FILES:
        return [
            {"reasoning": f"I should read file{done}.txt next."},
            {"call": "read_file", "arguments": json.dumps({"name": f"file{done}.txt"})},
        ]
    return [{"reasoning": "Every file is read."}, {"text": DONE}]


@dataclass
class Stack:
    fake: FakeResponsesUpstream
    upstream_url: str
    proxy_url: str
    work: Path

    def run(self, base_url: str) -> subprocess.CompletedProcess[str]:
        """The agent, with the SDK's interpreter, against ``base_url`` (a fake key)."""
        return subprocess.run(
            [
                str(SDK_PYTHON),
                str(AGENT),
                f"{base_url}/v1",
                MODEL.name,
                str(self.work),
                f"Read file0.txt to file{FILES - 1}.txt, one at a time.",
            ],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.work)},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("agents-sdk")
    for k in range(FILES):
        lines = [f"file {k} line {i}: the quick brown fox jumps over the lazy dog" for i in range(FILE_LINES)]
        (work / f"file{k}.txt").write_text("\n".join(lines), encoding="utf-8")
    models_file = work / "models.toml"
    models_file.write_text(
        f'[models."{MODEL.name}"]\nwindow = {MODEL.window_tokens}\nmax_output = {MODEL.max_output_tokens}\n'
        f'encoding = "{MODEL.encoding}"\n',
        encoding="utf-8",
    )
    fake = FakeResponsesUpstream([MODEL])
    fake.responder = script
    with fake.serve() as upstream_url, serve_proxy(upstream_url, models_file=models_file) as proxy_url:
        yield Stack(fake=fake, upstream_url=upstream_url, proxy_url=proxy_url, work=work)


def test_an_agents_sdk_run_dies_at_the_window_when_it_talks_to_the_model_directly(stack: Stack) -> None:
    stack.fake.clear()
    result = stack.run(stack.upstream_url)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "BadRequestError" in result.stderr and "context window" in result.stderr
    statuses = [r.status for r in stack.fake.responses()]
    assert statuses[-1] == 400 and all(s == 200 for s in statuses[:-1])
    assert DONE not in result.stdout


def test_an_agents_sdk_run_completes_through_the_proxy(stack: Stack) -> None:
    stack.fake.clear()
    result = stack.run(stack.proxy_url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert DONE in result.stdout
    received = stack.fake.responses()
    assert len(received) == FILES + 1 and all(r.status == 200 for r in received)
    assert all(r.prompt_tokens is not None and r.prompt_tokens <= MODEL.window_tokens for r in received)
    assert any("[ctxproxy:" in r.body.decode() for r in received)  # the proxy did fit the run
    last = received[-1].json()
    assert last["instructions"].startswith("You read the files")  # the pinned instructions survive
    items = last["input"]
    assert items[0]["role"] == "user" and "file0.txt to file5.txt" in json.dumps(items[0])  # the task
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert calls and calls == outputs  # every kept call with its output, in order
    assert json.loads([i for i in items if i.get("type") == "function_call"][-1]["arguments"]) == {
        "name": f"file{FILES - 1}.txt"
    }  # the newest step is kept
    assert any(i.get("type") == "reasoning" for i in items)  # sealed reasoning went through unedited
