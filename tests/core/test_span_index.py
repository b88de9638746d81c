"""app.core.span_index: the exact strings of a forgotten span, found without a model."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.span_index import KINDS, identifiers, message_entries, span_index


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_9zz",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


SESSION: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": "Deploy with access code AKX-4821; the docs are at https://example.com/deploy.",
    },
    call("run_shell", command="pytest -q tests/test_api.py", cwd="/srv/app"),
    {
        "role": "tool",
        "tool_call_id": "call_9zz",
        "content": 'Traceback (most recent call last):\n  File "src/api/views.py", line 12\n'
        "KeyError: 'max_tokens'\n$ pip install httpx==0.27.2",
    },
    {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "getUserName needs v2.1.0 of the SDK"}],
    },
    {"role": "assistant", "content": "Run `make lint` next; see README.md."},
]


def entries(text: str) -> list[tuple[str, str]]:
    return message_entries({"role": "user", "content": text})


def test_every_kind_is_found_verbatim_and_rendered_by_kind() -> None:
    index = span_index(SESSION, max_chars=10_000)
    found = set(index.entries)
    assert {("identifier", "AKX-4821"), ("identifier", "getUserName")} <= found
    assert {("path", "src/api/views.py"), ("path", "README.md"), ("path", "/srv/app")} <= found
    assert ("url", "https://example.com/deploy") in found  # the sentence's full stop is not in it
    assert {("command", "pytest -q tests/test_api.py"), ("command", "pip install httpx==0.27.2")} <= found
    assert {("error", "Traceback (most recent call last):"), ("error", "KeyError: 'max_tokens'")} <= found
    assert ("version", "v2.1.0") in found  # from the model's reasoning: source material too
    assert ("string", "make lint") in found
    text = index.text()
    assert text.splitlines()[0].startswith("identifiers: AKX-4821")
    assert [line.split(":")[0] for line in text.splitlines() if not line.startswith("- ")] == [
        "identifiers",
        "files",
        "errors",
        "commands",
        "urls",
        "versions",
        "strings",
    ]
    # Structure is not content: a tool's name, a call's id, an argument's key.
    assert not {"run_shell", "call_9zz", "cwd"} & set(index.strings())


def test_identifiers_are_tokens_a_model_would_have_to_copy() -> None:
    assert identifiers("FACT-t12 snake_case camelCase HttpClient MAX_TOKENS ABC-DEF sha1f00d") == [
        "FACT-t12",
        "snake_case",
        "camelCase",
        "HttpClient",
        "MAX_TOKENS",
        "ABC-DEF",
        "sha1f00d",
    ]
    assert identifiers("Hello world, the plan is 1234 words long; ok a1") == []


def test_the_end_of_a_sentence_is_no_file_name() -> None:
    assert ("path", "end.The") not in entries("That was the end.The next one")
    assert ("path", "config.yaml") in entries("Edit config.yaml.")


def test_deduplicated_and_byte_stable() -> None:
    twice = [*SESSION, *SESSION]
    assert span_index(twice, max_chars=10_000) == span_index(SESSION, max_chars=10_000)
    assert span_index(SESSION, max_chars=10_000).text() == span_index(list(SESSION), max_chars=10_000).text()
    assert not span_index([{"role": "user", "content": "just some words here"}], max_chars=1000)
    assert span_index(SESSION, max_chars=0).text() == ""


def codes(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Turn {k}: the code is QX-{1000 + k}."} for k in range(n)]


def test_a_bound_that_binds_keeps_the_newest_of_every_kind() -> None:
    messages = [*codes(200), {"role": "user", "content": "see notes.txt and 3.2.1"}]
    index = span_index(messages, max_chars=300)
    assert len(index.text()) <= 300
    kept = [text for kind, text in index.entries if kind == "identifier"]
    assert "QX-1199" in kept and "QX-1000" not in kept  # the newest first
    assert kept == sorted(kept)  # rendered in the order they were seen
    assert ("path", "notes.txt") in index.entries and ("version", "3.2.1") in index.entries


def test_the_index_of_a_longer_span_holds_the_shorter_ones_until_the_bound_binds() -> None:
    short = span_index(codes(20), max_chars=10_000)
    longer = span_index(codes(30), max_chars=10_000)
    assert set(short.entries) < set(longer.entries)


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(alphabet=st.sampled_from("aZ09_-./: `$\n"), max_size=60), max_size=12),
    bound=st.integers(0, 400),
)
def test_any_text_gives_a_bounded_index_of_verbatim_strings(texts: list[str], bound: int) -> None:
    messages = [{"role": "user", "content": t} for t in texts]
    index = span_index(messages, max_chars=bound)
    assert len(index.text()) <= bound
    joined = "\n".join(texts)
    assert all(kind in KINDS for kind, _ in index.entries)
    for kind, text in index.entries:
        if kind not in ("error", "command"):  # those are whitespace-normalized lines
            assert text in joined


def test_an_identifier_only_part_of_a_longer_word_is_kept() -> None:
    # "FACT-c5" is another string than "FACT-c5a" (a model reading the longer one does not learn
    # the shorter exists); "w1" inside "log_w1" or "w1x2" likewise.
    messages = [{"role": "user", "content": "FACT-c5 then FACT-c5a, later FACT-c5a again"}]
    listed = span_index(messages, max_chars=2000).text().split("identifiers: ", 1)[1].split("\n")[0]
    assert listed.split(", ") == ["FACT-c5", "FACT-c5a"]
