"""The strict fake Gemini upstream refuses what the real API (and our stricter promise) refuses, frames
its streams as Google does, and serves the official ``google-genai`` SDK."""

from __future__ import annotations

import base64
import copy
import json
import math
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from app.compaction.prompts import summarize_messages
from app.core.dialects.gemini import GEMINI
from tests.fake_gemini_upstream import (
    ALTERNATE,
    CALL_AFTER,
    CORRUPTED,
    MODEL_TURN,
    RESPONSE_AFTER,
    SAME_COUNT,
    FakeGemini,
    FakeGeminiModel,
    Reader,
    Refused,
    check_structure,
)

MODEL = "gemini-test"
MODELS = [
    FakeGeminiModel(MODEL, input_token_limit=400, output_token_limit=1000),
    FakeGeminiModel("gemini-big"),
    FakeGeminiModel("gemini-lenient", requires_signatures=False, thinking=False),
]
READ = {"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}


@pytest.fixture
def fake() -> FakeGemini:
    return FakeGemini(MODELS)


def post(
    fake: FakeGemini, body: Any, *, model: str = "gemini-big", verb: str = "generateContent", query: str = ""
) -> httpx.Response:
    transport = httpx.MockTransport(fake.handler)
    with httpx.Client(transport=transport, base_url="http://fake.invalid") as client:
        url = f"/v1beta/models/{model}:{verb}" + (f"?{query}" if query else "")
        return client.post(url, json=body, headers={"x-goog-api-key": "k"})


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def loop(fake: FakeGemini, files: list[str], *, model: str = "gemini-big") -> dict[str, Any]:
    """A reading session run against the fake itself, replaying every answer as a client does."""
    fake.script = Reader(files)
    body: dict[str, Any] = {"contents": [user("read them all")], "tools": [READ]}
    for _ in files:
        answer = post(fake, body, model=model).json()
        content = answer["candidates"][0]["content"]
        call = next(p["functionCall"] for p in content["parts"] if "functionCall" in p)
        result = {"functionResponse": {"name": "read_file", "response": {"output": f"FACT-{call['args']}"}}}
        body["contents"] += [content, {"role": "user", "parts": [result]}]
    return body


def forged(signature: str) -> str:
    """The signature with one byte changed (still valid base64)."""
    raw = bytearray(base64.b64decode(signature))
    raw[5] ^= 1
    return base64.b64encode(bytes(raw)).decode()


def refusal(fake: FakeGemini, body: dict[str, Any], *, model: str = "gemini-big") -> str:
    with pytest.raises(Refused) as caught:
        check_structure(body, fake.model(model), fake.signer)
    return caught.value.message


def test_a_genuine_signed_session_passes_and_its_calls_are_signed(fake: FakeGemini) -> None:
    body = loop(fake, ["a", "b", "c"])
    check_structure(body, fake.model("gemini-big"), fake.signer)
    calls = [p for c in body["contents"] if c["role"] == "model" for p in c["parts"]]
    assert len(calls) == 3 and all(len(base64.b64decode(p["thoughtSignature"])) == 32 for p in calls)
    assert post(fake, body).status_code == 200


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p["functionCall"]["args"].update(file_path="z"),  # an edited call
        lambda p: p["functionCall"]["args"].update(start_line=1),
        lambda p: p.update(thoughtSignature=forged(p["thoughtSignature"])),
    ],
)
def test_an_edited_signed_part_is_corrupted(fake: FakeGemini, edit: Any) -> None:
    body = loop(fake, ["a", "b"])
    edited = copy.deepcopy(body)
    edit(edited["contents"][1]["parts"][0])
    assert refusal(fake, edited) == CORRUPTED
    answer = post(fake, edited)
    assert answer.status_code == 400
    assert answer.json() == {"error": {"code": 400, "message": CORRUPTED, "status": "INVALID_ARGUMENT"}}


def test_a_signature_from_another_model_is_corrupted_but_ids_clients_add_are_not_signed(
    fake: FakeGemini,
) -> None:
    body = loop(fake, ["a"])
    with_id = copy.deepcopy(body)
    with_id["contents"][1]["parts"][0]["functionCall"]["id"] = "read_file_123_0"  # as gemini-cli does
    check_structure(with_id, fake.model("gemini-big"), fake.signer)
    assert refusal(fake, body, model=MODEL) == CORRUPTED


