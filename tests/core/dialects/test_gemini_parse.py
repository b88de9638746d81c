"""A Gemini body's validation and neutral conversation: bad bodies name their field, a
``:countTokens`` body is read through its ``generateContentRequest``, a resent history reuses its
parse and equals a fresh one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.core.dialects.gemini import GEMINI
from app.core.dialects.gemini_parse import parse_gemini, validate_body
from app.core.errors import InvalidRequest
from app.core.parse_memo import ParseMemo
from tests.core.dialects.gemini_kit import step, user, words
from tests.core.fakes import FakeMessageCounter

SYSTEM = {"parts": [{"text": "You are a CLI agent."}]}


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({}, "contents"),
        ({"contents": "hi"}, "contents"),
        ({"contents": ["hi"]}, "contents[0]"),
        ({"contents": [{"role": "assistant", "parts": []}]}, "contents[0].role"),
        ({"contents": [{"parts": {"text": "x"}}]}, "contents[0].parts"),
        ({"contents": [{"parts": ["x"]}]}, "contents[0].parts[0]"),
        ({"contents": [{"parts": [{"functionCall": {"args": {}}}]}]}, "contents[0].parts[0].functionCall"),
        (
            {"contents": [{"parts": [{"functionCall": {"name": "f", "args": []}}]}]},
            "contents[0].parts[0].functionCall.args",
        ),
        (
            {"contents": [{"parts": [{"functionResponse": {"response": {}}}]}]},
            "contents[0].parts[0].functionResponse",
        ),
        ({"contents": [user("x")], "systemInstruction": "be nice"}, "systemInstruction"),
        (
            {"contents": [user("x")], "generationConfig": {"maxOutputTokens": 0}},
            "generationConfig.maxOutputTokens",
        ),
        ({"contents": [user("x")], "tools": {"functionDeclarations": []}}, "tools"),
        ({"contents": []}, "contents"),
    ],
)
def test_bad_bodies_are_invalid_requests_naming_the_field(request_body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_gemini(request_body, model="m", stream=False)
    assert caught.value.param == param


def test_a_count_tokens_body_is_read_through_its_generate_content_request() -> None:
    tools = [{"functionDeclarations": [{"name": "read_file", "parametersJsonSchema": {"type": "object"}}]}]
    inner = {"model": "models/g", "systemInstruction": SYSTEM, "contents": [user("hi")], "tools": tools}
    counter = FakeMessageCounter()
    wrapped = GEMINI.parse({"generateContentRequest": inner})
    assert wrapped.messages == GEMINI.parse(inner).messages and wrapped.model == "g"
    assert (
        GEMINI.tool_tokens({"generateContentRequest": inner}, counter)
        == GEMINI.tool_tokens(inner, counter)
        > 0
    )


def resent(turns: int) -> dict[str, Any]:
    contents: list[dict[str, Any]] = [user("<session_context>", "read them all")]
    for k in range(turns):
        contents += step(["read_file"], [words(30, f"r{k}")], tag=f"s{k}", think=k % 3 == 0)
    return {"systemInstruction": SYSTEM, "contents": contents}


def test_a_resent_history_reuses_its_parse_and_equals_a_fresh_one() -> None:
    memo = ParseMemo()
    first = resent(12)
    once = GEMINI.parse(first, memo=memo)
    assert once.messages == GEMINI.parse(first).messages and len(memo) == 1
    second = copy.deepcopy(resent(13))
    again = GEMINI.parse(second, memo=memo)
    assert again.messages == GEMINI.parse(second).messages
    shared = sum(a is b for a, b in zip(once.messages, again.messages, strict=False))
    assert shared >= len(once.messages) - 1  # the resent contents' messages are the same objects
    # A content that looks equal but is not strictly equal (1 vs 1.0) is built again (bodies are
    # never mutated once parsed: each is a new copy).
    ints, floats = copy.deepcopy(second), copy.deepcopy(second)
    ints["contents"][3]["parts"][0]["functionCall"]["args"] = {"n": 1}
    floats["contents"][3]["parts"][0]["functionCall"]["args"] = {"n": 1.0}
    GEMINI.parse(ints, memo=memo)
    changed = floats
    fresh = GEMINI.parse(changed)
    assert GEMINI.parse(changed, memo=memo).messages == fresh.messages
    assert "1.0" in fresh.messages[4]["tool_calls"][0]["function"]["arguments"]


def test_a_bad_content_after_a_resent_history_is_still_refused() -> None:
    memo = ParseMemo()
    GEMINI.parse(resent(12), memo=memo)
    bad = resent(13)
    bad["contents"].append({"role": "assistant", "parts": [{"text": "x"}]})
    with pytest.raises(InvalidRequest) as caught:
        GEMINI.parse(bad, memo=memo)
    assert caught.value.param == f"contents[{len(bad['contents']) - 1}].role"


@pytest.mark.parametrize(
    ("request_body", "words"),
    [
        (
            {"contents": [user("x")], "generationConfig": {"maxOutputTokens": "64"}},
            "Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32), \"64\"",
        ),
        (
            {"contents": [user("x")], "generationConfig": {"maxOutputTokens": True}},
            "Invalid value at 'generation_config.max_output_tokens' (TYPE_INT32), true",
        ),
        (
            {"contents": [user("x")], "generationConfig": {"maxOutputTokens": 0}},
            "maxOutputTokens value of 0 but the supported range is from 1 (inclusive)",
        ),
        (
            {"contents": "a prompt the error must not echo back"},
            "Invalid value at 'contents' (a repeated field), a string",
        ),
        ({"contents": []}, "contents is not specified"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_in_googles_words(
    request_body: dict[str, Any], words: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validate_body(request_body)
    assert words in refused.value.message
    assert "must not echo" not in refused.value.message


def test_an_empty_history_is_counted_but_never_answered() -> None:
    assert validate_body({"contents": []}, kind="count")[0] == []
    for kind in ("fit", None):
        with pytest.raises(InvalidRequest, match="contents is not specified"):
            validate_body({"contents": []}, kind=kind)  # type: ignore[arg-type]
