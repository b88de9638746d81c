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
from app.core.routes import RouteMatch
from app.service.driver import Service
from app.service.request import Forwarded, RequestOptions
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
