"""Finding usage.prompt_tokens in responses: JSON bodies and SSE streams cut anywhere."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.dialects.gemini import GEMINI
from app.core.usage import (
    MAX_LINE_BYTES,
    JsonArrayUsageScanner,
    SseUsageScanner,
    input_tokens_from_json,
    prompt_tokens_from_json,
)


def sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"


CHUNK = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
USAGE = {
    "id": "c",
    "choices": [],
    "usage": {"prompt_tokens": 1234, "completion_tokens": 5, "total_tokens": 1239},
}
STREAM = sse(CHUNK, CHUNK, {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, USAGE)


def test_json_usage() -> None:
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 1}}).encode()
    assert prompt_tokens_from_json(body) == 42
    for bad in (b"", b"{", b"[]", b'{"usage": {"prompt_tokens": -1}}', b'{"usage": {"prompt_tokens": true}}'):
        assert prompt_tokens_from_json(bad) is None
    assert prompt_tokens_from_json(b'{"usage": null, "x": "prompt_tokens"}') is None


def test_the_json_usage_readers_parse_with_the_loads_they_are_given() -> None:
    body = b'{"usage": {"prompt_tokens": 42, "input_tokens": 7}}'
    seen: list[bytes] = []

    def loads(raw: bytes) -> object:
        seen.append(raw)
        return json.loads(raw)

    def refuses(raw: bytes) -> object:
        raise ValueError("not JSON to this parser")

    assert prompt_tokens_from_json(body, loads=loads) == 42
    assert input_tokens_from_json(body, lambda answer: answer["usage"]["input_tokens"], loads=loads) == 7
    assert seen == [body, body]
    assert prompt_tokens_from_json(body, loads=refuses) is None
    assert input_tokens_from_json(body, lambda answer: 1, loads=refuses) is None


def test_the_final_usage_chunk_is_found() -> None:
    scanner = SseUsageScanner()
    scanner.feed(STREAM)
    assert scanner.prompt_tokens == 1234


def test_no_usage_no_count_and_the_last_usage_wins() -> None:
    scanner = SseUsageScanner()
    scanner.feed(sse(CHUNK, CHUNK))
    assert scanner.prompt_tokens is None
    continuous = {**CHUNK, "usage": {"prompt_tokens": 7}}
    scanner.feed(sse(continuous, {**CHUNK, "usage": {"prompt_tokens": 8}}))
    assert scanner.prompt_tokens == 8


def test_crlf_lines_and_comments() -> None:
    scanner = SseUsageScanner()
    scanner.feed(b": keep-alive\r\n\r\n" + STREAM.replace(b"\n", b"\r\n"))
    assert scanner.prompt_tokens == 1234


def test_an_over_long_line_is_skipped_without_being_kept() -> None:
    scanner = SseUsageScanner()
    big = {**CHUNK, "choices": [{"index": 0, "delta": {"content": "x" * (MAX_LINE_BYTES * 2)}}]}
    data = sse(big, USAGE)
    for i in range(0, len(data), 1000):
        scanner.feed(data[i : i + 1000])
        assert len(scanner._pending) <= MAX_LINE_BYTES
    assert scanner.prompt_tokens == 1234


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_of_the_stream_gives_the_same_count(cuts: list[int]) -> None:
    scanner = SseUsageScanner()
    bounds = [0, *sorted(cuts), len(STREAM)]
    for start, stop in itertools.pairwise(bounds):
        scanner.feed(STREAM[start:stop])
    assert scanner.prompt_tokens == 1234


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_raises(data: bytes) -> None:
    SseUsageScanner().feed(data)
    prompt_tokens_from_json(data)


def test_another_apis_usage_is_read_by_its_extractor_from_json_and_events() -> None:
    from app.core.dialects.responses import RESPONSES
    from app.core.usage import input_tokens_from_json

    completed = (
        b'{"type":"response.completed","response":{"id":"r","usage":{"input_tokens":321,"output_tokens":2}}}'
    )
    assert input_tokens_from_json(completed, RESPONSES.input_tokens_used) == 321
    assert input_tokens_from_json(b'{"id":"r"}', RESPONSES.input_tokens_used) is None
    scanner = SseUsageScanner(RESPONSES.input_tokens_used, needles=(b'"usage"',), max_line_bytes=1 << 20)
    created = b'event: response.created\ndata: {"type":"response.created","response":{"usage":null}}\n\n'
    scanner.feed(created + b"event: response.completed\ndata: " + completed[:40])
    assert scanner.prompt_tokens is None
    scanner.feed(completed[40:] + b"\n\n")
    assert scanner.prompt_tokens == 321


def test_geminis_usage_metadata_is_read_from_a_json_answer_and_crlf_framed_events() -> None:
    from app.core.dialects.gemini import GEMINI

    answer = b'{"candidates":[],"usageMetadata":{"promptTokenCount":77,"totalTokenCount":80}}'
    assert input_tokens_from_json(answer, GEMINI.input_tokens_used) == 77
    scanner = SseUsageScanner(GEMINI.input_tokens_used, needles=GEMINI.usage_needles)
    scanner.feed(b"data: " + answer + b"\r\n\r\ndata: " + answer.replace(b"77", b"78")[:30])
    assert scanner.prompt_tokens == 77
    scanner.feed(answer.replace(b"77", b"78")[30:] + b"\r\n\r\n")
    assert scanner.prompt_tokens == 78  # usage on every chunk: the last one counts


def gemini_array(*prompts: int, text: str = 'say "{hi}" \\ [ok]') -> bytes:
    """A JSON-array stream as Google sends one: pretty-printed elements, ``,\\r\\n`` between them."""
    elements = [
        {
            "candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}],
            "usageMetadata": {"promptTokenCount": n, "totalTokenCount": n + 3},
        }
        for n in prompts
    ]
    return b"[" + b",\r\n".join(json.dumps(e, indent=2).encode() for e in elements) + b"]"


ARRAY = gemini_array(500, 501, 502)


def test_a_json_array_streams_usage_is_read_element_by_element() -> None:
    scanner = JsonArrayUsageScanner(GEMINI.input_tokens_used, needles=GEMINI.usage_needles)
    first_end = ARRAY.index(b"}\n},\r\n") + 3
    scanner.feed(ARRAY[:first_end])
    assert scanner.prompt_tokens == 500  # an element is read as soon as it is closed
    scanner.feed(ARRAY[first_end:])
    assert scanner.prompt_tokens == 502  # the last element's count wins
    lone = JsonArrayUsageScanner(GEMINI.input_tokens_used, needles=GEMINI.usage_needles)
    lone.feed(json.dumps({"usageMetadata": {"promptTokenCount": 9}}).encode())
    assert lone.prompt_tokens == 9  # a lone object (an answer that is not an array) too
    error = JsonArrayUsageScanner(GEMINI.input_tokens_used, needles=GEMINI.usage_needles)
    error.feed(b'[{"error": {"code": 400, "message": "} usageMetadata {", "status": "INVALID_ARGUMENT"}}]')
    assert error.prompt_tokens is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(ARRAY)), max_size=12))
def test_any_split_of_a_json_array_gives_the_same_count(cuts: list[int]) -> None:
    scanner = JsonArrayUsageScanner(GEMINI.input_tokens_used, needles=GEMINI.usage_needles)
    bounds = [0, *sorted(cuts), len(ARRAY)]
    for start, stop in itertools.pairwise(bounds):
        scanner.feed(ARRAY[start:stop])
    assert scanner.prompt_tokens == 502


def test_an_over_long_element_is_skipped_without_being_kept() -> None:
    long = gemini_array(700, text="x" * 5000)
    scanner = JsonArrayUsageScanner(
        GEMINI.input_tokens_used, needles=GEMINI.usage_needles, max_element_bytes=1000
    )
    for k in range(0, len(long), 300):
        scanner.feed(long[k : k + 300])
        assert len(scanner._held) <= 1000
    assert scanner.prompt_tokens is None
    scanner.feed(b",\r\n" + gemini_array(701)[1:])
    assert scanner.prompt_tokens == 701  # the next element is read again


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_a_json_array_scanner_never_raises_on_garbage(data: bytes) -> None:
    JsonArrayUsageScanner().feed(data)
