"""The Gemini dialect: parsing, rendering, its rules, errors, usage and counting answers; a fitted
gemini-cli-shaped session checked by the strict fake upstream's own rules."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest

from app.core.budget import Policy
from app.core.conversation import PRICE_KEY, is_opaque, origin_of, priced_view
from app.core.dialect import ErrorInfo, error_info
from app.core.dialects import CHAT, DIALECTS
from app.core.dialects.gemini import (
    GEMINI,
    UNFITTABLE_CACHED,
    array_stream_error,
    counted_request,
    parse_gemini,
    status_name,
)
from app.core.dialects.gemini_media import (
    IMAGE_FLOOR_TOKENS,
    IMAGE_UNKNOWN_TOKENS,
    image_tokens,
    media_tokens,
)
from app.core.dialects.gemini_wire import SEPARATOR_TEXT, pair_responses
from app.core.endpoints import UpstreamTarget
from app.core.errors import CannotFit, InvalidRequest
from app.core.fit import plan_request
from app.core.overflow import classify_overflow
from app.core.routes import RouteTable, detect
from app.core.strategies import IMAGE_PLACEHOLDER
from tests.core.dialects.gemini_kit import (
    PNG_DATA,
    call_part,
    dumps,
    fit,
    result_part,
    said,
    spec,
    step,
    strict_check,
    thought,
    user,
    words,
)
from tests.core.fakes import FakeMessageCounter

SYSTEM = {"parts": [{"text": "You are a CLI agent."}]}


def parse(request: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return tuple(parse_gemini(request, model="gemini-test", stream=False).messages)


def test_parse_maps_contents_onto_neutral_messages() -> None:
    request = {
        "systemInstruction": SYSTEM,
        "contents": [
            user("context", "read the files"),
            *step(["read_file", "read_file"], ["one", "two"], tag="s1"),
            said("done"),
        ],
    }
    system, task, calls, first, second, done = parse(request)
    assert system["role"] == "system" and origin_of(system) == ((-1, 0),)
    assert task["role"] == "user" and [p["text"] for p in task["content"]] == ["context", "read the files"]
    assert calls["role"] == "assistant" and is_opaque(calls)  # the step's first call is signed
    assert [c["function"]["name"] for c in calls["tool_calls"]] == ["read_file", "read_file"]
    assert json.loads(calls["tool_calls"][0]["function"]["arguments"]) == {"n": "s1.0"}
    assert (first["role"], first["content"], first["name"]) == ("tool", "one", "read_file")
    assert [first["tool_call_id"], second["tool_call_id"]] == [c["id"] for c in calls["tool_calls"]]
    assert not is_opaque(first)  # results are not signed: prunable
    assert origin_of(calls) == ((1, 0), (1, 1)) and origin_of(second) == ((2, 1),)
    assert done["role"] == "assistant" and done["content"] == "done"  # one text part: its string


def test_a_changed_one_text_content_or_system_instruction_keeps_its_part() -> None:
    request = {
        "systemInstruction": {"parts": [{"text": "long rules", "x": 1}]},  # not plain: a list
        "contents": [user("first question"), said("answer"), user("now?")],
    }
    plain = {**request, "systemInstruction": {"role": "system", "parts": [{"text": "long rules"}]}}
    messages = parse(plain)
    assert messages[0]["content"] == "long rules" and messages[1]["content"] == "first question"
    changed = [{**messages[0], "content": "short"}, {**messages[1], "content": "first"}, *messages[2:]]
    rendered = GEMINI.render(plain, changed, source=messages)
    assert rendered["systemInstruction"] == {"role": "system", "parts": [{"text": "short"}]}
    assert rendered["contents"][0] == {"role": "user", "parts": [{"text": "first"}]}
    assert rendered["contents"][1:] == plain["contents"][1:]
    assert isinstance(parse(request)[0]["content"], list)  # a part with more than a text stays parts


def test_pairing_is_by_id_when_both_have_one_else_by_name_in_order() -> None:
    assert pair_responses([("f", "1"), ("f", "2")], [("f", "2"), ("f", "1")]) == [1, 0]
    assert pair_responses([("f", None), ("g", None)], [("g", None), ("f", "x")]) == [1, 0]
    assert pair_responses([("f", "1")], [("f", "2")]) == [None]  # two ids that differ never pair
    assert pair_responses([("f", None)], [("f", None), ("f", None)]) == [0, None]
    request = {
        "contents": [
            user("go"),
            {"role": "model", "parts": [call_part("a", {}, signed=False), call_part("b", {}, signed=False)]},
            {"role": "user", "parts": [result_part("b", "B"), result_part("a", "A"), result_part("c", "C")]},
        ]
    }
    _, calls, b, a, orphan = parse(request)
    ids = [c["id"] for c in calls["tool_calls"]]
    assert (a["tool_call_id"], b["tool_call_id"]) == (ids[0], ids[1])
    assert orphan["tool_call_id"] not in ids
    assert GEMINI.problems(request) == [
        "function response 'c' without its function call in the content before"
    ]


def test_signed_and_thought_parts_are_opaque_and_priced_not_counted_as_text() -> None:
    signed = {"contents": [user("q"), {"role": "model", "parts": [thought("hmm " * 50), {"text": "a"}]}]}
    _, answer = parse(signed)
    assert is_opaque(answer)
    kinds = [p["type"] for p in answer["content"]]
    assert kinds == ["thinking", "signature", "text"]
    assert answer["content"][1][PRICE_KEY] == -(
        -len(signed["contents"][1]["parts"][0]["thoughtSignature"]) // 4
    )
    unsigned = {"contents": [user("q"), said("plain")]}
    assert not is_opaque(parse(unsigned)[1])


def test_media_is_priced_by_geminis_rules() -> None:
    assert image_tokens(300, 300) == IMAGE_FLOOR_TOKENS  # one 258 tile, Gemini 3's floor
    assert image_tokens(3000, 3000) == 16 * 258
    assert media_tokens("image/png", PNG_DATA) == IMAGE_FLOOR_TOKENS
    assert media_tokens("image/png", None) == IMAGE_UNKNOWN_TOKENS
    assert media_tokens("application/pdf", None) == 258 * 100
    assert media_tokens("audio/mp3", "A" * 40_000) == 75  # 30,000 bytes at 400 a token
    request = {
        "contents": [
            {
                "role": "user",
                "parts": [
                    {"text": "look"},
                    {"inlineData": {"mimeType": "image/png", "data": PNG_DATA}},
                    {"file_data": {"mime_type": "video/mp4", "file_uri": "gs://v"}},
                ],
            }
        ]
    }
    (message,) = parse(request)
    assert [p["type"] for p in message["content"]] == ["text", "image", "media"]
    assert message["content"][1][PRICE_KEY] == IMAGE_FLOOR_TOKENS


def test_snake_case_fields_are_read_like_camel_case_ones() -> None:
    request = {
        "system_instruction": {"parts": [{"text": "sys"}]},
        "generation_config": {"max_output_tokens": 77},
        "contents": [
            user("go"),
            {"role": "model", "parts": [{"function_call": {"name": "f", "args": {}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "f", "response": {"output": "r"}}}]},
        ],
    }
    conversation = parse_gemini(request, model="m", stream=True)
    roles = [m["role"] for m in conversation.messages]
    assert roles == ["system", "user", "assistant", "tool"]
    assert conversation.requested_output_tokens == 77 and conversation.stream and conversation.model == "m"
    assert GEMINI.problems(request) == []
    assert GEMINI.render(request, conversation.messages) == request


def test_the_model_and_the_stream_come_from_the_path_and_cached_content_is_not_fittable() -> None:
    request = {"contents": [user("hi")], "cachedContent": "cachedContents/abc"}
    conversation = parse_gemini(request, model="gemini-2.5-flash", stream=True)
    assert conversation.model == "gemini-2.5-flash" and conversation.stream is True
    assert not conversation.fittable and conversation.unfittable_reason == UNFITTABLE_CACHED
    assert GEMINI.parse({"model": "models/gemini-x", "contents": []}).model == "gemini-x"
    inner = {"model": "models/g", "contents": [user("x")]}
    assert counted_request({"generateContentRequest": inner}) is inner
    assert counted_request({"contents": []}) == {"contents": []}


def test_render_of_an_unchanged_parse_is_the_body_itself() -> None:
    request = {
        "systemInstruction": SYSTEM,
        "contents": [user("a"), *step(["f"], ["r"], tag="x", think=True), said("b", signed=True), user("c")],
        "generationConfig": {"maxOutputTokens": 10},
    }
    messages = parse(request)
    for rendered in (GEMINI.render(request, messages, source=messages), GEMINI.render(request, messages)):
        assert rendered == request
        assert all(a is b for a, b in zip(rendered["contents"], request["contents"], strict=True))
        assert rendered["systemInstruction"] is request["systemInstruction"]


def session(files: int, *, lines: int = 60) -> dict[str, Any]:
    """gemini-cli's shape: context and task in one user content, then one signed read per step."""
    contents: list[dict[str, Any]] = [user("<session_context>", "Read every file and tell me the secrets.")]
    for k in range(files):
        text = "\n".join(f"line {i} of part {k}" for i in range(lines)) + f"\nFACT-part{k}"
        call = call_part("read_file", {"file_path": f"/p/part{k}.txt"}, call_id=f"read_file_{k}")
        contents += [
            {"role": "model", "parts": [call]},
            {"role": "user", "parts": [result_part("read_file", text, call_id=f"read_file_{k}")]},
        ]
    tools = [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}]
    return {"systemInstruction": SYSTEM, "contents": contents, "tools": tools}


