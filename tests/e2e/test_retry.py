"""The emergency retry: the proxy's count fits, the upstream (counting 1.5x) refuses, one retry fixes it.

For each error dialect (OpenAI, vLLM, llama.cpp), the conversation is sized so that the proxy's exact
tiktoken count is under its input budget (so the first attempt is the client's own bytes) while the
fake upstream's count is over the 4,096-token window.
"""

from __future__ import annotations

import openai
import pytest

from app.core.tokens import MessageCounter
from tests.e2e.conftest import RATIO, WINDOW_TOKENS, Stack, conversation
from tests.fake_upstream import DIALECTS


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
