"""Recall on the request path: the store of what cuts removed, and the rounds that answer ``ctx_recall``.

INTERFACE CONTRACT (``Service`` drives it; ``app.core.recall`` has the pure rules, each API's
``Dialect.recall`` its shapes):

* ``Recall(*, settings, store=None, events=None)``: one per app. ``store`` defaults to the cache
  backend (``cache_from_url(settings.cache_url, ...)`` under the prefix ``ctxproxy:recall:``:
  Redis when configured, so any replica answers; else in process, at most
  ``CTXPROXY_RECALL_MAX_MB`` of memory), every entry for ``CTXPROXY_RECALL_TTL_S``.
* ``remember(request, plan)``: what ``plan`` removed and names by a recall id (``Plan.recall``)
  is stored under the request's tenant (``ProxyRequest.tenant``: a hash of its credential), its
  conversation (a hash of its opening messages: ``conversation_key``) and the id; an entry this
  process wrote less than half a TTL ago is not written again. Redis writes run in the
  background (``await flush()`` waits for them); nothing here fails a request.
* ``await settle(rounds, request, outcome) -> Outcome``: when the answered plan offered the tool
  (``Plan.recall_tool``) and the upstream answered 200. A whole answer is read; while it calls
  ``ctx_recall`` and nothing of the client's (at most ``MAX_ROUNDS`` times), the calls are
  answered (``next_round``) and the request continued with them (``rounds.continued``: a new
  request value of the continued body, planned and sent like any other by ``rounds.run``); the
  client gets ``Dialect.recall.client_answer`` of every round (its ``recalls``: the rounds). A
  streamed answer is wrapped (``app.service.recall_stream.RecallStreamResponse``) and does the
  same as the client reads it. A round that fails (an error status, an exception) ends the
  rounds: the client gets what the rounds before it answered, the recall calls removed.
* ``await next_round(rounds, request, answer, calls, known) -> (request, outcome, RoundFigures) |
  None``: one round, answered and sent (None when it failed: the rounds end). Each id is looked
  up in ``known`` (what this request's plans removed) and then in the store (this tenant's, this
  conversation's); ``answered(rounds, request, answer, calls, texts)`` is the continued
  request: each page is cut to fit
  (``app.core.recall.recall_answer``): the pages of one round take at most ``RECALL_SHARE`` of
  the input budget, fitted like anything else (the continuation is planned: older history may
  be cut further for them, never the pages), less while that plan does not fit, down to the room
  the continuation with empty results leaves (which always fits).
* ``stats() -> dict`` (per API: calls, bytes, rounds, misses, failures), ``await aclose()``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from ..compaction.cache import SummaryCache, cache_from_url
from ..core.conversation import strip_reserved
from ..core.errors import CtxproxyError
from ..core.messages import Message
from ..core.plan import Plan
from ..core.recall import page_chars_for, recall_answer
from ..core.recall_shape import AnswerCalls, RecallShape
from ..core.recall_stream import NEEDLE
from ..settings import Settings
from ..upstream.client import UpstreamResponse, WrappedResponse
from ..upstream.errors import UpstreamError
from ..upstream.headers import Header
from ..wire import dump_json
from .fastpath import run_plan
from .outcome import Outcome
from .recall_stream import MAX_ROUNDS, RecallStreamResponse, RoundFigures, Rounds
from .request import ProxyRequest, load_json

logger = logging.getLogger("ctxproxy.recall")

PREFIX = "ctxproxy:recall:"
# The most of the input budget the pages of one round may take (older history is cut for them).
RECALL_SHARE = 0.25
# What a recall answer's heading and the result's framing cost, per call, in tokens (kept free).
HEADING_TOKENS = 64
_WRITTEN_MAX = 65_536
COUNTERS = ("calls", "bytes", "rounds", "misses", "failures")


class RecallEvents(Protocol):
    """Where recall reports, per wire API (``app.observability.Observability``)."""

    def record_recall(self, *, api: str, calls: int, bytes_: int, rounds: int, misses: int) -> None: ...


def conversation_key(messages: Sequence[Message]) -> str:
    """A hash of a conversation's opening (its first two neutral messages, which a cut never
    removes: the system prompt and the first task), the same on every request of it."""
    opening = [strip_reserved(m) for m in messages[:2]]
    text = json.dumps(opening, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def store_key(tenant: str, conversation: str, ref: str) -> str:
    return hashlib.sha256(f"{tenant}\x00{conversation}\x00{ref}".encode()).hexdigest()


class ReplacedBody(WrappedResponse):
    """``inner``'s status and headers with another body (the client's answer after the rounds):
    no ``Content-Encoding`` (the body is made here), its own length."""

    def __init__(self, inner: UpstreamResponse, body: bytes) -> None:
        super().__init__(inner)
        self._replaced = body
        self._raw = [
            (name, value)
            for name, value in inner.raw_headers
            if name.lower() not in (b"content-encoding", b"content-length")
        ]

    @property
    def raw_headers(self) -> Sequence[tuple[bytes, bytes]]:
        return self._raw

    @property
    def headers(self) -> list[Header]:
        return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._raw]

    @property
    def body(self) -> bytes:
        return self._replaced

    async def aread(self) -> bytes:
        return self._replaced

    def decoded_body(self) -> bytes:
        return self._replaced

    async def aiter_raw(self) -> Any:
        yield self._replaced


async def read_or_close(response: UpstreamResponse) -> None:
    """Read ``response`` whole; closed if that is cancelled or fails (nobody else would)."""
    try:
        await response.aread()
    except BaseException:
        await response.aclose()
        raise


def answer_json(response: UpstreamResponse) -> dict[str, Any] | None:
    """A read answer's JSON object, or None."""
    try:
        value = load_json(response.decoded_body())
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class Recall:
    """The app's recall store and rounds (see the module docstring)."""

    def __init__(
        self, *, settings: Settings, store: SummaryCache | None = None, events: RecallEvents | None = None
    ) -> None:
        self.settings = settings
        self.events = events
        self.ttl_s = settings.recall_ttl_s
        self.store: SummaryCache = (
            store
            if store is not None
            else cache_from_url(
                settings.cache_url,
                ttl_s=settings.recall_ttl_s,
                max_entries=1_000_000,
                prefix=PREFIX,
                max_bytes=settings.recall_max_mb * 1024 * 1024,
            )
        )
        self._written: OrderedDict[str, float] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._counts: dict[str, dict[str, int]] = {}

    # -- the store ---------------------------------------------------------------------------

    def _keys(self, request: ProxyRequest) -> tuple[str, str]:
        return request.tenant, conversation_key(request.conversation.messages)

    def remember(self, request: ProxyRequest, plan: Plan) -> None:
        """Store what ``plan`` removed (see the module docstring). Never raises."""
        if not plan.recall:
            return
        try:
            tenant, conversation = self._keys(request)
            now = time.monotonic()
            fresh = {}
            for entry in plan.recall:
                key = store_key(tenant, conversation, entry.ref)
                written = self._written.get(key)
                if written is not None and now - written < self.ttl_s / 2:
                    continue
                self._written[key] = now
                self._written.move_to_end(key)
                fresh[key] = entry.text
            while len(self._written) > _WRITTEN_MAX:
                self._written.popitem(last=False)
            if fresh:
                task = asyncio.get_running_loop().create_task(self._write(fresh))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception:  # the store must never fail a request
            logger.warning("recall: storing what a cut removed failed", exc_info=True)

    async def flush(self) -> None:
        """Wait for the writes under way."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _write(self, entries: Mapping[str, str]) -> None:
        for key, text in entries.items():
            await self.store.set(key, text)  # for the store's own TTL (CTXPROXY_RECALL_TTL_S)

    async def lookup(self, request: ProxyRequest, ref: str) -> str | None:
        """What ``ref`` stands for in this tenant's conversation, from the store."""
        tenant, conversation = self._keys(request)
        return await self.store.get(store_key(tenant, conversation, ref))

    # -- the rounds --------------------------------------------------------------------------

    async def settle(self, rounds: Rounds, request: ProxyRequest, outcome: Outcome) -> Outcome:
        """The outcome the client gets (see the module docstring)."""
        plan = outcome.plan
        shape = request.dialect.recall
        if not plan.recall_tool or shape is None or outcome.response.status_code != 200:
            return outcome
        if outcome.stream:
            streamed = RecallStreamResponse(self, rounds, request, outcome, shape)
            return replace(outcome, response=streamed)
        return await self._whole(rounds, request, outcome, shape)

    async def _whole(
        self, rounds: Rounds, request: ProxyRequest, outcome: Outcome, shape: RecallShape
    ) -> Outcome:
        known = {entry.ref: entry.text for entry in outcome.plan.recall}
        current, response = request, outcome.response
        answers: list[dict[str, Any]] = []
        done = 0
        figures = RoundFigures()
        await read_or_close(response)
        if NEEDLE not in response.decoded_body():
            return replace(outcome, recalls=0)  # not called: the answer goes as it came
        try:
            while (answer := answer_json(response)) is not None:
                answers.append(answer)
                calls = shape.calls(answer)
                if not calls.only_ours or done >= MAX_ROUNDS:
                    break
                following = await self.next_round(rounds, current, answer, calls, known)
                if following is None:
                    break
                current, nxt, answered = following
                figures = figures.plus(answered)
                response = nxt.response
                await read_or_close(response)
                done += 1
        except Exception:  # never fail a request because of recall: what the rounds had goes
            logger.warning(
                "recall: a round failed; the client gets what the rounds before it answered", exc_info=True
            )
            self.failed(request.dialect.name)
        finally:
            self.record(request.dialect.name, figures, done)
        if not answers:
            return replace(outcome, recalls=0)
        merged = dump_json(shape.client_answer(answers))
        return replace(outcome, response=ReplacedBody(response, merged), recalls=done)

    async def next_round(
        self,
        rounds: Rounds,
        request: ProxyRequest,
        answer: Mapping[str, Any],
        calls: AnswerCalls,
        known: dict[str, str],
    ) -> tuple[ProxyRequest, Outcome, RoundFigures] | None:
        """The next round: ``request`` continued with ``answer`` and its calls' results
        (``answered``), sent; what it removed remembered and added to ``known``. None when it
        failed (an error status, a refusal, an upstream failure: counted, logged)."""
        api = request.dialect.name
        texts: list[str | None] = []
        for call in calls.ours:
            text = known.get(call.ref) if call.ref else None
            if text is None and call.ref:
                text = await self.lookup(request, call.ref)
            texts.append(text)
        try:
            following, figures = await self.answered(rounds, request, answer, calls, texts)
            outcome = await rounds.run(following)
        except (CtxproxyError, UpstreamError):
            logger.warning("recall: a round failed; the answer ends with what it had", exc_info=True)
            self.failed(api)
            return None
        if outcome.response.status_code != 200:
            await outcome.response.aclose()
            self.failed(api)
            return None
        self.remember(following, outcome.plan)
        known.update({entry.ref: entry.text for entry in outcome.plan.recall})
        return following, outcome, figures

    async def answered(
        self,
        rounds: Rounds,
        request: ProxyRequest,
        answer: Mapping[str, Any],
        calls: AnswerCalls,
        texts: Sequence[str | None],
    ) -> tuple[ProxyRequest, RoundFigures]:
        """The request that continues ``request`` with ``answer`` and the calls' results, the
        ``texts`` their ids stand for (None: unknown), paged to fit (see the module docstring)."""
        shape = request.dialect.recall
        assert shape is not None
        empty = rounds.continued(
            request, shape.continuation(request.body, answer, [(call.call_id, "") for call in calls.ours])
        )
        plan = await run_plan(empty.plan, size_bytes=len(empty.raw))
        budget = plan.budget
        room = budget.input_budget_tokens + budget.tool_tokens - plan.tokens_after if plan.fits else 0
        # The recalled pages may take more than the room the cut left: the continuation is planned
        # like any request, so what is older may be cut further to make room (the pages never are),
        # up to RECALL_SHARE of the budget; less while that does not fit, down to the room left.
        wanted = max(room, int(RECALL_SHARE * budget.input_budget_tokens))
        page_chars = page_chars_for(budget.input_budget_tokens, RECALL_SHARE / max(1, len(calls.ours)))
        count = request.counter.counter.count_text
        while True:
            share = max(0, wanted // max(1, len(calls.ours)) - HEADING_TOKENS)
            results = []
            recalled = misses = 0
            for call, text in zip(calls.ours, texts, strict=True):
                result, miss = _fitted_answer(call.ref, text, call.page, share, count, page_chars)
                results.append((call.call_id, result))
                misses += miss
                recalled += 0 if miss else len(result.encode("utf-8", "surrogatepass"))
            following = rounds.continued(request, shape.continuation(request.body, answer, results))
            figures = RoundFigures(calls=len(calls.ours), bytes_=recalled, misses=misses)
            if wanted <= room:
                return following, figures
            planned = await run_plan(following.plan, size_bytes=len(following.raw))
            if planned.fits:
                return following, figures
            wanted = max(room, wanted // 2)

    # -- figures ----------------------------------------------------------------------------

    def _count(self, api: str, name: str, value: int = 1) -> None:
        counts = self._counts.setdefault(api, dict.fromkeys(COUNTERS, 0))
        counts[name] += value

    def failed(self, api: str) -> None:
        """A round of a request of ``api`` failed (the rounds ended there)."""
        self._count(api, "failures")

    def record(self, api: str, figures: RoundFigures, rounds: int) -> None:
        """One request's rounds, into the counters and the app's events. Never raises."""
        self._count(api, "calls", figures.calls)
        self._count(api, "bytes", figures.bytes_)
        self._count(api, "rounds", rounds)
        self._count(api, "misses", figures.misses)
        if self.events is not None and (figures.calls or rounds):
            try:
                self.events.record_recall(
                    api=api, calls=figures.calls, bytes_=figures.bytes_, rounds=rounds, misses=figures.misses
                )
            except Exception:  # reporting must never fail a request
                logger.debug("reporting recall failed", exc_info=True)

    def stats(self) -> dict[str, Any]:
        """Counters per wire API and their totals; the store's counters."""
        totals = {name: sum(c[name] for c in self._counts.values()) for name in COUNTERS}
        return {
            **totals,
            "by_api": {api: dict(c) for api, c in self._counts.items()},
            "store": self.store.stats().as_dict(),
        }

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.store.aclose()


def _fitted_answer(
    ref: str | None, text: str | None, page: int, share_tokens: int, count: Any, page_chars: int
) -> tuple[str, bool]:
    """``recall_answer`` with its page cut until it takes at most ``share_tokens`` tokens."""
    max_chars = page_chars
    result, miss = recall_answer(ref, text, page, max_chars=max_chars, page_chars=page_chars)
    for _ in range(6):
        if miss:
            return result, miss
        tokens = count(result)
        if tokens <= share_tokens:
            return result, miss
        max_chars = int(max_chars * share_tokens / tokens * 0.95)
        result, miss = recall_answer(ref, text, page, max_chars=max_chars, page_chars=page_chars)
    return recall_answer(ref, text, page, max_chars=0, page_chars=page_chars)
