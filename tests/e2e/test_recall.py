"""Recall end to end: a model that needs a fact it sees only as a recall id fetches it with
``ctx_recall``, which the proxy answers itself; the official SDKs see no trace of the tool.

Every API, streamed and not, through real uvicorn servers: the proxy in front of the strict fakes
with a scripted model (``tests.fake_recaller``) that knows nothing of what the test planted. The
upstream logs show every request valid and within the window; the client gets the answer as if
the model had answered at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google import genai
from google.genai import types

from app.core.recall import RECALL_TOOL
from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude
from tests.fake_gemini_upstream import FakeGemini, FakeGeminiModel
from tests.fake_recaller import Recall, Recaller
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, FakeUpstream, serve_proxy

WINDOW = 6000
FACT = "FACT-deploy-7731"
NO_SUMMARY = {"X-Context-Summarize": "off"}
# The fact must reach the model only through its recall id: the memory's index of exact strings
# (CTXPROXY_MEMORY_INDEX, on by default) would carry an identifier like it, so it is off here.
NO_INDEX = {"memory_index": False}


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
    with fake.serve() as upstream, serve_proxy(upstream, models_file=models, **NO_INDEX) as proxy:
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


# -- the Responses API -----------------------------------------------------------------------


def responses_recaller(recaller: Recaller) -> Any:
    """The Responses fake's responder: reasoning, then the recaller's turn."""

    def respond(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        items = body.get("input") or []
        offered = any(isinstance(t, dict) and t.get("name") == RECALL_TOOL for t in body.get("tools") or [])
        fetched = [
            (args["id"], args.get("page", 1))
            for item in items
            if isinstance(item, dict)
            and item.get("type") == "function_call"
            and item.get("name") == RECALL_TOOL
            for args in [json.loads(item.get("arguments") or "{}")]
        ]
        decision = recaller.decide(json.dumps(items), offered=offered, fetched=fetched)
        if isinstance(decision, Recall):
            arguments = json.dumps({"id": decision.ref, "page": decision.page})
            return [
                {"reasoning": "The code is in an early log."},
                {"call": RECALL_TOOL, "arguments": arguments},
            ]
        return [{"reasoning": "I have it."}, {"text": decision.text}]

    return respond


def responses_history(results: int = 14) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "Read the logs, then tell me the deploy code."}
    ]
    for k in range(results):
        text = filler(k) if k else f"{filler(k, 40)} The deploy code is {FACT}. {filler(k, 40)}"
        items += [
            {
                "type": "function_call",
                "call_id": f"c{k}",
                "name": "read_log",
                "arguments": json.dumps({"n": k}),
            },
            {"type": "function_call_output", "call_id": f"c{k}", "output": text},
        ]
    items.append({"role": "user", "content": "So, what is the deploy code?"})
    return items


RESPONSES_TOOLS = [{"type": "function", "name": "read_log", "parameters": {"type": "object"}}]


@pytest.fixture(scope="module")
def responses_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeResponsesUpstream, str]]:
    model = FakeModel("recall-responses", WINDOW)
    fake = FakeResponsesUpstream([model])
    table = tmp_path_factory.mktemp("recall-responses") / "models.toml"
    table.write_text(
        f'[models."{model.name}"]\nwindow = {WINDOW}\nmax_output = 1024\nencoding = "{model.encoding}"\n',
        encoding="utf-8",
    )
    with fake.serve() as upstream, serve_proxy(upstream, models_file=table, **NO_INDEX) as proxy:
        yield fake, proxy


@pytest.mark.parametrize("stream", [False, True])
def test_responses_the_model_recalls_the_fact_and_the_client_sees_only_the_answer(
    responses_stack: tuple[FakeResponsesUpstream, str], stream: bool
) -> None:
    fake, proxy = responses_stack
    fake.clear()
    fake.responder = responses_recaller(Recaller("deploy"))
    try:
        with _client(proxy) as client:
            options: dict[str, Any] = {
                "model": "recall-responses",
                "input": responses_history(),
                "tools": RESPONSES_TOOLS,
                "instructions": "You are a deploy assistant.",
                "extra_headers": NO_SUMMARY,
            }
            if stream:
                options["store"] = False  # as Codex streams (a stored stream is not offered the tool)
                with client.responses.stream(**options) as events:
                    seen = list(events)
                    response = events.get_final_response()
                assert not [e for e in seen if "function_call" in e.type]
                assert [e.type for e in seen].count("response.created") == 1
                numbers = [e.sequence_number for e in seen]
                assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
            else:
                raw = client.responses.with_raw_response.create(**options)
                response = raw.parse()
                assert raw.headers["x-context-recalls"] == "1"
    finally:
        fake.responder = None
    assert FACT in response.output_text
    assert not [item for item in response.output if item.type == "function_call"]
    # The reasoning that led to the recall call went with it; the answer's own reasoning stays.
    assert [item.type for item in response.output] == ["reasoning", "message"]
    first, second = fake.client_responses()
    for request in fake.client_responses():
        assert request.status == 200 and request.prompt_tokens is not None and request.prompt_tokens <= WINDOW
    assert first.json()["tools"][-1]["name"] == RECALL_TOOL and FACT not in first.body.decode()
    continued = second.json()["input"]
    assert [i.get("type") for i in continued[-3:]] == ["reasoning", "function_call", "function_call_output"]
    assert FACT in continued[-1]["output"]


# -- Anthropic Messages ----------------------------------------------------------------------


def messages_recaller(recaller: Recaller) -> Any:
    """The Anthropic fake's script: a sentence and the recall call, or the answer."""
    ids = iter(range(1, 1_000_000))

    def script(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        messages = body.get("messages") or []
        offered = any(isinstance(t, dict) and t.get("name") == RECALL_TOOL for t in body.get("tools") or [])
        fetched = [
            (block["input"]["id"], block["input"].get("page", 1))
            for message in messages
            if message.get("role") == "assistant" and isinstance(message.get("content"), list)
            for block in message["content"]
            if block.get("type") == "tool_use" and block.get("name") == RECALL_TOOL
        ]
        decision = recaller.decide(json.dumps(messages), offered=offered, fetched=fetched)
        if isinstance(decision, Recall):
            call = {"id": decision.ref, "page": decision.page}
            return [
                {"type": "text", "text": "Let me look at the early log."},
                {"type": "tool_use", "id": f"toolu_recall{next(ids)}", "name": RECALL_TOOL, "input": call},
            ]
        return [{"type": "text", "text": decision.text}]

    return script


def messages_history(results: int = 14) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Read the logs, then tell me the deploy code."}
    ]
    for k in range(results):
        text = filler(k) if k else f"{filler(k, 40)} The deploy code is {FACT}. {filler(k, 40)}"
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "read_log", "input": {"n": k}}
        result: list[dict[str, Any]] = [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": text}]
        if k == results - 1:
            result.append({"type": "text", "text": "So, what is the deploy code?"})
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": result}]
    return messages


MESSAGES_TOOLS = [{"name": "read_log", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def messages_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeAnthropic, str]]:
    fake = FakeAnthropic([FakeClaude("recall-claude", window_tokens=WINDOW)])
    table = tmp_path_factory.mktemp("recall-messages") / "models.toml"
    table.write_text(
        f'[models]\n"recall-claude" = {{ window = {WINDOW}, max_output = 2048, encoding = "estimate" }}\n',
        encoding="utf-8",
    )
    with fake.serve() as upstream, serve_proxy(upstream, models_file=table, **NO_INDEX) as proxy:
        yield fake, proxy


@pytest.mark.parametrize("stream", [False, True])
def test_messages_the_model_recalls_the_fact_with_signed_thinking_kept(
    messages_stack: tuple[FakeAnthropic, str], stream: bool
) -> None:
    fake, proxy = messages_stack
    fake.requests.clear()
    fake.script = messages_recaller(Recaller("deploy"))
    http = anthropic.DefaultHttpxClient(timeout=30)
    client = anthropic.Anthropic(base_url=proxy, api_key="test", max_retries=0, http_client=http)
    options: dict[str, Any] = {
        "model": "recall-claude",
        "max_tokens": 1500,
        "system": "You are a deploy assistant.",
        "messages": messages_history(),
        "tools": MESSAGES_TOOLS,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "extra_headers": NO_SUMMARY,
    }
    try:
        if stream:
            with client.messages.stream(**options) as events:
                seen = list(events)
                message = events.get_final_message()
            assert [e.type for e in seen].count("message_start") == 1
            assert not [
                e for e in seen if e.type == "content_block_start" and e.content_block.type == "tool_use"
            ]
        else:
            raw = client.messages.with_raw_response.create(**options)
            message = raw.parse()
            assert raw.headers["x-context-recalls"] == "1"
    finally:
        fake.script = None
        client.close()
    text = "".join(block.text for block in message.content if block.type == "text")
    assert FACT in text and message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["thinking", "text", "thinking", "text"]
    first, second = fake.client_requests()
    for request in fake.client_requests():
        assert request.status == 200
    assert first.json()["tools"][-1]["name"] == RECALL_TOOL and FACT not in first.body.decode()
    said, answered = second.json()["messages"][-2:]
    assert [b["type"] for b in said["content"]] == ["thinking", "text", "tool_use"]
    assert answered["content"][0]["type"] == "tool_result" and FACT in answered["content"][0]["content"]
    # The client sends the answer back next turn: its signed thinking is still valid.
    follow = {
        **options,
        "messages": [*options["messages"], {"role": "assistant", "content": message.content}],
    }
    follow["messages"].append({"role": "user", "content": "Thanks."})
    with anthropic.Anthropic(base_url=proxy, api_key="test", max_retries=0) as again:
        again.messages.create(**follow)
    assert fake.client_requests()[-1].status == 200


# -- Gemini ------------------------------------------------------------------------------------


def gemini_recaller(recaller: Recaller) -> Any:
    """The Gemini fake's script: a sentence and the recall call, or the answer."""

    def script(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        contents = body.get("contents") or []
        names = {
            d.get("name") for tool in body.get("tools") or [] for d in tool.get("functionDeclarations") or []
        }
        fetched = [
            (part["functionCall"]["args"]["id"], part["functionCall"]["args"].get("page", 1))
            for content in contents
            if content.get("role") == "model"
            for part in content.get("parts") or []
            if isinstance(part.get("functionCall"), dict) and part["functionCall"].get("name") == RECALL_TOOL
        ]
        decision = recaller.decide(json.dumps(contents), offered=RECALL_TOOL in names, fetched=fetched)
        if isinstance(decision, Recall):
            call = {"name": RECALL_TOOL, "args": {"id": decision.ref, "page": decision.page}}
            return [{"text": "Let me look at the early log."}, {"functionCall": call}]
        return [{"text": decision.text}]

    return script


def gemini_history(results: int = 14) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = [
        {"role": "user", "parts": [{"text": "Read the logs, then give the deploy code."}]}
    ]
    for k in range(results):
        text = filler(k) if k else f"{filler(k, 40)} The deploy code is {FACT}. {filler(k, 40)}"
        call = {"name": "read_log", "args": {"n": k}}
        contents += [
            {
                "role": "model",
                "parts": [{"functionCall": call, "thoughtSignature": "skip_thought_signature_validator"}],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "read_log", "response": {"output": text}}}],
            },
        ]
    return contents


