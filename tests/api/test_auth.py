"""Proxy key parsing and the constant-time comparison over every key."""

from __future__ import annotations

import hmac

import pytest

from app.api import auth
from app.api.auth import key_matches, presented_key
from app.core.dialects import DIALECTS
from app.core.routes import KeySlot, key_slots

SLOTS = key_slots(DIALECTS.values())


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"authorization", b"Bearer abc")], b"abc"),
        ([(b"Authorization", b"bearer   abc  ")], b"abc"),
        ([(b"authorization", b"Basic abc")], None),
        ([(b"authorization", b"Bearer")], None),
        ([(b"authorization", b"")], None),
        ([], None),
        ([(b"x-api-key", b"abc")], b"abc"),  # Anthropic clients send their key there
        ([(b"x-api-key", b"abc"), (b"authorization", b"Bearer t")], b"t"),
    ],
)
def test_presented_key(headers: list[tuple[bytes, bytes]], expected: bytes | None) -> None:
    assert presented_key(headers, slots=SLOTS) == expected


def test_a_key_slot_in_the_query_is_read_decoded() -> None:
    slots = (*SLOTS, KeySlot("key", in_query=True))
    assert presented_key([], b"alt=sse&key=a%2Bb", slots=slots) == b"a+b"
    assert presented_key([], b"alt=sse", slots=slots) is None
    # A header slot comes first in registry order.
    assert presented_key([(b"authorization", b"Bearer h")], b"key=q", slots=slots) == b"h"


def test_key_matches_any_configured_key_exactly() -> None:
    keys = (b"alpha", b"beta")
    assert key_matches(b"alpha", keys) and key_matches(b"beta", keys)
    for wrong in (b"alph", b"alphaa", b"ALPHA", b"", None):
        assert not key_matches(wrong, keys)


def test_every_key_is_compared_even_after_a_match(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert key_matches(b"k1", (b"k1", b"k2", b"k3"))
    assert [b for _, b in calls] == [b"k1", b"k2", b"k3"]
    calls.clear()
    assert not key_matches(None, (b"k1", b"k2"))
    assert len(calls) == 2
