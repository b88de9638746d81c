"""The gateway engine without HTTP: which API a message list is in, the budget of what the gateway
keeps aside, and the fitted messages of each API keeping every structural guarantee (pairing,
signed reasoning untouched, pins), deterministic across replicas and stable as a conversation grows."""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
import pytest
import respx

from app.core.dialects import CHAT, DIALECTS, GEMINI, MESSAGES, RESPONSES
from app.core.errors import InvalidRequest
from app.core.routes import RouteMatch
from app.service.compress import (
    DEFAULT_ASIDE_SHARE,
    Compressor,
    aside_tokens_for,
    compress_answer,
    messages_api,
)
from app.service.driver import Service
from app.service.outcome import PlanCannotFit
from app.service.request import RequestOptions
from app.upstream.client import UpstreamClient
from tests.api import (
    MAX_OUTPUT_TOKENS,
    UPSTREAM,
    WINDOW_TOKENS,
    OneModelRegistry,
    WordVocabularies,
    make_settings,
    words,
)

KNOWN = {name: DIALECTS[name] for name in ("chat", "responses", "messages")}
OPTIONS = RequestOptions()


def service(**settings: Any) -> Service:
    router = respx.Router(assert_all_called=False)
    http = httpx.AsyncClient(transport=httpx.MockTransport(router.handler))
    settings.setdefault("discovery", False)
    return Service(
        settings=make_settings(**settings),
        registry=OneModelRegistry(),
        vocabularies=WordVocabularies(),
        upstream=UpstreamClient(http, base_url=UPSTREAM),
    )


def chat_history(turns: int, size: int = 60) -> list[dict[str, Any]]:
    """An agent's chat history: the system prompt, the task, then one tool call and result a turn."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Task: read every file."},
    ]
    for i in range(turns):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"file {i} " + words(size)},
        ]
    return messages


def anthropic_history(turns: int, size: int = 60) -> list[dict[str, Any]]:
    """Anthropic messages with signed thinking before each tool call (the system prompt is kept
    aside by the gateway)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Task: read every file."}]
    for i in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"I read file {i}.", "signature": f"sig-{i}-abc=="},
                    {"type": "tool_use", "id": f"toolu_{i}", "name": "read", "input": {"path": f"f{i}"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{i}",
                        "content": f"file {i} " + words(size),
                    }
                ],
            },
        ]
    return messages


def responses_history(turns: int, size: int = 60) -> list[dict[str, Any]]:
    """Responses input items: encrypted reasoning glued to each call, calls and their outputs."""
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Task: read."}]}
    ]
    for i in range(turns):
        items += [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": f"gAAA{i}" * 8},
            {"type": "function_call", "call_id": f"call_{i}", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"call_{i}", "output": f"file {i} " + words(size)},
        ]
    return items


def room_tokens(aside: int) -> int:
    """The input budget of OneModelRegistry's window with the default reserve and margin."""
    reserve = min(max(round(WINDOW_TOKENS * 0.15), 512), 4096, MAX_OUTPUT_TOKENS)
    margin = max(16, round(WINDOW_TOKENS * 0.01))
    return WINDOW_TOKENS - reserve - margin - aside


# -- which API -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "headers", "named", "api"),
    [
        ([{"role": "user", "content": "hi"}], {}, None, "chat"),
        ([{"role": "user", "content": "hi"}], {"anthropic-version": "2023-06-01"}, None, "messages"),
        ([{"role": "user", "content": "hi"}], {}, "Responses", "responses"),
        (chat_history(1), {}, None, "chat"),
        (anthropic_history(1), {}, None, "messages"),
        (responses_history(1), {}, None, "responses"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], {}, None, "chat"),
        (
            [{"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}],
            {},
            None,
            "messages",
        ),
    ],
)
def test_the_api_of_a_message_list(
    messages: list[Any], headers: dict[str, str], named: str | None, api: str
) -> None:
    assert messages_api(messages, named=named, headers=headers, dialects=KNOWN).name == api


def test_a_mark_only_one_api_has_wins_and_an_unknown_name_is_refused() -> None:
    mixed = [*chat_history(1), *anthropic_history(1)]  # Anthropic's blocks are its mark alone
    assert messages_api(mixed, named=None, headers={}, dialects=KNOWN).name == "messages"
    with pytest.raises(InvalidRequest, match="Unknown api 'toy'"):
        messages_api([], named="toy", headers={}, dialects=KNOWN)