@pytest.fixture(scope="module")
def gemini_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeGemini, str]]:
    fake = FakeGemini([FakeGeminiModel("recall-gemini", input_token_limit=WINDOW)])
    table = tmp_path_factory.mktemp("recall-gemini") / "models.toml"
    table.write_text(
        f'[models]\n"recall-gemini" = {{ window = {WINDOW}, max_output = 2048, encoding = "estimate" }}\n',
        encoding="utf-8",
    )
    with fake.serve() as upstream, serve_proxy(upstream, models_file=table, **NO_INDEX) as proxy:
        yield fake, proxy


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_the_model_recalls_the_fact_with_thought_signatures_kept(
    gemini_stack: tuple[FakeGemini, str], stream: bool
) -> None:
    fake, proxy = gemini_stack
    fake.clear()
    fake.script = gemini_recaller(Recaller("deploy"))
    http = httpx.Client(timeout=60)
    options = types.HttpOptions(
        base_url=proxy,
        headers=NO_SUMMARY,
        httpx_client=http,
        retry_options=types.HttpRetryOptions(attempts=1),
    )
    client = genai.Client(api_key="test", http_options=options)
    config = types.GenerateContentConfig(
        system_instruction="You are a deploy assistant.",
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(name="read_log", parameters={"type": "OBJECT"})
                ]
            )
        ],
        thinking_config=types.ThinkingConfig(include_thoughts=True),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    try:
        if stream:
            chunks = list(
                client.models.generate_content_stream(
                    model="recall-gemini", contents=gemini_history(), config=config
                )
            )
            parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
            finish = [c.candidates[0].finish_reason for c in chunks if c.candidates[0].finish_reason]
            assert len(finish) == 1
        else:
            response = client.models.generate_content(
                model="recall-gemini", contents=gemini_history(), config=config
            )
            parts = response.candidates[0].content.parts
    finally:
        fake.script = None
        http.close()
    assert not [p for p in parts if p.function_call is not None]
    assert FACT in "".join(p.text or "" for p in parts if not p.thought)
    first, second = fake.client_requests()
    for request in fake.client_requests():
        assert request.status == 200 and request.prompt_tokens is not None and request.prompt_tokens <= WINDOW
    sent = first.json()
    assert (
        sent["tools"][-1]["functionDeclarations"][0]["name"] == RECALL_TOOL
        and FACT not in first.body.decode()
    )
    said, answered = second.json()["contents"][-2:]
    calls = [p for p in said["parts"] if "functionCall" in p]
    assert calls[0]["functionCall"]["name"] == RECALL_TOOL and calls[0].get("thoughtSignature")
    assert FACT in answered["parts"][0]["functionResponse"]["response"]["output"]


