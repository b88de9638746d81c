"""A scripted model that needs one fact and fetches it back with ``ctx_recall``, for every strict fake.

``Recaller(wanted)`` decides one turn from what the model is sent, as a model would, knowing
nothing of what a test planted: when a ``FACT-<wanted>...`` token is in its input it answers with
it (``Answer``); else, when the ``ctx_recall`` tool is offered and its input names recall ids it has
not fetched yet, it calls the tool for the first of them (``Recall``), or for the next page of the
one it fetched last when that answer says a next page exists; else it answers that it cannot find
the fact. It never restates what it read in its own messages. The fakes turn its decision into
their API's answer (a function call, a ``tool_use`` block, a ``functionCall`` part).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

RECALL_TOOL = "ctx_recall"
_ID = re.compile(r"recall id ([0-9a-f]{12})")
_NEXT = re.compile(r"\[ctxproxy: recalled recall id ([0-9a-f]{12}), page ([0-9]+) of ([0-9]+)")


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class Recall:
    ref: str
    page: int = 1


class Recaller:
    """See the module docstring. ``text_before_call``: text the model says before a call;
    ``also_call``: a tool of the client it calls beside ``ctx_recall`` (a mixed answer)."""

    def __init__(self, wanted: str, *, text_before_call: str = "", also_call: str | None = None) -> None:
        self.pattern = re.compile(rf"FACT-{re.escape(wanted)}[\w-]*")
        self.text_before_call = text_before_call
        self.also_call = also_call

    def decide(
        self, prompt: str, *, offered: bool, fetched: Sequence[tuple[str, int]] = ()
    ) -> Answer | Recall:
        """``prompt``: every text the model reads; ``fetched``: the (id, page) it asked for already
        in this conversation, in order."""
        found = self.pattern.search(prompt)
        if found is not None:
            return Answer(f"The fact is {found.group(0)}.")
        if offered:
            pages = {(m.group(1), int(m.group(2)), int(m.group(3))) for m in _NEXT.finditer(prompt)}
            for ref, page, total in sorted(pages):
                if (ref, page + 1) not in fetched and page < total and (ref, page) in fetched:
                    return Recall(ref, page + 1)
            asked = {ref for ref, _ in fetched}
            for ref in dict.fromkeys(_ID.findall(prompt)):
                if ref not in asked:
                    return Recall(ref)
        return Answer("I cannot find the fact.")


def next_recall(prompt: str, *, offered: bool, fetched: Sequence[str], limit: int) -> str | None:
    """For an agent that has done its work and fetches back up to ``limit`` removed contents
    before it answers: the first recall id of ``prompt`` it has not fetched, or None."""
    if not offered or len(fetched) >= limit:
        return None
    return next((ref for ref in dict.fromkeys(_ID.findall(prompt)) if ref not in fetched), None)
