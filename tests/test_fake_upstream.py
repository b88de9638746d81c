"""The fake upstream must behave like the servers it imitates, or the e2e tests prove nothing."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fake_upstream import FakeModel, FakeUpstream, context_error, serve_app


class WordCounter:
    """One token per whitespace-separated word: makes the fake's arithmetic easy to check."""

    name = "words"
    exact = True

    def count_text(self, text: str, /) -> int:
        return len(text.split())

    def head_tail(self, text: str, /, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        words = text.split()
        return " ".join(words[:head_tokens]), " ".join(
            words[len(words) - tail_tokens :] if tail_tokens else []
        )


def words(n: int) -> str:
    return " ".join(["w"] * n)


def body(n_words: int, **extra: object) -> dict[str, object]:
    # one message: 3 (per message) + 1 (role) + n_words, plus 3 reply priming = n_words + 7
    return {
        "model": extra.pop("model", "m-openai"),
        "messages": [{"role": "user", "content": words(n_words)}],
        **extra,
    }


MODELS = [
    FakeModel("m-openai", 100, "openai"),
    FakeModel("m-vllm", 100, "vllm"),
    FakeModel("m-llamacpp", 100, "llamacpp"),
    FakeModel("m-ratio", 100, "openai", counter_ratio=2.0),
]


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream(MODELS, counter_factory=lambda encoding: WordCounter())


@pytest.fixture
async def client(fake: FakeUpstream):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(fake.app), base_url="http://fake") as c:
        yield c


async def test_fitting_request_gets_reply_with_usage_and_is_recorded(fake, client) -> None:
    response = await client.post("/v1/chat/completions", json=body(50), headers={"Authorization": "Bearer k"})
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "chat.completion"
    assert data["usage"]["prompt_tokens"] == 57
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert data["choices"][0]["finish_reason"] == "stop"
    (recorded,) = fake.chat_requests()
    assert recorded.json() == body(50)
    assert recorded.headers["authorization"] == "Bearer k"
    assert recorded.prompt_tokens == 57
    assert recorded.status == 200


async def test_a_refused_key_is_answered_401_whatever_it_asks(fake, client) -> None:
    fake.refused_keys.add("bad")
    refused = await client.post("/v1/chat/completions", json=body(5), headers={"Authorization": "Bearer bad"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    taken = await client.post("/v1/chat/completions", json=body(5), headers={"Authorization": "Bearer good"})
    assert taken.status_code == 200
    assert [r.status for r in fake.chat_requests()] == [401, 200]


@pytest.mark.parametrize(
    ("model", "fits_words"),
    [("m-openai", 93), ("m-vllm", 93), ("m-llamacpp", 92)],
)
async def test_window_edge_per_dialect(client, model: str, fits_words: int) -> None:
    ok = await client.post("/v1/chat/completions", json=body(fits_words, model=model))
    over = await client.post("/v1/chat/completions", json=body(fits_words + 1, model=model))
    assert ok.status_code == 200
    assert over.status_code == 400


async def test_openai_dialect_body(client) -> None:
    response = await client.post("/v1/chat/completions", json=body(120))
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 100 tokens. However, your messages "
            "resulted in 127 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


async def test_openai_dialect_counts_requested_output(client) -> None:
    response = await client.post("/v1/chat/completions", json=body(50, max_tokens=60))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "you requested 117 tokens (57 in the messages, 60 in the completion)" in message


async def test_vllm_dialect_body(client) -> None:
    response = await client.post(
        "/v1/chat/completions", json=body(50, model="m-vllm", max_completion_tokens=60)
    )
    assert response.status_code == 400
    data = response.json()
    assert data["object"] == "error"
    assert data["type"] == "BadRequestError"
    assert data["code"] == 400
    assert data["message"] == (
        "This model's maximum context length is 100 tokens. However, you requested 117 tokens "
        "(57 in the messages, 60 in the completion). Please reduce the length of the messages or completion."
    )


async def test_llamacpp_dialect_body(client) -> None:
    response = await client.post("/v1/chat/completions", json=body(120, model="m-llamacpp"))
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 127,
            "n_ctx": 100,
        }
    }


async def test_counter_ratio_counts_more_than_the_tokenizer(fake, client) -> None:
    ok = await client.post("/v1/chat/completions", json=body(43, model="m-ratio"))
    over = await client.post("/v1/chat/completions", json=body(60, model="m-ratio"))
    assert ok.json()["usage"]["prompt_tokens"] == 100
    assert over.status_code == 400
    assert "resulted in 134 tokens" in over.json()["error"]["message"]
    assert [r.prompt_tokens for r in fake.chat_requests()] == [100, 134]


