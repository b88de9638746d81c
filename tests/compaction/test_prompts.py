"""app.compaction.prompts: what a summary is asked to keep, its size, and the order it is cut in."""

from __future__ import annotations

from app.compaction.prompts import (
    PROMPT_VERSION,
    SECTIONS,
    SYSTEM_MARKER,
    merge_messages,
    render_message,
    section_of,
    summarize_messages,
    truncate_sections,
    words_for,
)


def words(text: str) -> int:
    return len(text.split())


def test_the_prompt_asks_for_the_sections_agents_keep_in_the_size_of_the_reply() -> None:
    system = summarize_messages("[user]: hi", reply_tokens=500)[0]["content"]
    assert system.startswith(SYSTEM_MARKER) and PROMPT_VERSION == "handoff-v2"
    assert [system.index(f"## {name}") for name in SECTIONS] == sorted(
        system.index(f"## {n}") for n in SECTIONS
    )
    assert f"under {words_for(500)} words" in system and words_for(500) == 300
    assert "do not list them" in system  # the index holds the exact strings
    assert "[thinking]" in system  # the reasoning is source material
    assert summarize_messages("x", reply_tokens=100)[0] != summarize_messages("x", reply_tokens=200)[0]
    assert merge_messages(["a", "b"], reply_tokens=100)[0] == summarize_messages("x", reply_tokens=100)[0]


def test_the_reasoning_of_a_turn_is_rendered_as_source_material() -> None:
    message = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "the key is AKX-4821"},
            {"type": "text", "text": "Done."},
        ],
    }
    assert render_message(message) == "[assistant]: [thinking] the key is AKX-4821\nDone."
    empty = {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": " "}, {"type": "text", "text": "ok"}],
    }
    assert render_message(empty) == "[assistant]: ok"


def test_headings_are_read_in_the_forms_models_write_them() -> None:
    assert section_of("## Files") == 1
    assert section_of("**Open tasks:**") == 5
    assert section_of("User requests:") == 0
    assert section_of("- Files were read") is None and section_of("## Something else") is None


SUMMARY = "\n".join(
    [
        "## User requests",
        "- fix the parser",
        "## Facts",
        "- the port is 8080",
        "## Files",
        "- src/parse.py: the tokenizer loop",
        "- src/main.py: the entry point",
        "## Open tasks",
        "- run the tests",
    ]
)


def test_an_overrun_loses_its_lowest_sections_first() -> None:
    assert truncate_sections(SUMMARY, cap_tokens=1000, count_text=words) == SUMMARY
    cut = truncate_sections(SUMMARY, cap_tokens=words(SUMMARY) - 1, count_text=words)
    assert "## Facts" not in cut and "## Open tasks" in cut and words(cut) < words(SUMMARY)
    assert cut.splitlines()[:2] == ["## User requests", "- fix the parser"]  # in the order written
    smaller = truncate_sections(SUMMARY, cap_tokens=15, count_text=words)
    # Within the last section that fits in part, its last lines go.
    assert smaller == "## User requests\n- fix the parser\n## Files\n- src/parse.py: the tokenizer loop"
    assert truncate_sections(SUMMARY, cap_tokens=5, count_text=words) == "## User requests\n- fix"


def test_a_summary_without_headings_is_cut_by_its_last_lines_then_at_a_word() -> None:
    text = "\n".join(f"point {k} made here" for k in range(10))
    cut = truncate_sections(text, cap_tokens=9, count_text=words)
    assert cut == "point 0 made here\npoint 1 made here"
    line = " ".join(f"w{k}" for k in range(50))
    assert truncate_sections(line, cap_tokens=7, count_text=words) == "w0 w1 w2 w3 w4 w5 w6"