# -- the defined answers: mixed calls, a miss, pages, a forced choice, recall off -------------


def _chat(proxy: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    headers = {**NO_SUMMARY, **extra.pop("headers", {})}
    with _client(proxy) as client:
        if extra.get("stream"):
            return list(
                client.chat.completions.create(
                    model="recall-model", messages=messages, tools=TOOLS, extra_headers=headers, **extra
                )
            )
        return client.chat.completions.with_raw_response.create(
            model="recall-model", messages=messages, tools=TOOLS, extra_headers=headers, **extra
        )


@pytest.mark.parametrize("stream", [False, True])
def test_a_mixed_answer_gives_the_client_its_own_calls_and_drops_the_recall_call(
    chat_stack: tuple[FakeUpstream, str], stream: bool
) -> None:
    fake, proxy = chat_stack
    fake.clear()
    fake.recaller = Recaller("deploy", text_before_call="Checking.", also_call="read_log")
    try:
        got = _chat(proxy, agent_history(), stream=stream)
    finally:
        fake.recaller = None
    if stream:
        deltas = [c.choices[0].delta for c in got if c.choices]
        calls = [call for d in deltas for call in d.tool_calls or []]
        assert {call.index for call in calls} == {0} and calls[0].function.name == "read_log"
        assert "".join(call.function.arguments or "" for call in calls) == '{"n": 99}'
        assert [c.choices[0].finish_reason for c in got if c.choices and c.choices[0].finish_reason] == [
            "tool_calls"
        ]
    else:
        assert got.headers["x-context-recalls"] == "0"
        message = got.parse().choices[0].message
        assert [call.function.name for call in message.tool_calls] == ["read_log"]
        assert message.content == "Checking." and got.parse().choices[0].finish_reason == "tool_calls"
    assert len(fake.client_requests()) == 1  # no round: the client answers its own call first
    _within_window(fake)


def test_an_unknown_id_is_answered_as_a_miss_and_the_model_goes_on(
    chat_stack: tuple[FakeUpstream, str],
) -> None:
    fake, proxy = chat_stack
    fake.clear()
    history = agent_history()
    # The client's own text names an id the proxy never made (say, a summary's of another session).
    history[1] = {**history[1], "content": history[1]["content"] + " (see recall id 0123456789ab)"}
    fake.recaller = Recaller("deploy")
    try:
        raw = _chat(proxy, history)
    finally:
        fake.recaller = None
    assert raw.headers["x-context-recalls"] == "2"
    assert FACT in raw.parse().choices[0].message.content
    miss = fake.client_requests()[1].json()["messages"][-1]["content"]
    assert miss.startswith("[ctxproxy: recalled nothing for recall id 0123456789ab")
    _within_window(fake)


def test_a_recall_larger_than_the_room_comes_in_pages(chat_stack: tuple[FakeUpstream, str]) -> None:
    fake, proxy = chat_stack
    fake.clear()
    history = agent_history()
    # The fact sits on the second page of a result far larger than the window.
    big = f"{filler(0, 110)} The deploy code is {FACT}. {filler(1, 400)}"
    history[3] = {**history[3], "content": big}
    fake.recaller = Recaller("deploy")
    try:
        raw = _chat(proxy, history)
    finally:
        fake.recaller = None
    assert FACT in raw.parse().choices[0].message.content
    asked = [
        json.loads(r.json()["messages"][-2]["tool_calls"][0]["function"]["arguments"])
        for r in fake.client_requests()[1:]
    ]
    assert [a["page"] for a in asked] == [1, 2] and len({a["id"] for a in asked}) == 1
    heads = [r.json()["messages"][-1]["content"].partition("]")[0] for r in fake.client_requests()[1:]]
    totals = {re.search(r"page [12] of ([0-9]+)", head).group(1) for head in heads}  # type: ignore[union-attr]
    assert len(totals) == 1 and int(totals.pop()) >= 3, heads  # pages of one fixed size
    assert raw.headers["x-context-recalls"] == "2"
    _within_window(fake)


@pytest.mark.parametrize("headers", [{"X-Context-Recall": "off"}, {}])
def test_a_forced_choice_or_recall_off_is_never_offered_the_tool(
    chat_stack: tuple[FakeUpstream, str], headers: dict[str, str]
) -> None:
    fake, proxy = chat_stack
    fake.clear()
    extra: dict[str, Any] = {"headers": headers}
    if not headers:
        extra["tool_choice"] = "required"
    raw = _chat(proxy, agent_history(), **extra)
    assert "x-context-recalls" not in raw.headers
    (sent,) = fake.client_requests()
    names = [t["function"]["name"] for t in sent.json()["tools"]]
    assert names == ["read_log"]
    # A forced choice still names what was removed by its id (the same bytes as the next request's).
    assert ("recall id" in sent.body.decode()) is (not headers)
