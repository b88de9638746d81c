"""The OpenAI Agents SDK (PyPI ``openai-agents``) through ctxproxy, offline: what it reads and
the proxy has to cut is still known at the end.

The SDK runs an agent loop on the Responses API: a function tool reads files, and every turn the
SDK resends the whole history (its items, reasoning included) as ``input``. A scripted fake model
(the strict fake Responses upstream, ``tests/e2e/reading_agent.py``'s ``reading_script``) reads
``FILES`` files of about 3K tokens (one fact each, in the middle), one per step, never restating
what it read, then answers with every fact it can still see in its input. Straight at the fake,
the run dies with the SDK's ``BadRequestError`` on ``context_length_exceeded``; through the proxy,
with default settings (summaries on, asked with ``/v1/responses``), it completes, nothing over
the window or invalid reaches the upstream, the proxy refuses nothing, and the final answer holds
at least ``MIN_FACTS`` of the ``FILES`` facts.

The agent runs in the SDK's own interpreter (``.agents-sdk/``, installed by
``bash .ci/install-agents-sdk``; ``.ci/run`` does it) from ``tests/e2e/agents_sdk_agent.py``;
without it these tests are skipped with that reason (a skip, never a pass), except under CI.
"""

from __future__ import annotations

import json
import os
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
    write_fact_files,
    write_models_file,
)
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_summarizer import is_summary_prompt
from tests.fake_upstream import FakeModel, serve_app

ROOT = Path(__file__).resolve().parents[2]
SDK_PYTHON = ROOT / ".agents-sdk" / "bin" / "python"
AGENT = Path(__file__).with_name("agents_sdk_agent.py")
MODEL = FakeModel("fake-agent", 24_000, max_output_tokens=1024)
FILES = 12
MIN_FACTS = 10

pytestmark = pytest.mark.skipif(
    not SDK_PYTHON.exists() and not os.environ.get("CI"),
    reason=f"the Agents SDK is not installed (run: bash .ci/install-agents-sdk; looked for {SDK_PYTHON})",
)


@dataclass
class Stack:
    fake: FakeResponsesUpstream
    upstream_url: str
    proxy_url: str
    proxy_statuses: StatusRecorder
    work: Path
    facts: set[str]

    def run(self, base_url: str) -> subprocess.CompletedProcess[str]:
        """The agent, with the SDK's interpreter, against ``base_url`` (a fake key)."""
        return subprocess.run(
            [
                str(SDK_PYTHON),
                str(AGENT),
                f"{base_url}/v1",
                MODEL.name,
                str(self.work),
                f"Read file0.txt to file{FILES - 1}.txt, one at a time, and tell me every secret.",
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
    paths = write_fact_files(work, files=FILES)
    models_file = write_models_file(work / "models.toml", MODEL)
    fake = FakeResponsesUpstream([MODEL])
    fake.responder = reading_script(
        files=FILES,
        tool="read_file",
        arguments=lambda k: {"name": f"file{k}.txt"},
        file_of=lambda arguments: int(arguments["name"].removeprefix("file").removesuffix(".txt")),
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
            yield Stack(fake, upstream_url, proxy_url, recorder, work, {fact_of(p) for p in paths})


def answer_facts(stdout: str, facts: set[str]) -> set[str]:
    return {f.rstrip(".") for f in FACT.findall(stdout)} & facts


def test_an_agents_sdk_run_dies_at_the_window_when_it_talks_to_the_model_directly(stack: Stack) -> None:
    stack.fake.clear()
    result = stack.run(stack.upstream_url)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "BadRequestError" in result.stderr and "context window" in result.stderr
    statuses = [r.status for r in stack.fake.responses()]
    assert statuses[-1] == 400 and all(s == 200 for s in statuses[:-1])
    assert DONE not in result.stdout and not answer_facts(result.stdout, stack.facts)  # 0 facts


def test_an_agents_sdk_run_keeps_what_it_read_through_the_proxy(stack: Stack) -> None:
    stack.fake.clear()
    result = stack.run(stack.proxy_url)
    found = answer_facts(result.stdout, stack.facts)
    where = (
        f"direct: BadRequestError at the first refused request, 0 of {FILES} facts; proxy: exit "
        f"{result.returncode}, {len(found)} of {FILES} facts, {stack.fake.summary_calls} summary calls"
    )
    assert result.returncode == 0, (result.stderr[-3000:], where)
    assert DONE in result.stdout, where
    received = stack.fake.responses()
    client = [r for r in received if not is_summary_prompt(r.json().get("instructions"))]
    assert len(client) == FILES + 1 and all(r.status == 200 for r in received), where
    assert all(r.prompt_tokens is not None and r.prompt_tokens <= MODEL.window_tokens for r in received), (
        where
    )
    statuses = stack.proxy_statuses.statuses
    assert statuses and all(s == 200 for s in statuses), (statuses, where)  # the proxy refused nothing
    assert stack.fake.summary_calls >= 1, where
    last = client[-1].json()
    assert last["instructions"].startswith("You read the files")  # the pinned instructions survive
    items = last["input"]
    assert items[0]["role"] == "user" and f"file{FILES - 1}.txt" in json.dumps(items[0])  # the task
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert calls and calls == outputs  # every kept call with its output, in order
    assert json.loads([i for i in items if i.get("type") == "function_call"][-1]["arguments"]) == {
        "name": f"file{FILES - 1}.txt"
    }  # the newest step is kept
    assert any(i.get("type") == "reasoning" for i in items)  # sealed reasoning went through unedited
    assert "[ctxproxy: summary of" in json.dumps(items), where
    assert len(found) >= MIN_FACTS, where
