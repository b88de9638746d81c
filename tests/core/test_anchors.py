"""app.core.anchors: the upstream's count of a conversation's next request, from its last one."""

from __future__ import annotations

import math
from typing import Any

from app.core.anchors import (
    APPENDED_SPREAD_ESTIMATE,
    APPENDED_SPREAD_EXACT,
    PRICED_LOWER_RATIO,
    SLACK_TOKENS,
    AnchorMemory,
    context_of,
)
from app.core.conversation import PRICE_KEY
from app.core.tokens import REPLY_PRIMING_TOKENS

SYSTEM = {"role": "system", "content": "You are careful."}
FIRST = {"role": "user", "content": "Read the file."}
TENANT = "t-alice"


def history(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [SYSTEM, FIRST]
    for i in range(n):
        out.append({"role": "assistant", "content": f"answer {i}"})
        out.append({"role": "user", "content": f"question {i}"})
    return out


def remembered(
    memory: AnchorMemory, messages: list[dict[str, Any]], tokens: list[int], *, upstream: int
) -> None:
    counted = sum(tokens) + REPLY_PRIMING_TOKENS + 100
    memory.remember(
        "m", messages, tokens, tenant=TENANT, context=100, counted_tokens=counted, upstream_tokens=upstream
    )


def test_the_next_request_is_the_upstreams_count_plus_what_was_appended() -> None:
    memory = AnchorMemory()
    before = history(3)
    tokens = [100] * len(before)
    ours = sum(tokens) + REPLY_PRIMING_TOKENS + 100  # 903
    remembered(memory, before, tokens, upstream=ours * 2)  # the upstream counts twice ours
    after = [*before, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    count = memory.count("m", after, [*tokens, 50, 50], tenant=TENANT, context=100, exact=False)
    assert count is not None
    assert count.upstream_tokens == ours * 2 and count.appended_tokens == 100 and count.ratio == 2.0
    assert count.estimate_tokens == ours * 2 + 200
    assert count.upper_tokens == ours * 2 + math.ceil(100 * 2 * (1 + APPENDED_SPREAD_ESTIMATE)) + SLACK_TOKENS
    assert count.lower_tokens == ours * 2 + math.floor(100 * 1.0 * (1 - APPENDED_SPREAD_ESTIMATE))
    assert count.lower_tokens <= count.estimate_tokens <= count.upper_tokens


def test_an_exact_counter_has_a_narrow_spread_and_a_ratio_below_one_is_not_trusted_for_new_text() -> None:
    memory = AnchorMemory()
    before = history(2)
    tokens = [100] * len(before)
    remembered(memory, before, tokens, upstream=500)  # below ours (703): encrypted content priced high
    count = memory.count(
        "m",
        [*before, {"role": "user", "content": "z"}],
        [*tokens, 200],
        tenant=TENANT,
        context=100,
        exact=True,
    )
    assert count is not None and count.ratio < 1
    assert count.upper_tokens == 500 + math.ceil(200 * (1 + APPENDED_SPREAD_EXACT)) + SLACK_TOKENS
    assert count.estimate_tokens < 700


def test_appended_priced_messages_widen_the_lower_bound_only() -> None:
    memory = AnchorMemory()
    before = history(2)
    tokens = [100] * len(before)
    remembered(memory, before, tokens, upstream=703)
    reasoning = {"role": "assistant", "content": [{"type": "encrypted", PRICE_KEY: 400}]}
    count = memory.count("m", [*before, reasoning], [*tokens, 400], tenant=TENANT, context=100, exact=True)
    assert count is not None
    assert count.lower_tokens == 703 + math.floor(400 * PRICED_LOWER_RATIO)
    assert count.upper_tokens == 703 + math.ceil(400 * (1 + APPENDED_SPREAD_EXACT)) + SLACK_TOKENS


def test_a_moved_marker_at_the_end_is_the_same_message_and_an_edit_is_removed_and_appended() -> None:
    memory = AnchorMemory()
    before = history(2)
    before[-1] = {
        "role": "user",
        "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}],
    }
    tokens = [100] * len(before)
    remembered(memory, before, tokens, upstream=703)
    moved = [
        *before[:-1],
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "user", "content": "n"},
    ]
    count = memory.count("m", moved, [*tokens, 30], tenant=TENANT, context=100, exact=True)
    assert count is not None and count.appended_tokens == 30 and count.estimate_tokens == 733
    # The same place, another count: the old message counts as removed, the new one as appended.
    edited = [*before[:-1], {"role": "user", "content": "a longer question"}]
    count = memory.count("m", edited, [*tokens[:-1], 160], tenant=TENANT, context=100, exact=True)
    assert count is not None and count.appended_tokens == 160 and count.estimate_tokens == 703 + 60


def test_another_clients_conversation_with_the_same_opening_neither_anchors_nor_displaces() -> None:
    memory = AnchorMemory()
    before = history(6)
    tokens = [100] * len(before)
    remembered(memory, before, tokens, upstream=2000)
    longer = [*before, {"role": "user", "content": "more"}]
    assert memory.count("m", longer, [*tokens, 10], tenant="t-mallory", context=100, exact=True) is None
    memory.remember(
        "m", before, tokens, tenant="t-mallory", context=100, counted_tokens=703, upstream_tokens=9
    )
    anchored = memory.count("m", longer, [*tokens, 10], tenant=TENANT, context=100, exact=True)
    assert anchored is not None and anchored.upstream_tokens == 2000  # alice's own, not mallory's


def test_no_anchor_for_another_conversation_model_or_tool_set_or_a_history_changed_early() -> None:
    memory = AnchorMemory()
    before = history(6)
    tokens = [100] * len(before)
    remembered(memory, before, tokens, upstream=2000)
    longer = [*before, {"role": "user", "content": "more"}]
    assert memory.count("other", longer, [*tokens, 10], tenant=TENANT, context=100, exact=True) is None
    assert memory.count("m", longer, [*tokens, 10], tenant=TENANT, context=101, exact=True) is None
    other = [SYSTEM, {"role": "user", "content": "another task"}, *before[2:]]
    assert memory.count("m", other, tokens, tenant=TENANT, context=100, exact=True) is None
    early = [*before[:3], {"role": "user", "content": "edited"}, *before[4:]]
    assert memory.count("m", early, tokens, tenant=TENANT, context=100, exact=True) is None
    assert memory.count("m", longer, [*tokens, 10], tenant=TENANT, context=100, exact=True) is not None


def test_the_memory_is_bounded_and_ignores_what_it_cannot_key() -> None:
    memory = AnchorMemory(max_conversations=2)
    for i in range(3):
        conversation = [SYSTEM, {"role": "user", "content": f"task {i}"}]
        memory.remember(
            "m", conversation, [10, 10], tenant=TENANT, context=0, counted_tokens=23, upstream_tokens=25
        )
    assert len(memory) == 2
    assert (
        memory.count(
            "m",
            [SYSTEM, {"role": "user", "content": "task 0"}],
            [10, 10],
            tenant=TENANT,
            context=0,
            exact=True,
        )
        is None
    )
    memory.remember("m", [SYSTEM], [10], tenant=TENANT, context=0, counted_tokens=13, upstream_tokens=13)
    memory.remember(
        "m", [SYSTEM, FIRST], [10, 10], tenant=TENANT, context=0, counted_tokens=23, upstream_tokens=0
    )
    assert len(memory) == 2


def test_the_context_is_what_can_hold_prompt_text_besides_the_history() -> None:
    tools = [{"name": "read", "input_schema": {"type": "object"}}]
    body = {
        "model": "m",
        "max_tokens": 32_000,
        "stream": True,
        "temperature": 0.5,
        "system": "s",
        "tools": tools,
    }
    context = context_of({**body, "messages": [FIRST]}, "messages")
    assert context == (("model", "m"), ("system", "s"), ("tools", tools))
    lowered = context_of({**body, "max_tokens": 20_000, "stream": False, "messages": []}, "messages")
    assert lowered == context
    assert context_of({**body, "tools": [*tools, {"name": "write"}], "messages": []}, "messages") != context
