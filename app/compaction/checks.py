"""Is a model's answer a summary? The checks every summary passes before it is trusted (issue 28).

INTERFACE CONTRACT (``summarizer.py`` checks every answer of a summary call; a failed one is not
cached and not used, and counted by its ``cause``):

* ``check_summary(answer, *, request, cap_tokens, count_text) -> Rejection | None``: None when
  ``answer`` (one summary call's reply, already held to its size by ``prompts.truncate_sections``)
  may stand for what ``request`` (the call's messages, built by ``prompts``) gave it to summarize;
  else why not. Pure: the same answer and request always get the same verdict.
* ``Rejection`` (frozen): ``cause``, one of ``CAUSES`` (a bounded label: metrics count by it),
  and ``detail`` (a few words for the log, quoting at most a little of the answer).
* ``material(request) -> tuple[str, str]``: what a summary request gave to summarize (its
  ``<conversation>``, ``<conversation_part>``, ``<previous_summary>`` and ``<summary>`` sections)
  and the rest of its text (the instructions).

The causes, in the order they are checked (what small local models were seen to answer, kept as
fixtures in ``tests/fixtures/summaries/``):

* ``empty``: fewer than ``MIN_WORDS`` words (an "ok" is no summary);
* ``template``: a chat template's or tokenizer's control token (``<|im_start|>``,
  ``<start_of_turn>``, ``<end_of_turn>``, ``<|eot_id|>``, ``[INST]``, ``</s>``...): the model
  wrote a conversation instead of a summary;
* ``echo``: the prompt given back: its framing tags, the transcript's message labels
  (``[user]: ...``) on two lines or more (the span re-quoted), or at least ``ECHO_SHARE`` of the
  answer's word 6-grams found in the instructions;
* ``repetition``: a line said ``REPEATED_LINES`` times or more making a third of the lines, a word
  said ``REPEATED_WORDS`` times in a row, or fewer than ``DISTINCT_SHARE`` of a long answer's word
  4-grams distinct;
* ``invented``: an identifier with a digit (``app.core.span_index.identifiers``) or a number of
  three digits or more that the request's text holds nowhere: a model that makes up a code is
  worse than no summary;
* ``unrelated``: under ``OVERLAP_SHARE`` of the answer's content words (four letters or more, not
  common words, not the instructions') found in the material;
* ``overrun``: more than ``cap_tokens`` (what was asked) even after the sections were cut.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.span_index import identifiers
from .prompts import render_content

CAUSES: tuple[str, ...] = ("empty", "template", "echo", "repetition", "invented", "unrelated", "overrun")
MIN_WORDS = 2
ECHO_SHARE = 0.25
REPEATED_LINES = 3
REPEATED_WORDS = 6
DISTINCT_SHARE = 0.5
OVERLAP_SHARE = 0.3
_LONG_WORDS = 24  # an answer this long may be judged by its distinct 4-grams
_FEW_CONTENT_WORDS = 6  # fewer content words than this: too little to judge the overlap

_SECTION = re.compile(
    r"<(previous_summary|conversation|conversation_part|summary)(?: [^>]*)?>\n(.*?)\n</\1>", re.DOTALL
)
_CONTROL = re.compile(
    r"<\|[A-Za-z0-9_]+\|>|<(?:start|end)_of_turn>|</?s>|\[/?INST\]|<<?/?SYS>>?|<(?:bos|eos|pad|unk)>"
    r"|<\|?(?:im_start|im_end|endoftext)\|?>"
)
_FRAMING = re.compile(r"</?(?:conversation|conversation_part|previous_summary|summary)\b[^>]*>")
_LABEL = re.compile(
    r"^\s*\[(?:user|assistant|system|developer|tool|tool result[^\]\n]*)(?: \([^)\n]*\))?\]:", re.MULTILINE
)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_'-]*")
_NUMBER = re.compile(r"(?<![\w.])\d{3,}(?![\w])")
# Words any summary uses, whatever it summarizes: not evidence of what it read.
_COMMON = frozenset(
    """about above after again against also because been before being below between both cannot could
    does doing down during each from further have having here into itself just more most must only
    other over same should some such than that their them then there these they this those through
    under until very were what when where which while will with would your yours user users
    assistant assistants summary summarized conversation earlier message messages asked said says
    told wants wanted want need needs needed make made using used uses first last next still like
    well""".split()  # noqa: SIM905 (a paragraph of words reads better than a list)
)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why an answer is not a summary: ``cause`` (one of ``CAUSES``) and a few words of detail."""

    cause: str
    detail: str

    def __str__(self) -> str:
        return f"{self.cause}: {self.detail}"


