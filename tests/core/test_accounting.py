"""app.core.accounting: OpenAI chat accounting of messages and tool definitions."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.accounting import TOKENS_PER_TOOL_CALL
from app.core.tokens import MessageCounter
from tests.core.chat_samples import CL100K, COOKBOOK_MESSAGES, COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS, O200K


def test_hello_world_is_two_tokens_on_o200k() -> None:
    assert O200K.count_text("Hello world") == 2


@pytest.mark.parametrize(("counter", "expected"), [(O200K, 124), (CL100K, 129)])
def test_cookbook_messages(counter: Any, expected: int) -> None:
    assert MessageCounter(counter).count_request({"model": "x", "messages": COOKBOOK_MESSAGES}) == expected


@pytest.mark.parametrize(("counter", "expected"), [(O200K, 101), (CL100K, 105)])
def test_cookbook_tools(counter: Any, expected: int) -> None:
    body = {"messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}
    assert MessageCounter(counter).count_request(body) == expected


def test_legacy_functions_count_like_tools() -> None:
    mc = MessageCounter(O200K)
    assert mc.count_tools({"functions": [COOKBOOK_TOOLS[0]["function"]]}) == mc.count_tools(
        {"tools": COOKBOOK_TOOLS}
    )
    assert mc.count_tools({}) == 0 and mc.count_tools({"tools": []}) == 0


def test_nested_tool_schemas_are_counted() -> None:
    mc = MessageCounter(O200K)
    flat = {"type": "object", "properties": {"order": {"type": "object", "description": "The order"}}}
    nested = {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "description": "The order",
                "properties": {
                    "sku": {"type": "string", "description": "Stock keeping unit"},
                    "lines": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"qty": {"type": "integer", "enum": [1, 2]}},
                        },
                    },
                },
            }
        },
    }

    def tools(params: dict[str, Any]) -> dict[str, Any]:
        return {
            "tools": [
                {"type": "function", "function": {"name": "place", "description": "", "parameters": params}}
            ]
        }

    extra = mc.count_tools(tools(nested)) - mc.count_tools(tools(flat))
    # prop_init + 2 * (prop_key + line) for sku/lines, "object" item type, prop_init + qty with its enum
    assert extra >= 3 + 2 * 3 + O200K.count_text("sku:string:Stock keeping unit") + 3 + 3
    custom = {"tools": [{"type": "custom", "custom": {"name": "grep", "description": "Search files"}}]}
    assert mc.count_tools(custom) == 7 + O200K.count_text("grep") + O200K.count_text("Search files") + 12


def test_message_rules() -> None:
    mc = MessageCounter(O200K)
    c = O200K.count_text
    call = {
        "id": "call_abc123",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
    }
    assistant = {"role": "assistant", "content": None, "tool_calls": [call, call]}
    expected = (
        3 + c("assistant") + 2 * (TOKENS_PER_TOOL_CALL + c("call_abc123") + c("lookup") + c('{"q": "x"}'))
    )
    assert mc.count_message(assistant) == expected
    tool = {"role": "tool", "tool_call_id": "call_abc123", "content": "42"}
    assert mc.count_message(tool) == 3 + c("tool") + c("call_abc123") + c("42")
    legacy = {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}}
    assert mc.count_message(legacy) == 3 + c("assistant") + TOKENS_PER_TOOL_CALL + c("f") + c("{}")
    reasoning = {"role": "assistant", "content": "ok", "reasoning_content": "think hard", "x_extra": "more"}
    assert mc.count_message(reasoning) == 3 + c("assistant") + c("ok") + c("think hard") + c("more")
    parts = {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "refusal", "refusal": "no"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
        ],
    }
    assert mc.count_message(parts) == 3 + c("user") + c("look") + c("no") + 85
    named = {"role": "user", "name": "bob", "content": "hi"}
    assert mc.count_message(named) == 3 + c("user") + 1 + c("bob") + c("hi")
