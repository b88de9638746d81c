"""``POST /v1/responses`` end to end: a real ctxproxy in front of the strict fake Responses upstream,
the official ``openai`` SDK's ``client.responses.create`` as the client (streaming and not)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from app.core.dialects import RESPONSES
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, serve_proxy

MODEL = FakeModel("resp-e2e", 4096, max_output_tokens=512)
# Counts 1.5x what the proxy counts (a tokenizer the proxy does not have): only a retry gets through.
RATIO = FakeModel("resp-ratio", 4096, max_output_tokens=512, counter_ratio=1.5)
# The same, for the streamed case: what the first refusal teaches (per model) must not carry over.
RATIO_STREAM = FakeModel("resp-ratio-stream", 4096, max_output_tokens=512, counter_ratio=1.5)
MAX_BODY_BYTES = 2 * 1024 * 1024
TOOLS = [
    {
        "type": "function",
        "name": "exec_command",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]


@dataclass
class Stack:
    fake: FakeResponsesUpstream
    upstream_url: str
    proxy_url: str
    sent: list[bytes] = field(default_factory=list)

    def client(self, *, direct: bool = False) -> openai.OpenAI:
        """An SDK client at the proxy (or straight at the fake) that records the bytes it sends."""

        def record(request: httpx.Request) -> None:
            self.sent.append(request.read())

        base = self.upstream_url if direct else self.proxy_url
        http = httpx.Client(event_hooks={"request": [record]}, timeout=30)
        return openai.OpenAI(base_url=f"{base}/v1", api_key="test", max_retries=0, http_client=http)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    fake = FakeResponsesUpstream([MODEL, RATIO, RATIO_STREAM])
    models_file: Path = tmp_path_factory.mktemp("responses") / "models.toml"
    models_file.write_text(
        "".join(
            f'[models."{m.name}"]\nwindow = {m.window_tokens}\nmax_output = {m.max_output_tokens}\n'
            f'encoding = "{m.encoding}"\n'
            for m in (MODEL, RATIO, RATIO_STREAM)
        ),
        encoding="utf-8",
    )
    with (
        fake.serve() as upstream_url,
        # No memory index: its room would be headroom the retry tests must not have (the
        # upstream counts more than the proxy and must still refuse the first try).
        serve_proxy(
            upstream_url, models_file=models_file, max_body_bytes=MAX_BODY_BYTES, memory_index=False
        ) as proxy_url,
    ):
        yield Stack(fake=fake, upstream_url=upstream_url, proxy_url=proxy_url)


@pytest.fixture
def e2e(stack: Stack) -> Iterator[Stack]:
    stack.fake.clear()
    stack.fake.responder = None
    stack.fake.overflow_in_stream = False
    stack.fake.drip_timeouts.clear()
    stack.sent.clear()
    yield stack


@pytest.fixture
def client(e2e: Stack) -> Iterator[openai.OpenAI]:
    with e2e.client() as c:
        yield c


def as_input(item: Any) -> dict[str, Any]:
    """An output item of a response, as the next request's input item (what clients send back)."""
    return item.model_dump(exclude_none=True)


def test_a_plain_request_is_forwarded_byte_for_byte(e2e: Stack, client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL.name, input="Say hello.", instructions="Be brief.")
    assert response.output_text.startswith("fake reply to 1 input items")
    (received,) = e2e.fake.client_responses()
    assert received.body == e2e.sent[0]
    assert response.usage is not None and response.usage.input_tokens == received.prompt_tokens


