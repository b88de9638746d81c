"""End-to-end fixtures: a real ctxproxy server in front of a real fake upstream, the openai SDK as client.

Both servers are uvicorn on free 127.0.0.1 ports in background threads, started once per session and
stopped in teardown. The fake upstream serves one model per dialect with a 4,096-token window
(``fake-openai``, ``fake-vllm``, ``fake-llamacpp``) and the same three with a tokenizer that counts
1.5x what tiktoken counts (``ratio-openai``, ...), which only the emergency retry gets through.
The proxy knows the windows from an operator model table (``CTXPROXY_MODELS_FILE``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.core.tokens import MessageCounter
from app.tokenizer import counter_for
from tests.fake_upstream import DIALECTS, FakeModel, FakeUpstream, serve_proxy

WINDOW_TOKENS = 4096
RATIO = 1.5
MODELS = [FakeModel(f"fake-{d}", WINDOW_TOKENS, d) for d in DIALECTS] + [
    FakeModel(f"ratio-{d}", WINDOW_TOKENS, d, counter_ratio=RATIO) for d in DIALECTS
]
SYSTEM_PROMPT = "You are the e2e assistant. Answer in one sentence."


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)


@dataclass
class Stack:
    """The running servers and what the tests need to talk to them."""

    fake: FakeUpstream
    upstream_url: str
    proxy_url: str
    sent: list[bytes] = field(default_factory=list)

    def client(self, **kwargs: Any) -> openai.OpenAI:
        """An SDK client pointed at the proxy that records the exact bytes it sends."""
        return self._client(f"{self.proxy_url}/v1", **kwargs)

    def direct_client(self) -> openai.OpenAI:
        """An SDK client pointed straight at the fake upstream (what users do without ctxproxy)."""
        return self._client(f"{self.upstream_url}/v1")

    def _client(self, base_url: str, **kwargs: Any) -> openai.OpenAI:
        def record(request: httpx.Request) -> None:
            self.sent.append(request.read())

        http = httpx.Client(event_hooks={"request": [record]}, timeout=30)
        return openai.OpenAI(base_url=base_url, api_key="test", max_retries=0, http_client=http, **kwargs)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    fake = FakeUpstream(MODELS)
    models_file: Path = tmp_path_factory.mktemp("e2e") / "models.toml"
    models_file.write_text(fake.models_toml(), encoding="utf-8")
    with fake.serve() as upstream_url, serve_proxy(upstream_url, models_file=models_file) as proxy_url:
        yield Stack(fake=fake, upstream_url=upstream_url, proxy_url=proxy_url)


@pytest.fixture
def e2e(stack: Stack) -> Iterator[Stack]:
    """The session's stack with the fake's request log and the sent-bytes log cleared."""
    stack.fake.clear()
    stack.sent.clear()
    yield stack


@pytest.fixture
def client(e2e: Stack) -> Iterator[openai.OpenAI]:
    with e2e.client() as c:
        yield c


@pytest.fixture
def direct(e2e: Stack) -> Iterator[openai.OpenAI]:
    with e2e.direct_client() as c:
        yield c


@pytest.fixture(scope="session")
def counter() -> MessageCounter:
    """The proxy's own counter for the fake models (o200k_base, OpenAI chat accounting)."""
    return MessageCounter(counter_for("o200k_base"))


def conversation(
    counter: MessageCounter, *, at_least_tokens: int, model: str = "fake-openai"
) -> list[dict[str, Any]]:
    """System prompt, then user/assistant turns of ~150 tokens, then a new user question, growing
    until the request counts at least ``at_least_tokens`` (our count)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    turn = 0
    while True:
        question = {"role": "user", "content": f"Question {turn}: what is the newest question number?"}
        if counter.count_request({"model": model, "messages": [*messages, question]}) >= at_least_tokens:
            return [*messages, question]
        facts = " ".join(f"fact {turn}.{i} is about topic {turn * 31 + i}." for i in range(18))
        messages += [
            {"role": "user", "content": f"Turn {turn}: remember these facts. {facts}"},
            {"role": "assistant", "content": f"Noted the facts of turn {turn}. {facts}"},
        ]
        turn += 1