def material(request: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """``(material, instructions)`` of a summary request (see the module docstring)."""
    found: list[str] = []
    rest: list[str] = []
    for message in request:
        text = render_content(message.get("content"))
        found += [body for _, body in _SECTION.findall(text)]
        rest.append(_SECTION.sub(" ", text))
    return "\n".join(found), "\n".join(rest)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _grams(words: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


def _quote(text: str) -> str:
    text = " ".join(text.split())
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def _repetition(answer: str, words: Sequence[str]) -> str | None:
    lines = [" ".join(line.split()).lower() for line in answer.splitlines() if line.strip()]
    if lines:
        line, count = Counter(lines).most_common(1)[0]
        if count >= REPEATED_LINES and count * 3 >= len(lines):
            return f"the line {_quote(line)} {count} times"
    run = 1
    for a, b in itertools.pairwise(words):
        run = run + 1 if a == b else 1
        if run >= REPEATED_WORDS:
            return f"{_quote(a)} {run} times in a row"
    if len(words) >= _LONG_WORDS:
        grams = _grams(words, 4)
        distinct = len(set(grams)) / len(grams)
        if distinct < DISTINCT_SHARE:
            return f"only {distinct:.0%} of its 4-word runs distinct"
    return None


def _invented(answer: str, source: str) -> str | None:
    made_up = [t for t in identifiers(answer) if any(c.isdigit() for c in t) and t not in source]
    made_up += [n for n in _NUMBER.findall(answer) if n not in source]
    if made_up:
        return f"{', '.join(dict.fromkeys(made_up[:3]))} found nowhere in what it read"
    return None


def check_summary(
    answer: str,
    *,
    request: Sequence[Mapping[str, Any]],
    cap_tokens: int,
    count_text: Callable[[str], int],
) -> Rejection | None:
    """None when ``answer`` may be trusted as a summary of what ``request`` gave it; else why not."""
    words = _words(answer)
    if len(words) < MIN_WORDS:
        return Rejection("empty", f"{len(words)} words")
    control = _CONTROL.search(answer)
    if control:
        return Rejection("template", f"control token {control.group(0)!r}")
    found, instructions = material(request)
    if _FRAMING.search(answer):
        return Rejection("echo", "the prompt's framing tags given back")
    labels = len(_LABEL.findall(answer))
    if labels >= 2:
        return Rejection("echo", f"{labels} transcript message labels (the messages re-quoted)")
    grams = _grams(words, 6)
    if len(grams) >= 4:
        taught = set(_grams(_words(instructions), 6))
        share = sum(1 for g in grams if g in taught) / len(grams)
        if share >= ECHO_SHARE:
            return Rejection("echo", f"{share:.0%} of it is the instructions")
    repeated = _repetition(answer, words)
    if repeated:
        return Rejection("repetition", repeated)
    invented = _invented(answer, f"{found}\n{instructions}")
    if invented:
        return Rejection("invented", invented)
    taught_words = set(_words(instructions))
    content = [w for w in words if len(w) >= 4 and w.isalpha() and w not in _COMMON and w not in taught_words]
    if len(content) >= _FEW_CONTENT_WORDS:
        source_words = set(_words(found))
        share = sum(1 for w in content if w in source_words) / len(content)
        if share < OVERLAP_SHARE:
            return Rejection("unrelated", f"{share:.0%} of its words are in what it read")
    tokens = count_text(answer)
    if tokens > cap_tokens:
        return Rejection("overrun", f"{tokens} tokens over the {cap_tokens} asked")
    return None


__all__ = ["CAUSES", "Rejection", "check_summary", "material"]