def test_a_streamed_response_arrives_as_the_upstreams_events(e2e: Stack, client: openai.OpenAI) -> None:
    e2e.fake.responder = lambda body: [{"text": "streamed words arrive in order"}]
    events = list(client.responses.create(model=MODEL.name, input="Stream please.", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "streamed words arrive in order"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_stream_events_are_not_buffered(e2e: Stack, client: openai.OpenAI) -> None:
    """Each event reaches the client before the fake sends the next one (it waits for the ack).

    The preamble (``response.created``, ``response.in_progress``) is the exception: the proxy holds
    it until the first event after it, to retry an overflow reported inside the stream
    (``app/core/preamble.py``), so the fake sends those two without waiting."""
    e2e.fake.responder = lambda body: [{"text": "one two three four five six seven eight nine ten"}]
    acks = [threading.Event() for _ in range(32)]
    preamble = len(RESPONSES.preamble_events & {"response.created", "response.in_progress"})
    for k in range(preamble):
        acks[k].set()
    e2e.fake.drip_acks = acks
    try:
        for event in client.responses.create(model=MODEL.name, input="Drip.", stream=True):
            acks[event.sequence_number].set()
    finally:
        e2e.fake.drip_acks = None
    assert event.type == "response.completed"
    assert e2e.fake.drip_timeouts == []


def test_a_tool_call_loop_with_reasoning_items(e2e: Stack, client: openai.OpenAI) -> None:
    def responder(body: Any) -> list[dict[str, Any]]:
        done = sum(1 for i in body["input"] if i.get("type") == "function_call_output")
        if done < 3:
            return [
                {"reasoning": f"step {done}"},
                {"call": "exec_command", "arguments": json.dumps({"cmd": f"ls {done}"})},
            ]
        return [{"reasoning": "finish"}, {"text": "all done"}]

    e2e.fake.responder = responder
    history: list[dict[str, Any]] = [{"role": "user", "content": "List three directories."}]
    for _ in range(5):
        response = client.responses.create(
            model=MODEL.name,
            input=history,
            tools=TOOLS,
            store=False,
            include=["reasoning.encrypted_content"],
        )
        history += [as_input(item) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            break
        history += [
            {"type": "function_call_output", "call_id": c.call_id, "output": f"dir{c.call_id}"} for c in calls
        ]
    assert response.output_text == "all done"
    assert [r.status for r in e2e.fake.client_responses()] == [200, 200, 200, 200]
    assert [r.body for r in e2e.fake.client_responses()] == e2e.sent  # each fitted request went as sent


def long_session(fake: FakeResponsesUpstream, *, calls: int, output_words: int) -> list[dict[str, Any]]:
    """An agent session whose tool outputs overflow the window: reasoning sealed by the fake."""
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "You are a coding agent."},
        {"role": "user", "content": "Read every file and summarise them."},
    ]
    for k in range(calls):
        summary = [{"type": "summary_text", "text": f"read file {k}"}]
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{k}",
                "summary": summary,
                "encrypted_content": fake.seal(f"rs_{k}", summary),
            }
        )
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{k}",
                "call_id": f"call_{k}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"cat file{k}.txt"}),
            }
        )
        text = " ".join(f"line{k}-{i}" for i in range(output_words))
        items.append({"type": "function_call_output", "call_id": f"call_{k}", "output": text})
    return items


def test_a_session_that_overflows_directly_succeeds_through_the_proxy(
    e2e: Stack, client: openai.OpenAI
) -> None:
    items = long_session(e2e.fake, calls=8, output_words=300)
    with e2e.client(direct=True) as direct, pytest.raises(openai.BadRequestError) as refused:
        direct.responses.create(model=MODEL.name, input=items, tools=TOOLS)
    assert refused.value.code == "context_length_exceeded"

    e2e.fake.clear()
    response = client.responses.create(model=MODEL.name, input=items, tools=TOOLS)
    assert response.status == "completed"
    (received,) = e2e.fake.client_responses()
    assert received.status == 200 and received.prompt_tokens is not None
    assert received.prompt_tokens <= MODEL.window_tokens
    forwarded = received.json()["input"]
    sent = {json.dumps(i, sort_keys=True) for i in items}
    for item in forwarded:
        if item.get("type") in ("reasoning", "function_call"):
            assert json.dumps(item, sort_keys=True) in sent  # never edited
    assert forwarded[-1]["call_id"] == "call_7"  # the newest output is kept


