"""receive_body: the whole body from ASGI messages, within a limit, as read_body reads it."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import ClientDisconnect

from app.api.errors import BodyTooLarge
from app.api.request_io import declared_length, receive_body


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
