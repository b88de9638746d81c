"""When the opening events of a stream have been read: at the first event past the preamble."""

from __future__ import annotations

from app.core.dialects import RESPONSES
from app.core.preamble import MAX_PREAMBLE_BYTES, preamble_done

KINDS = RESPONSES.preamble_events
CREATED = b'event: response.created\ndata: {"type":"response.created"}\n\n'
PROGRESS = b'event: response.in_progress\ndata: {"type":"response.in_progress"}\n\n'
ITEM = b'event: response.output_item.added\ndata: {"type":"response.output_item.added"}\n\n'


def test_only_the_preamble_is_not_enough_and_the_first_other_event_is() -> None:
    assert not preamble_done(b"", KINDS)
    assert not preamble_done(CREATED + PROGRESS, KINDS)
    assert preamble_done(CREATED + PROGRESS + ITEM, KINDS)
    failed = b'event: response.failed\ndata: {"type":"response.failed"}\n\n'
    assert preamble_done(CREATED + failed, KINDS)


def test_an_event_still_arriving_is_not_judged_yet() -> None:
    assert not preamble_done(CREATED + ITEM[:20], KINDS)
    assert not preamble_done(CREATED + ITEM[:-1], KINDS)  # no blank line yet


def test_data_only_frames_crlf_and_unreadable_frames() -> None:
    assert not preamble_done(b'data: {"type":"response.created"}\r\n\r\n', KINDS)
    assert preamble_done(b'data: {"type":"response.created"}\r\n\r\ndata: {"type":"x"}\r\n\r\n', KINDS)
    assert preamble_done(b"data: not json\n\n", KINDS)  # unreadable: the answer proper


def test_a_long_preamble_stops_at_the_byte_limit() -> None:
    assert preamble_done(b": keep-alive\n" * (MAX_PREAMBLE_BYTES // 10), KINDS)
