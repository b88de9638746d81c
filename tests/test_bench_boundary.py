"""bench/boundary.py: a short session near the boundary, in both modes, measured as the report says."""

from __future__ import annotations

from bench.boundary import BASELINE, fits_models, no_numbers_scenario, run_session, summarize
from bench.boundary_sessions import Session


async def test_near_the_boundary_the_new_mode_forwards_what_fits_and_the_baseline_may_cut() -> None:
    summaries = {}
    for mode, settings in (("new", {}), ("baseline", BASELINE)):
        rows = await run_session(
            fits_models(),
            "claude-like-chat",
            Session("chat", seed=1),
            api="chat",
            requests=50,
            max_tokens=1_000,
            settings=settings,
        )
        summaries[mode] = summarize(rows)
    new, base = summaries["new"], summaries["baseline"]
    assert new.fits > 0 and new.fits_identical == new.fits  # every request that fits goes whole
    assert base.fits_identical < base.fits  # the fixed margin cut some of them
    assert new.over_reached == 0 and new.errors == 0


async def test_a_wrong_table_with_errors_without_numbers_costs_two_refusals_then_none() -> None:
    result = await no_numbers_scenario(seed=1, api="responses", numbers=False)
    assert result.first_failed <= 2 and result.later_failed == 0 and result.client_errors == 0
