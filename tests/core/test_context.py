"""app.core.context: pins, the protected tail, the stable blocks and the fit context."""

from __future__ import annotations

from app.core.budget import Policy
from app.core.context import (
    block_tokens_for,
    build_context,
    droppable_blocks,
    pinned_indices,
    protected_start,
)
from tests.core.fakes import (
    FakeMessageCounter,
    agent_session,
    assistant,
    budget,
    chat,
    ctx_for,
    system,
    tool_exchange,
    user,
)


def test_pinned_indices_are_instructions_and_the_first_user_message() -> None:
    messages = [system(), user(), assistant(), {"role": "developer", "content": "x"}, user()]
    assert pinned_indices(messages, pin_first_user=True) == frozenset({0, 1, 3})
    assert pinned_indices(messages, pin_first_user=False) == frozenset({0, 3})


def test_protected_start_keeps_at_least_the_newest_turn() -> None:
    messages = chat(5)  # system, then turns starting at 1, 3, 5, 7, 9
    assert protected_start(messages, keep_turns=2) == 7
    assert protected_start(messages, keep_turns=0) == 9
    assert protected_start(messages, keep_turns=99) == 1
    assert protected_start([system()], keep_turns=2) == 1


def test_block_size_default_and_override() -> None:
    assert block_tokens_for(budget(100_000), Policy()) == 12_500
    assert block_tokens_for(budget(1_000), Policy()) == 256
    assert block_tokens_for(budget(100_000), Policy(drop_block_tokens=777)) == 777


def test_blocks_depend_only_on_the_conversation_start(counter: FakeMessageCounter) -> None:
    short = chat(20)
    longer = [*chat(20)[:-1], *chat(40)[len(short) - 1 :]]
    assert longer[: len(short) - 1] == short[:-1]
    cut_short = droppable_blocks(
        short, counter.count_messages(short), region_stop=len(short) - 1, block_tokens=200
    )
    cut_long = droppable_blocks(
        longer, counter.count_messages(longer), region_stop=len(longer) - 1, block_tokens=200
    )
    assert len(cut_short) > 3
    assert cut_long[: len(cut_short) - 1] == cut_short[:-1]
    assert cut_long[len(cut_short) - 1][0] == cut_short[-1][0]
    # every boundary is a turn start in a plain chat
    assert all(short[start]["role"] == "user" for start, _ in cut_short)


def test_blocks_split_a_turn_larger_than_a_block_at_unit_starts(counter: FakeMessageCounter) -> None:
    messages = [system(), user(10)]
    for k in range(10):
        messages += tool_exchange([f"c{k}"], 100)
    messages.append(user(10))
    blocks = droppable_blocks(
        messages, counter.count_messages(messages), region_stop=len(messages) - 1, block_tokens=250
    )
    assert len(blocks) > 2
    for start, _ in blocks[1:]:
        assert messages[start]["role"] == "assistant" and "tool_calls" in messages[start]


def test_protected_start_is_bounded_to_a_share_in_whole_units(counter: FakeMessageCounter) -> None:
    messages = agent_session(10, 100)  # units of 1 + 1 messages: call (9 tokens) and result (105)
    counts = counter.count_messages(messages)
    unit = counts[2] + counts[3]
    assert protected_start(messages, keep_turns=2) == 1  # the one turn: everything
    assert protected_start(messages, keep_turns=2, tokens=counts, max_tokens=10 * unit) == 2
    assert protected_start(messages, keep_turns=2, tokens=counts, max_tokens=3 * unit) == len(messages) - 6
    assert (
        protected_start(messages, keep_turns=2, tokens=counts, max_tokens=3 * unit - 1) == len(messages) - 4
    )
    # the newest unit always stays, whatever its size
    assert protected_start(messages, keep_turns=2, tokens=counts, max_tokens=0) == len(messages) - 2
    # never earlier than the newest keep_turns turns
    chat_messages = chat(5)
    chat_counts = counter.count_messages(chat_messages)
    assert protected_start(chat_messages, keep_turns=2, tokens=chat_counts, max_tokens=10**9) == 7


def test_a_parallel_tool_group_joins_the_tail_whole(counter: FakeMessageCounter) -> None:
    messages = agent_session(6, 50, parallel=3)
    counts = counter.count_messages(messages)
    for max_tokens in range(0, sum(counts), 37):
        start = protected_start(messages, keep_turns=1, tokens=counts, max_tokens=max_tokens)
        assert start == 1 or messages[start].get("tool_calls"), max_tokens
        assert start == len(messages) - 4 or sum(counts[start:]) <= max_tokens


def test_build_context_bounds_the_tail_with_the_clients_counts(counter: FakeMessageCounter) -> None:
    messages = agent_session(40, 100)
    ctx = ctx_for(messages, 2000, counter)  # the tail holds at most 1000 tokens
    assert ctx.newest_user == 1
    assert sum(ctx.tokens[ctx.protected_from :]) <= 1000
    assert ctx.protected_from == len(messages) - 2 * (1000 // (ctx.tokens[2] + ctx.tokens[3]))
    assert ctx.untouchable(0) and ctx.untouchable(1) and not ctx.untouchable(2)
    shrunk = [m if m.get("role") != "tool" else {**m, "content": "x"} for m in messages]
    ctx2 = build_context(
        shrunk,
        budget=budget(2000),
        policy=Policy(),
        counter=counter,
        input_messages=messages,
        input_tokens=counter.count_messages(messages),
    )
    assert ctx2.protected_from == ctx.protected_from


def test_agent_blocks_depend_only_on_the_session_start(counter: FakeMessageCounter) -> None:
    short = agent_session(50, 80, parallel=2)
    longer = agent_session(90, 80, parallel=2)
    assert longer[: len(short)] == short
    cut_short = droppable_blocks(
        short, counter.count_messages(short), region_stop=len(short) - 3, block_tokens=500
    )
    cut_long = droppable_blocks(
        longer, counter.count_messages(longer), region_stop=len(longer) - 3, block_tokens=500
    )
    assert len(cut_short) > 5
    assert cut_long[: len(cut_short) - 1] == cut_short[:-1]
    assert all(short[start].get("tool_calls") for start, _ in cut_short[1:])


def test_the_memorys_room_comes_out_of_the_tail_and_the_target(counter: FakeMessageCounter) -> None:
    messages = agent_session(40, 100)
    plain = build_context(messages, budget=budget(2000), policy=Policy(), counter=counter)
    remembering = build_context(
        messages, budget=budget(2000), policy=Policy(), counter=counter, memory_tokens=300
    )
    # The tail holds at most its share less the room (whole units), so the region a cut works
    # in keeps its size; the strategies aim the room lower.
    assert sum(remembering.tokens[remembering.protected_from :]) <= 1000 - 300
    assert remembering.protected_from > plain.protected_from
    assert remembering.target_tokens == plain.target_tokens - 300
    ahead = build_context(
        messages, budget=budget(2000), policy=Policy(), counter=counter, memory_tokens=300, headroom_tokens=50
    )
    assert (
        ahead.protected_from == remembering.protected_from
        and ahead.target_tokens == plain.target_tokens - 350
    )