def signed_parts(request: dict[str, Any]) -> list[str]:
    return [dumps(p) for c in request["contents"] for p in c["parts"] if "thoughtSignature" in p]


@pytest.mark.parametrize("cap", [1200, 2000, 3000])
def test_a_fitted_gemini_cli_session_keeps_every_rule_and_every_signature(cap: int) -> None:
    request = session(12)
    strict_check(request)
    pristine = copy.deepcopy(request)
    plan, forwarded = fit(request, counter=FakeMessageCounter(), cap_tokens=cap)
    assert request == pristine
    assert plan.changed and plan.fits
    strict_check(forwarded)  # the fake's own rules: alternation, pairing, signatures
    assert GEMINI.problems(forwarded) == []
    assert set(signed_parts(forwarded)) <= set(signed_parts(request))
    newest = request["contents"][-2]["parts"][0]
    assert forwarded["contents"][-2]["parts"][0] is newest  # the current step's signed call, untouched
    results = [
        p["functionResponse"] for c in forwarded["contents"] for p in c["parts"] if "functionResponse" in p
    ]
    assert all(r["id"].startswith("read_file_") and r["name"] == "read_file" for r in results)


class FixedSummary:
    """A summary provider that answers every span with one text."""

    def summary_for(self, span: Any, /) -> str | None:
        return "FACT-remembered"


