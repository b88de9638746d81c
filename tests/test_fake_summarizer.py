"""The fake upstreams' summarizer is extractive, capped, and knows nothing of planted facts."""

from __future__ import annotations

from app.compaction.prompts import render_messages, summarize_messages
from tests.fake_summarizer import is_summary_prompt, salient_summary, summary_answer


def words(text: str) -> int:
    return len(text.split())


def prompt(messages: list[dict[str, object]], previous: str | None = None) -> str:
    return summarize_messages("\n\n".join(render_messages(messages)), previous_summary=previous)[-1][
        "content"
    ]


def file_read(k: int, line: str) -> list[dict[str, object]]:
    lines = [f"{i}\trow {i} of the table is unremarkable" for i in range(40)]
    lines[20] = line
    call = {"id": f"c{k}", "type": "function", "function": {"name": "read", "arguments": f'{{"n": {k}}}'}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{k}", "content": "\n".join(lines)},
    ]


def test_it_keeps_what_only_one_sentence_says_and_drops_a_files_repeated_lines() -> None:
    text = prompt([*file_read(0, "The owner of the table is Zanzibar Quux."), *file_read(1, "Nothing here.")])
    summary = salient_summary(text, cap_tokens=200, count_text=words)
    assert "Zanzibar Quux" in summary
    assert "unremarkable" not in summary  # the repeated template of one result
    assert "Summarize the conversation" not in summary  # instructions are not material


NAMES = [
    a + b for a in ("ka", "lo", "mi", "nu", "po") for b in ("ra", "se", "ti", "vu", "we", "xo", "yi", "zu")
]


def test_what_does_not_fit_the_cap_is_lost_and_the_answer_fits_it() -> None:
    distinct = [f"The {name} item is called {name.upper()}." for name in NAMES]
    text = prompt([{"role": "user", "content": " ".join(distinct)}])
    summary = salient_summary(text, cap_tokens=60, count_text=words)
    assert words(summary) <= 60
    assert 5 <= sum(name.upper() in summary for name in NAMES) < len(NAMES)


def test_lines_where_only_numbers_change_are_boilerplate_within_a_message() -> None:
    rows = " ".join(f"Row {k} holds value {k * 7}." for k in range(10))
    summary = salient_summary(prompt([{"role": "user", "content": rows}]), cap_tokens=200, count_text=words)
    assert "holds value" not in summary


def test_a_previous_summary_is_material_and_has_no_boilerplate() -> None:
    previous = "\n".join(f"Point {k} was settled." for k in range(5))
    text = prompt([{"role": "user", "content": "A new point: the deadline is Friday."}], previous=previous)
    summary = salient_summary(text, cap_tokens=200, count_text=words)
    assert all(f"Point {k} was settled." in summary for k in range(5))
    assert "the deadline is Friday" in summary


def test_it_answers_summary_requests_only() -> None:
    request = summarize_messages("[user]: hi")
    assert is_summary_prompt(request[0]["content"])
    assert is_summary_prompt([{"type": "text", "text": request[0]["content"]}])
    assert not is_summary_prompt("You are a helpful assistant.")
    assert summary_answer("be brief", "x", cap_tokens=10, count_text=words) is None
    answer = summary_answer(request[0]["content"], request[1]["content"], cap_tokens=10, count_text=words)
    assert answer is not None and answer.endswith(": hi") and not answer.startswith("[user]")
    extractive = summary_answer(
        request[0]["content"], request[1]["content"], cap_tokens=10, count_text=words, style="extractive"
    )
    assert extractive == "[user]: hi"


def test_prose_around_the_points_costs_room_under_a_cap_that_binds() -> None:
    distinct = [f"The {name} item is called {name.upper()}." for name in NAMES]
    request = summarize_messages("[user]: " + " ".join(distinct))
    system, text = request[0]["content"], request[1]["content"]
    prose = summary_answer(system, text, cap_tokens=60, count_text=words)
    bare = summary_answer(system, text, cap_tokens=60, count_text=words, style="extractive")
    assert prose is not None and bare is not None and words(prose) <= 60
    kept = sum(name.upper() in prose for name in NAMES)
    assert 0 < kept < sum(name.upper() in bare for name in NAMES)  # the lead-ins take their share
    lines = prose.splitlines()
    assert len(set(lines)) == len(lines) and len({line.split(":")[0] for line in lines}) > 1  # varied


def test_every_bad_style_is_refused_by_the_summary_checks() -> None:
    from app.compaction.checks import check_summary

    text = "\n\n".join(
        f"[user]: Turn {k}: remember the code QX-{k}{k}{k}. " + "Words about it. " * 5 for k in range(6)
    )
    request = summarize_messages(text, reply_tokens=120)
    causes = {}
    for style in ("echo", "template", "repeat", "requote", "invent", "empty"):
        answer = summary_answer(
            request[0]["content"], request[1]["content"], cap_tokens=120, count_text=words, style=style
        )
        assert answer is not None and words(answer) <= 120
        rejection = check_summary(answer, request=request, cap_tokens=120, count_text=words)
        assert rejection is not None, style
        causes[style] = rejection.cause
    assert causes == {
        "echo": "echo",
        "template": "template",
        "repeat": "echo",
        "requote": "echo",
        "invent": "invented",
        "empty": "empty",
    }
    real = summary_answer(
        request[0]["content"], request[1]["content"], cap_tokens=120, count_text=words, style="real"
    )
    assert (
        real is not None
        and check_summary(real, request=request, cap_tokens=120, count_text=words) is not None
    )
    good = summary_answer(request[0]["content"], request[1]["content"], cap_tokens=120, count_text=words)
    assert good is not None and check_summary(good, request=request, cap_tokens=120, count_text=words) is None
