"""Tests for app.core.retry: the cap for the emergency retry after a context overflow."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.budget import Budget, Policy, default_reserve_tokens
from app.core.overflow import ContextOverflow, classify_overflow
from app.core.registry import ModelSpec
from app.core.retry import MAX_RETRIES, RetrySize, retry_cap_tokens, retry_size, window_after_refusal
from app.core.tokens import REPLY_PRIMING_TOKENS

BUDGET = Budget(window_tokens=8192, reserve_tokens=1000, margin_tokens=82, tool_tokens=0)


def overflow(
    *,
    limit: int | None = None,
    prompt: int | None = None,
    output: int | None = None,
    at_least: bool = False,
) -> ContextOverflow:
    return ContextOverflow(
        dialect="test",
        limit_tokens=limit,
        prompt_tokens=prompt,
        output_tokens=output,
        message="m",
        prompt_at_least=at_least,
    )


def test_max_retries_is_two() -> None:
    assert MAX_RETRIES == 2


def test_ratio_case_scales_by_the_upstreams_count() -> None:
    # We counted 8000, the upstream 10000 (ratio 1.25); its window 8192 minus 1000 output it counted.
    cap = retry_cap_tokens(
        overflow=overflow(limit=8192, prompt=10000, output=1000), sent_tokens=8000, budget=BUDGET
    )
    assert cap == math.floor((8192 - 1000) / 1.25 * 0.95)


def test_ratio_case_uses_the_reserve_when_the_output_is_not_stated() -> None:
    budget = Budget(window_tokens=8192, reserve_tokens=2000, margin_tokens=82, tool_tokens=0)
    cap = retry_cap_tokens(
        overflow=overflow(limit=8192, prompt=9000, output=None), sent_tokens=9000, budget=budget
    )
    assert cap == math.floor((8192 - 2000) * 0.95)


def test_stated_zero_output_is_used_not_the_reserve() -> None:
    cap = retry_cap_tokens(
        overflow=overflow(limit=131072, prompt=140000, output=0), sent_tokens=140000, budget=BUDGET
    )
    assert cap == math.floor(131072 * 0.95)


def test_an_upstream_counting_less_than_us_is_not_trusted_to_count_less() -> None:
    # Ratio 0.5 is clamped to 1.0: the cap is the upstream's room in our units, unscaled.
    cap = retry_cap_tokens(
        overflow=overflow(limit=4000, prompt=5000, output=0), sent_tokens=10000, budget=BUDGET
    )
    assert cap == math.floor(4000 * 0.95)


def test_ratio_is_clamped_at_four() -> None:
    cap = retry_cap_tokens(
        overflow=overflow(limit=8000, prompt=300000, output=0), sent_tokens=3000, budget=BUDGET
    )
    assert cap == math.floor(8000 / 4.0 * 0.95)


def test_the_margin_ratio_is_honoured() -> None:
    o = overflow(limit=8192, prompt=9000, output=0)
    small = retry_cap_tokens(overflow=o, sent_tokens=9000, budget=BUDGET, margin_ratio=0.01)
    large = retry_cap_tokens(overflow=o, sent_tokens=9000, budget=BUDGET, margin_ratio=0.2)
    assert small == math.floor(8192 * 0.99)
    assert large == math.floor(8192 * 0.8)


def test_numbers_that_do_not_explain_the_refusal_still_shrink_the_input() -> None:
    # The upstream's room is larger than what we sent: trust the refusal, cut by the margin.
    cap = retry_cap_tokens(
        overflow=overflow(limit=100000, prompt=5000, output=0), sent_tokens=5000, budget=BUDGET
    )
    assert cap == math.floor(5000 * 0.95)


def test_limit_only_uses_a_wider_margin_and_at_most_ninety_percent() -> None:
    cap = retry_cap_tokens(overflow=overflow(limit=8192, output=0), sent_tokens=10000, budget=BUDGET)
    assert cap == math.floor(8192 * 0.9)
    capped = retry_cap_tokens(overflow=overflow(limit=100000, output=0), sent_tokens=10000, budget=BUDGET)
    assert capped == 9000


def test_limit_only_subtracts_the_reserve() -> None:
    cap = retry_cap_tokens(overflow=overflow(limit=8192), sent_tokens=10000, budget=BUDGET)
    assert cap == math.floor((8192 - 1000) * 0.9)


def test_a_lower_bound_prompt_is_treated_like_limit_only_with_its_ratio() -> None:
    # vLLM "at least 24577": a lower bound on the upstream's count, so the ratio is a lower bound too.
    o = overflow(limit=32768, prompt=24577, output=8192, at_least=True)
    cap = retry_cap_tokens(overflow=o, sent_tokens=20000, budget=BUDGET)
    ratio = 24577 / 20000
    assert cap == min(math.floor((32768 - 8192) / ratio * 0.9), 18000)


def test_no_numbers_halves() -> None:
    assert retry_cap_tokens(overflow=overflow(), sent_tokens=9001, budget=BUDGET) == 4500


def test_a_stated_output_that_fills_the_window_means_no_retry() -> None:
    # TGI "Given: 30 `inputs` tokens and 999999999 `max_new_tokens`": no input cut can help.
    assert (
        retry_cap_tokens(
            overflow=overflow(limit=32769, prompt=30, output=999999999), sent_tokens=30, budget=BUDGET
        )
        is None
    )
    assert (
        retry_cap_tokens(
            overflow=overflow(limit=4096, prompt=5000, output=4096), sent_tokens=5000, budget=BUDGET
        )
        is None
    )


def test_a_reserve_that_fills_the_window_means_no_retry() -> None:
    budget = Budget(window_tokens=4096, reserve_tokens=4096, margin_tokens=41, tool_tokens=0)
    assert (
        retry_cap_tokens(overflow=overflow(limit=4096, prompt=5000), sent_tokens=5000, budget=budget) is None
    )


def test_no_room_next_to_the_tools_means_no_retry() -> None:
    budget = Budget(window_tokens=8192, reserve_tokens=1000, margin_tokens=82, tool_tokens=3000)
    assert retry_cap_tokens(overflow=overflow(), sent_tokens=6000, budget=budget) is None
    # One token more than tools + priming is still a (tiny) useful cap.
    assert retry_cap_tokens(overflow=overflow(), sent_tokens=6008, budget=budget) == 3004


@pytest.mark.parametrize("sent", [-5, 0, 1])
def test_nothing_sent_means_no_retry(sent: int) -> None:
    assert (
        retry_cap_tokens(overflow=overflow(limit=8192, prompt=9000), sent_tokens=sent, budget=BUDGET) is None
    )


def test_end_to_end_from_a_real_body() -> None:
    found = classify_overflow(
        400,
        b'{"error":{"message":"This model\'s maximum context length is 128000 tokens. However, your '
        b'messages resulted in 130021 tokens. Please reduce the length of the messages.",'
        b'"type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}',
    )
    assert found is not None
    budget = Budget(window_tokens=128000, reserve_tokens=4096, margin_tokens=1280, tool_tokens=500)
    cap = retry_cap_tokens(overflow=found, sent_tokens=125000, budget=budget)
    assert cap == math.floor((128000 - 4096) / (130021 / 125000) * 0.95)
    assert cap is not None and cap < 125000


overflows = st.builds(
    ContextOverflow,
    dialect=st.just("x"),
    limit_tokens=st.one_of(st.none(), st.integers(min_value=-10, max_value=2_000_000)),
    prompt_tokens=st.one_of(st.none(), st.integers(min_value=-10, max_value=4_000_000)),
    requested_tokens=st.none(),
    output_tokens=st.one_of(st.none(), st.integers(min_value=-10, max_value=300_000)),
    message=st.just("m"),
    prompt_at_least=st.booleans(),
)
budgets = st.builds(
    Budget,
    window_tokens=st.integers(min_value=1, max_value=2_000_000),
    reserve_tokens=st.integers(min_value=0, max_value=200_000),
    margin_tokens=st.integers(min_value=0, max_value=20_000),
    tool_tokens=st.integers(min_value=0, max_value=50_000),
)
sents = st.integers(min_value=-10, max_value=3_000_000)
margins = st.floats(min_value=0.0, max_value=0.4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(o=overflows, sent=sents, budget=budgets, margin=margins)
def test_the_cap_is_always_below_what_was_sent_and_never_negative(
    o: ContextOverflow, sent: int, budget: Budget, margin: float
) -> None:
    cap = retry_cap_tokens(overflow=o, sent_tokens=sent, budget=budget, margin_ratio=margin)
    if cap is not None:
        assert 0 < cap < sent
        assert cap > budget.tool_tokens + REPLY_PRIMING_TOKENS


def _key(cap: int | None) -> int:
    return -1 if cap is None else cap


@settings(max_examples=200, deadline=None)
@given(
    o=overflows, sent=sents, budget=budgets, margin=margins, more=st.integers(min_value=1, max_value=500_000)
)
def test_the_cap_is_monotone(o: ContextOverflow, sent: int, budget: Budget, margin: float, more: int) -> None:
    def cap(**changes: object) -> int:
        bigger = ContextOverflow(**{**{f: getattr(o, f) for f in o.__slots__}, **changes})  # type: ignore[arg-type]
        return _key(retry_cap_tokens(overflow=bigger, sent_tokens=sent, budget=budget, margin_ratio=margin))

    base = _key(retry_cap_tokens(overflow=o, sent_tokens=sent, budget=budget, margin_ratio=margin))
    # A larger stated window never shrinks the cap.
    if o.limit_tokens is not None and o.limit_tokens > 0:
        assert cap(limit_tokens=o.limit_tokens + more) >= base
    # The upstream counting more, or counting more output, never grows it.
    if o.prompt_tokens is not None and o.prompt_tokens > 0:
        assert cap(prompt_tokens=o.prompt_tokens + more) <= base
    if o.output_tokens is not None and o.output_tokens >= 0:
        assert cap(output_tokens=o.output_tokens + more) <= base
    # Having sent more (same upstream numbers) never shrinks it.
    assert (
        _key(retry_cap_tokens(overflow=o, sent_tokens=sent + more, budget=budget, margin_ratio=margin))
        >= base
    )
    # A larger margin never grows it.
    wider = _key(
        retry_cap_tokens(overflow=o, sent_tokens=sent, budget=budget, margin_ratio=min(margin + 0.05, 0.45))
    )
    assert wider <= base


# ---- retry_size: the window and the output of the next attempt ------------------------------------


SPEC_4K = ModelSpec(name="m", window_tokens=131_072, max_output_tokens=16_384, encoding="o200k_base")


def test_window_after_refusal_halves_unless_a_larger_input_was_taken_whole() -> None:
    assert window_after_refusal(33_660) == 16_830
    assert window_after_refusal(10_000, known_good_tokens=7_000) == 7_000
    assert window_after_refusal(10_000, known_good_tokens=20_000) == 9_999  # never at what it refused
    assert window_after_refusal(1) == 1


def test_a_stated_window_is_what_the_retry_is_fitted_to() -> None:
    size = retry_size(
        overflow=overflow(limit=8192, prompt=10000, output=1000),
        sent_tokens=8000,
        budget=BUDGET,
        spec=SPEC_4K,
        policy=Policy(),
    )
    assert size == RetrySize(cap_tokens=math.floor((8192 - 1000) / 1.25 * 0.95), window_tokens=8192)


def test_our_reserve_over_the_stated_window_is_lowered_to_the_windows_default() -> None:
    # The repro: no max_tokens, the table's 4,096 reserve, a 4,096-token server.
    budget = Budget(window_tokens=131_072, reserve_tokens=4096, margin_tokens=1311, tool_tokens=0)
    size = retry_size(
        overflow=overflow(limit=4096, prompt=33_660),
        sent_tokens=33_660,
        budget=budget,
        spec=SPEC_4K,
        policy=Policy(),
    )
    assert size is not None and size.window_tokens == 4096
    assert size.output_cap_tokens == 614  # 15% of 4,096
    assert 0 < size.cap_tokens <= math.floor((4096 - 614) * 0.95)


def test_a_clients_cap_over_the_window_keeps_the_prompt_whole_when_the_floor_allows() -> None:
    budget = Budget(window_tokens=200_000, reserve_tokens=32_000, margin_tokens=2000, tool_tokens=0)
    o = overflow(limit=60_000, prompt=30_000, output=32_000)
    size = retry_size(
        overflow=o,
        sent_tokens=28_000,
        budget=budget,
        spec=SPEC_4K,
        policy=Policy(),
        requested_output_tokens=32_000,
    )
    assert size is not None and size.output_cap_tokens == 60_000 - 30_000 - 600
    assert size.cap_tokens == 28_000 and size.margin_tokens == 60_000 - size.output_cap_tokens - 28_000
    # Not allowed to lower the client's cap: nothing helps.
    assert (
        retry_size(
            overflow=o,
            sent_tokens=28_000,
            budget=budget,
            spec=SPEC_4K,
            policy=Policy(lower_output=False),
            requested_output_tokens=32_000,
        )
        is None
    )


def test_a_clients_cap_with_no_room_for_the_prompt_comes_down_to_the_floor_and_the_input_is_cut() -> None:
    budget = Budget(window_tokens=200_000, reserve_tokens=32_000, margin_tokens=2000, tool_tokens=0)
    o = overflow(limit=60_000, prompt=59_500, output=32_000)
    size = retry_size(
        overflow=o,
        sent_tokens=55_000,
        budget=budget,
        spec=SPEC_4K,
        policy=Policy(),
        requested_output_tokens=32_000,
    )
    assert size is not None and size.output_cap_tokens == 4096  # the window's default, above the floor
    assert size.cap_tokens < 55_000 and size.margin_tokens is None


def test_no_numbers_fit_the_retry_to_half_of_what_was_refused_output_cap_included() -> None:
    size = retry_size(overflow=overflow(), sent_tokens=30_000, budget=BUDGET, spec=SPEC_4K, policy=Policy())
    assert size == RetrySize(cap_tokens=15_000, window_tokens=15_000)
    with_cap = retry_size(
        overflow=overflow(),
        sent_tokens=30_000,
        budget=BUDGET,
        spec=SPEC_4K,
        policy=Policy(),
        requested_output_tokens=2_000,
    )
    assert with_cap is not None and with_cap.window_tokens == 16_000 and with_cap.output_cap_tokens is None
    # A cap over half that window comes down (when allowed).
    big = retry_size(
        overflow=overflow(),
        sent_tokens=30_000,
        budget=BUDGET,
        spec=SPEC_4K,
        policy=Policy(),
        requested_output_tokens=30_000,
    )
    assert big is not None and big.window_tokens == 30_000 and big.output_cap_tokens == 4096


def test_two_refusals_without_numbers_bring_a_wrong_table_to_a_small_servers_reach() -> None:
    first = retry_size(overflow=overflow(), sent_tokens=33_660, budget=BUDGET, spec=SPEC_4K, policy=Policy())
    assert first is not None and first.window_tokens == 16_830
    # The retry planned in that window (cut to its target share) is refused again.
    second = retry_size(overflow=overflow(), sent_tokens=8_500, budget=BUDGET, spec=SPEC_4K, policy=Policy())
    assert second is not None and second.window_tokens == 4_250
    # Planned in that window, with its default reserve, the input stays under a 4,096-token server's.
    assert second.window_tokens - default_reserve_tokens(SPEC_4K, Policy(), window_tokens=4_250) < 4_096
