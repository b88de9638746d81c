"""The Responses API dialect: parse, render, problems, errors, overflow, usage (unit tests)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app.core.conversation import OPAQUE_KEY, ORIGIN_KEY, PRICE_KEY, is_opaque, origin_of
from app.core.dialect import ErrorInfo, error_info
from app.core.dialects.responses import ENCRYPTED_CHARS_PER_TOKEN, RESPONSES
from app.core.endpoints import UpstreamTarget
from app.core.errors import CannotFit, InvalidRequest
from app.core.messages import group_units, pairing_problems
from app.core.tokens import MessageCounter
from tests.core.dialects.responses_kit import (
    body,
    call,
    dumps,
    fit,
    output,
    reasoning,
    said,
    user,
    words,
)
from tests.core.fakes import FakeMessageCounter, WordCounter

# -- parse ------------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_and_instructions_are_pinned_system() -> None:
    conversation = RESPONSES.parse(body("hello there", instructions="be brief", max_output_tokens=77))
    assert [m["role"] for m in conversation.messages] == ["system", "user"]
    assert conversation.messages[1]["content"] == "hello there"
    assert conversation.requested_output_tokens == 77
    assert conversation.fittable and conversation.model == "test-model"


def test_items_map_to_neutral_messages_with_their_origins() -> None:
    items = [
        {"role": "developer", "content": "rules"},  # a message without "type"
        user("look"),
        call("c1"),
        call("c2"),
        output("c2", "two"),
        output("c1", "one"),
        said("done"),
    ]
    messages = RESPONSES.parse(body(items)).messages
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "tool", "tool", "assistant"]
    assert [origin_of(m) for m in messages] == [((0,),), ((1,),), ((2,), (3,)), ((4,),), ((5,),), ((6,),)]
    calls = messages[2]["tool_calls"]
    assert [c["id"] for c in calls] == ["c1", "c2"]
    assert calls[0]["function"] == {"name": "exec_command", "arguments": '{"cmd": "ls"}'}
    assert messages[3]["tool_call_id"] == "c2" and messages[3]["content"] == "two"
    assert messages[1]["content"] == [{"type": "text", "text": "look"}]
    assert [u.kind for u in group_units(messages)] == ["message", "message", "tool_group", "message"]
    assert not any(is_opaque(m) for m in messages)
    assert pairing_problems(messages) == []


def test_reasoning_is_glued_to_the_item_after_it_and_priced_by_its_ciphertext() -> None:
    secret = reasoning("rs_1", secret_chars=4000, summary="plan the search")
    items = [user("go"), secret, call("c1"), output("c1", "result")]
    messages = RESPONSES.parse(body(items)).messages
    glued = messages[1]
    assert is_opaque(glued) and origin_of(glued) == ((1,), (2,))
    assert glued["tool_calls"][0]["id"] == "c1"
    parts = glued["content"]
    assert {"type": "text", "text": "plan the search"} in parts
    assert [p[PRICE_KEY] for p in parts if PRICE_KEY in p] == [4000 // ENCRYPTED_CHARS_PER_TOKEN]
    assert not is_opaque(messages[2])  # the output itself may be pruned
    counter = MessageCounter(WordCounter())
    assert counter.count_message(glued) >= 1000  # the ciphertext counts, not as text


def test_reasoning_before_a_message_makes_one_opaque_message() -> None:
    messages = RESPONSES.parse(body([user("q"), reasoning("rs"), said("a")])).messages
    assert len(messages) == 2 and is_opaque(messages[1]) and messages[1]["role"] == "assistant"
    assert origin_of(messages[1]) == ((1,), (2,))


def test_built_in_items_are_opaque_and_paired_built_ins_stay_one_unit() -> None:
    items = [
        user("q"),
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "weather"}},
        {"type": "computer_call", "id": "cu_1", "call_id": "k1", "action": {"type": "screenshot"}},
        {
            "type": "computer_call_output",
            "call_id": "k1",
            "output": {"type": "input_image", "image_url": "x"},
        },
        {"type": "local_shell_call", "id": "ls_1", "call_id": "k2", "action": {"type": "exec"}},
        {"type": "local_shell_call_output", "id": "k2", "output": "{}"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "z" * 80},
        {"type": "some_future_item", "note": "kept whole"},
    ]
    messages = RESPONSES.parse(body(items)).messages
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "developer",
        "assistant",
    ]
    assert all(is_opaque(m) for m in messages[1:])
    assert pairing_problems(messages) == []
    assert messages[6]["content"] == [{"type": "encrypted", PRICE_KEY: 20}]
    assert {"type": "item:web_search_call", "action": {"query": "weather"}} in messages[1]["content"]


def test_an_unknown_item_with_an_instruction_role_stays_pinned() -> None:
    tools = {"type": "additional_tools", "role": "developer", "tools": [{"type": "function", "name": "f"}]}
    messages = RESPONSES.parse(body([user("q"), tools, said("a"), {"type": "compaction_trigger"}])).messages
    assert [m["role"] for m in messages] == ["user", "developer", "assistant", "assistant"]
    assert is_opaque(messages[1]) and is_opaque(messages[3])


def test_an_output_after_other_items_keeps_the_whole_span_in_one_opaque_message() -> None:
    items = [user("q"), call("c1"), said("meanwhile"), output("c1", "late"), user("next")]
    messages = RESPONSES.parse(body(items)).messages
    assert [origin_of(m) for m in messages] == [((0,),), ((1,), (2,), (3,)), ((4,),)]
    assert is_opaque(messages[1])


def test_images_and_files_are_priced_by_the_chat_rules() -> None:
    items = [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "https://example.test/a.png", "detail": "low"},
                {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,AAAA"},
            ],
        }
    ]
    parts = RESPONSES.parse(body(items)).messages[0]["content"]
    assert parts[1] == {
        "type": "image_url",
        "image_url": {"url": "https://example.test/a.png", "detail": "low"},
    }
    assert parts[2] == {"type": "file", "file": {"filename": "a.pdf"}}
    counter = MessageCounter(WordCounter())
    assert counter.count_message(RESPONSES.parse(body(items)).messages[0]) == 3 + 1 + 1 + 85 + 1024 + 1


def test_history_stored_upstream_is_not_fittable() -> None:
    stored = RESPONSES.parse(body([output("c1", "x")], previous_response_id="resp_1"))
    assert not stored.fittable and "previous_response_id" in stored.unfittable_reason
    conv = RESPONSES.parse(body("hi", conversation="conv_1"))
    assert not conv.fittable and "conversation" in conv.unfittable_reason


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"model": "m", "input": 42}, "input"),
        ({"model": "m", "input": {"role": "user"}}, "input"),
        ({"model": "m", "input": ["hi"]}, "input[0]"),
        ({"model": "m", "input": [{"content": "no role, no type"}]}, "input[0]"),
        ({"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user", "content": 5}]}, "input[0].content"),
        ({"model": "m", "input": [{"role": "user", "content": [{"text": "x"}]}]}, "input[0].content[0]"),
        ({"model": "m", "input": [{"type": 7}]}, "input[0].type"),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": 3}]},
            "input[0].output",
        ),
        ({"model": "m", "input": [output("c9", "orphan")]}, "input[0]"),
        ({"model": "m", "input": "x", "instructions": ["no"]}, "instructions"),
        ({"model": "m", "input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ({"model": "m", "input": "x", "max_output_tokens": True}, "max_output_tokens"),
        ({"model": "m", "input": "x", "tools": {"type": "function"}}, "tools"),
    ],
)
def test_bad_input_is_an_invalid_request_naming_the_field(request_body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        RESPONSES.parse(request_body)
    assert raised.value.param == param


def test_an_orphan_output_is_the_upstreams_business_when_the_history_is_stored_upstream() -> None:
    RESPONSES.parse(body([output("c9", "x")], previous_response_id="resp_1"))
    RESPONSES.parse(body([{"type": "item_reference", "id": "fc_9"}, output("c9", "x")]))


def test_parse_never_mutates_the_body() -> None:
    request = body([user("q"), reasoning("r"), call("c1"), output("c1", "x")], instructions="i")
    pristine = copy.deepcopy(request)
    RESPONSES.parse(request)
    RESPONSES.render(request, RESPONSES.parse(request).messages)
    assert request == pristine


# -- render -----------------------------------------------------------------------------------


def test_render_of_the_parsed_messages_is_the_same_body_with_the_same_item_objects() -> None:
    items = [user("q"), reasoning("r1"), call("c1"), output("c1", "x"), said("a"), {"type": "zzz", "k": 1}]
    request = body(items, instructions="sys", tools=[], store=False, include=["reasoning.encrypted_content"])
    rendered = RESPONSES.render(request, RESPONSES.parse(request).messages)
    assert rendered == request
    assert all(a is b for a, b in zip(rendered["input"], items, strict=True))


def test_a_pruned_output_replaces_only_the_output_and_keeps_every_other_key() -> None:
    item = {**output("c1", words(50)), "id": "fco_1", "status": "completed"}
    request = body([user("q"), call("c1"), item, user("next")])
    messages = list(RESPONSES.parse(request).messages)
    messages[2] = {**messages[2], "content": "[ctxproxy: tool result removed]"}
    rendered = RESPONSES.render(request, messages)
    assert rendered["input"][2] == {**item, "output": "[ctxproxy: tool result removed]"}
    assert rendered["input"][1] is request["input"][1]


def test_a_cut_text_part_keeps_the_part_type_and_its_other_keys() -> None:
    request = body([user("q"), said(words(40)), user("next")])
    messages = list(RESPONSES.parse(request).messages)
    messages[1] = {**messages[1], "content": [{"type": "text", "text": "w0 … w39"}]}
    rendered = RESPONSES.render(request, messages)
    part = rendered["input"][1]["content"][0]
    assert part == {"type": "output_text", "text": "w0 … w39", "annotations": []}
    assert rendered["input"][1]["id"] == "msg_1" and rendered["input"][1]["status"] == "completed"


def test_a_pruned_image_becomes_an_input_text_part() -> None:
    image = {"type": "input_image", "image_url": "https://example.test/i.png"}
    request = body([{"type": "message", "role": "user", "content": [image]}, user("next")])
    messages = list(RESPONSES.parse(request).messages)
    messages[0] = {**messages[0], "content": [{"type": "text", "text": "[image removed]"}]}
    rendered = RESPONSES.render(request, messages)
    assert rendered["input"][0]["content"] == [{"type": "input_text", "text": "[image removed]"}]


def test_cut_instructions_and_a_cut_string_input_are_written_back_as_strings() -> None:
    request = body("a b c d", instructions="x y z")
    messages = list(RESPONSES.parse(request).messages)
    messages = [{**messages[0], "content": "x z"}, {**messages[1], "content": "a d"}]
    rendered = RESPONSES.render(request, messages)
    assert rendered["instructions"] == "x z" and rendered["input"] == "a d"


def test_a_note_is_a_message_item_and_reads_back_as_a_note() -> None:
    request = body([user("q1"), said("a1"), user("q2")])
    messages = list(RESPONSES.parse(request).messages)
    text = "[ctxproxy: 2 earlier messages (40 tokens) were removed here to fit the context window]"
    note = {"role": "user", "content": text}
    rendered = RESPONSES.render(request, [note, messages[2]])
    assert rendered["input"][0] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": note["content"]}],
    }
    again = RESPONSES.parse(rendered).messages[0]
    assert again["content"] == note["content"]  # recognised as our note on the next request


def test_dropping_a_unit_drops_its_items_in_order() -> None:
    items = [user("q1"), reasoning("r"), call("c1"), output("c1", "x"), said("a"), user("q2")]
    request = body(items)
    messages = RESPONSES.parse(request).messages
    kept = [m for m in messages if origin_of(m) not in (((1,), (2,)), ((3,),))]
    rendered = RESPONSES.render(request, kept)
    assert [dumps(i) for i in rendered["input"]] == [dumps(items[k]) for k in (0, 4, 5)]


# -- problems ---------------------------------------------------------------------------------


def test_problems_find_calls_without_outputs_outputs_without_calls_and_trailing_reasoning() -> None:
    request = body([call("c1"), output("c2", "x"), reasoning("r9")])
    assert RESPONSES.problems(request) == [
        "function_call 'c1' has no function_call_output",
        "function_call_output 'c2' has no function_call",
        "reasoning item 'r9' is not followed by an item",
    ]
    assert RESPONSES.problems(body([user("q"), call("c1"), output("c1", "x")])) == []
    assert RESPONSES.problems(body("just text")) == []


# -- errors, overflow, usage ------------------------------------------------------------------


def test_cannot_fit_is_a_context_length_exceeded_error_with_the_numbers() -> None:
    error = CannotFit(tokens=900, budget_tokens=500, window_tokens=600, reserve_tokens=100, reason="too big")
    shaped = RESPONSES.error_body(error_info(error, RESPONSES))
    assert shaped["error"]["code"] == "context_length_exceeded"
    assert shaped["error"]["type"] == "invalid_request_error"
    assert shaped["error"]["param"] == "input"
    assert "900" in shaped["error"]["message"] and "600" in shaped["error"]["message"]


def test_error_shapes_of_invalid_requests_and_upstream_failures() -> None:
    bad = RESPONSES.error_body(error_info(InvalidRequest("nope", param="input[2]"), RESPONSES))
    assert bad == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "input[2]", "code": None}
    }
    timeout = RESPONSES.error_body(ErrorInfo(status=504, code="upstream_timeout", message="slow"))
    assert timeout["error"]["type"] == "upstream_error" and timeout["error"]["code"] == "upstream_timeout"


def test_stream_error_is_an_error_event_frame() -> None:
    frame = RESPONSES.stream_error(ErrorInfo(status=502, code="upstream_unreachable", message="gone"))
    assert frame.startswith(b"event: error\ndata: ") and frame.endswith(b"\n\n")
    data = json.loads(frame.split(b"data: ", 1)[1])
    assert data["type"] == "error" and data["code"] == "upstream_unreachable" and data["message"] == "gone"
    assert isinstance(data["sequence_number"], int)


OPENAI_OVERFLOW = {
    "error": {
        "message": (
            "Your input exceeds the context window of this model. Please adjust your input and try again."
        ),
        "type": "invalid_request_error",
        "param": "input",
        "code": "context_length_exceeded",
    }
}


def test_overflow_is_recognised_in_json_in_a_failed_event_and_in_an_error_event() -> None:
    assert RESPONSES.overflow(400, json.dumps(OPENAI_OVERFLOW).encode()) is not None
    failed = {
        "type": "response.failed",
        "sequence_number": 3,
        "response": {"id": "resp_1", "status": "failed", "error": OPENAI_OVERFLOW["error"]},
    }
    assert RESPONSES.overflow(200, failed) is not None
    created = 'event: response.created\ndata: {"type":"response.created"}\n\n'
    sse = f"{created}event: response.failed\ndata: {json.dumps(failed)}\n\n"
    assert RESPONSES.overflow(200, sse.encode()) is not None
    error_event = {"type": "error", "code": "context_length_exceeded", "message": "too long", "param": None}
    assert RESPONSES.overflow(200, f"event: error\ndata: {json.dumps(error_event)}\n\n") is not None


def test_what_is_not_an_overflow() -> None:
    rate = {"error": {"message": "Rate limit reached", "type": "tokens", "code": "rate_limit_exceeded"}}
    assert RESPONSES.overflow(429, json.dumps(rate)) is None
    other_failure = {
        "type": "response.failed",
        "response": {"error": {"code": "server_error", "message": "oops"}},
    }
    assert RESPONSES.overflow(200, other_failure) is None
    assert (
        RESPONSES.overflow(200, b'event: response.completed\ndata: {"type":"response.completed"}\n\n') is None
    )
    assert RESPONSES.overflow(400, None) is None


def test_input_tokens_used_from_a_response_and_from_the_completed_event() -> None:
    assert RESPONSES.input_tokens_used({"object": "response", "usage": {"input_tokens": 321}}) == 321
    completed = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 55, "output_tokens": 2}},
    }
    assert RESPONSES.input_tokens_used(completed) == 55
    assert RESPONSES.input_tokens_used({"type": "response.created", "response": {"usage": None}}) is None
    assert RESPONSES.input_tokens_used({"usage": {"input_tokens": "many"}}) is None


def test_count_answer_is_openais_input_tokens_object() -> None:
    assert RESPONSES.count_answer(12) == {"object": "response.input_tokens", "input_tokens": 12}


# -- tools ------------------------------------------------------------------------------------


def test_function_tools_count_by_the_chat_rule_and_other_tools_by_their_strings() -> None:
    counter = MessageCounter(WordCounter())
    flat_tool = {"type": "function", "name": "get_weather", "description": "Weather.", "parameters": {}}
    chat_tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather.", "parameters": {}},
    }
    assert RESPONSES.tool_tokens(body("x", tools=[flat_tool]), counter) == counter.count_tools(
        {"tools": [chat_tool]}
    )
    custom = {"type": "custom", "name": "apply_patch", "description": "Apply a patch to files"}
    assert RESPONSES.tool_tokens(body("x", tools=[custom]), counter) > 0
    schema = {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}}}
    assert RESPONSES.tool_tokens(body("x", text=schema), counter) > 0
    assert RESPONSES.tool_tokens(body("x"), counter) == 0


# -- through the pipeline ---------------------------------------------------------------------


def test_a_body_that_fits_is_forwarded_unchanged() -> None:
    request = body([user("q"), reasoning("r"), call("c1"), output("c1", words(30))])
    plan, forwarded = fit(request, cap_tokens=100_000, counter=FakeMessageCounter())
    assert not plan.changed and forwarded is request


def test_an_over_long_agent_session_is_fitted_keeping_reasoning_and_pairs_intact() -> None:
    items: list[dict[str, Any]] = [{"role": "developer", "content": "you are an agent"}, user("fix the bug")]
    for k in range(12):
        items += [reasoning(f"rs_{k}", secret_chars=200), call(f"c{k}"), output(f"c{k}", words(300, f"o{k}"))]
    items.append(said("done"))
    request = body(items, instructions="system prompt")
    plan, forwarded = fit(request, cap_tokens=2000, counter=FakeMessageCounter())
    assert plan.changed and plan.fits
    assert RESPONSES.problems(forwarded) == []
    originals = {dumps(i) for i in items}
    for k, item in enumerate(forwarded["input"]):
        if item.get("type") == "reasoning":
            assert dumps(item) in originals  # never edited
            follower = forwarded["input"][k + 1]
            assert follower["type"] == "function_call" and follower["id"] == f"fc_c{item['id'][3:]}"
    assert forwarded["input"][0] is items[0] and forwarded["input"][1] is items[1]
    assert forwarded["instructions"] == "system prompt"
    assert all(ORIGIN_KEY not in i and OPAQUE_KEY not in i for i in forwarded["input"])
    plan_again, again = fit(forwarded, cap_tokens=2000, counter=FakeMessageCounter())
    assert not plan_again.changed and again is forwarded


def test_the_count_request_keeps_only_what_the_input_tokens_endpoint_takes() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "hi"}],
        "tools": [],
        "reasoning": {"effort": "low"},
        "max_output_tokens": 4_000,
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "metadata": {"k": "v"},
    }
    call = RESPONSES.count_request(body, "/v1/whatever")
    assert call is not None
    target, counted = call
    assert target == UpstreamTarget("responses/input_tokens")  # under the base URL, whatever the path
    assert counted == {k: body[k] for k in ("model", "instructions", "input", "tools", "reasoning")}


def test_the_output_cap_is_max_output_tokens() -> None:
    body = {"model": "m", "input": "hi", "max_output_tokens": 8_000}
    assert RESPONSES.with_output_cap(body, 2_000) == {**body, "max_output_tokens": 2_000}
    assert RESPONSES.with_output_cap(body, 9_000) == body
    assert body["max_output_tokens"] == 8_000


def test_a_summary_is_asked_with_instructions_and_input_not_stored() -> None:
    prompt = [
        {"role": "system", "content": "You write handoff summaries"},
        {"role": "user", "content": "Summarize."},
    ]
    call = RESPONSES.summary_request(prompt, model="m", max_tokens=300)
    assert call.path == "responses"
    assert call.body == {
        "model": "m",
        "instructions": "You write handoff summaries",
        "input": [{"role": "user", "content": "Summarize."}],
        "max_output_tokens": 300,
        "store": False,
        "stream": False,
    }
    assert "authorization" in call.carry
    answer = {
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "- one"}, {"type": "refusal"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "\n- two"}]},
        ]
    }
    assert RESPONSES.summary_text(answer) == "- one\n- two"
    assert RESPONSES.summary_text({"output": [{"type": "reasoning"}]}) is None
    assert RESPONSES.summary_text({}) is None