@pytest.mark.parametrize(("cap", "in_loop"), [(1200, False), (2000, True), (3000, True)])
def test_the_memory_of_a_tool_loop_goes_before_the_function_responses_it_joins(
    cap: int, in_loop: bool
) -> None:
    request = session(12)
    plan = plan_request(
        request,
        spec=spec(),
        policy=Policy(summarize=True),
        counter=FakeMessageCounter(),
        cap_tokens=cap,
        summaries=FixedSummary(),
        dialect=GEMINI,
        conversation=parse_gemini(request, model="gemini-test", stream=False),
    )
    assert "summarized" in [a.kind for a in plan.actions]
    forwarded = plan.body(request)
    (holder,) = [c for c in forwarded["contents"] if "FACT-remembered" in json.dumps(c)]
    texts = [p.get("text", "") for p in holder["parts"]]
    memory_at = next(n for n, t in enumerate(texts) if t.startswith("[ctxproxy: summary of "))
    responses = [n for n, p in enumerate(holder["parts"]) if "functionResponse" in p]
    # Where the forgetting ends: after a drop, the task's own content; after a prune, inside the
    # loop, a user content of function responses, before them (Gemini 3 refuses any part after).
    assert bool(responses) is in_loop
    assert all(memory_at < n for n in responses)
    strict_check(forwarded)
    assert GEMINI.problems(forwarded) == []


