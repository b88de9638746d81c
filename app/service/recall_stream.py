"""A streamed answer whose ``ctx_recall`` calls the proxy answers as the client reads it.

``RecallStreamResponse(recall, rounds, request, outcome, shape)`` wraps the first upstream answer
(``recall``: what answers the calls, ``app.service.recall.Recall``; ``rounds``: the service):
``aiter_raw`` passes its bytes through the API's editor (``Dialect.recall.stream()``: text goes to
the client as it comes, a recall call's own events and, while one was seen, the answer's closing
events are held back). At the end of an upstream answer that called ``ctx_recall`` and nothing of
the client's, the next round is answered and sent (``Recall.next_round``) and its stream
continues the same answer through the same editor, at most
``MAX_ROUNDS`` times; otherwise the held-back events go out (the recall calls removed) and the
stream ends. A round that fails (an error status, an exception) ends the stream the same way.
The response closes whichever upstream answer is open (``aclose``). What the rounds took is
recorded once the stream ends (``Recall.record``) and in the request's access fields
(``recalls``), through ``on_end``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.recall_shape import AnswerCalls, RecallShape
from ..upstream.client import WrappedResponse
from .outcome import Outcome
from .request import ProxyRequest

MAX_ROUNDS = 3


class Rounds(Protocol):
    """What the rounds need of the service (``Service`` is one)."""

    def continued(self, request: ProxyRequest, body: Mapping[str, Any]) -> ProxyRequest: ...

    async def run(self, request: ProxyRequest) -> Outcome: ...


@dataclass(frozen=True, slots=True)
class RoundFigures:
    """What answering one round's calls took: calls answered, bytes recalled (UTF-8), misses."""

    calls: int = 0
    bytes_: int = 0
    misses: int = 0

    def plus(self, other: RoundFigures) -> RoundFigures:
        return RoundFigures(self.calls + other.calls, self.bytes_ + other.bytes_, self.misses + other.misses)


class Answerer(Protocol):
    """What runs the rounds and keeps the figures (``app.service.recall.Recall``)."""

    async def next_round(
        self,
        rounds: Rounds,
        request: ProxyRequest,
        answer: Mapping[str, Any],
        calls: AnswerCalls,
        known: dict[str, str],
    ) -> tuple[ProxyRequest, Outcome, RoundFigures] | None: ...

    def record(self, api: str, figures: RoundFigures, rounds: int) -> None: ...


class RecallStreamResponse(WrappedResponse):
    """The first upstream answer, continued while it calls only ``ctx_recall`` (module docstring)."""

    def __init__(
        self, recall: Answerer, rounds: Rounds, request: ProxyRequest, outcome: Outcome, shape: RecallShape
    ) -> None:
        super().__init__(outcome.response)
        self._recall = recall
        self._rounds = rounds
        self._request = request
        self._shape = shape
        self._current = outcome.response
        self._known = {entry.ref: entry.text for entry in outcome.plan.recall}
        self.rounds = 0
        self.on_end: Callable[[int], None] | None = None

    async def aread(self) -> bytes:
        return b"".join([chunk async for chunk in self.aiter_raw()])

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        editor = self._shape.stream()
        request = self._request
        figures = RoundFigures()
        api = request.dialect.name
        try:
            while True:
                async for chunk in self._current.aiter_raw():
                    out = editor.feed(chunk)
                    if out:
                        yield out
                answer = editor.answer()
                calls = self._shape.calls(answer)
                if not calls.only_ours or self.rounds >= MAX_ROUNDS:
                    break
                following = await self._recall.next_round(self._rounds, request, answer, calls, self._known)
                if following is None:
                    break
                request, outcome, answered = following
                figures = figures.plus(answered)
                done, self._current = self._current, outcome.response  # closed by aclose from now on
                await done.aclose()
                editor.next_round()
                self.rounds += 1
            tail = editor.release() + editor.unfinished()
            if tail:
                yield tail
        finally:
            self._recall.record(api, figures, self.rounds)
            if self.on_end is not None:
                self.on_end(self.rounds)

    @property
    def closed(self) -> bool:
        return self._current.closed

    async def aclose(self) -> None:
        await self._current.aclose()
