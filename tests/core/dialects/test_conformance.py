"""The contract every registered wire API passes: one suite, parametrized over ``DIALECTS``.

A dialect plugs in with one ``Kit`` entry below (its samples, a conversation that must be cut, its
fake upstream's real overflow and usage answers, the keys of its error shape); a dialect without a
kit fails ``test_every_registered_dialect_has_a_kit``. Warnings are errors in this suite, so a
fitted body that trips the final structural guard (``StructureGuardWarning``) fails here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from app.core.budget import Policy
from app.core.dialect import Dialect, ErrorInfo, error_info
from app.core.dialects import DIALECTS
from app.core.errors import CannotFit, InvalidRequest
from app.core.fit import plan_request
from app.core.registry import ModelSpec
from app.core.routes import RouteMatch, RouteTable, detect
from tests.core.dialects import gemini_kit as gk
from tests.core.dialects import responses_kit as rk
from tests.core.fakes import FakeMessageCounter, tool_exchange, words
from tests.fake_anthropic_upstream import FakeAnthropic, FakeClaude
from tests.fake_gemini_upstream import FakeGemini, FakeGeminiModel
from tests.fake_responses_upstream import FakeResponsesUpstream
from tests.fake_upstream import FakeModel, context_error

SPEC = ModelSpec(name="conformance", window_tokens=1_000_000, max_output_tokens=4096, encoding="estimate")
STATUSES = (400, 401, 404, 413, 429, 500, 502, 503, 504)

Answer = tuple[int, bytes | Mapping[str, Any]]


@dataclass(frozen=True)
class Kit:
    """What the suite needs to hold one dialect to the contract."""

    samples: Callable[[], list[dict[str, Any]]]  # valid bodies, at least one with tool calls
    long: Callable[[], dict[str, Any]]  # a conversation far over ``CAP_TOKENS``
    overflow: Callable[[], list[Answer]]  # its fake upstream's own context-length answers
    not_overflow: Callable[[], list[Answer]]  # its fake upstream's other errors
    usage: Callable[[], list[tuple[Mapping[str, Any], int]]]  # answers/events and their prompt count
    error_keys: frozenset[str]  # the top-level keys of its error shape
    headers: Mapping[str, str] = field(default_factory=dict)  # what its clients send (detection)
    # Its strict fake upstream's status for a body (structure, pairing, signatures), when the fake
    # checks structure (chat's fake does not: ``Dialect.problems`` is the check there).
    upstream_status: Callable[[dict[str, Any]], int] | None = None


CAP_TOKENS = 600


# -- chat ---------------------------------------------------------------------------------------


def chat_samples() -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "be terse"}, {"role": "user", "content": "list files"}]
    return [
        {"model": "m", "messages": messages},
        {"model": "m", "messages": [*messages, *tool_exchange(["c1", "c2"], 5)], "stream": True},
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 9,
        },
    ]


def chat_long() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be terse"}]
    for k in range(12):
        messages.append({"role": "user", "content": f"question {k} " + words(40, f"q{k}")})
        messages += tool_exchange([f"c{k}"], 120, tag=f"t{k}")
        messages.append({"role": "assistant", "content": words(30, f"a{k}")})
    messages.append({"role": "user", "content": "the last question"})
    return {"model": "m", "messages": messages}


def chat_overflow() -> list[Answer]:
    answers: list[Answer] = []
    for kind in ("openai", "vllm", "llamacpp"):
        model = FakeModel("m", window_tokens=1000, dialect=kind)  # type: ignore[arg-type]
        error = context_error(model, prompt_tokens=1500, output_tokens=10)
        assert error is not None
        answers.append((400, json.dumps(error).encode()))
    return answers


def chat_usage() -> list[tuple[Mapping[str, Any], int]]:
    answer = {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 321, "completion_tokens": 1, "total_tokens": 322},
    }
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": answer["usage"]}
    return [(answer, 321), (chunk, 321)]


# -- responses -----------------------------------------------------------------------------------


def responses_samples() -> list[dict[str, Any]]:
    return [
        rk.body("hello"),
        rk.body(
            [rk.user("list files"), rk.call("c1"), rk.output("c1", "a b"), rk.said("done")], instructions="x"
        ),
        rk.body([rk.user("think"), rk.reasoning("rs_1"), rk.call("c2"), rk.output("c2", "r")], stream=True),
    ]


def responses_long() -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for k in range(12):
        items += [rk.user(f"question {k} " + rk.words(40, f"q{k}")), rk.call(f"c{k}")]
        items += [rk.output(f"c{k}", rk.words(120, f"o{k}")), rk.said(rk.words(30, f"a{k}"), item_id=f"m{k}")]
    return rk.body([*items, rk.user("the last question")], instructions="be terse")


def responses_fake() -> FakeResponsesUpstream:
    return FakeResponsesUpstream([FakeModel("gpt-small", window_tokens=50)])


def responses_overflow() -> list[Answer]:
    fake = responses_fake()
    raw = json.dumps(rk.body([rk.user(rk.words(200))], model="gpt-small")).encode()
    refused = fake.answer("POST", "/v1/responses", {}, raw)
    fake.overflow_in_stream = True
    streamed = json.dumps(rk.body([rk.user(rk.words(200))], model="gpt-small", stream=True)).encode()
    failed = fake.answer("POST", "/v1/responses", {}, streamed)
    assert refused.status == 400 and failed.status == 200
    return [(refused.status, refused.body), (failed.status, failed.body)]


def responses_not_overflow() -> list[Answer]:
    missing = responses_fake().answer(
        "POST", "/v1/responses", {}, json.dumps(rk.body("hi", model="nope")).encode()
    )
    return [(missing.status, missing.body)]


def responses_status(body: dict[str, Any]) -> int:
    fake = FakeResponsesUpstream([FakeModel(str(body["model"]), window_tokens=1_000_000)])
    return fake.answer("POST", "/v1/responses", {}, json.dumps(body).encode()).status


def responses_usage() -> list[tuple[Mapping[str, Any], int]]:
    fake = FakeResponsesUpstream([FakeModel("gpt-big", window_tokens=100_000)])
    answer = json.loads(
        fake.answer("POST", "/v1/responses", {}, json.dumps(rk.body("hi", model="gpt-big")).encode()).body
    )
    prompt = fake.requests[-1].prompt_tokens
    assert prompt is not None
    return [(answer, prompt), ({"type": "response.completed", "response": answer}, prompt)]


# -- messages ------------------------------------------------------------------------------------


def messages_samples() -> list[dict[str, Any]]:
    use = {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "file a"}
    return [
        {
            "model": "claude-test",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "hi"}],
            "system": "x",
        },
        {
            "model": "claude-test",
            "max_tokens": 50,
            "messages": [
                {"role": "user", "content": "read a"},
                {"role": "assistant", "content": [{"type": "text", "text": "reading"}, use]},
                {"role": "user", "content": [result]},
            ],
            "stream": True,
        },
    ]


def messages_long() -> dict[str, Any]:
    wire: list[dict[str, Any]] = []
    for k in range(12):
        use = {"type": "tool_use", "id": f"c{k}", "name": "read", "input": {"path": f"p{k}"}}
        wire.append({"role": "user", "content": f"question {k} " + words(40, f"q{k}")})
        wire.append({"role": "assistant", "content": [{"type": "text", "text": words(5, f"a{k}")}, use]})
        result = {"type": "tool_result", "tool_use_id": f"c{k}", "content": words(120, f"r{k}")}
        wire.append({"role": "user", "content": [result]})
        wire.append({"role": "assistant", "content": words(30, f"b{k}")})
    wire.append({"role": "user", "content": "the last question"})
    return {"model": "claude-test", "max_tokens": 100, "system": "be terse", "messages": wire}


def anthropic_fake() -> FakeAnthropic:
    return FakeAnthropic(models=[FakeClaude("claude-small", window_tokens=60), FakeClaude("claude-big")])


def messages_overflow() -> list[Answer]:
    fake = anthropic_fake()
    long = {"model": "claude-small", "max_tokens": 5, "messages": [{"role": "user", "content": words(200)}]}
    tight = {"model": "claude-small", "max_tokens": 50, "messages": [{"role": "user", "content": words(20)}]}
    answers: list[Answer] = []
    for body in (long, tight):
        status, answer = fake.respond("/v1/messages", body)
        assert status == 400 and isinstance(answer, dict)
        answers.append((status, json.dumps(answer).encode()))
    return answers


def messages_not_overflow() -> list[Answer]:
    status, answer = anthropic_fake().respond(
        "/v1/messages", {"model": "nope", "max_tokens": 5, "messages": []}
    )
    assert isinstance(answer, dict)
    return [(status, json.dumps(answer).encode())]


def messages_status(body: dict[str, Any]) -> int:
    return FakeAnthropic(models=[FakeClaude(str(body["model"]), window_tokens=1_000_000)]).respond(
        "/v1/messages", body
    )[0]


def messages_usage() -> list[tuple[Mapping[str, Any], int]]:
    fake = anthropic_fake()
    body = {"model": "claude-big", "max_tokens": 5, "messages": [{"role": "user", "content": "hello there"}]}
    status, answer = fake.respond("/v1/messages", body)
    assert status == 200 and isinstance(answer, dict)
    start = {"type": "message_start", "message": answer}
    return [(answer, fake.count(body)), (start, fake.count(body))]


# -- gemini --------------------------------------------------------------------------------------


def gemini_samples() -> list[dict[str, Any]]:
    system = {"parts": [{"text": "be terse"}]}
    return [
        # The model is in the path; a body may name it too (the dry run and the gateway engine).
        {"model": gk.MODEL, "contents": [gk.user("hi")], "systemInstruction": system},
        gk.body([gk.user("list files"), *gk.step(["ls", "cat"], ["a b", "c"], tag="s1"), gk.said("done")]),
        gk.body(
            [gk.user("think"), *gk.step(["read_file"], ["r"], tag="s2", think=True)],
            generationConfig={"maxOutputTokens": 9, "thinkingConfig": {"includeThoughts": True}},
        ),
    ]


def gemini_long() -> dict[str, Any]:
    contents: list[dict[str, Any]] = []
    for k in range(12):
        contents.append(gk.user(f"question {k} " + words(40, f"q{k}")))
        contents += gk.step(["read_file"], [words(120, f"r{k}")], tag=f"t{k}")
        contents.append(gk.said(words(30, f"a{k}"), signed=True))
    contents.append(gk.user("the last question"))
    return gk.body(contents, systemInstruction={"parts": [{"text": "be terse"}]})


def gemini_fake(window_tokens: int = 1_000_000) -> FakeGemini:
    return FakeGemini([FakeGeminiModel(gk.MODEL, input_token_limit=window_tokens)], signer=gk.SIGNER)


def _gemini_answer(fake: FakeGemini, verb: str, body: dict[str, Any], query: str = "") -> tuple[int, bytes]:
    url = f"http://gemini.test/v1beta/models/{gk.MODEL}:{verb}" + (f"?{query}" if query else "")
    headers = {"x-goog-api-key": "k"}
    answer = fake.handler(httpx.Request("POST", url, json=body, headers=headers))
    return answer.status_code, answer.read()


def gemini_overflow() -> list[Answer]:
    fake = gemini_fake(window_tokens=50)
    long = gk.body([gk.user(words(400))])
    return [
        _gemini_answer(fake, "generateContent", long),
        _gemini_answer(fake, "streamGenerateContent", long),  # the array form: [{"error": ...}]
        _gemini_answer(fake, "streamGenerateContent", long, "alt=sse"),
    ]


def gemini_not_overflow() -> list[Answer]:
    forged = gk.body([gk.user("x"), {"role": "model", "parts": [{"text": "y", "thoughtSignature": "AAAA"}]}])
    missing = FakeGemini([FakeGeminiModel("other")])
    return [
        _gemini_answer(gemini_fake(), "generateContent", forged),  # Corrupted thought signature.
        _gemini_answer(missing, "generateContent", gk.body([gk.user("x")])),  # 404 NOT_FOUND
    ]


def gemini_status(body: dict[str, Any]) -> int:
    return _gemini_answer(gemini_fake(), "generateContent", body)[0]


def gemini_usage() -> list[tuple[Mapping[str, Any], int]]:
    fake = gemini_fake()
    request = gk.body([gk.user("hello there")])
    status, answer = fake.respond("POST", f"/{gk.MODEL}:generateContent", request)
    _, chunks = fake.respond("POST", f"/{gk.MODEL}:streamGenerateContent", request)
    assert status == 200 and isinstance(answer, dict) and isinstance(chunks, list)
    prompt = fake.count(request, fake.model(gk.MODEL))
    return [(answer, prompt), *((chunk, prompt) for chunk in chunks)]


KITS: dict[str, Kit] = {
    "chat": Kit(
        samples=chat_samples,
        long=chat_long,
        overflow=chat_overflow,
        not_overflow=lambda: [(404, b'{"error": {"message": "The model `x` does not exist", "code": null}}')],
        usage=chat_usage,
        error_keys=frozenset({"error"}),
    ),
    "responses": Kit(
        samples=responses_samples,
        long=responses_long,
        overflow=responses_overflow,
        not_overflow=responses_not_overflow,
        usage=responses_usage,
        error_keys=frozenset({"error"}),
        upstream_status=responses_status,
    ),
    "messages": Kit(
        samples=messages_samples,
        long=messages_long,
        overflow=messages_overflow,
        not_overflow=messages_not_overflow,
        usage=messages_usage,
        error_keys=frozenset({"type", "error"}),
        headers={"anthropic-version": "2023-06-01"},
        upstream_status=messages_status,
    ),
    "gemini": Kit(
        samples=gemini_samples,
        long=gemini_long,
        overflow=gemini_overflow,
        not_overflow=gemini_not_overflow,
        usage=gemini_usage,
        error_keys=frozenset({"error"}),
        headers={"x-goog-api-key": "k"},
        upstream_status=gemini_status,
    ),
}

NAMES = sorted(DIALECTS)


@pytest.fixture(params=NAMES)
def api(request: pytest.FixtureRequest) -> tuple[Dialect, Kit]:
    return DIALECTS[request.param], KITS[request.param]


def test_every_registered_dialect_has_a_kit() -> None:
    assert set(KITS) == set(DIALECTS)


def test_the_accounting_view_counts_what_the_plan_counts(api: tuple[Dialect, Kit]) -> None:
    # What learning compares the upstream's usage with: the chat accounting of the view is the
    # plan's own count of the request; a view of the neutral messages carries the tools' price
    # (here 50 more tokens of tools than the samples have) in one priced message (4 tokens more).
    dialect, kit = api
    counter = FakeMessageCounter()
    for body in kit.samples():
        plan = plan_request(body, spec=SPEC, policy=Policy(mode="off"), counter=counter, dialect=dialect)
        view = dialect.accounting_view(body, plan.messages, plan.budget.tool_tokens + 50)
        if view is body:  # the accounting's own shape: its tools are in it
            assert counter.count_request(view) == plan.tokens_before
        else:
            assert counter.count_request(view) == plan.tokens_before + 50 + 4


def test_the_registry_builds_one_route_table_without_clashes() -> None:
    table = RouteTable.of(DIALECTS)
    assert len(table.routes) == sum(len(d.routes) for d in DIALECTS.values())


def test_routes_keys_and_names(api: tuple[Dialect, Kit]) -> None:
    dialect, _kit = api
    assert DIALECTS[dialect.name] is dialect
    assert any(route.kind == "fit" for route in dialect.routes)
    assert dialect.key_slots, "the operator's key goes in the first slot"
    table = RouteTable.of(DIALECTS)
    for route in dialect.routes:
        example = route.template.replace("{", "").replace("}", "")
        matched = table.match(example)
        assert matched is not None and matched.dialect is dialect and matched.route == route
        assert matched.target.path, "every route says where it goes upstream"


def test_render_of_an_unchanged_parse_is_the_same_body(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    for body in [*kit.samples(), kit.long()]:
        parsed = dialect.parse(body)
        assert dialect.render(body, parsed.messages, source=parsed.messages) == body
        plan = plan_request(body, spec=SPEC, policy=Policy(), counter=FakeMessageCounter(), dialect=dialect)
        assert plan.fits and not plan.changed and plan.api == dialect.name
        assert plan.body(body) == body


def test_a_fitted_output_has_no_new_structural_problems(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    body = kit.long()
    before = set(dialect.problems(body))
    plan = plan_request(
        body, spec=SPEC, policy=Policy(), counter=FakeMessageCounter(), dialect=dialect, cap_tokens=CAP_TOKENS
    )
    assert plan.changed and plan.fits and not plan.broken
    fitted = plan.body(body)
    assert set(dialect.problems(fitted)) <= before
    assert plan.tokens_after < plan.tokens_before
    # What it sends is a body of its own API, read again as the same conversation.
    assert dialect.parse(fitted).messages


@pytest.mark.parametrize("name", [name for name in NAMES if KITS[name].upstream_status is not None])
def test_a_fitted_output_is_taken_by_the_apis_strict_fake_upstream(name: str) -> None:
    dialect, kit = DIALECTS[name], KITS[name]
    assert kit.upstream_status is not None
    body = kit.long()
    assert kit.upstream_status(body) == 200  # the input itself is valid
    plan = plan_request(
        body, spec=SPEC, policy=Policy(), counter=FakeMessageCounter(), dialect=dialect, cap_tokens=CAP_TOKENS
    )
    assert plan.changed and kit.upstream_status(plan.body(body)) == 200


def test_samples_are_detected_as_their_own_api(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    for body in [*kit.samples(), kit.long()]:
        assert detect(DIALECTS, body, kit.headers) is dialect


def test_the_model_comes_from_the_request(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    body = kit.samples()[0]
    match = RouteMatch.first(dialect)
    assert dialect.model_of(body, match.params) == body["model"]
    bare = {k: v for k, v in body.items() if k != "model"}
    with pytest.raises(InvalidRequest):
        dialect.model_of(bare, {})
    table = RouteTable.of(DIALECTS)
    for route in dialect.routes:
        if "{model}" in route.template:  # the path names the model: the path's wins
            matched = table.match(route.template.replace("{model}", "from-path"))
            assert matched is not None and dialect.model_of(bare, matched.params) == "from-path"
            assert dialect.model_of(body, matched.params) == "from-path"


@pytest.mark.parametrize("status", STATUSES)
def test_every_error_status_renders_in_the_apis_shape(api: tuple[Dialect, Kit], status: int) -> None:
    dialect, kit = api
    info = ErrorInfo(
        status=status, code="upstream_timeout" if status == 504 else "invalid_request_error", message="m!"
    )
    shaped = dialect.error_body(info)
    assert set(shaped) == kit.error_keys
    assert "m!" in json.dumps(shaped)
    event = dialect.stream_error(info)
    # One SSE event: a blank line ends it (LF, or CRLF as Google frames its events).
    assert event.endswith((b"\n\n", b"\r\n\r\n")) and b"m!" in event
    assert event.startswith((b"data:", b"event:"))
    ending = dialect.json_stream_error(info, started=True)
    assert ending is None or b"m!" in ending


def test_cannot_fit_carries_the_numbers_in_the_apis_shape(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    error = CannotFit(tokens=9000, budget_tokens=7000, window_tokens=8000, reserve_tokens=500, reason="r")
    shaped = dialect.error_body(error_info(error, dialect))
    assert set(shaped) == kit.error_keys and "9000" in json.dumps(shaped)
    # Our own refusal is recognised as an overflow by the same dialect (a client's retry logic).
    assert dialect.overflow(400, json.dumps(shaped).encode()) is not None


def test_overflow_is_recognised_from_the_fake_upstreams_answers(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    for status, answer in kit.overflow():
        assert dialect.overflow(status, answer) is not None, answer
    for status, answer in kit.not_overflow():
        assert dialect.overflow(status, answer) is None, answer


def test_usage_is_read_from_answers_and_events(api: tuple[Dialect, Kit]) -> None:
    dialect, kit = api
    for answer, expected in kit.usage():
        assert dialect.input_tokens_used(answer) == expected
        raw = json.dumps(answer).encode()
        assert all(needle in raw.replace(b": ", b":") or needle in raw for needle in dialect.usage_needles)
    assert dialect.input_tokens_used({"id": "x"}) is None


def test_a_count_answer_reads_back_as_an_upstream_count(api: tuple[Dialect, Kit]) -> None:
    dialect, _kit = api
    assert dialect.upstream_count(dialect.count_answer(1234)) == 1234
    assert dialect.upstream_count({}) is None