def test_problems_name_a_part_after_function_responses() -> None:
    call = call_part("read_file", {"file_path": "a"}, call_id="r1")
    result = result_part("read_file", "text", call_id="r1")
    after = {
        "contents": [
            user("q"),
            {"role": "model", "parts": [call]},
            {"role": "user", "parts": [result, {"text": "x"}]},
        ]
    }
    before = {
        "contents": [
            user("q"),
            {"role": "model", "parts": [call]},
            {"role": "user", "parts": [{"text": "x"}, result]},
        ]
    }
    assert GEMINI.problems(after) == ["a part follows the function responses of a content"]
    assert GEMINI.problems(before) == []


def test_a_pruned_result_keeps_its_part_id_and_name_and_says_what_it_replaced() -> None:
    request = session(12)
    plan, forwarded = fit(request, counter=FakeMessageCounter(), cap_tokens=3000)
    assert [a.kind for a in plan.actions] == ["pruned"]
    pruned = [
        p["functionResponse"]
        for c in forwarded["contents"]
        for p in c["parts"]
        if "functionResponse" in p and "tool result removed" in p["functionResponse"]["response"]["output"]
    ]
    assert pruned and set(pruned[0]) == {"name", "response", "id"}
    assert list(pruned[0]["response"]) == ["output"]