def test_a_stream_that_overflows_directly_succeeds_through_the_proxy(
    e2e: Stack, client: openai.OpenAI
) -> None:
    items = long_session(e2e.fake, calls=8, output_words=300)
    events = list(client.responses.create(model=MODEL.name, input=items, tools=TOOLS, stream=True))
    assert events[-1].type == "response.completed"


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_overflow_is_retried_smaller(e2e: Stack, client: openai.OpenAI, stream: bool) -> None:
    """The upstream counts more than the proxy: its context_length_exceeded (a 400, or a
    ``response.failed`` event inside a 200 stream) makes the proxy retry with a smaller body."""
    e2e.fake.overflow_in_stream = stream
    model = RATIO_STREAM if stream else RATIO
    items = long_session(e2e.fake, calls=6, output_words=300)
    off = {"X-Context-Summarize": "off"}  # a cut leaves room for a summary: headroom the test must not have
    if stream:
        events = list(
            client.responses.create(
                model=model.name, input=items, tools=TOOLS, stream=True, extra_headers=off
            )
        )
        assert events[-1].type == "response.completed"
    else:
        created = client.responses.create(model=model.name, input=items, tools=TOOLS, extra_headers=off)
        assert created.status == "completed"
    statuses = [r.status for r in e2e.fake.client_responses()]
    assert len(statuses) >= 2 and statuses[-1] == 200
    refused = e2e.fake.client_responses()[0]
    assert (refused.status == 200) if stream else (refused.status == 400)  # the failed event or the 400
    assert len(e2e.fake.client_responses()[-1].body) < len(refused.body)
    # The refusal stated no window; the bound it taught holds for the next request of the model.
    e2e.fake.clear()
    more = [*items, {"role": "user", "content": "One more question, please."}]
    if stream:
        list(
            client.responses.create(model=model.name, input=more, tools=TOOLS, stream=True, extra_headers=off)
        )
    else:
        client.responses.create(model=model.name, input=more, tools=TOOLS, extra_headers=off)
    assert [r.status for r in e2e.fake.client_responses()] == [200]


def test_previous_response_id_is_passed_through(e2e: Stack, client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL.name, input="Remember the number 7.")
    second = client.responses.create(model=MODEL.name, input="Which number?", previous_response_id=first.id)
    assert second.status == "completed"
    bodies = [r.body for r in e2e.fake.client_responses()]
    assert bodies == e2e.sent  # forwarded unchanged: the proxy cannot see the stored history
    raw = httpx.post(
        f"{e2e.proxy_url}/v1/responses",
        json={"model": MODEL.name, "input": "Again?", "previous_response_id": first.id},
        timeout=30,
    )
    assert raw.status_code == 200
    assert "history-upstream" in raw.headers.get("x-context-warning", "")


def test_an_overflow_of_a_history_kept_upstream_reaches_the_client_in_the_responses_shape(
    e2e: Stack, client: openai.OpenAI
) -> None:
    first = client.responses.create(model=MODEL.name, input="word " * 2500)
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=MODEL.name, input="word " * 2500, previous_response_id=first.id)
    assert refused.value.code == "context_length_exceeded"
    assert set(refused.value.body) >= {"message", "type", "param", "code"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (b"{not json", None),
        (json.dumps({"model": MODEL.name, "input": 42}).encode(), "input"),
        (json.dumps({"model": MODEL.name, "input": [{"content": "no type, no role"}]}).encode(), "input[0]"),
        (
            json.dumps(
                {
                    "model": MODEL.name,
                    "input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}],
                }
            ).encode(),
            "input[0]",
        ),
    ],
)
def test_bad_input_is_a_4xx_in_the_responses_shape_from_the_proxy(
    e2e: Stack, content: bytes, param: str | None
) -> None:
    answer = httpx.post(
        f"{e2e.proxy_url}/v1/responses",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert e2e.fake.client_responses() == []  # refused by the proxy itself


def test_a_body_over_the_limit_is_a_413_in_the_responses_shape(e2e: Stack) -> None:
    content = json.dumps({"model": MODEL.name, "input": "x" * (MAX_BODY_BYTES + 10)}).encode()
    answer = httpx.post(
        f"{e2e.proxy_url}/v1/responses",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"
    assert e2e.fake.client_responses() == []
