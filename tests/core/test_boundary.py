"""app.core.boundary: margins, the uncertainty zone, the margin an exact count implies, lowering."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.core.boundary import (
    MARGIN_FLOOR_RATIO,
    UNCALIBRATED_ESTIMATE,
    UNCERTAINTY_BASE,
    Uncertainty,
    keep_tokens,
    lowered_output_tokens,
    margin_for_count,
    margin_ratio,
    may_be_over,
    may_fit,
    memory_room_beside,
    room_tokens,
    safety_tokens,
    uncertainty,
)
from app.core.budget import Budget, Policy
from app.core.dialects import CHAT
from app.core.knowledge import Precision
from app.core.memory import MEMORY_MAX_TOKENS, memory_tokens_for
from app.core.plan import Action, Plan
from tests.core.fakes import SPEC

POLICY = Policy()
BUDGET = Budget(window_tokens=100_000, reserve_tokens=4_000, margin_tokens=5_000, tool_tokens=0)


def plan(tokens: int, *, fits: bool, budget: Budget = BUDGET, actions: tuple[Action, ...] = ()) -> Plan:
    return Plan(
        model="m",
        spec=SPEC,
        budget=budget,
        count_kind="estimate",
        tokens_before=tokens,
        tokens_after=tokens,
        changed=bool(actions),
        fits=fits,
        messages=(),
        message_tokens=(),
        actions=actions,
        dialect=CHAT,
    )


def test_the_margin_shrinks_as_the_upstreams_counts_confirm_ours_and_never_grows() -> None:
    assert margin_ratio(None, policy=POLICY, exact=False) == POLICY.margin_estimate_ratio
    assert margin_ratio(None, policy=POLICY, exact=True) == POLICY.margin_exact_ratio
    close = Precision(under=0.004, over=0.01, samples=5)
    assert margin_ratio(close, policy=POLICY, exact=False) == pytest.approx(2 * 0.004 + UNCERTAINTY_BASE)
    assert margin_ratio(Precision(0.0, 0.0, 9), policy=POLICY, exact=True) == MARGIN_FLOOR_RATIO
    wild = Precision(under=0.3, over=0.0, samples=5)
    assert margin_ratio(wild, policy=POLICY, exact=False) == POLICY.margin_estimate_ratio


def test_uncertainty_without_a_record_is_wide_for_an_estimate_and_one_sided_for_an_exact_count() -> None:
    assert uncertainty(None, policy=POLICY, exact=False) == Uncertainty(
        UNCALIBRATED_ESTIMATE, UNCALIBRATED_ESTIMATE
    )
    exact = uncertainty(None, policy=POLICY, exact=True)
    assert exact.under == POLICY.margin_exact_ratio and exact.over > exact.under
    measured = uncertainty(Precision(0.02, 0.1, 4), policy=POLICY, exact=False)
    assert measured == Uncertainty(0.02 + UNCERTAINTY_BASE, 0.1 + UNCERTAINTY_BASE)


def test_the_room_is_the_window_less_the_reserve_and_a_small_safety() -> None:
    assert safety_tokens(100_000, POLICY) == 200
    assert safety_tokens(1_000, POLICY) == POLICY.margin_min_tokens
    assert room_tokens(BUDGET, POLICY) == 100_000 - 4_000 - 200
    assert room_tokens(replace(BUDGET, cap_tokens=50_000), POLICY) == 50_000


def test_the_zone_is_where_the_uncertainty_can_cross_the_room() -> None:
    u = Uncertainty(0.05, 0.05)
    room = room_tokens(BUDGET, POLICY)  # 95,800
    assert not may_be_over(90_000, BUDGET, POLICY, u)
    assert may_be_over(92_000, BUDGET, POLICY, u)
    assert may_fit(100_000, BUDGET, POLICY, u)
    assert not may_fit(101_000, BUDGET, POLICY, u)
    assert not may_fit(room * 2, BUDGET, POLICY, Uncertainty(0.0, 0.4))


def test_the_margin_for_an_exact_count_scales_the_room_by_its_ratio_to_ours() -> None:
    room = room_tokens(BUDGET, POLICY)
    # The upstream counts what we count: the margin is just the safety.
    assert margin_for_count(BUDGET, POLICY, counted_tokens=90_000, upstream_tokens=90_000) == 200
    # It counts 10% less (encrypted reasoning we price high): the budget in our units is above the window's.
    less = margin_for_count(BUDGET, POLICY, counted_tokens=100_000, upstream_tokens=90_000)
    assert less < 0 and 100_000 - 4_000 - less == int(room * 100_000 / 90_000)
    more = margin_for_count(BUDGET, POLICY, counted_tokens=90_000, upstream_tokens=99_000)
    assert 100_000 - 4_000 - more == int(room * 90_000 / 99_000)


def test_keep_tokens_adds_back_what_the_last_resort_cut() -> None:
    cut = plan(
        30_000, fits=True, actions=(Action("dropped_turns", 2, 9_000), Action("last_resort", 1, 4_000))
    )
    assert keep_tokens(cut) == 34_000


def test_the_output_cap_comes_down_to_keep_what_must_be_kept() -> None:
    budget = Budget(window_tokens=60_000, reserve_tokens=32_000, margin_tokens=3_000, tool_tokens=18_000)
    last_resort = plan(25_000, fits=True, budget=budget, actions=(Action("last_resort", 1, 5_000),))
    assert (
        lowered_output_tokens(last_resort, requested_output_tokens=32_000, policy=POLICY)
        == 60_000 - 3_000 - 30_000
    )
    over = plan(36_000, fits=False, budget=budget)
    assert lowered_output_tokens(over, requested_output_tokens=32_000, policy=POLICY) == 21_000
    # A plan that fits without cutting into what must be kept needs no lower cap.
    fine = plan(20_000, fits=True, budget=budget, actions=(Action("dropped_turns", 1, 3_000),))
    assert lowered_output_tokens(fine, requested_output_tokens=32_000, policy=POLICY) is None


def test_with_summaries_the_lowered_cap_leaves_the_memory_its_room_beside_what_must_be_kept() -> None:
    budget = Budget(window_tokens=60_000, reserve_tokens=32_000, margin_tokens=3_000, tool_tokens=18_000)
    last_resort = plan(25_000, fits=True, budget=budget, actions=(Action("last_resort", 1, 5_000),))
    remembering = Policy(summarize=True)
    cap = lowered_output_tokens(last_resort, requested_output_tokens=32_000, policy=remembering)
    assert cap is not None and cap < 60_000 - 3_000 - 30_000  # lower than without the memory
    # At the lowered cap, what must be kept (30,000 with the tools) fits beside the memory's room.
    lowered = replace(budget, reserve_tokens=cap)
    assert 30_000 - 18_000 + memory_tokens_for(lowered, remembering) <= lowered.input_budget_tokens
    # ... and not at a cap a few tokens higher (the room is the smallest that does, but rounding).
    higher = replace(budget, reserve_tokens=cap + 3)
    assert 30_000 - 18_000 + memory_tokens_for(higher, remembering) > higher.input_budget_tokens
    # A large kept span: the memory's room is capped, so is what the cap gives up for it.
    assert memory_room_beside(10_000_000) == MEMORY_MAX_TOKENS


def test_lowering_respects_the_floor_the_switches_and_the_input_cap() -> None:
    budget = Budget(window_tokens=60_000, reserve_tokens=32_000, margin_tokens=3_000, tool_tokens=18_000)
    over = plan(56_500, fits=False, budget=budget)  # 500 tokens of room: under the floor
    assert lowered_output_tokens(over, requested_output_tokens=32_000, policy=POLICY) is None
    # What must be kept does not leave the floor whole, but the smallest the plan reached does.
    keep = plan(55_000, fits=False, budget=budget, actions=(Action("last_resort", 1, 2_000),))
    assert (
        lowered_output_tokens(keep, requested_output_tokens=32_000, policy=POLICY)
        == POLICY.output_floor_tokens
    )
    over = plan(36_000, fits=False, budget=budget)
    assert lowered_output_tokens(over, requested_output_tokens=None, policy=POLICY) is None
    assert (
        lowered_output_tokens(over, requested_output_tokens=32_000, policy=Policy(lower_output=False)) is None
    )
    assert lowered_output_tokens(over, requested_output_tokens=32_000, policy=Policy(mode="reject")) is None
    capped = replace(budget, cap_tokens=30_000)
    assert (
        lowered_output_tokens(
            plan(36_000, fits=False, budget=capped), requested_output_tokens=32_000, policy=POLICY
        )
        is None
    )
    # Never at or above what the client asked for.
    small = plan(36_000, fits=False, budget=replace(budget, reserve_tokens=2_000))
    assert lowered_output_tokens(small, requested_output_tokens=2_000, policy=POLICY) == 1_999
