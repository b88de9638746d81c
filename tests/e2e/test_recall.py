"""Recall end to end: a model that needs a fact it sees only as a recall id fetches it with
``ctx_recall``, which the proxy answers itself; the official SDKs see no trace of the tool.

Every API, streamed and not, through real uvicorn servers: the proxy in front of the strict fakes
with a scripted model (``tests.fake_recaller``) that knows nothing of what the test planted. The
upstream logs show every request valid and within the window; the client gets the answer as if
the model had answered at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from app.core.recall import RECALL_TOOL
from tests.fake_recaller import Recaller
from tests.fake_upstream import FakeModel, FakeUpstream, serve_proxy

WINDOW = 6000
FACT = "FACT-deploy-7731"
NO_SUMMARY = {"X-Context-Summarize": "off"}


def filler(k: int, size: int = 90) -> str:
    return " ".join(f"line {k}.{i}: nothing of note happened in module {k * 17 + i}." for i in range(size))


def agent_history(results: int = 14) -> list[dict[str, Any]]:
    """A chat agent session: the fact is in the first tool result, far back."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a deploy assistant."},
        {"role": "user", "content": "Read the logs, then tell me the deploy code."},
    ]
    for k in range(results):
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": "read_log", "arguments": json.dumps({"n": k})},
        }
        text = filler(k)
        if k == 0:
            text = f"{filler(k, 40)} The deploy code is {FACT}. {filler(k, 40)}"
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": text},
        ]
    messages.append({"role": "user", "content": "So, what is the deploy code?"})
    return messages


TOOLS = [{"type": "function", "function": {"name": "read_log", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def chat_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream([FakeModel("recall-model", WINDOW)])
    models = tmp_path_factory.mktemp("recall") / "models.toml"
    models.write_text(fake.models_toml(), encoding="utf-8")
    with fake.serve() as upstream, serve_proxy(upstream, models_file=models) as proxy:
        yield fake, proxy


def _client(proxy: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy}/v1", api_key="test", max_retries=0, http_client=httpx.Client(timeout=30)
    )


def _within_window(fake: FakeUpstream) -> None:
    for request in fake.client_requests():
        assert request.status == 200, request.body[:300]
        assert request.prompt_tokens is not None and request.prompt_tokens <= WINDOW


@pytest.mark.parametrize("stream", [False, True])
def test_chat_the_model_recalls_the_fact_and_the_client_sees_only_the_answer(
    chat_stack: tuple[FakeUpstream, str], stream: bool
) -> None:
    fake, proxy = chat_stack
    fake.clear()
    fake.recaller = Recaller("deploy")
    try:
        with _client(proxy) as client:
            if stream:
                chunks = list(
                    client.chat.completions.create(
                        model="recall-model",
                        messages=agent_history(),
                        tools=TOOLS,
                        stream=True,
                        extra_headers=NO_SUMMARY,
                    )
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
                assert [
                    c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
                ] == ["stop"]
                assert len({c.id for c in chunks}) == 1
            else:
                raw = client.chat.completions.with_raw_response.create(
                    model="recall-model", messages=agent_history(), tools=TOOLS, extra_headers=NO_SUMMARY
                )
                completion = raw.parse()
                text = completion.choices[0].message.content or ""
                assert completion.choices[0].message.tool_calls is None
                assert completion.choices[0].finish_reason == "stop"
                assert raw.headers["x-context-recalls"] == "1"
    finally:
        fake.recaller = None
    assert FACT in text
    first, second = fake.client_requests()
    _within_window(fake)
    sent = first.json()
    assert sent["tools"][-1]["function"]["name"] == RECALL_TOOL
    assert FACT not in json.dumps(sent)  # the model saw it only as a recall id
    continued = second.json()["messages"]
    assert continued[-2]["tool_calls"][0]["function"]["name"] == RECALL_TOOL
    assert continued[-1]["role"] == "tool" and FACT in continued[-1]["content"]
    # The continuation is the forwarded request (what the page needed room for cut further: a
    # placeholder instead of a result, never anything else) plus the call and its answer.
    for before, after in zip(sent["messages"], continued, strict=False):
        assert after == before or (
            "recall id" in str(after.get("content")) and after["role"] == before["role"]
        )
    assert len(continued) == len(sent["messages"]) + 2