def test_what_is_kept_aside_is_the_requests_figure_else_the_operators_else_a_share_of_the_window() -> None:
    assert aside_tokens_for(100_000, requested=7, configured=9) == 7
    assert aside_tokens_for(100_000, requested=None, configured=9) == 9
    assert aside_tokens_for(100_000, requested=None, configured=None) == round(100_000 * DEFAULT_ASIDE_SHARE)


# -- the messages contract --------------------------------------------------------------------------


async def test_a_long_chat_history_comes_back_fitted_paired_and_pinned() -> None:
    history = chat_history(turns=12)
    sent = copy.deepcopy(history)
    result = await Compressor(service()).compress_messages(
        history, model="gpt-x", dialect=CHAT, options=OPTIONS, aside_tokens=100
    )
    assert history == sent  # never mutated
    items = result.items
    assert result.plan.changed and result.tokens_saved > 0
    assert result.tokens_saved == result.plan.tokens_before - result.plan.tokens_after
    assert result.plan.tokens_after <= room_tokens(100)
    assert CHAT.problems({"messages": items}) == []
    assert items[0] == history[0] and items[1] == history[1]  # the system prompt and the task: pinned
    assert items[-2:] == history[-2:]  # the newest call and its result
    answer = compress_answer(result)
    assert answer["messages"] == items and answer["tokens_saved"] == result.tokens_saved
    assert answer["api"] == "chat" and answer["aside_tokens"] == 100


async def test_a_history_that_fits_comes_back_as_it_was() -> None:
    history = chat_history(turns=2, size=10)
    result = await Compressor(service()).compress_messages(
        history, model="gpt-x", dialect=CHAT, options=OPTIONS
    )
    assert not result.plan.changed and result.items is history and result.tokens_saved == 0
    assert compress_answer(result)["tokens_after"] == result.plan.tokens_before


async def test_anthropic_messages_keep_signed_thinking_byte_for_byte_and_every_tool_pair() -> None:
    history = anthropic_history(turns=10)
    result = await Compressor(service()).compress_messages(
        history, model="claude-x", dialect=MESSAGES, options=OPTIONS, aside_tokens=50
    )
    items = result.items
    assert result.plan.changed and result.plan.tokens_after <= room_tokens(50)
    assert MESSAGES.problems({"model": "claude-x", "max_tokens": 10, "messages": items}) == []
    originals = {
        json.dumps(b, sort_keys=True) for m in history for b in m["content"] if isinstance(m["content"], list)
    }
    for message in items:
        for block in message["content"] if isinstance(message["content"], list) else ():
            if block["type"] in ("thinking", "redacted_thinking"):
                assert json.dumps(block, sort_keys=True) in originals  # never edited
    # The task stays first (the note for the cut span joins it: Anthropic's roles alternate).
    assert items[0]["content"][0] == {"type": "text", "text": history[0]["content"]}
    assert items[-2:] == history[-2:]


async def test_responses_items_keep_encrypted_reasoning_glued_and_untouched() -> None:
    items_in = responses_history(turns=10)
    result = await Compressor(service()).compress_messages(
        items_in, model="gpt-x", dialect=RESPONSES, options=OPTIONS, aside_tokens=50
    )
    items = result.items
    assert result.plan.changed and RESPONSES.problems({"model": "gpt-x", "input": items}) == []
    by_id = {item["id"]: item for item in items_in if item.get("type") == "reasoning"}
    for i, item in enumerate(items):
        if item.get("type") == "reasoning":
            assert item == by_id[item["id"]]  # encrypted content never edited
            assert items[i + 1]["type"] == "function_call"  # still glued to its call
    assert items[-3:] == items_in[-3:]


async def test_more_kept_aside_means_a_deeper_cut_and_too_much_cannot_fit() -> None:
    history = chat_history(turns=12)
    engine = Compressor(service())
    light = await engine.compress_messages(history, model="m", dialect=CHAT, options=OPTIONS, aside_tokens=0)
    heavy = await engine.compress_messages(
        history, model="m", dialect=CHAT, options=OPTIONS, aside_tokens=300
    )
    assert heavy.plan.tokens_after <= room_tokens(300) < light.plan.tokens_before
    assert heavy.tokens_saved > light.tokens_saved
    configured = Compressor(service(compress_aside_tokens=300))
    by_setting = await configured.compress_messages(history, model="m", dialect=CHAT, options=OPTIONS)
    assert by_setting.items == heavy.items
    with pytest.raises(PlanCannotFit) as refused:
        await engine.compress_messages(history, model="m", dialect=CHAT, options=OPTIONS, aside_tokens=10_000)
    assert refused.value.budget_tokens == 0 or refused.value.tokens > refused.value.budget_tokens


