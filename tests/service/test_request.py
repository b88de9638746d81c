"""The request value: what it plans, what it forwards, and the guard's fallback made loud."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx
import pytest
import respx

from app.core.body_memo import BodyMemo
from app.core.dialects import CHAT, RESPONSES
from app.core.errors import InvalidJson
from app.core.fit import StructureGuardWarning
from app.core.messages import Message
from app.core.plan import StrategyResult
from app.core.routes import RouteMatch
from app.service.driver import Service
from app.service.request import Forwarded, RequestOptions, load_json, parse_body
from app.upstream.client import UpstreamClient
from tests.api import UPSTREAM, OneModelRegistry, WordVocabularies, make_settings, words

CHAT_ROUTE = RouteMatch.first(CHAT)


def service() -> Service:
    http = httpx.AsyncClient(transport=httpx.MockTransport(respx.Router().handler))
    return Service(
        settings=make_settings(),
        registry=OneModelRegistry(),
        vocabularies=WordVocabularies(),
        upstream=UpstreamClient(http, base_url=UPSTREAM),
    )


def agent_body() -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for k in range(4):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": words(300)})
    messages.append({"role": "user", "content": "now"})
    return {"model": "m", "messages": messages}


def test_a_plan_the_guard_had_to_undo_is_logged_as_a_bug(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import app.core.fit as fit

    def orphaning(messages: Sequence[Message], ctx: Any) -> StrategyResult:
        return StrategyResult(tuple(m for m in messages if "tool_calls" not in m))

    monkeypatch.setattr(fit, "STRATEGIES", (("broken", orphaning),))
    request = service().request(agent_body(), RequestOptions(), route=CHAT_ROUTE)
    with caplog.at_level("ERROR", logger="ctxproxy.fit"), pytest.warns(StructureGuardWarning):
        plan = request.plan()
    assert plan.broken and not plan.changed
    (record,) = caplog.records
    assert "strategy bug" in record.getMessage() and "chat" in record.getMessage()
    assert "the unchanged request" in record.getMessage()


def test_forwarded_counts_each_body_by_its_dialects_accounting_view() -> None:
    # A chat body is the accounting's own shape (counted as it is); another API's is its neutral
    # messages with the tools priced by its own rule.
    svc = service()
    chat = svc.request(agent_body(), RequestOptions(), route=CHAT_ROUTE)
    assert Forwarded.of(chat, None).counted is chat.body
    body = {"model": "m", "input": "hello", "tools": [{"type": "function", "name": "f", "parameters": {}}]}
    responses = svc.request(body, RequestOptions(), route=RouteMatch.first(RESPONSES))
    counted = Forwarded.of(responses, None).counted
    assert counted is not body
    assert counted["messages"][0]["role"] == "user" and len(counted["messages"]) == 2  # + the tools' price


def test_what_the_fast_path_sent_first_is_counted_as_the_client_request_with_the_plans_tool_price() -> None:
    svc = service()
    body = {"model": "m", "input": "hello", "tools": [{"type": "function", "name": "f", "parameters": {}}]}
    responses = svc.request(body, RequestOptions(), route=RouteMatch.first(RESPONSES))
    plan = responses.plan()
    assert not plan.changed and plan.budget.tool_tokens > 0
    sent = Forwarded.sent_first(responses, plan)
    assert sent.plan is plan and sent.content == responses.raw and sent.body is responses.body
    assert sent.counted == Forwarded.of(responses, None).counted  # the same comparison for learning
    chat = svc.request(agent_body(), RequestOptions(), route=CHAT_ROUTE)
    changed = Forwarded.sent_first(chat, replace(plan, changed=True))
    assert changed.plan is None  # a plan that changed the request is not what went out


@pytest.mark.parametrize(
    ("raw", "token"),
    [
        (b'{"model": "m", "temperature": NaN}', True),
        (b'{"model": "m", "temperature": Infinity}', True),
        (b'{"model": "m", "temperature": -Infinity}', True),
        (b'{"model": "m", "temperature": 1e400}', False),
        (b'{"model": "m", "temperature": -1E+999}', False),
        (b'{"model": "m", "seed": 1' + b"0" * 400 + b"}", False),  # an integer over a double
        # With an escaped lone surrogate (orjson refuses it, the standard library decides): the same.
        (b'{"model": "m\\ud800", "temperature": NaN}', True),
        (b'{"model": "m\\ud800", "temperature": 1e400}', False),
        (b'{"model": "m\\ud800", "seed": 1' + b"0" * 400 + b"}", False),
    ],
)
def test_what_rfc_8259_leaves_out_is_refused_as_invalid_json(raw: bytes, token: bool) -> None:
    with pytest.raises(InvalidJson) as refused:
        parse_body(raw)
    assert refused.value.unexpected_token is token
    with pytest.raises(ValueError):  # the JSON readers of answers catch ValueError
        load_json(raw)


def test_an_invalid_json_error_says_where_and_shows_the_place() -> None:
    raw = b'{"model": "m",\n "messages": [], "temperature": NaN, "top_p": 1}'
    with pytest.raises(InvalidJson) as refused:
        parse_body(raw)
    error = refused.value
    assert (error.line, error.column) == (2, 33) and raw.decode()[error.offset :].startswith("NaN")
    line, caret = error.excerpt.split("\n")
    assert line[caret.index("^") :].startswith("NaN")
    assert error.message == f"{error.reason}: line 2 column 33 (char {error.offset})"


def test_what_json_allows_is_taken_as_before() -> None:
    assert parse_body(b'{"a": "\\ud800", "b": 1e308, "c": -0.0, "d": 18446744073709551615}') == {
        "a": "\ud800",
        "b": 1e308,
        "c": -0.0,
        "d": 18446744073709551615,
    }
    assert parse_body('{"a": 1}'.encode("utf-16")) == {"a": 1}  # the standard library's encodings


def test_a_resent_body_is_held_to_the_same_rule_by_the_memo() -> None:
    bodies = BodyMemo(min_bytes=0, min_reuse_bytes=0)
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": words(40)} for i in range(9)]
    first = json.dumps({"model": "m", "messages": history, "top_p": 1}).encode()
    remembered = parse_body(first, memo=bodies, key="messages")

    def grown(element: bytes, tail: bytes = b'"top_p": 1}') -> bytes:
        return first.replace(b"]", b", " + element + b"]").replace(b'"top_p": 1}', tail)

    valid = parse_body(grown(b'{"role": "user", "content": "x"}'), memo=bodies, key="messages")
    assert valid["messages"][0] is remembered["messages"][0]  # the memo's partial parse took it
    for raw in (
        grown(b'{"role": "user", "content": "x", "weight": NaN}'),  # in a new element
        grown(b'{"role": "user", "content": "x", "weight": 1e400}'),
        grown(b'{"role": "user", "content": "x"}', b'"top_p": -Infinity}'),  # after the array
    ):
        with pytest.raises(InvalidJson):
            parse_body(raw, memo=bodies, key="messages")
