"""The recall tool in one wire API's shape: the seam between ``app.core.recall`` and an API.

INTERFACE CONTRACT (each dialect that supports recall has one, ``Dialect.recall``; the fit pipeline
offers the tool through it, ``app.service.recall`` executes the calls through it):

* ``RecallShape`` (a protocol; implementations are stateless, frozen, pure):

  - ``offered(body) -> bool``: the body allows the tool: no forced tool choice (``required``, a
    named tool, ``none``), one answer asked for, no tool of the client named ``ctx_recall``, no
    prefilled answer; the answer's shapes the proxy can edit (what an API's ``n``/candidate
    count or output settings would change);
  - ``with_tool(body) -> dict``: ``body`` with the tool appended after the client's own tools,
    the same bytes on every request (``recall.TOOL_DESCRIPTION``, ``recall.TOOL_PARAMETERS``);
    a body that has it already is returned as it is;
  - ``calls(answer) -> AnswerCalls``: the recall calls of a whole (non-streamed) answer, and how
    many calls of the client's own tools it holds;
  - ``continuation(body, answer, results) -> dict``: ``body`` (the client's request, as planned)
    with the answer's turn appended as the API requires it back (signed thinking, encrypted
    reasoning and thought signatures exactly as the answer had them) and one result per
    recall call (``results``: ``(call id, text)``), so the model can go on;
  - ``client_answer(answers) -> dict``: what the client receives for the rounds' whole answers:
    the last one's envelope (id, usage, stop reason) with the content of every round in order,
    every recall call removed (a signature it carried moved to the next call kept, when the
    API signs calls), and a stop reason that no longer names a tool call when none is left;
  - ``stream() -> RecallStream``: a fresh editor of one client's streamed answer.

* ``RecallStream`` (stateful, one per streamed answer; ``app.core.recall_stream`` has the shared
  framing): ``feed(data) -> bytes`` the bytes of the upstream's stream as they come, returns what
  the client gets now (a recall call's own events held back, the answer's closing events held
  back while a recall call was seen, indices renumbered after a removed call and across rounds);
  ``answer() -> dict``: at the end of a round, that round's whole answer as the API's
  non-streamed JSON (for ``calls`` and ``continuation``); ``next_round()``: the next upstream
  stream continues this answer (its opening events are not sent again); ``release() -> bytes``:
  the end of the answer: what was held back, recall calls removed; ``unfinished() -> bytes``:
  what the upstream sent after its last whole event (passed on as it came).
* ``RecallCall`` (frozen): ``call_id`` (the API's id of the call), ``ref`` (the id asked for, or
  None), ``page``; ``AnswerCalls`` (frozen): ``ours`` and ``theirs`` (the client's own calls).
* ``function_tool()``: the tool's name, description and parameters as a function declaration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .recall import RECALL_TOOL, TOOL_DESCRIPTION, TOOL_PARAMETERS


@dataclass(frozen=True, slots=True)
class RecallCall:
    """One ``ctx_recall`` call of an answer."""

    call_id: str
    ref: str | None
    page: int = 1


@dataclass(frozen=True, slots=True)
class AnswerCalls:
    """The recall calls of an answer and the number of the client's own calls beside them."""

    ours: tuple[RecallCall, ...] = ()
    theirs: int = 0

    @property
    def only_ours(self) -> bool:
        """The answer calls ``ctx_recall`` and nothing of the client's: the proxy goes on."""
        return bool(self.ours) and self.theirs == 0


class RecallStream(Protocol):
    """One streamed answer's editor (see the module docstring)."""

    def feed(self, data: bytes, /) -> bytes: ...

    def answer(self) -> dict[str, Any]: ...

    def next_round(self) -> None: ...

    def release(self) -> bytes: ...

    def unfinished(self) -> bytes: ...


class RecallShape(Protocol):
    """The recall tool in one wire API (see the module docstring)."""

    def offered(self, body: Mapping[str, Any], /) -> bool: ...

    def with_tool(self, body: Mapping[str, Any], /) -> dict[str, Any]: ...

    def calls(self, answer: Mapping[str, Any], /) -> AnswerCalls: ...

    def continuation(
        self, body: Mapping[str, Any], answer: Mapping[str, Any], results: Sequence[tuple[str, str]], /
    ) -> dict[str, Any]: ...

    def client_answer(self, answers: Sequence[Mapping[str, Any]], /) -> dict[str, Any]: ...

    def stream(self) -> RecallStream: ...


def function_tool() -> dict[str, Any]:
    """The tool as a function declaration (``name``, ``description``, ``parameters``)."""
    return {"name": RECALL_TOOL, "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS}