def test_a_note_joins_the_user_content_before_it_and_the_first_content_stays_the_users() -> None:
    request = {
        "contents": [user(words(300)), said(words(300)), user(words(300)), said(words(10)), user("now?")]
    }
    plan, forwarded = fit(request, counter=FakeMessageCounter(), cap_tokens=700)
    assert plan.changed and plan.fits
    roles = [c["role"] for c in forwarded["contents"]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    notes = [p["text"] for c in forwarded["contents"] for p in c["parts"] if "ctxproxy:" in p.get("text", "")]
    assert notes and all(
        c["role"] == "user"
        for c in forwarded["contents"]
        if any("ctxproxy:" in p.get("text", "") for p in c["parts"])
    )
    strict_check(forwarded)


def test_signed_model_contents_are_never_merged_a_separator_goes_between() -> None:
    signed = said("first", signed=True)
    messages = parse({"contents": [user("q"), signed, user(words(50)), said("second", signed=True)]})
    request = {"contents": [user("q"), signed, user(words(50)), said("second", signed=True)]}
    kept = [m for m in messages if m["role"] != "user" or m is messages[0]]  # drop the middle user
    rendered = GEMINI.render(request, kept)
    assert [c["role"] for c in rendered["contents"]] == ["user", "model", "user", "model"]
    assert rendered["contents"][2] == {"role": "user", "parts": [{"text": SEPARATOR_TEXT}]}
    assert rendered["contents"][1] is signed
    opens = GEMINI.render(request, kept[1:])
    assert opens["contents"][0] == {"role": "user", "parts": [{"text": SEPARATOR_TEXT}]}


def test_a_cut_text_keeps_its_part_and_a_pruned_image_becomes_a_placeholder() -> None:
    image = {"inlineData": {"mimeType": "image/png", "data": PNG_DATA}, "mediaResolution": "high"}
    text = {"text": words(40), "partMetadata": {"k": 1}}
    request = {"contents": [{"role": "user", "parts": [text, image]}, said("ok"), user("next")]}
    (first, *rest) = parse(request)
    changed = {
        **first,
        "content": [{"type": "text", "text": "cut"}, {"type": "text", "text": IMAGE_PLACEHOLDER}],
    }
    rendered = GEMINI.render(request, [changed, *rest])
    assert rendered["contents"][0]["parts"] == [
        {"text": "cut", "partMetadata": {"k": 1}},
        {"text": IMAGE_PLACEHOLDER},
    ]
    assert rendered["contents"][1] is request["contents"][1]


def test_problems_name_the_structural_rules() -> None:
    assert GEMINI.problems({"contents": []}) == ["contents is not a non-empty list"]
    assert GEMINI.problems(
        {"contents": [said("a"), user("b"), user("c"), {"role": "user", "parts": []}]}
    ) == [
        "a content has no parts",
        "the first content is not a user content",
        "two adjacent user contents",
    ]
    unanswered = {"contents": [user("a"), {"role": "model", "parts": [call_part("f", {})]}, user("b")]}
    assert GEMINI.problems(unanswered) == ["function call 'f' has no function response in the next content"]
    unsigned = {"contents": [user("a"), *step(["f"], ["r"], tag="1")]}
    del unsigned["contents"][1]["parts"][0]["thoughtSignature"]
    unsigned["contents"] += [{"role": "model", "parts": [thought("x"), call_part("g", {}, signed=False)]}]
    assert "a function call of the current turn has no thought signature" in GEMINI.problems(unsigned)


def test_cannot_fit_speaks_geminis_wording_with_our_numbers_in_googles_shape() -> None:
    over_budget = CannotFit(
        reason="test", tokens=50_000, budget_tokens=45_000, window_tokens=48_000, reserve_tokens=0
    )
    assert GEMINI.error_body(error_info(over_budget, GEMINI)) == {
        "error": {
            "code": 400,
            "message": "The input token count (50000) exceeds the maximum number of tokens allowed (48000).",
            "status": "INVALID_ARGUMENT",
        }
    }
    inside = CannotFit(
        reason="test", tokens=46_000, budget_tokens=45_000, window_tokens=48_000, reserve_tokens=0
    )
    message = GEMINI.error_body(error_info(inside, GEMINI))["error"]["message"]
    assert message.endswith("allowed (45000).")
    found = classify_overflow(400, GEMINI.error_body(error_info(inside, GEMINI)))
    assert found is not None and (found.prompt_tokens, found.limit_tokens) == (46_000, 45_000)
    timeout = ErrorInfo(status=504, code="upstream_timeout", message="The upstream timed out.")
    assert GEMINI.error_body(timeout)["error"] == {
        "code": 504,
        "message": "The upstream timed out.",
        "status": "DEADLINE_EXCEEDED",
    }
    assert [status_name(s) for s in (401, 403, 404, 429, 500, 503, 418)] == [
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
        "NOT_FOUND",
        "RESOURCE_EXHAUSTED",
        "INTERNAL",
        "UNAVAILABLE",
        "FAILED_PRECONDITION",
    ]


def test_stream_errors_are_crlf_sse_frames_or_the_closing_element_of_an_array() -> None:
    error = error_info(
        CannotFit(reason="test", tokens=10, budget_tokens=5, window_tokens=8, reserve_tokens=0),
        GEMINI,
    )
    frame = GEMINI.stream_error(error)
    assert frame.startswith(b"data: {") and frame.endswith(b"}\r\n\r\n")
    assert GEMINI.overflow(200, frame) is not None
    closing = array_stream_error(error)
    assert json.loads(b"[{}" + closing)[1] == GEMINI.error_body(error)
    assert GEMINI.json_stream_error(error, started=True) == closing
    whole = GEMINI.json_stream_error(error, started=False)  # nothing went out yet: a whole array
    assert whole is not None and json.loads(whole) == [GEMINI.error_body(error)]
    assert GEMINI.overflow(400, whole) is not None


@pytest.mark.parametrize(
    "answer",
    [
        '{"error":{"code":400,"message":"The input token count (49276) exceeds the maximum number of tokens '
        'allowed (48000).","status":"INVALID_ARGUMENT"}}',
        '[{"error":{"code":400,"message":"The input token count (49276) exceeds the maximum number of tokens '
        'allowed (48000).","status":"INVALID_ARGUMENT"}}]',
        'data: {"error":{"code":400,"message":"The input token count (49276) exceeds the maximum number of '
        'tokens allowed (48000).","status":"INVALID_ARGUMENT"}}\r\n\r\n',
    ],
)
def test_upstream_overflows_are_recognised_in_every_form(answer: str) -> None:
    found = GEMINI.overflow(400, answer.encode())
    assert found is not None and (found.prompt_tokens, found.limit_tokens, found.output_tokens) == (
        49276,
        48000,
        0,
    )


def test_other_upstream_errors_are_not_overflows() -> None:
    quota = (
        '{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).",'
        '"status":"RESOURCE_EXHAUSTED"}}'
    )
    assert GEMINI.overflow(429, quota) is None
    assert GEMINI.overflow(200, b'data: {"candidates":[]}\r\n\r\n') is None


def test_usage_counting_answers_and_tools() -> None:
    chunk = {"candidates": [], "usageMetadata": {"promptTokenCount": 123, "totalTokenCount": 130}}
    assert GEMINI.input_tokens_used(chunk) == 123
    assert GEMINI.input_tokens_used({"usage_metadata": {"prompt_token_count": 7}}) == 7
    assert GEMINI.input_tokens_used({"candidates": []}) is None
    assert GEMINI.count_answer(42) == {"totalTokens": 42}
    counter = FakeMessageCounter()
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "file path"}}}
    with_json = {
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "read", "description": "reads", "parametersJsonSchema": schema}
                ]
            }
        ]
    }
    with_openapi = {
        "tools": [{"function_declarations": [{"name": "read", "description": "reads", "parameters": schema}]}]
    }
    assert GEMINI.tool_tokens(with_json, counter) == GEMINI.tool_tokens(with_openapi, counter) > 0
    searched = {
        "tools": [*with_json["tools"], {"googleSearch": {}}],
        "generationConfig": {"responseJsonSchema": schema},
    }
    assert GEMINI.tool_tokens(searched, counter) > GEMINI.tool_tokens(with_json, counter)
    assert GEMINI.tool_tokens({"contents": []}, counter) == 0
    # A function's parameters are priced once: not again as a response schema the body has not.
    bare = {"tools": [{"functionDeclarations": [{"name": "read", "description": "reads"}]}]}
    per_schema = GEMINI.tool_tokens(with_json, counter) - GEMINI.tool_tokens(bare, counter)
    structured = {**with_json, "generationConfig": {"responseJsonSchema": schema}}
    assert GEMINI.tool_tokens(structured, counter) > GEMINI.tool_tokens(with_json, counter)
    assert GEMINI.tool_tokens(with_json, counter) < GEMINI.tool_tokens(bare, counter) + 2 * per_schema