async def test_streaming_with_usage(client) -> None:
    request = body(10, stream=True, stream_options={"include_usage": True})
    async with client.stream("POST", "/v1/chat/completions", json=request) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in response.aiter_bytes()]).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.startswith("Fake reply to 1 messages")
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == 17


async def test_streaming_without_usage_has_no_usage_chunk(client) -> None:
    response = await client.post("/v1/chat/completions", json=body(10, stream=True))
    chunks = [json.loads(e[6:]) for e in response.text.split("\n\n") if e and e != "data: [DONE]"]
    assert all("usage" not in c for c in chunks)
    assert all(c["choices"] for c in chunks)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


async def test_tool_call_when_the_user_names_a_tool(client) -> None:
    request = {
        "model": "m-openai",
        "messages": [{"role": "user", "content": "please use read_file"}],
        "tools": TOOLS,
    }
    data = (await client.post("/v1/chat/completions", json=request)).json()
    choice = data["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "fake"}

    request["messages"] += [choice["message"], {"role": "tool", "tool_call_id": call["id"], "content": "x"}]
    follow_up = (await client.post("/v1/chat/completions", json=request)).json()
    assert follow_up["choices"][0]["finish_reason"] == "stop"
    assert follow_up["choices"][0]["message"]["content"].startswith("Fake reply to 3 messages")


async def test_no_tool_call_unless_asked(client) -> None:
    request = {"model": "m-openai", "messages": [{"role": "user", "content": "hello"}], "tools": TOOLS}
    assert (
        "tool_calls"
        not in (await client.post("/v1/chat/completions", json=request)).json()["choices"][0]["message"]
    )
    request["tool_choice"] = "required"
    forced = (await client.post("/v1/chat/completions", json=request)).json()
    assert forced["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "read_file"


async def test_streamed_tool_call(client) -> None:
    request = {
        "model": "m-openai",
        "messages": [{"role": "user", "content": "read_file please"}],
        "tools": TOOLS,
        "stream": True,
    }
    response = await client.post("/v1/chat/completions", json=request)
    chunks = [json.loads(e[6:]) for e in response.text.split("\n\n") if e and e != "data: [DONE]"]
    calls = [
        c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls[0][0]["function"]["name"] == "read_file"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_bad_input_and_unknown_model(client) -> None:
    malformed = await client.post("/v1/chat/completions", content=b"{nope")
    no_messages = await client.post("/v1/chat/completions", json={"model": "m-openai"})
    unknown = await client.post("/v1/chat/completions", json=body(1, model="nope"))
    assert malformed.status_code == 400
    assert no_messages.json()["error"]["param"] == "messages"
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"


async def test_models_listing(client) -> None:
    data = (await client.get("/v1/models")).json()
    assert [m["id"] for m in data["data"]] == ["m-openai", "m-vllm", "m-llamacpp", "m-ratio"]


def test_models_toml_declares_every_window(fake: FakeUpstream) -> None:
    import tomllib

    table = tomllib.loads(fake.models_toml())
    assert table["models"]["m-ratio"] == {"window": 100, "max_output": 1024, "encoding": "o200k_base"}
    assert set(table["models"]) == {m.name for m in MODELS}


def test_context_error_is_none_when_it_fits() -> None:
    for dialect in ("openai", "vllm", "llamacpp"):
        assert context_error(FakeModel("x", 10, dialect), prompt_tokens=5, output_tokens=4) is None


def test_served_over_real_http_and_stopped_after(fake: FakeUpstream) -> None:
    with fake.serve() as url:
        assert url.startswith("http://127.0.0.1:")
        response = httpx.post(f"{url}/v1/chat/completions", json=body(5))
        assert response.status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/v1/models", timeout=2)


def test_serve_app_reports_a_failed_start() -> None:
    async def broken(scope, receive, send):
        if scope["type"] == "lifespan":
            await receive()
            await send({"type": "lifespan.startup.failed", "message": "boom"})

    with pytest.raises(RuntimeError, match="did not start"), serve_app(broken):
        pass


def test_default_counter_is_the_project_tokenizer() -> None:
    fake = FakeUpstream([FakeModel("gpt", 100)])
    # "Hello world" is 2 o200k tokens: 3 + 1 (role) + 2 + 3 priming
    assert (
        fake.prompt_tokens(fake.models["gpt"], {"messages": [{"role": "user", "content": "Hello world"}]})
        == 9
    )
