"""The fake upstreams' summarizer: extractive, generic, capped, and no kinder than a real model.

Every fake upstream (chat, Responses, Anthropic Messages) answers a summary request (recognised
by the project's summary prompt, ``app.compaction.prompts.SYSTEM_MARKER``, as its system prompt)
with :func:`salient_summary` of the request's text, in its own API's answer shape.

The rule is a classic extractive summary (SumBasic-like sentence ranking), and it knows nothing
of what a test plants or looks for:

1. what it reads is the request's material: the ``<previous_summary>``, ``<conversation>``,
   ``<conversation_part>`` and ``<summary ...>`` sections of the prompt (the instructions around
   them are not material);
2. the material is cut into sentences (line ends, and ``.``, ``!``, ``?``, ``;`` before a space);
3. inside one message of the transcript, sentences that repeat one *template* (the sentence with
   every run of digits read as ``#``, its message label aside) three times or more are boilerplate
   (a file's repetitive lines, a log's): dropped, as a model does not copy them into a summary; so
   is a label with nothing after it, and one word said over and over (filler). A summary it is
   given (previous or partial) has no boilerplate: each of its lines is a point already made;
4. what was said or read (user, assistant and tool-result text, earlier summaries) comes before
   the record of the actions that produced it (the transcript's tool-call lines): a model
   summarizes what it learned before what it did. Within each, sentences are ranked by what they
   say that nothing else does: first by how many of their words occur nowhere else in the whole
   material (a name, an identifier, a number), then by the mean rarity of their words (``1 /
   count`` of each): a sentence of words used everywhere says little;
5. the best ranked are kept, in their original order, while they fit the request's output cap
   (``max_tokens``/``max_output_tokens``, counted with the fake's tokenizer): a hard cap, as a
   real model's; what does not fit is lost, oldest points included.

Why it is no kinder than a real model: it never restates anything it did not read, never
rephrases, drops every repeated line and everything past the cap, and its only notion of
importance is word rarity, which a fact shares with every other distinctive sentence (a name, a
path, a version). A real model reads meaning: it keeps what a user asked it to remember even when
worded with common words, and it can say more in fewer tokens. A fact survives here only when it
is written somewhere the summarizer was shown and outranks the rest within the cap.

Styles (``summary_answer(..., style=)``; every fake upstream has a ``summary_style``):

* ``prose`` (the default): a model writes prose around what it keeps, which costs room under
  the cap: each kept sentence comes with a lead-in (one of ``LEADS``, chosen by the sentence's
  CRC, so no line repeats), the lead-ins counted in the cap, so fewer points fit than bare
  sentences would;
* ``extractive``: the kept sentences alone (the fake of before issue 28);
* the bad answers small local models give (issue 28, ``app.compaction.checks`` must refuse each):
  ``echo`` (the instructions given back), ``template`` (a conversation in chat-template tokens),
  ``repeat`` (``[user]: Turn`` until the cap), ``requote`` (the transcript copied from its start
  until the cap), ``invent`` (the prose summary and a code it never read), ``empty``, and ``real``
  (one of the answers Gemma 3 270M gave through llama.cpp's server, saved in
  ``tests/fixtures/summaries/gemma3-270m.json``, chosen by the prompt's CRC).
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from app.compaction.prompts import SYSTEM_MARKER

BOILERPLATE_REPEATS = 3
_SECTION = re.compile(
    r"<(previous_summary|conversation|conversation_part|summary)(?: [^>]*)?>\n(.*?)\n</\1>", re.DOTALL
)
# A rendered message of the transcript starts a paragraph with its label: ``[user]: ...``.
_MESSAGE_START = re.compile(r"\n\n(?=\[[a-z][^\]\n]*\](?::|\n|$))")
_SENTENCE = re.compile(r"\n+|(?<=[.!?;])[ \t]+")
_WORD = re.compile(r"[A-Za-z0-9][\w./:-]*")
_DIGITS = re.compile(r"[0-9]+")
# The label ``render_message`` puts before a message's text: ``[user]: ``, ``[tool result for f [c1]]: ``.
_LABEL = re.compile(r"^\[(?:[^\[\]]|\[[^\]]*\])*\]:? ?")


def is_summary_prompt(system: object) -> bool:
    """True when ``system`` (a system prompt: text, or text blocks) is the project's summarizer's."""
    if isinstance(system, list):
        system = "".join(b.get("text", "") for b in system if isinstance(b, Mapping))
    return isinstance(system, str) and system.startswith(SYSTEM_MARKER)


def _template(sentence: str) -> str:
    return _DIGITS.sub("#", _LABEL.sub("", sentence))


def _filler(sentence: str) -> bool:
    """One word said over and over (``w w w w``): filler, no model copies it."""
    words = _LABEL.sub("", sentence).split()
    return len(words) >= BOILERPLATE_REPEATS and len(set(words)) == 1


def _is_action(sentence: str) -> bool:
    return sentence.startswith(("-> tool call ", "-> function call "))


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


STYLES = ("prose", "extractive", "echo", "template", "repeat", "requote", "invent", "empty", "real")
LEADS = (
    "Earlier, {}",
    "It was noted that {}",
    "One point to keep: {}",
    "Also established: {}",
    "From this part of the work: {}",
    "A detail to remember: {}",
    "Before that, {}",
    "The exchange covered this: {}",
    "Worth keeping: {}",
    "Among the points made: {}",
    "Another thing settled: {}",
    "Recorded here: {}",
)
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "summaries"


_LEAD_INS = tuple(lead.removesuffix("{}") for lead in LEADS)


def _lead(sentence: str) -> str:
    """``sentence`` in its lead-in (a transcript's message label is no prose, and a point of an
    earlier summary keeps its own lead-in rather than a second one: left out)."""
    bare = _LABEL.sub("", sentence)
    while bare.startswith(_LEAD_INS):
        bare = bare[next(len(lead) for lead in _LEAD_INS if bare.startswith(lead)) :]
    return LEADS[zlib.crc32(bare.encode()) % len(LEADS)].format(bare)


def salient_summary(
    prompt: str, *, cap_tokens: int, count_text: Callable[[str], int], prose: bool = False
) -> str:
    """The extractive summary of the material in ``prompt`` (see the module docstring); with
    ``prose``, each kept sentence in a lead-in that costs its share of the cap."""
    shown = _lead if prose else (lambda sentence: sentence)
    candidates: list[str] = []
    for kind, body in _SECTION.findall(prompt):
        if kind in ("previous_summary", "summary"):
            candidates += _sentences(body)
            continue
        for message in _MESSAGE_START.split(body):
            sentences = [s for s in _sentences(message) if _template(s).strip()]
            repeats = Counter(_template(s) for s in sentences)
            candidates += [
                s for s in sentences if repeats[_template(s)] < BOILERPLATE_REPEATS and not _filler(s)
            ]
    unique = list(dict.fromkeys(candidates))
    counts = Counter(w.lower() for s in unique for w in _WORD.findall(s))

    def rank(i: int) -> tuple[bool, int, float, int]:
        words = [w.lower() for w in _WORD.findall(unique[i])]
        only_here = sum(1 for w in words if counts[w] == 1)
        rarity = sum(1 / counts[w] for w in words) / len(words) if words else 0.0
        return (_is_action(unique[i]), -only_here, -rarity, i)

    ranked = sorted(range(len(unique)), key=rank)
    kept: list[int] = []
    used = 0
    for i in ranked:
        cost = count_text(shown(unique[i])) + 1
        if used + cost <= cap_tokens:
            kept.append(i)
            used += cost
    # The cap is on the answer as written (sentences joined may count differently).
    while kept and count_text("\n".join(shown(unique[i]) for i in sorted(kept))) > cap_tokens:
        kept.pop()
    return "\n".join(shown(unique[i]) for i in sorted(kept))


@cache
def real_answers() -> tuple[str, ...]:
    """The bad summaries a small local model really wrote (``FIXTURES``)."""
    data = json.loads((FIXTURES / "gemma3-270m.json").read_text(encoding="utf-8"))
    return tuple(str(entry["answer"]) for entry in data["answers"])


def _capped(text: str, cap_tokens: int, count_text: Callable[[str], int]) -> str:
    """``text`` cut to at most ``cap_tokens`` (as a model stops at its output cap)."""
    if count_text(text) <= cap_tokens:
        return text
    low, high = 0, len(text)
    while low < high:
        mid = (low + high + 1) // 2
        if count_text(text[:mid]) <= cap_tokens:
            low = mid
        else:
            high = mid - 1
    return text[:low]


def bad_summary(
    style: str, system: str, prompt: str, *, cap_tokens: int, count_text: Callable[[str], int]
) -> str:
    """The answer of one of the bad ``STYLES`` (see the module docstring)."""
    material = "\n".join(body for _, body in _SECTION.findall(prompt))
    if style == "echo":
        return _capped(system, cap_tokens, count_text)
    if style == "template":
        first = next((s for s in _sentences(material) if s), "hello")
        turn = (
            f"<start_of_turn>user\n{first}<end_of_turn>\n"
            "<start_of_turn>model\nSure, I can help with that.<end_of_turn>\n"
        )
        return _capped(turn * 8, cap_tokens, count_text)
    if style == "repeat":
        return _capped("[user]: Turn\n" * (4 * cap_tokens), cap_tokens, count_text)
    if style == "requote":
        return _capped(material, cap_tokens, count_text)
    if style == "invent":
        code = f"ZQX-{zlib.crc32(prompt.encode()) % 9000 + 1000}"
        made_up = f"The access code to remember is {code}."
        rest = salient_summary(
            prompt, cap_tokens=max(0, cap_tokens - count_text(made_up) - 1), count_text=count_text, prose=True
        )
        return f"{rest}\n{made_up}".strip()
    if style == "real":
        answers = real_answers()
        return _capped(answers[zlib.crc32(prompt.encode()) % len(answers)], cap_tokens, count_text)
    return ""


def summary_answer(
    system: object,
    user_text: str,
    *,
    cap_tokens: object,
    count_text: Callable[[str], int],
    style: str = "prose",
) -> str | None:
    """The summary a fake upstream answers in ``style``, or None when the request is not a
    summary request."""
    if not is_summary_prompt(system):
        return None
    cap = cap_tokens if isinstance(cap_tokens, int) and cap_tokens > 0 else 1024
    if style in ("prose", "extractive"):
        return salient_summary(user_text, cap_tokens=cap, count_text=count_text, prose=style == "prose")
    return bad_summary(style, prompt_text(system), user_text, cap_tokens=cap, count_text=count_text)


def prompt_text(content: Any) -> str:
    """A message's text (a string, or its text blocks/parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping) and "text" in part
        )
    return ""
