"""Smoke test of ``bench.summaries``: a short session through real servers on loopback, then the report.

No timing is asserted: only that the session overflows, summaries are made ahead of time and reused,
and the analysis and the Markdown table hold together.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import summaries

pytestmark = pytest.mark.timeout(120)


def test_a_short_session_is_measured_and_reported(tmp_path: Path) -> None:
    # Recall off: its tool's tokens move this session's second cut one turn earlier, to where a
    # memory stop appears between the ahead-of-time plan and the cut (one request then waits for
    # its summary: seen with recall on, left to the summaries' own round).
    session = summaries.run_session(
        turns=30, window_tokens=2048, user_tokens=50, think_s=0.02, summary_delay_s=0, recall=False
    )
    result = summaries.analyse(session)
    assert result["requests"] == 30
    assert result["first_cut"] is not None and result["cut_requests"] >= 3
    assert 1 <= result["summary_calls"] < result["cut_requests"]  # reused across requests
    assert result["stats"]["ahead"] >= 1
    assert result["waited_with_ahead_idle"] == 0
    # a prefix changes without a new cut only where a summary did not fit and the note was used
    assert result["stable_pairs"] > 0 and result["unstable_pairs"] <= result["notes"]
    assert 0 < result["kept_facts"] <= result["cut_facts"]
    text = summaries.render(result)
    assert "| extra upstream calls per client request |" in text
    out = tmp_path / "summaries.md"
    summaries.main(["--turns", "0", "--out", str(out)])
    assert out.read_text(encoding="utf-8").startswith("# LLM summaries over a long session")
