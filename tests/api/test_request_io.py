"""receive_body: the whole body from ASGI messages, within a limit, as read_body reads it;
request_head: the headers, options and declared length of one pass, as the separate readers give them."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from app.api.errors import BodyTooLarge
from app.api.headers import NO_OPTIONS, options_of
from app.api.request_io import declared_length, decoded_headers, receive_body, request_head
from app.core.errors import InvalidRequest
from app.upstream.headers import labelled_json


def messages(*items: dict[str, Any]):
    queue = list(items)

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    return receive


async def test_one_message_and_several_give_the_same_bytes() -> None:
    one = messages({"type": "http.request", "body": b'{"a":1}'})
    assert await receive_body(one, [], limit_bytes=100) == b'{"a":1}'
    parts = messages(
        {"type": "http.request", "body": b'{"a"', "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b":1}", "more_body": False},
    )
    assert await receive_body(parts, [], limit_bytes=100) == b'{"a":1}'


async def test_over_the_limit_by_declaration_or_while_reading() -> None:
    never = messages()  # a declared length over the limit is refused before reading
    with pytest.raises(BodyTooLarge):
        await receive_body(never, [(b"content-length", b"101")], limit_bytes=100)
    with pytest.raises(BodyTooLarge):
        await receive_body(messages({"type": "http.request", "body": b"x" * 101}), [], limit_bytes=100)
    chunks = messages(
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
        {"type": "http.request", "body": b"x" * 60, "more_body": True},
    )
    with pytest.raises(BodyTooLarge):
        await receive_body(chunks, [], limit_bytes=100)


async def test_a_client_that_leaves_while_sending() -> None:
    gone = messages({"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"})
    with pytest.raises(ClientDisconnect):
        await receive_body(gone, [], limit_bytes=100)


def test_declared_length_reads_plain_digits_only() -> None:
    assert declared_length([(b"Content-Length", b" 12 ")]) == 12
    assert declared_length([(b"content-length", b"+5")]) is None
    assert declared_length([(b"host", b"x")]) is None


HEADS = [
    [],
    [(b"host", b"x"), (b"Content-Type", b"application/json"), (b"content-length", b"12")],
    [(b"content-type", b"text/plain"), (b"Content-Length", b" 7 "), (b"content-length", b"9")],
    [(b"content-type", b"application/json"), (b"content-type", b"application/json")],
    [(b"X-Context-Window", b"5000"), (b"x-context-policy", b"reject"), (b"x-contexts", b"no")],
    [(b"content-type", b"application/vnd.api+json; charset=utf-8"), (b"content-length", b"+5")],
    [(b"authorization", b"Bearer \xe9"), (b"x-context", b"1"), (b"Content-Lengths", b"3")],
]


@pytest.mark.parametrize("raw", HEADS)
def test_request_head_is_the_separate_readers_in_one_pass(raw: list[tuple[bytes, bytes]]) -> None:
    head = request_head(raw)
    assert head.headers == labelled_json(decoded_headers(raw))
    assert head.options == options_of(raw)
    assert head.declared_length == declared_length(raw)


def test_request_head_options_and_their_errors() -> None:
    head = request_head([(b"X-Context-Window", b"5000"), (b"x-context-policy", b"reject")])
    assert head.options.window_tokens == 5000 and head.options.mode == "reject"
    assert request_head([(b"host", b"x")]).options is NO_OPTIONS
    with pytest.raises(InvalidRequest):
        request_head([(b"x-context-window", b"lots")])


async def test_receive_body_takes_the_declared_length_from_the_head() -> None:
    never = messages()
    raw = [(b"content-length", b"101")]
    with pytest.raises(BodyTooLarge):
        await receive_body(never, raw, limit_bytes=100, head=request_head(raw))
