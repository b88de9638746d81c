"""bench/boundary.py: a short session near the boundary, in both modes, measured as the report says."""

from __future__ import annotations

from app.core.dialects import GEMINI
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


async def test_gemini_near_the_boundary_forwards_what_fits_whole_and_counts_its_input_alone() -> None:
    rows = await run_session(
        fits_models(),
        "claude-like-chat",
        Session("chat", seed=1),
        api="gemini",
        requests=50,
        max_tokens=1_000,
        settings={},
    )
    summary = summarize(rows)
    assert summary.fits > 0 and summary.fits_identical == summary.fits  # every fit goes whole
    assert summary.over_reached == 0 and summary.errors == 0 and summary.trimmed > 0
    assert summary.counted >= 1  # its own :countTokens asked near the boundary
    assert all(r.output_tokens == 0 for r in rows)  # maxOutputTokens is not in Gemini's window


def test_gemini_session_bodies_keep_geminis_rules() -> None:
    session = Session("agent", seed=2, reasoning=True)
    for _ in range(20):
        session.grow()
    body = session.body("gemini", model="m", max_tokens=2_000)
    assert GEMINI.problems(body) == [] and "model" not in body
    assert body["generationConfig"] == {"maxOutputTokens": 2_000}
    calls = [p for c in body["contents"] for p in c["parts"] if "functionCall" in p]
    assert calls and all("thoughtSignature" in p for p in calls)