def test_the_dialect_is_registered_with_its_routes_keys_and_budget_facts() -> None:
    assert DIALECTS["gemini"] is GEMINI and GEMINI.items_key == "contents"
    assert GEMINI.output_in_window is False
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    messages = GEMINI.parse(body).messages
    assert GEMINI.accounting_view(body, messages, 7) == priced_view(messages, 7)  # not its own shape
    assert GEMINI.preamble_events == frozenset()  # overflows come as a 400 before the stream opens
    table = RouteTable.of(DIALECTS)
    for version in ("/v1beta", "/v1"):
        for verb, stream, kind in (
            ("generateContent", False, "fit"),
            ("streamGenerateContent", True, "fit"),
            ("countTokens", None, "count"),
        ):
            path = f"{version}/models/gemini-2.5-flash:{verb}"
            matched = table.match(path, "alt=sse&key=k")
            assert matched is not None and matched.dialect is GEMINI
            assert (matched.route.stream, matched.route.kind) == (stream, kind)
            assert matched.route.upstream_first is (kind == "count")  # the tokenizer is not public
            assert matched.params == {"model": "gemini-2.5-flash"}
            assert matched.target == UpstreamTarget(path, at_origin=True)  # its own path, at the origin
            assert matched.query == "alt=sse&key=k"
    assert ("/v1beta", True) in table.passthrough_prefixes()  # GET /v1beta/models... passes through
    assert table.owner("/v1beta/models") is GEMINI
    assert [(s.name, s.in_query) for s in GEMINI.key_slots] == [("x-goog-api-key", False), ("key", True)]


