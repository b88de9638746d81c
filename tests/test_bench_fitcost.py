"""bench.fitcost: its bodies are valid agent sessions new to every cache, its ratios are computed
in the same run, and its report says what it measured (no timing is asserted)."""

from __future__ import annotations

from app.core.messages import pairing_problems
from bench import fitcost


def test_an_agent_session_is_a_valid_conversation_of_about_the_size_asked() -> None:
    messages = fitcost.agent_session(approx_tokens=40_000, seed=3)
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "user"
    assert pairing_problems(messages) == []
    assert any(m["role"] == "tool" for m in messages) and any("tool_calls" in m for m in messages)
    elapsed, tokens = fitcost.baseline_s(messages)
    assert elapsed > 0 and 30_000 < tokens < 60_000
    assert fitcost.agent_session(approx_tokens=40_000, seed=3) == messages  # deterministic


def test_salted_messages_are_new_to_every_cache_and_the_input_is_kept() -> None:
    messages = fitcost.agent_session(approx_tokens=5_000)
    before = [dict(m) for m in messages]
    one, two = fitcost.salted(messages, "a"), fitcost.salted(messages, "b")
    assert messages == before
    assert all(a["content"] != b["content"] and a["role"] == b["role"] for a, b in zip(one, two, strict=True))
    assert all(m["content"].startswith("[a] ") for m in one)


def test_an_in_process_case_reports_ratios_of_the_same_runs() -> None:
    case = fitcost.Case("tiny", "a small session into 4,096", 12_000, 4_096)
    result = fitcost.in_process(case, runs=2)
    assert len(result["ratio"]) == 2 and result["tokens_before"] > result["tokens_after"]
    assert result["ratio"] == [f / b for f, b in zip(result["fit_s"], result["baseline_s"], strict=True)]
    text = fitcost.report(
        {
            "when": "now",
            "commit": "abc",
            "machine": "2 CPUs",
            "load_start": "0.1",
            "load_end": "0.2",
            "runs": 2,
            "cases": {"tiny": result},
        }
    )
    assert "| tiny: a small session into 4,096 |" in text and f"{result['ratio_median']:.2f}x" in text
