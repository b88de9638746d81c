"""The request value: what it plans, what it forwards, and the guard's fallback made loud."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx
import pytest
import respx

from app.core.dialects import CHAT, RESPONSES
from app.core.fit import StructureGuardWarning
from app.core.messages import Message
from app.core.plan import StrategyResult
from app.service.driver import Service
from app.service.request import Forwarded, RequestOptions
from app.upstream.client import UpstreamClient
from tests.api import UPSTREAM, OneModelRegistry, WordVocabularies, make_settings, words


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
    request = service().request(agent_body(), RequestOptions())
    with caplog.at_level("ERROR", logger="ctxproxy.fit"), pytest.warns(StructureGuardWarning):
        plan = request.plan()
    assert plan.broken and not plan.changed
    (record,) = caplog.records
    assert "strategy bug" in record.getMessage() and "chat" in record.getMessage()
    assert "the unchanged request" in record.getMessage()


def test_forwarded_counts_a_chat_shaped_body_as_itself_and_others_by_their_neutral_messages() -> None:
    svc = service()
    chat = svc.request(agent_body(), RequestOptions())
    assert CHAT.chat_shaped and Forwarded.of(chat, None).counted is chat.body
    body = {"model": "m", "input": "hello", "tools": [{"type": "function", "name": "f", "parameters": {}}]}
    responses = svc.request(body, RequestOptions(), dialect=RESPONSES)
    counted = Forwarded.of(responses, None).counted
    assert not RESPONSES.chat_shaped and counted is not body
    assert counted["messages"][0]["role"] == "user" and len(counted["messages"]) == 2  # + the tools' price


def test_what_the_fast_path_sent_first_is_counted_as_the_client_request_with_the_plans_tool_price() -> None:
    svc = service()
    body = {"model": "m", "input": "hello", "tools": [{"type": "function", "name": "f", "parameters": {}}]}
    responses = svc.request(body, RequestOptions(), dialect=RESPONSES)
    plan = responses.plan()
    assert not plan.changed and plan.budget.tool_tokens > 0
    sent = Forwarded.sent_first(responses, plan)
    assert sent.plan is plan and sent.content == responses.raw and sent.body is responses.body
    assert sent.counted == Forwarded.of(responses, None).counted  # the same comparison for learning
    changed = Forwarded.sent_first(svc.request(agent_body(), RequestOptions()), replace(plan, changed=True))
    assert changed.plan is None  # a plan that changed the request is not what went out


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [{"role": "user", "content": "caf\\u00e9 \\ud83d\\ude00 \xe6\x97\xa5"}]}',
        b'{"a": 1.0, "b": -0.0, "c": 1e-7, "d": 12345678901234567890123, "e": [true, null, "x"], "a": 2}',
        b'{"i": [18446744073709551615, 18446744073709551616, -9223372036854775809, -0]}',
        b'{"t": NaN, "u": -Infinity, "s": "\\ud800"}',  # orjson refuses these; the fallback reads them
        b'{"x": 1e400}',
    ],
)
def test_a_large_body_is_read_by_the_standard_library_with_the_same_value(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.service.request as request

    small = request.load_json(raw)
    monkeypatch.setattr(request, "LARGE_BODY_BYTES", 1)  # every body "large"
    large = request.load_json(raw)
    assert repr(small) == repr(large)  # repr: NaN is not equal to itself, and 1 == 1.0
    with pytest.raises(ValueError):
        request.load_json(b'{"model": ')