def test_the_model_comes_from_the_path_else_the_body_and_bodies_are_recognised() -> None:
    bare = {"contents": [user("hi")]}
    assert GEMINI.model_of(bare, {"model": "gemini-2.5-pro"}) == "gemini-2.5-pro"
    assert GEMINI.model_of({**bare, "model": "models/gemini-x"}, {}) == "gemini-x"
    counted = {"generateContentRequest": {"model": "models/g", **bare}}
    assert GEMINI.model_of(counted, {}) == "g"
    with pytest.raises(InvalidRequest) as caught:
        GEMINI.model_of(bare, {})
    assert caught.value.param == "model"
    assert GEMINI.recognition(bare, {}) == 2 and GEMINI.recognition(counted, {}) == 2
    assert GEMINI.recognition({"messages": []}, {}) == 0
    # The gateway engine asks with any API's items under ``contents``: only Contents are Gemini's.
    assert GEMINI.recognition({"contents": [{"role": "user", "content": "hi"}]}, {}) == 0
    assert detect(DIALECTS, bare, {}) is GEMINI
    assert GEMINI.upstream_count({"totalTokens": 31, "promptTokensDetails": []}) == 31
    assert GEMINI.upstream_count({"totalTokens": 0}) is None


def test_the_budget_keeps_no_output_reserve_against_the_input_limit() -> None:
    request = {"contents": [user(words(50))], "generationConfig": {"maxOutputTokens": 4000}}
    plan, _ = fit(request, counter=FakeMessageCounter(), window_tokens=10_000)
    assert plan.budget.reserve_tokens == 0
    assert plan.budget.input_budget_tokens == 10_000 - plan.budget.margin_tokens
    chat = plan_request(
        {"model": "m", "messages": [{"role": "user", "content": words(50)}], "max_tokens": 4000},
        spec=spec(10_000),
        policy=Policy(),
        counter=FakeMessageCounter(),
        dialect=CHAT,
    )
    assert chat.budget.reserve_tokens == 4000  # an API that counts the output keeps its reserve


def test_the_count_request_goes_to_the_clients_own_version_at_the_origin_with_the_whole_request() -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "tools": [{"functionDeclarations": [{"name": "read"}]}],
        "generationConfig": {"maxOutputTokens": 100},
    }
    call = GEMINI.count_request(body, "/v1beta/models/gemini-2.5-flash:streamGenerateContent")
    assert call is not None
    target, counted = call
    assert target == UpstreamTarget("/v1beta/models/gemini-2.5-flash:countTokens", at_origin=True)
    assert counted == {"generateContentRequest": {**body, "model": "models/gemini-2.5-flash"}}
    v1 = GEMINI.count_request(body, "/v1/models/gemini-2.5-pro:generateContent")
    assert v1 is not None and v1[0].path == "/v1/models/gemini-2.5-pro:countTokens"
    assert GEMINI.count_request(body, "/v1beta/models") is None  # no model's method: nothing to ask


def test_the_output_cap_is_left_alone_as_it_is_not_counted_against_the_input_limit() -> None:
    body = {"contents": [], "generationConfig": {"maxOutputTokens": 65_536}}
    assert GEMINI.with_output_cap(body, 1_000) == body
