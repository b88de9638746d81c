"""Routes as templates, where a matched request goes upstream, key slots and detection."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core import routes as routes_module
from app.core.dialects import CHAT, DIALECTS, GEMINI, MESSAGES, RESPONSES
from app.core.errors import InvalidRequest
from app.core.routes import (
    AUTHORIZATION,
    KeySlot,
    Route,
    RouteMatch,
    RouteTable,
    UpstreamTarget,
    detect,
    key_slots,
)

# A stand-in for an API whose clients send their own versioned path (Gemini's shape).
VERSIONED = replace(
    CHAT,
    name="versioned",
    routes=(
        Route("/v1beta/models/{model}:generate", stream=False),
        Route("/v1beta/models/{model}:streamGenerate", stream=True),
        Route("/v1beta/models/{model}:count", kind="count", upstream_first=True),
        Route("/v1/models/{model}:generate", stream=False),
    ),
    key_slots=(KeySlot("x-versioned-key"), KeySlot("key", in_query=True)),
)
# The three APIs under /v1 beside the stand-in (Gemini, the real one, shares /v1beta with it).
REGISTRY = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES, "versioned": VERSIONED}


def test_literal_routes_are_a_dict_lookup_and_templates_come_after() -> None:
    table = RouteTable.of(REGISTRY)
    chat = table.literal("/v1/chat/completions", "a=1")
    assert chat is not None and chat.dialect is CHAT and chat.query == "a=1" and chat.params == {}
    assert table.literal("/v1beta/models/g:generate") is None
    streamed = table.match("/v1beta/models/gem-2.5:streamGenerate", "alt=sse")
    assert streamed is not None and streamed.dialect is VERSIONED and streamed.route.stream is True
    assert streamed.params == {"model": "gem-2.5"} and streamed.query == "alt=sse"
    assert table.match("/v1beta/models/a/b:generate") is None  # a parameter is one segment
    assert table.match("/v1beta/models/:generate") is None  # and never empty
    assert table.match("/v1/unknown") is None


def test_a_stream_chosen_by_the_path_is_a_json_array_without_its_event_query() -> None:
    table = RouteTable.of(DIALECTS)
    for query, array in [("", True), ("alt=sse", False), ("key=k&alt=sse", False), ("alt=json", True)]:
        streamed = table.match("/v1beta/models/g:streamGenerateContent", query)
        assert streamed is not None and streamed.json_stream is array, query
    whole = table.match("/v1beta/models/g:generateContent", "")
    chat = table.match("/v1/chat/completions", "")
    assert whole is not None and not whole.json_stream and chat is not None and not chat.json_stream


def test_template_parameters_are_decoded_and_written_upstream_as_sent() -> None:
    table = RouteTable.of(REGISTRY)
    matched = table.match("/v1beta/models/a b:count", raw_path="/v1beta/models/a%20b:count")
    assert (
        matched is not None
        and matched.params == {"model": "a b"}
        and matched.raw_params == {"model": "a%20b"}
    )
    # Sent at the origin: the client's own path, percent-encoding kept.
    assert matched.target == UpstreamTarget("/v1beta/models/a%20b:count", at_origin=True)
    relative = replace(matched, route=replace(matched.route, upstream="models/{model}:countTokens"))
    assert relative.target == UpstreamTarget("models/a%20b:countTokens")


@pytest.mark.parametrize("raw", ["/v1beta/../x", "/v1beta/%2e%2e/x", "/v1beta/models/./x"])
def test_a_templated_path_with_a_dot_segment_is_refused(raw: str) -> None:
    table = RouteTable.of(
        {"t": replace(CHAT, name="t", routes=(Route("/v1beta/{a}/{b}"), Route("/v1beta/{a}/{b}/{c}")))}
    )
    with pytest.raises(InvalidRequest, match=r"'\.\.'"):
        table.match(raw.replace("%2e%2e", ".."), raw_path=raw)


def test_a_templated_path_matched_again_is_remembered_and_a_dot_segment_refused_each_time() -> None:
    table = RouteTable.of(REGISTRY)
    first = table.match("/v1beta/models/a b:count", "x=1", raw_path="/v1beta/models/a%20b:count")
    again = table.match("/v1beta/models/a b:count", "y=2", raw_path="/v1beta/models/a%20b:count")
    assert first is not None and again is not None
    assert (again.route, again.params, again.raw_params, again.path) == (
        first.route, {"model": "a b"}, {"model": "a%20b"}, "/v1beta/models/a%20b:count"
    )  # fmt: skip
    assert (first.query, again.query) == ("x=1", "y=2")  # the query is the request's own
    # The same decoded path sent otherwise is its own entry: its raw parameters are its own.
    plain = table.match("/v1beta/models/a b:count", raw_path="/v1beta/models/a b:count")
    assert plain is not None and plain.raw_params == {"model": "a b"}
    for i in range(routes_module.MATCHED_MAX + 10):
        assert table.match(f"/v1beta/models/m{i}:generate") is not None
    again = table.match("/v1beta/models/a b:count", raw_path="/v1beta/models/a%20b:count")
    assert again is not None and again.params == {"model": "a b"}  # dropped, matched afresh
    dotted = RouteTable.of({"t": replace(CHAT, name="t", routes=(Route("/v1beta/{a}/{b}"),))})
    for _ in range(2):  # never remembered: refused every time
        with pytest.raises(InvalidRequest):
            dotted.match("/v1beta/../x", raw_path="/v1beta/%2e%2e/x")


def test_literal_routes_go_under_the_base_url() -> None:
    for dialect in (CHAT, RESPONSES, MESSAGES):
        for route in dialect.routes:
            match = RouteTable.of(DIALECTS).literal(route.template)
            assert match is not None and match.target == UpstreamTarget(route.upstream)
            assert not match.target.path.startswith("/")
    assert RouteMatch.first(MESSAGES, "count").target == UpstreamTarget("messages/count_tokens")


def test_first_prefers_a_literal_route_and_says_when_there_is_none() -> None:
    assert RouteMatch.first(CHAT).route.template == "/v1/chat/completions"
    assert RouteMatch.first(VERSIONED).route.template == "/v1beta/models/{model}:generate"
    with pytest.raises(LookupError):
        RouteMatch.first(CHAT, "count")


def test_a_registry_whose_routes_clash_or_start_with_a_parameter_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        RouteTable.of({**DIALECTS, "copy": replace(CHAT, name="copy")})
    with pytest.raises(ValueError, match="first segment"):
        RouteTable.of({"bad": replace(CHAT, name="bad", routes=(Route("/{version}/models"),))})


def test_the_owner_of_a_path() -> None:
    table = RouteTable.of(REGISTRY)
    assert table.owner("/v1/messages") is MESSAGES
    assert table.owner("/v1/messages/batches") is MESSAGES  # under its literal route
    assert table.owner("/v1/responses/resp_1/cancel") is RESPONSES
    assert table.owner("/v1beta/models") is VERSIONED  # the only API under that prefix
    assert table.owner("/v1/models") is None  # several APIs live under /v1
    assert table.owner("/other") is None
    assert RouteTable.of(DIALECTS).owner("/v1beta/models/gemini-2.5-flash") is GEMINI


def test_passthrough_prefixes_and_where_they_send() -> None:
    assert RouteTable.of(DIALECTS).passthrough_prefixes() == (("/v1", False), ("/v1beta", True))
    prefixes = dict(RouteTable.of(REGISTRY).passthrough_prefixes())
    assert prefixes == {"/v1": False, "/v1beta": True}


def test_key_slots_are_the_registrys_each_once_in_order() -> None:
    assert key_slots(DIALECTS.values()) == (
        AUTHORIZATION,
        KeySlot("x-api-key"),
        KeySlot("x-goog-api-key"),
        KeySlot("key", in_query=True),
    )
    assert key_slots(REGISTRY.values())[-2:] == (KeySlot("x-versioned-key"), KeySlot("key", in_query=True))
    assert AUTHORIZATION.value("k") == "Bearer k" and AUTHORIZATION.key_in(" bearer  k ") == "k"
    assert AUTHORIZATION.key_in("Basic k") is None and AUTHORIZATION.key_in("Bearer ") is None
    assert KeySlot("x-api-key").key_in(" k ") == "k" and KeySlot("x-api-key").key_in("") is None


def test_detect_takes_the_surest_recognition_else_the_registrys_first() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert detect(DIALECTS, chat, {}) is CHAT
    assert detect(DIALECTS, chat, {"anthropic-version": "2023-06-01"}) is MESSAGES
    assert detect(DIALECTS, {"model": "m", "input": "hi"}, {}) is RESPONSES
    assert detect(DIALECTS, {"model": "m", "system": "s", "messages": []}, {}) is MESSAGES
    blocks = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]
    assert detect(DIALECTS, {"model": "m", "messages": blocks}, {}) is MESSAGES
    assert detect(DIALECTS, {"model": "m"}, {}) is CHAT