def test_signed_thoughts_and_texts_verify_and_their_edits_do_not(fake: FakeGemini) -> None:
    body = {
        "contents": [user("hi FACT-1")],
        "generationConfig": {"thinkingConfig": {"includeThoughts": True}},
    }
    content = post(fake, body).json()["candidates"][0]["content"]
    thought, *_, last = content["parts"]
    assert thought["thought"] is True and "thoughtSignature" in thought and "thoughtSignature" in last
    replay = {"contents": [*body["contents"], content, user("again")]}
    check_structure(replay, fake.model("gemini-big"), fake.signer)
    edited = copy.deepcopy(replay)
    edited["contents"][1]["parts"][0]["text"] += " (shortened)"
    assert refusal(fake, edited) == CORRUPTED


def test_the_current_turn_needs_its_signatures_and_older_turns_do_not(fake: FakeGemini) -> None:
    body = loop(fake, ["a", "b"])
    unsigned = copy.deepcopy(body)
    del unsigned["contents"][3]["parts"][0]["thoughtSignature"]
    message = refusal(fake, unsigned)
    assert message.startswith("Function call is missing a thought_signature in functionCall parts.")
    assert "`default_api:read_file`, position 1" in message
    placeholder = copy.deepcopy(unsigned)
    placeholder["contents"][3]["parts"][0]["thoughtSignature"] = "skip_thought_signature_validator"
    check_structure(placeholder, fake.model("gemini-big"), fake.signer)
    older = {**unsigned, "contents": [*unsigned["contents"], {"role": "model", "parts": [{"text": "ok"}]}]}
    older["contents"].append(user("next question"))  # a new turn: the old calls are history now
    check_structure(older, fake.model("gemini-big"), fake.signer)
    bare = copy.deepcopy(unsigned)
    del bare["contents"][1]["parts"][0]["thoughtSignature"]
    check_structure(bare, fake.model("gemini-lenient"), fake.signer)  # Gemini 2.5 does not ask


def call(name: str, call_id: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"name": name, "args": {}}}
    if call_id:
        part["functionCall"]["id"] = call_id
    return part


