"""Budget: input_budget = window - reserve - margin - tool_tokens, capped, never negative."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.budget import (
    POLICY_MODES,
    Budget,
    Limits,
    Policy,
    budget_for,
    default_reserve_tokens,
    margin_tokens_for,
    requested_output_tokens,
)
from app.core.registry import ModelSpec


def model(window: int, max_output: int, encoding: str = "o200k_base") -> ModelSpec:
    return ModelSpec(name="m", window_tokens=window, max_output_tokens=max_output, encoding=encoding)


GPT4O = model(128_000, 16_384)
POLICY = Policy()


# ---- the formula ----------------------------------------------------------------------------------


def test_formula_with_exact_counts() -> None:
    budget = budget_for(GPT4O, POLICY, tool_tokens=300, exact=True)
    # reserve: 15% of 128000 = 19200, clamped to 4096; margin: 1% of 128000 = 1280
    assert (budget.reserve_tokens, budget.margin_tokens, budget.tool_tokens) == (4_096, 1_280, 300)
    assert budget.window_tokens == 128_000
    assert budget.cap_tokens is None
    assert budget.input_budget_tokens == 128_000 - 4_096 - 1_280 - 300


def test_formula_with_estimated_counts() -> None:
    budget = budget_for(model(200_000, 64_000, "estimate"), POLICY, tool_tokens=0, exact=False)
    assert budget.margin_tokens == 10_000  # 5% of 200000
    assert budget.input_budget_tokens == 200_000 - 4_096 - 10_000


def test_budget_value_formula_directly() -> None:
    assert (
        Budget(window_tokens=1_000, reserve_tokens=100, margin_tokens=10, tool_tokens=5).input_budget_tokens
        == 885
    )


# ---- the reserve ----------------------------------------------------------------------------------


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    body = {"max_completion_tokens": 700, "max_tokens": 50}
    requested = requested_output_tokens(body)
    assert requested == 700
    budget = budget_for(GPT4O, POLICY, requested_tokens=requested, tool_tokens=0, exact=True)
    assert budget.reserve_tokens == 700


def test_max_tokens_used_when_alone() -> None:
    budget = budget_for(GPT4O, POLICY, requested_tokens=1_234, tool_tokens=0, exact=True)
    assert budget.reserve_tokens == 1_234


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.5, "100", None, [100]])
def test_unusable_output_sizes_are_ignored(bad: Any) -> None:
    assert requested_output_tokens({"max_completion_tokens": bad}) is None
    assert requested_output_tokens({"max_completion_tokens": bad, "max_tokens": 300}) == 300


def test_request_reserve_beats_policy_reserve() -> None:
    policy = Policy(reserve_tokens=2_000)
    assert budget_for(GPT4O, policy, requested_tokens=500, tool_tokens=0, exact=True).reserve_tokens == 500
    assert budget_for(GPT4O, policy, tool_tokens=0, exact=True).reserve_tokens == 2_000


@pytest.mark.parametrize(
    ("window", "max_output", "expected"),
    [
        (128_000, 16_384, 4_096),  # 19200 clamped down to the maximum
        (16_385, 4_096, 2_458),  # 15% of the window, inside the clamp
        (8_192, 8_192, 1_229),
        (2_048, 2_048, 512),  # 307 clamped up to the minimum
        (128_000, 1_000, 1_000),  # never more than the model can output
        (300, 300, 150),  # a tiny model: min clamp, then never more than half the window
    ],
)
def test_default_reserve_is_15_percent_clamped(window: int, max_output: int, expected: int) -> None:
    assert default_reserve_tokens(model(window, max_output), POLICY) == expected


def test_default_reserve_follows_the_policy_knobs() -> None:
    policy = Policy(reserve_ratio=0.5, reserve_min_tokens=100, reserve_max_tokens=10_000)
    assert default_reserve_tokens(model(8_000, 8_000), policy) == 4_000
    assert default_reserve_tokens(model(100_000, 100_000), policy) == 10_000


# ---- the margin -----------------------------------------------------------------------------------


def test_margin_is_larger_for_estimates() -> None:
    for window in (1_000, 8_192, 128_000, 1_048_576):
        spec = model(window, min(window, 4_096))
        exact = budget_for(spec, POLICY, tool_tokens=0, exact=True).margin_tokens
        estimate = budget_for(spec, POLICY, tool_tokens=0, exact=False).margin_tokens
        assert estimate > exact


def test_margin_has_a_floor() -> None:
    assert budget_for(model(500, 500), POLICY, tool_tokens=0, exact=True).margin_tokens == 16


# ---- the cap header -------------------------------------------------------------------------------


def test_cap_lowers_the_budget() -> None:
    budget = budget_for(GPT4O, POLICY, tool_tokens=0, exact=True, cap_tokens=5_000)
    assert budget.cap_tokens == 5_000
    assert budget.input_budget_tokens == 5_000


def test_cap_above_the_room_changes_nothing() -> None:
    capped = budget_for(GPT4O, POLICY, tool_tokens=0, exact=True, cap_tokens=10_000_000)
    plain = budget_for(GPT4O, POLICY, tool_tokens=0, exact=True)
    assert capped.input_budget_tokens == plain.input_budget_tokens


def test_cap_covers_the_whole_input_tools_included() -> None:
    # Budget.cap_tokens is in the same unit as retry_cap_tokens: messages + priming + tools.
    budget = budget_for(GPT4O, POLICY, tool_tokens=2_000, exact=True, cap_tokens=5_000)
    assert budget.input_budget_tokens == 5_000 - 2_000
    tools_bigger_than_cap = budget_for(GPT4O, POLICY, tool_tokens=6_000, exact=True, cap_tokens=5_000)
    assert tools_bigger_than_cap.input_budget_tokens == 0


def test_cap_never_raises_the_budget_even_with_tools() -> None:
    plain = budget_for(GPT4O, POLICY, tool_tokens=2_000, exact=True)
    capped = budget_for(GPT4O, POLICY, tool_tokens=2_000, exact=True, cap_tokens=5_000)
    assert capped.input_budget_tokens <= min(plain.input_budget_tokens, 5_000)


# ---- never negative -------------------------------------------------------------------------------


def test_never_negative() -> None:
    assert (
        budget_for(
            model(1_000, 1_000), POLICY, requested_tokens=5_000, tool_tokens=0, exact=True
        ).input_budget_tokens
        == 0
    )
    assert budget_for(GPT4O, POLICY, tool_tokens=500_000, exact=True).input_budget_tokens == 0
    assert budget_for(GPT4O, POLICY, tool_tokens=0, exact=True, cap_tokens=0).input_budget_tokens == 0


_sizes = st.integers(min_value=1, max_value=2_000_000)


@settings(max_examples=200, deadline=None)
@given(
    window=_sizes,
    max_output_share=st.floats(min_value=0.0, max_value=1.0),
    requested=st.none() | st.integers(min_value=-10, max_value=3_000_000),
    tool_tokens=st.integers(min_value=0, max_value=3_000_000),
    cap=st.none() | st.integers(min_value=0, max_value=3_000_000),
    exact=st.booleans(),
)
def test_budget_properties(
    window: int,
    max_output_share: float,
    requested: int | None,
    tool_tokens: int,
    cap: int | None,
    exact: bool,
) -> None:
    spec = model(window, max(1, int(window * max_output_share)))
    # A dialect reads only a positive output cap (``Conversation.requested_output_tokens``).
    asked = requested if requested is not None and requested > 0 else None
    budget = budget_for(
        spec, POLICY, requested_tokens=asked, tool_tokens=tool_tokens, exact=exact, cap_tokens=cap
    )
    room = window - budget.reserve_tokens - budget.margin_tokens - tool_tokens
    assert budget.input_budget_tokens >= 0
    assert budget.input_budget_tokens <= max(0, room)
    if cap is None:
        assert budget.input_budget_tokens == max(0, room)
    else:
        assert budget.input_budget_tokens <= cap
    if requested is not None and requested > 0:
        assert budget.reserve_tokens == requested
    else:
        assert 0 <= budget.reserve_tokens <= spec.max_output_tokens
        assert budget.reserve_tokens <= POLICY.reserve_max_tokens
    assert budget.margin_tokens >= POLICY.margin_min_tokens


def test_policy_modes_are_the_documented_four() -> None:
    assert POLICY_MODES == ("auto", "truncate", "reject", "off")
    assert POLICY.mode == "auto"


def test_policy_refined_applies_only_the_given_overrides() -> None:
    base = Policy(keep_turns=3, reserve_tokens=700)
    assert base.refined() is base
    refined = base.refined(mode="truncate", keep_turns=0)
    assert (refined.mode, refined.keep_turns, refined.reserve_tokens) == ("truncate", 0, 700)
    assert base.refined(reserve_tokens=10).reserve_tokens == 10
    assert base.keep_turns == 3  # the original value is untouched


# ---- limits: what a request learned before it is planned again -----------------------------------


def test_limits_override_the_window_the_reserve_and_the_margin() -> None:
    limits = Limits(window_tokens=4_096, output_cap_tokens=500, margin_tokens=-200)
    budget = budget_for(GPT4O, POLICY, requested_tokens=32_000, tool_tokens=100, exact=True, limits=limits)
    assert (budget.window_tokens, budget.reserve_tokens, budget.margin_tokens) == (4_096, 500, -200)
    # A negative margin (we count more than the upstream) makes room above the window less reserve.
    assert budget.input_budget_tokens == 4_096 - 500 + 200 - 100


def test_a_learned_window_gets_its_own_default_reserve_and_margin() -> None:
    budget = budget_for(GPT4O, POLICY, tool_tokens=0, exact=True, limits=Limits(window_tokens=4_096))
    assert (
        budget.reserve_tokens == 614
        and budget.margin_tokens == margin_tokens_for(4_096, POLICY, exact=True) == 41
    )


def test_an_output_cap_limit_never_raises_the_reserve() -> None:
    budget = budget_for(
        GPT4O, POLICY, requested_tokens=300, tool_tokens=0, exact=True, limits=Limits(output_cap_tokens=900)
    )
    assert budget.reserve_tokens == 300


def test_the_default_reserve_never_fills_the_window() -> None:
    assert default_reserve_tokens(model(128_000, 16_384), POLICY, window_tokens=600) == 300


def test_refined_switches_lowering_off_per_request() -> None:
    assert Policy().lower_output and not Policy().refined(lower_output=False).lower_output
    assert Policy(lower_output=False).refined(lower_output=None).lower_output is False
