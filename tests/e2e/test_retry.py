"""The emergency retry: the proxy's count fits, the upstream (counting 1.5x) refuses, one retry fixes it.

For each error dialect (OpenAI, vLLM, llama.cpp), the conversation is sized so that the proxy's exact
tiktoken count is under its input budget (so the first attempt is the client's own bytes) while the
fake upstream's count is over the 4,096-token window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from app.core.tokens import MessageCounter
from tests.e2e.conftest import RATIO, WINDOW_TOKENS, Stack, conversation
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import DIALECTS, FakeModel, serve_proxy


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_only_the_emergency_retry_saves_it(
    e2e: Stack, client: openai.OpenAI, counter: MessageCounter, dialect: str, stream: bool
) -> None:
    model = f"ratio-{dialect}"
    messages = conversation(counter, at_least_tokens=int(WINDOW_TOKENS / RATIO) + 200, model=model)
    ours = counter.count_request({"model": model, "messages": messages})
    assert ours * RATIO > WINDOW_TOKENS

    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, stream=stream)
    headers = raw.headers
    result = raw.parse()
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in result if c.choices)
    else:
        text = result.choices[0].message.content
    assert text.startswith("Fake reply")

    assert headers["x-context-retries"] == "1"
    assert int(headers["x-context-tokens-before"]) == ours
    first, second = e2e.fake.client_requests()
    assert first.status == 400
    assert first.body == e2e.sent[0]  # the first attempt fitted by our count: the client's bytes
    assert first.prompt_tokens is not None and first.prompt_tokens > WINDOW_TOKENS
    assert second.status == 200
    assert second.prompt_tokens is not None and second.prompt_tokens <= WINDOW_TOKENS
    forwarded = second.json()["messages"]
    assert len(forwarded) < len(messages)
    assert forwarded[0] == messages[0]
    assert forwarded[-1] == messages[-1]
    assert int(headers["x-context-tokens-after"]) < ours


def test_errors_without_numbers_and_a_wrong_table_converge_in_the_first_request_and_never_fail_after(
    tmp_path: Path,
) -> None:
    """The issue's target: the table says 131,072, the server's window is 4,096 and its refusals
    ("Your input exceeds the context window of this model") carry no numbers. At most two refused
    calls for the first request, none after, no error to the client (real HTTP, the OpenAI SDK)."""
    model = FakeModel("wrong-table", 4096, max_output_tokens=1024)
    fake = FakeResponsesUpstream([model])
    table = tmp_path / "models.toml"
    table.write_text(
        f'[models."{model.name}"]\nwindow = 131072\nmax_output = 16384\nencoding = "o200k_base"\n',
        encoding="utf-8",
    )
    items: list[dict[str, Any]] = []
    for turn in range(60):  # ~34K tokens of history
        items.append({"role": "user", "content": " ".join(f"question{turn}-{i}" for i in range(70))})
        items.append({"role": "assistant", "content": " ".join(f"answer{turn}-{i}" for i in range(70))})
    with (
        fake.serve() as upstream_url,
        serve_proxy(upstream_url, models_file=table, discovery=False) as proxy_url,
    ):
        client = openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="test", max_retries=0)
        windows, budgets = [], []
        for n in range(4):
            items.append({"role": "user", "content": f"Next question {n}, please."})
            raw = client.responses.with_raw_response.create(model=model.name, input=items)
            assert raw.parse().status == "completed"
            windows.append(int(raw.headers["x-context-window"]))
            budgets.append(int(raw.headers["x-context-budget"]))
            statuses = [r.status for r in fake.client_responses()]  # summary calls aside
            if n == 0:
                assert statuses[-1] == 200 and 1 <= statuses.count(400) <= 2
                assert int(raw.headers["x-context-retries"]) == statuses.count(400)
            else:
                assert statuses == [200]
            # No summary call is sized by a window a refusal just proved wrong: the emergency
            # retries ask for none, the next requests fit theirs to the window learned.
            clients = {id(r) for r in fake.client_responses()}
            assert all(r.status == 200 for r in fake.responses() if id(r) not in clients)
            fake.clear()
    # Every response reports what it was fitted to: the first the window its retry found, the
    # next ones the window the first one's success proved, whose budget holds what it carried.
    assert windows[0] < 131_072 and len(set(windows[1:])) == 1 and windows[1] <= windows[0]
    assert all(b < 4096 for b in budgets[1:])