def answer(name: str, response_id: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionResponse": {"name": name, "response": {"output": "r"}}}
    if response_id:
        part["functionResponse"]["id"] = response_id
    return part


@pytest.mark.parametrize(
    ("contents", "wording"),
    [
        ([{"role": "model", "parts": [{"text": "hi"}]}], ALTERNATE),
        ([{"role": "model", "parts": [call("f")]}, {"role": "user", "parts": [answer("f")]}], CALL_AFTER),
        ([user("a"), user("b")], ALTERNATE),
        ([user("a"), {"role": "user", "parts": []}], "contents.parts must not be empty"),
        (
            [user("a"), {"role": "assistant", "parts": [{"text": "b"}]}],
            "Please use a valid role: user, model.",
        ),
        ([user("a"), {"role": "model", "parts": [call("f"), call("g")]}, user("b")], SAME_COUNT),
        (
            [user("a"), {"role": "model", "parts": [call("f")]}, {"role": "user", "parts": [answer("g")]}],
            SAME_COUNT,
        ),
        (
            [
                user("a"),
                {"role": "model", "parts": [call("f", "1")]},
                {"role": "user", "parts": [answer("f", "2")]},
            ],
            SAME_COUNT,
        ),
        ([{"role": "user", "parts": [answer("f")]}], RESPONSE_AFTER),
        ([], "contents is not specified"),
    ],
)
def test_structural_rules_are_refused_with_googles_wording(
    fake: FakeGemini, contents: list[dict[str, Any]], wording: str
) -> None:
    reply = post(fake, {"contents": contents}, model="gemini-lenient")
    assert reply.status_code == 400
    assert wording in reply.json()["error"]["message"]
    assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_a_part_after_function_responses_is_refused_unless_the_model_takes_it(fake: FakeGemini) -> None:
    loop = [user("a"), {"role": "model", "parts": [call("f")]}]
    after = {"contents": [*loop, {"role": "user", "parts": [answer("f"), {"text": "note"}]}]}
    before = {"contents": [*loop, {"role": "user", "parts": [{"text": "note"}, answer("f")]}]}
    assert post(fake, after, model="gemini-lenient").json()["error"]["message"] == MODEL_TURN
    assert post(fake, before, model="gemini-lenient").status_code == 200
    taking = FakeGemini([FakeGeminiModel("gemini-2", requires_signatures=False, parts_after_responses=True)])
    assert post(taking, after, model="gemini-2").status_code == 200


def test_function_responses_pair_by_id_else_by_name_in_order(fake: FakeGemini) -> None:
    by_id = [
        user("a"),
        {"role": "model", "parts": [call("f", "1"), call("f", "2")]},
        {"role": "user", "parts": [answer("f", "2"), answer("f", "1")]},
    ]
    by_name = [
        user("a"),
        {"role": "model", "parts": [call("f"), call("g")]},
        {"role": "user", "parts": [answer("g"), answer("f", "x")]},
    ]
    for contents in (by_id, by_name):
        assert post(fake, {"contents": contents}, model="gemini-lenient").status_code == 200


def test_the_window_counts_the_input_only_and_refuses_with_geminis_wording(fake: FakeGemini) -> None:
    small = {"contents": [user("w" * 1200)], "generationConfig": {"maxOutputTokens": 1000}}
    assert fake.count(small, fake.model(MODEL)) <= 400  # output cap not counted against the window
    assert post(fake, small, model=MODEL).status_code == 200
    big = {"contents": [user("w" * 1600)]}
    reply = post(fake, big, model=MODEL)
    tokens = fake.count(big, fake.model(MODEL))
    assert reply.status_code == 400 and tokens > 400
    message = f"The input token count ({tokens}) exceeds the maximum number of tokens allowed (400)."
    assert reply.json() == {"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}
    too_long = {"contents": [user("hi")], "generationConfig": {"maxOutputTokens": 1001}}
    assert "maxOutputTokens value of 1001" in post(fake, too_long, model=MODEL).json()["error"]["message"]
    streamed = post(fake, big, model=MODEL, verb="streamGenerateContent")
    assert streamed.status_code == 400 and streamed.json()[0]["error"]["message"] == message


def test_sse_streams_are_crlf_framed_with_usage_on_every_chunk_and_no_done(fake: FakeGemini) -> None:
    body = {"contents": [user("hi FACT-7")]}
    reply = post(fake, body, verb="streamGenerateContent", query="alt=sse")
    assert reply.headers["content-type"].startswith("text/event-stream")
    frames = reply.content.split(b"\r\n\r\n")
    assert frames[-1] == b"" and len(frames) > 2 and b"[DONE]" not in reply.content
    chunks = [json.loads(f.removeprefix(b"data: ")) for f in frames[:-1]]
    tokens = fake.count(body, fake.model("gemini-big"))
    assert all(c["usageMetadata"]["promptTokenCount"] == tokens for c in chunks)
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    text = "".join(p["text"] for c in chunks for p in c["candidates"][0]["content"]["parts"])
    assert "FACT-7" in text


def test_array_streams_are_one_json_array(fake: FakeGemini) -> None:
    reply = post(fake, {"contents": [user("hi")]}, verb="streamGenerateContent")
    assert reply.headers["content-type"].startswith("application/json")
    chunks = reply.json()
    assert isinstance(chunks, list) and len(chunks) >= 2
    assert all("usageMetadata" in c for c in chunks)


def test_count_tokens_models_and_keys(fake: FakeGemini) -> None:
    body = {"contents": [user("w" * 400)]}
    tokens = fake.count(body, fake.model("gemini-big"))
    assert post(fake, body, verb="countTokens").json()["totalTokens"] == tokens
    wrapped = {"generateContentRequest": {"model": "models/gemini-big", **body}}
    assert post(fake, wrapped, verb="countTokens").json()["totalTokens"] == tokens
    transport = httpx.MockTransport(fake.handler)
    with httpx.Client(transport=transport, base_url="http://fake.invalid") as client:
        listed = client.get("/v1beta/models?key=k").json()["models"]
        assert {m["name"] for m in listed} == {f"models/{m.name}" for m in MODELS}
        one = client.get("/v1/models/gemini-test", headers={"x-goog-api-key": "k"}).json()
        assert (one["inputTokenLimit"], one["outputTokenLimit"]) == (400, 1000)
        assert client.get("/v1beta/models/nope?key=k").json()["error"]["status"] == "NOT_FOUND"
        assert client.get("/v1beta/models").status_code == 403  # no key at all
    keyed = FakeGemini(MODELS, api_key="right")
    transport = httpx.MockTransport(keyed.handler)
    with httpx.Client(transport=transport, base_url="http://fake.invalid") as client:
        assert client.get("/v1beta/models?key=right").status_code == 200
        wrong = client.get("/v1beta/models", headers={"x-goog-api-key": "wrong"})
        assert wrong.status_code == 400 and "API key not valid" in wrong.json()["error"]["message"]
    assert [r.api_key for r in keyed.requests] == ["right", "wrong"]
    assert [r.status for r in keyed.requests] == [200, 400]


def test_the_reader_reads_one_file_per_step_and_answers_only_from_its_input(fake: FakeGemini) -> None:
    files = ["/p/a.txt", "/p/b.txt"]
    fake.script = Reader(files)
    body: dict[str, Any] = {"contents": [user("go")], "tools": [READ]}
    asked = []
    for _ in range(2):
        content = post(fake, body).json()["candidates"][0]["content"]
        (part,) = content["parts"]
        assert set(part) == {"functionCall", "thoughtSignature"}  # no restated facts
        asked.append(part["functionCall"]["args"]["file_path"])
        secret = f"FACT-{len(asked)}"
        result = {"functionResponse": {"name": "read_file", "response": {"output": f"text {secret} text"}}}
        body["contents"] += [content, {"role": "user", "parts": [result]}]
    assert asked == files
    final = post(fake, body).json()["candidates"][0]["content"]["parts"]
    assert "FACT-1 FACT-2" in " ".join(p["text"] for p in final)
    # what the model no longer sees, it does not know: the first file's result dropped with its call
    forgot = {**body, "contents": [body["contents"][0], *body["contents"][3:]]}
    final = post(fake, forgot).json()["candidates"][0]["content"]["parts"]
    text = " ".join(p["text"] for p in final)
    assert "FACT-2" in text and "FACT-1" not in text


def summary_body(text: str, *, cap: int) -> dict[str, Any]:
    """A summary request as the proxy's Gemini dialect writes one."""
    return GEMINI.summary_request(summarize_messages(text), model="gemini-big", max_tokens=cap).body


def test_summary_requests_get_the_shared_summarizer_capped_and_counted(fake: FakeGemini) -> None:
    fake.script = Reader(["/p/a.txt"])  # a scripted model never answers a summary request
    lines = [f"[tool result for read_file [c{k}]]: filler line {k} of the file" for k in range(40)]
    lines[17] = "[tool result for read_file [c17]]: The secret of part 3 is FACT-part3-42."
    body = summary_body("\n\n".join(lines), cap=60)
    reply = post(fake, body)
    assert reply.status_code == 200
    parts = reply.json()["candidates"][0]["content"]["parts"]
    text = "".join(p["text"] for p in parts if not p.get("thought"))
    assert "FACT-part3-42" in text and "functionCall" not in json.dumps(parts)
    assert math.ceil(len(text) / 4) <= 60  # the cap, counted with the fake's own tokenizer
    tokens = fake.count(body, fake.model("gemini-big"))
    assert (fake.summary_calls, fake.summary_prompt_tokens) == (1, tokens)
    client = post(fake, {"contents": [user("go")], "tools": [READ]})
    assert client.status_code == 200
    assert [r.body for r in fake.summary_requests()] == [fake.requests[0].body]
    assert [r.body for r in fake.client_requests()] == [fake.requests[1].body]
    tiny = summary_body("\n\n".join(lines), cap=8)
    tiny_text = "".join(p["text"] for p in post(fake, tiny).json()["candidates"][0]["content"]["parts"])
    assert math.ceil(len(tiny_text) / 4) <= 8 and len(tiny_text) < len(text)


def test_summary_requests_are_checked_like_any_request(fake: FakeGemini) -> None:
    body = summary_body("[user]: remember FACT-9", cap=100)
    transport = httpx.MockTransport(fake.handler)
    with httpx.Client(transport=transport, base_url="http://fake.invalid") as client:
        keyless = client.post("/v1beta/models/gemini-big:generateContent", json=body)
    assert keyless.status_code == 403 and fake.summary_calls == 0
    over = summary_body("w" * 2000, cap=100)
    assert post(fake, over, model=MODEL).json()["error"]["status"] == "INVALID_ARGUMENT"
    assert fake.summary_calls == 0  # refused before it was answered
    fake.summary_mode = "missing"
    assert post(fake, body).status_code == 404 and fake.summary_calls == 1
    fake.clear()
    assert fake.requests == [] and fake.summary_calls == 0


def test_the_default_answer_names_the_facts_of_the_whole_input(fake: FakeGemini) -> None:
    body = {"systemInstruction": {"parts": [{"text": "FACT-sys"}]}, "contents": [user("FACT-user")]}
    text = " ".join(p["text"] for p in post(fake, body).json()["candidates"][0]["content"]["parts"])
    assert "FACT-sys" in text and "FACT-user" in text


@pytest.fixture
def served() -> Iterator[tuple[FakeGemini, genai.Client]]:
    fake = FakeGemini(MODELS, api_key="sdk-key")
    with fake.serve() as url:
        client = genai.Client(api_key="sdk-key", http_options=types.HttpOptions(base_url=url))
        yield fake, client


def test_the_official_sdk_talks_to_the_fake(served: tuple[FakeGemini, genai.Client]) -> None:
    fake, client = served
    reply = client.models.generate_content(model="gemini-big", contents="Say FACT-42")
    assert "FACT-42" in (reply.text or "")
    assert reply.usage_metadata is not None and reply.usage_metadata.prompt_token_count
    streamed = list(client.models.generate_content_stream(model="gemini-big", contents="Say FACT-43"))
    assert len(streamed) >= 2 and "FACT-43" in "".join(c.text or "" for c in streamed)
    assert all(c.usage_metadata and c.usage_metadata.prompt_token_count for c in streamed)
    count = client.models.count_tokens(model="gemini-big", contents="w" * 400)
    assert count.total_tokens == fake.count({"contents": [user("w" * 400)]}, fake.model("gemini-big"))
    info = client.models.get(model="gemini-test")
    assert (info.input_token_limit, info.output_token_limit) == (400, 1000)
    assert fake.requests[1].query == "alt=sse" and fake.requests[1].headers["x-goog-api-key"] == "sdk-key"


def test_the_sdk_replays_signed_tool_calls_and_sees_overflow_errors(
    served: tuple[FakeGemini, genai.Client],
) -> None:
    fake, client = served
    fake.script = Reader(["/p/a.txt"])
    tool = types.Tool(
        function_declarations=[
            types.FunctionDeclaration(name="read_file", parameters_json_schema={"type": "object"})
        ]
    )
    config = types.GenerateContentConfig(
        tools=[tool], automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True)
    )
    history: list[Any] = [types.Content(role="user", parts=[types.Part(text="read it")])]
    first = client.models.generate_content(model="gemini-big", contents=history, config=config)
    assert first.candidates and first.candidates[0].content
    content = first.candidates[0].content
    assert content.parts and content.parts[0].thought_signature  # bytes, replayed as base64
    history += [
        content,
        types.Content(
            role="user",
            parts=[types.Part.from_function_response(name="read_file", response={"output": "FACT-9"})],
        ),
    ]
    final = client.models.generate_content(model="gemini-big", contents=history, config=config)
    assert "FACT-9" in (final.text or "")
    with pytest.raises(genai_errors.ClientError) as caught:
        client.models.generate_content(model="gemini-test", contents="w" * 1800)
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert "exceeds the maximum number of tokens allowed (400)" in str(caught.value.message)