async def test_gemini_contents_get_no_output_reserve_as_gemini_counts_the_input_alone() -> None:
    contents = [
        {"role": "user" if k % 2 == 0 else "model", "parts": [{"text": f"part {k} " + words(80)}]}
        for k in range(11)
    ]
    engine = Compressor(service())
    whole = await engine.compress_messages(
        contents, model="m", dialect=GEMINI, options=OPTIONS, aside_tokens=0
    )
    # Over the room a chat request would have (its output reserve taken off), within Gemini's.
    margin = whole.plan.budget.margin_tokens
    assert room_tokens(0) < whole.plan.tokens_before <= WINDOW_TOKENS - margin
    assert not whole.plan.changed and whole.items == contents and whole.plan.budget.reserve_tokens == 0
    longer = [*contents, {"role": "model", "parts": [{"text": words(60)}]}, contents[0]]
    cut = await engine.compress_messages(longer, model="m", dialect=GEMINI, options=OPTIONS, aside_tokens=0)
    assert cut.plan.changed and room_tokens(0) < cut.plan.budget.input_budget_tokens
    assert cut.plan.tokens_after <= WINDOW_TOKENS - margin


async def test_two_replicas_cut_alike_and_a_grown_conversation_keeps_the_forwarded_prefix() -> None:
    history = chat_history(turns=12)
    one = await Compressor(service()).compress_messages(history, model="m", dialect=CHAT, options=OPTIONS)
    two = await Compressor(service()).compress_messages(
        copy.deepcopy(history), model="m", dialect=CHAT, options=OPTIONS
    )
    assert json.dumps(one.items) == json.dumps(two.items)
    grown = history + chat_history(turns=13)[-2:]
    later = await Compressor(service()).compress_messages(grown, model="m", dialect=CHAT, options=OPTIONS)
    assert later.items[: len(one.items)] == one.items  # headroom: the next turn appends only


async def test_bad_input_is_an_invalid_request() -> None:
    engine = Compressor(service())
    with pytest.raises(InvalidRequest, match="'model'"):
        await engine.compress_messages(chat_history(1), model=None, dialect=CHAT, options=OPTIONS)
    with pytest.raises(InvalidRequest, match="'messages'"):
        await engine.compress_messages({"role": "user"}, model="m", dialect=CHAT, options=OPTIONS)
    with pytest.raises(InvalidRequest):
        await engine.compress_messages(
            [{"role": "wizard", "content": "x"}], model="m", dialect=CHAT, options=OPTIONS
        )


# -- the whole-body contract ------------------------------------------------------------------------


async def test_a_whole_body_comes_back_in_its_own_shape_and_as_its_own_bytes_when_it_fits() -> None:
    engine = Compressor(service())
    tools = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]
    body = {"model": "m", "messages": chat_history(turns=12), "tools": tools, "max_tokens": 100, "x": 1}
    result = await engine.compact_body(
        json.dumps(body).encode(), route=RouteMatch.first(CHAT), options=OPTIONS
    )
    out = json.loads(result.content)
    assert {k: v for k, v in out.items() if k != "messages"} == {
        k: v for k, v in body.items() if k != "messages"
    }
    assert out["messages"] != body["messages"] and CHAT.problems(out) == []
    assert result.plan.tokens_after <= WINDOW_TOKENS - 100
    small = json.dumps({"model": "m", "messages": chat_history(turns=1, size=5)}, indent=1).encode()
    same = await engine.compact_body(small, route=RouteMatch.first(CHAT), options=OPTIONS)
    assert same.content == small  # byte for byte


async def test_a_whole_anthropic_body_keeps_its_system_prompt_and_structure() -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}],
        "messages": anthropic_history(turns=16, size=80),
    }
    result = await Compressor(service()).compact_body(
        json.dumps(body).encode(), route=RouteMatch.first(MESSAGES), options=OPTIONS
    )
    out = json.loads(result.content)
    assert out["system"] == body["system"] and out["max_tokens"] == 100
    assert MESSAGES.problems(out) == [] and len(out["messages"]) < len(body["messages"])
