from __future__ import annotations

from app.core.dialects import DIALECTS
from app.core.routes import AUTHORIZATION, KeySlot, key_slots
from app.upstream.headers import client_response_headers, upstream_query, upstream_request_headers

SLOTS = key_slots(DIALECTS.values())
X_API_KEY = KeySlot("x-api-key")


def test_hop_by_hop_context_and_expect_headers_are_not_forwarded_upstream() -> None:
    headers = [
        ("Host", "proxy:8080"),
        ("Content-Length", "12"),
        ("Connection", "keep-alive, X-Debug"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("TE", "trailers"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic x"),
        ("X-Debug", "1"),
        ("Expect", "100-continue"),
        ("X-Context-Budget", "100"),
        ("x-context-policy", "off"),
        ("Content-Type", "application/json"),
        ("OpenAI-Organization", "org-1"),
        ("Authorization", "Bearer client"),
    ]
    assert upstream_request_headers(headers) == [
        ("Content-Type", "application/json"),
        ("OpenAI-Organization", "org-1"),
        ("Authorization", "Bearer client"),
    ]


def test_configured_key_replaces_every_client_authorization() -> None:
    headers = [("authorization", "Bearer a"), ("Authorization", "Bearer b"), ("Accept", "*/*")]
    assert upstream_request_headers(headers, api_key="sk-op") == [
        ("Accept", "*/*"),
        ("Authorization", "Bearer sk-op"),
    ]


def test_response_headers_drop_hop_by_hop_and_keep_the_rest_in_order() -> None:
    headers = [
        ("Content-Type", "text/event-stream"),
        ("Transfer-Encoding", "chunked"),
        ("Content-Length", "5"),
        ("Connection", "close"),
        ("x-ratelimit-remaining-requests", "99"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
    ]
    assert client_response_headers(headers) == [
        ("Content-Type", "text/event-stream"),
        ("x-ratelimit-remaining-requests", "99"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
    ]


def test_the_key_replaces_an_anthropic_x_api_key_and_goes_where_the_client_put_its_own() -> None:
    anthropic = [("x-api-key", "client"), ("anthropic-version", "2023-06-01"), ("anthropic-beta", "b1")]
    forwarded = upstream_request_headers(anthropic, api_key="sk-op", key_slots=SLOTS)
    assert forwarded == [
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "b1"),
        ("x-api-key", "sk-op"),
    ]
    openai = upstream_request_headers(
        [("Authorization", "Bearer c"), ("X-Api-Key", "c")], api_key="sk-op", key_slots=SLOTS
    )
    assert openai == [("Authorization", "Bearer sk-op")]
    asked = upstream_request_headers(
        [("Authorization", "Bearer c")], api_key="sk-op", key_slot=X_API_KEY, key_slots=SLOTS
    )
    assert asked == [("x-api-key", "sk-op")]
    # Without an operator key both pass as the client sent them.
    assert upstream_request_headers(anthropic, key_slots=SLOTS) == anthropic


def test_every_registered_slot_is_cleared_even_one_the_request_does_not_use() -> None:
    goog = KeySlot("x-goog-api-key")
    headers = [("x-goog-api-key", "proxy-key"), ("Authorization", "Bearer c"), ("Accept", "*/*")]
    forwarded = upstream_request_headers(
        headers, api_key="sk-op", key_slot=AUTHORIZATION, key_slots=(*SLOTS, goog)
    )
    assert forwarded == [("Accept", "*/*"), ("Authorization", "Bearer sk-op")]


def test_a_query_slot_is_replaced_in_the_query_and_nothing_else_moves() -> None:
    key = KeySlot("key", in_query=True)
    slots = tuple(dict.fromkeys((*SLOTS, key)))  # the registry's slots hold it already (Gemini's)
    assert upstream_query("alt=sse&key=client&x=1", api_key="sk-op", key_slot=key, key_slots=slots) == (
        "alt=sse&x=1&key=sk-op"
    )
    # The key goes in a header slot: the client's query key is dropped all the same.
    assert upstream_query("key=client&alt=sse", api_key="sk op", key_slot=AUTHORIZATION, key_slots=slots) == (
        "alt=sse"
    )
    # No slot asked: the one the client used (here its query), encoded.
    assert upstream_query("KEY=c", api_key="a/b", key_slots=slots) == "key=a%2Fb"
    # Without an operator key the query is the client's, byte for byte.
    assert upstream_query("key=c&alt=sse", key_slots=slots) == "key=c&alt=sse"
    headers = upstream_request_headers(
        [("Authorization", "Bearer c")], api_key="k", key_slot=key, key_slots=slots
    )
    assert headers == []


def test_the_upstreams_date_and_server_are_left_to_our_server() -> None:
    headers = [("Date", "Mon, 01 Jan 2024 00:00:00 GMT"), ("server", "uvicorn"), ("X-Request-ID", "req_1")]
    assert client_response_headers(headers) == [("X-Request-ID", "req_1")]


def test_a_json_body_is_labelled_json_for_the_upstream() -> None:
    from app.upstream.headers import labelled_json

    plain = [("Accept", "*/*"), ("content-type", "text/plain"), ("X-A", "1")]
    assert labelled_json(plain) == [("Accept", "*/*"), ("X-A", "1"), ("Content-Type", "application/json")]
    form = [("Content-Type", "application/x-www-form-urlencoded")]
    assert labelled_json(form) == [("Content-Type", "application/json")]
    assert labelled_json([("Accept", "*/*")]) == [("Accept", "*/*"), ("Content-Type", "application/json")]
    kept = [("Content-Type", "application/json; charset=utf-8")]
    assert labelled_json(kept) == kept
    assert labelled_json([("content-type", "application/vnd.api+json")]) == [
        ("content-type", "application/vnd.api+json")
    ]


def test_the_raw_response_headers_are_filtered_as_the_text_ones() -> None:
    from app.upstream.headers import client_response_raw

    headers = [
        ("Content-Type", "text/event-stream"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close, X-Hop"),
        ("X-Hop", "1"),
        ("Date", "Mon, 01 Jan 2024 00:00:00 GMT"),
        ("x-ratelimit-remaining-requests", "99"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=\xe9"),
    ]
    raw = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    expected = [
        (name.lower().encode("latin-1"), value.encode("latin-1"))
        for name, value in client_response_headers(headers)
    ]
    assert client_response_raw(raw) == expected
    assert [name for name, _ in expected] == [
        b"content-type",
        b"x-ratelimit-remaining-requests",
        b"set-cookie",
        b"set-cookie",
    ]
