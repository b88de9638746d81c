"""``ctxproxy demo`` end to end: real servers on loopback, a conversation that outgrows the window."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.messages import pairing_problems
from app.demo import (
    DEMO_WINDOW_TOKENS,
    TurnResult,
    agent_requests,
    demo_max_output_tokens,
    demo_model,
    format_row,
    header_line,
    run_demo,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rows() -> list[TurnResult]:
    return run_demo(turns=8, on_row=lambda row: None)


def test_the_conversation_outgrows_the_window_directly(rows: list[TurnResult]) -> None:
    assert [r.turn for r in rows] == list(range(1, 9))
    assert rows[0].direct == "ok"
    assert rows[-1].direct == "context error"
    assert rows[-1].tokens_sent > DEMO_WINDOW_TOKENS
    # Once over the window, the upstream refuses every later turn.
    first_refused = next(i for i, r in enumerate(rows) if r.direct != "ok")
    assert all(r.direct == "context error" for r in rows[first_refused:])


def test_every_turn_succeeds_through_ctxproxy(rows: list[TurnResult]) -> None:
    assert all(r.proxied == "ok" for r in rows), rows
    for r in rows:
        assert r.tokens_forwarded is not None
        assert r.tokens_forwarded < DEMO_WINDOW_TOKENS
        assert r.retries == "0"
    over = [r for r in rows if r.direct != "ok"]
    assert over, "the demo must show turns that only ctxproxy gets through"
    assert all(r.actions != "none" and r.tokens_forwarded < r.tokens_sent for r in over)
    assert rows[0].actions == "none"
    assert rows[0].tokens_forwarded == rows[0].tokens_sent


def test_what_a_cut_forgets_is_remembered_by_its_index_and_no_summary_is_reported_failed(
    rows: list[TurnResult],
) -> None:
    cut = [r for r in rows if r.actions != "none"]
    assert cut and all("indexed=" in r.actions for r in cut), cut
    assert not any("summary_failed" in r.actions for r in rows), rows


def test_agent_requests_grow_and_stay_well_formed() -> None:
    requests = agent_requests(4)
    sizes = []
    for request in requests:
        messages = request["messages"]
        assert not pairing_problems(messages)
        assert messages[0]["role"] == "system"
        assert messages[-1]["role"] == "tool"
        sizes.append(len(messages))
        messages.append({"role": "assistant", "content": "ok"})
    assert sizes == [4, 8, 12, 16]


def test_table_rows_line_up() -> None:
    row = TurnResult(
        turn=7,
        tokens_sent=12_345,
        direct="context error",
        proxied="ok",
        tokens_forwarded=3_210,
        actions="pruned=4",
        retries="0",
    )
    header, line = header_line(), format_row(row)
    assert line.split("  ")[0].strip() == "7"
    assert line.index("12,345") == header.index("tokens sent")
    assert line.index("3,210") == header.index("tokens forwarded")
    assert line.endswith("pruned=4")


def test_ctxproxy_demo_command_exits_0_and_prints_the_table() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CTXPROXY_")}
    done = subprocess.run(
        [sys.executable, "-m", "app", "demo", "--turns", "6"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("turn"))
    table = lines[header + 1 : header + 7]
    assert [line.split()[0] for line in table] == ["1", "2", "3", "4", "5", "6"]
    assert any("context error" in line for line in table)
    assert "Through ctxproxy: 6 of 6 ok" in done.stdout


def test_the_model_is_named_after_its_window_and_its_max_output_fits_in_it() -> None:
    assert demo_model(4096) == "demo-4k" and demo_model(8192) == "demo-8k"
    assert demo_model(1000) == "demo-1000"
    assert demo_max_output_tokens(4096) == 1024
    assert demo_max_output_tokens(1000) == 250
    assert demo_max_output_tokens(2) == 1


def test_a_window_smaller_than_the_default_max_output_runs() -> None:
    """``--window 1000`` crashed: the demo's table said max_output 1024, over the window."""
    rows = run_demo(turns=2, window_tokens=1000, on_row=lambda row: None)
    assert [r.proxied for r in rows] == ["ok", "ok"]
    assert rows[1].direct == "context error"
    assert all(r.tokens_forwarded is not None and r.tokens_forwarded < 1000 for r in rows)


def test_the_commands_header_names_the_window_it_was_given() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CTXPROXY_")}
    done = subprocess.run(
        [sys.executable, "-m", "app", "demo", "--turns", "1", "--window", "2048"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a 2,048-token window (demo-2k)" in done.stdout
    assert "demo-4k" not in done.stdout
