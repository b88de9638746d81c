"""app.compaction.checks: an answer is trusted as a summary only when it is one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.compaction.checks import CAUSES, check_summary, material
from app.compaction.prompts import merge_messages, render_messages, summarize_messages

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "summaries"

CHAT = [
    {
        "role": "user",
        "content": "Turn 1. The release ships on Thursdays after the smoke tests pass on staging. "
        "Please keep in mind that the access code for vault 1 is QXV-4821.",
    },
    {"role": "assistant", "content": "Noted. For the release checklist, run the smoke tests first."},
    {
        "role": "user",
        "content": "Turn 2. The orders table gets a new index before the schema change lands. "
        "The access code for vault 2 is LMT-3307.",
    },
    {"role": "assistant", "content": "Understood: index the orders table, then change the schema."},
]
REQUEST = summarize_messages("\n\n".join(render_messages(CHAT)), reply_tokens=200)


def words(text: str) -> int:
    return len(text.split())


def verdict(answer: str, request: list[dict[str, str]] = REQUEST, cap: int = 200) -> str | None:
    rejection = check_summary(answer, request=request, cap_tokens=cap, count_text=words)
    return None if rejection is None else rejection.cause


GOOD = (
    "## User requests\n- Remember the vault codes for later.\n## Facts\n- Vault 1 uses QXV-4821 and vault 2 "
    "uses LMT-3307.\n- Releases ship on Thursdays once the smoke tests pass on staging.\n- The orders table "
    "gets its index before the schema change."
)


def test_a_real_summary_passes() -> None:
    assert verdict(GOOD) is None
    assert verdict("The user wants the release on Thursdays after staging smoke tests.") is None


def test_what_a_request_gave_to_summarize_is_its_material() -> None:
    found, instructions = material(REQUEST)
    assert "QXV-4821" in found and "handoff summaries" not in found
    assert "handoff summaries" in instructions and "QXV-4821" not in instructions
    merged, _ = material(merge_messages(["part one", "part two"]))
    assert "part one" in merged and "part two" in merged


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        ("", "empty"),
        ("ok", "empty"),
        ("<start_of_turn>user\nTurn 1. The release ships<end_of_turn>", "template"),
        ("<|im_start|>user\nTurn 1<|im_end|>", "template"),
        ("Sure. [INST] summarize [/INST] the release ships on Thursdays", "template"),
        ("<conversation>\n[user]: Turn 1. The release ships\n</conversation>", "echo"),
        ("[user]: Turn 1. The release ships on Thursdays.\n[assistant]: Noted.", "echo"),
        (REQUEST[0]["content"], "echo"),
        ("[user]: Turn\n" * 40, "echo"),
        ("Vault vault vault vault vault vault vault is the code.", "repetition"),
        ("- the release ships on Thursdays\n" * 5, "repetition"),
        ("The access code for vault 3 is ZZZ-9999, noted for later use by the team.", "invented"),
        ("Vault 1 is CERTAIN and the total is 31337 coins across every staging release.", "invented"),
        (
            "Bananas grow quickly in tropical climates; farmers harvest them green and ship them far.",
            "unrelated",
        ),
    ],
)
def test_what_small_models_answer_is_refused_with_its_cause(answer: str, cause: str) -> None:
    assert verdict(answer) == cause


def test_an_answer_over_its_size_is_an_overrun() -> None:
    assert verdict(GOOD, cap=10) == "overrun"
    assert set(CAUSES) == {"empty", "template", "echo", "repetition", "invented", "unrelated", "overrun"}


def test_a_merge_may_repeat_what_the_partial_summaries_said() -> None:
    request = merge_messages(["Vault 1 uses QXV-4821.", "Vault 2 uses LMT-3307."], reply_tokens=100)
    assert verdict("Vault 1 uses QXV-4821; vault 2 uses LMT-3307.", request, cap=100) is None
    assert verdict("Vault 3 uses AAA-1111.", request, cap=100) == "invented"


def test_the_real_answers_of_a_small_local_model_are_refused() -> None:
    # Gemma 3 270M through llama.cpp's server (bench.llama --fixtures): the answers it wrote to the
    # summary requests of a growing chat, each with the request it answered.
    from app.tokenizer import counter_for

    count = counter_for("o200k_base").count_text
    data = json.loads((FIXTURES / "gemma3-270m.json").read_text(encoding="utf-8"))
    answers = data["answers"]
    assert len(answers) >= 5
    causes = []
    for entry in answers:
        cap = 2 * int(entry["max_tokens"])  # the model's own count is not o200k's
        rejection = check_summary(entry["answer"], request=entry["request"], cap_tokens=cap, count_text=count)
        assert rejection is not None, entry["answer"][:200]
        causes.append(rejection.cause)
    assert len(set(causes)) >= 2  # not one failure only: the kinds the issue saw
