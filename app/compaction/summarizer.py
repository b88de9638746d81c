"""LLM handoff summaries of what a cut forgot: incremental, cached, chunked, fail-open, backing off.

INTERFACE CONTRACT (the service and ahead-of-time compaction rely on these):

* ``Complete = Callable[[list[dict], str, int], Awaitable[str]]``: the injected upstream call,
  ``(messages, model, max_tokens) -> text``; the service builds it over its upstream client in
  the request's own wire API (``max_tokens``: the job's ``reply_tokens``). It may raise anything:
  the summarizer fails open. A ``SummaryError`` with an HTTP ``status`` tells it what kind of
  failure it was (``SummaryError.permanent``: the endpoint or the credentials cannot work;
  ``SummaryError.refused``: the credential was refused, 401 or 403).
* ``SummaryJob(tenant, credential, window_tokens, reply_tokens, count_text)`` (frozen): whose
  summary it is and how big it may be, given with every call (a summarizer is what it is: an
  API, a model and an upstream; the sizes and the owner are each request's). ``tenant``
  (``app.core.tenant``) keys the summaries, the chains and the back-offs of spans; ``credential``
  (``UpstreamClient.credential_of``) the back-off of a refused key; every request sent fits
  ``window_tokens - reply_tokens`` by ``count_text``. ``problem()``: why no summary can be asked
  in that window (too small for the prompt), else None.
* ``Summarizer(complete, *, model, prompt_version=PROMPT_VERSION, timeout_s, identity="",
  retry_after_s=60.0, retry_max_s=3600.0, on_call=None)``:
  ``pace`` (``app.compaction.pace.Pace``, shared by the summarizers of one model at one upstream):
  the time limit of a summary follows the model's observed latency instead of ``timeout_s``.
  Every answer is held to the job's ``reply_tokens`` by its sections
  (``prompts.truncate_sections``) and checked (``checks.check_summary``): a refused one fails the
  summary (outcome ``rejected``, its cause logged once, not cached, backing off like any failure).

  - ``await memory_for(span, cache, job) -> str | None``: the summary of exactly ``span`` (the
    messages a memory stands for, ``app.core.memory.span_messages``) for ``job.tenant``.
    Incremental: a session's spans grow from the same start, so the longest prefix of ``span``
    already summarized (found through the conversation's *chain*, one cache entry per tenant and
    first message listing the spans summarized from it) is folded with the messages after it:
    one call per cut step, each forgotten message summarized about once. The result is cached
    under ``span_key(span, tenant)`` and joins the chain (``SummaryCache.merge_chain``: atomic).
    A failed span is not asked for again before its back-off ends (``fail:`` entries in the
    cache, ``retry_after_s`` doubling up to ``retry_max_s``, the failures counted by
    ``SummaryCache.incr``; shared by replicas through a shared cache) and its cause is logged
    once. A ``permanent`` failure turns summaries off for the same back-off: for the job's
    credential only when it was refused (401, 403: another client's key may work), for the
    summarizer (``identity``: the API, base URL and model) when the upstream lacks the route
    (404, 405). Everything else (5xx, timeouts, an answer that is no answer) backs off the span;
    ``NO_SUMMARY_STREAK`` answers in a row for one credential that were no summary (empty, refused
    by the checks) turn that credential's summaries off for the next back-off (a summary ends the
    streak).
  - ``await summarize_span(messages, job, *, previous_summary=None) -> str | None``: one handoff
    summary of ``messages`` (folding in ``previous_summary``). A span whose request would not fit
    the job's window is cut into parts that each fit, summarized part by part, and the parts'
    summaries are merged (hierarchically if even they do not fit). Any exception, a timeout
    (``timeout_s`` for the whole call) or an empty answer gives ``None``.
  - ``await longest_summarized(span, cache, tenant) -> (n, summary)``: the longest proper prefix
    of ``span`` its chain has a summary of (``(0, None)`` when none).
  - ``await blocked(key, cache, job) -> str | None``: why the span under ``key`` is not asked
    for now (its back-off, the job's credential's, the summarizer's), else None.
  - ``span_key(span, tenant)``; counters ``calls``,
    ``failures``, ``rejected``, ``tokens_in``, ``tokens_out`` (its own counts of what it sent and got),
    ``last_error``; ``on_call`` (keyword, optional): told ``(outcome, tokens_in, tokens_out)``
    of every call (:data:`CallHook`; never allowed to fail the summary).

* ``prompt_tokens(messages, count_text) -> int``: the input tokens of a summary request.
* ``PrefetchedSummaries(mapping, *, summarizer_model, tenant, prompt_version=PROMPT_VERSION)``:
  the synchronous ``app.core.fit.SummaryProvider`` the engine calls; answers ``summary_for(span)``
  from ``mapping`` (span key of ``tenant`` -> summary) that the service filled beforehand, records the keys it
  was asked for and those it missed; with ``lengths`` (of the mapped spans), a span of another
  length is a miss at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..core.errors import CtxproxyError
from ..core.messages import Message
from .cache import SummaryCache, prefix_keys, summary_key
from .checks import check_summary
from .pace import Pace
from .prompts import (
    PROMPT_VERSION,
    chunk_messages,
    merge_messages,
    render_messages,
    summarize_messages,
    truncate_sections,
)

logger = logging.getLogger("ctxproxy.compaction")

Complete = Callable[[list[dict[str, Any]], str, int], Awaitable[str]]
CountText = Callable[[str], int]
Render = Callable[[list[str]], list[dict[str, Any]]]

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
MAX_MERGE_DEPTH = 4
_PART_PLACEHOLDER = 99999


# HTTP statuses that say the summary endpoint or its credentials cannot work: no span can succeed.
PERMANENT_STATUSES: frozenset[int] = frozenset({401, 403, 404, 405})
# Of those, the ones that refuse the credential: another client's key may work.
REFUSED_STATUSES: frozenset[int] = frozenset({401, 403})
CHAIN_LENGTH = 16
# Spans whose failure was logged (a span backing off is logged once, not per request): the most
# recent ones, least recently logged forgotten first (a forgotten one is logged again, once).
LOGGED_SPANS_MAX = 1024
NO_SUMMARY_STREAK = 3
"""Answers in a row for one credential that were no summary (empty, refused by the checks) after
which that credential's summaries are off for a back-off: a model that cannot summarize (a small
local one) is not asked again and again, each call holding one of its few slots (and, on a
one-slot server, evicting the conversation's prompt cache) for nothing."""


class SummaryError(CtxproxyError):
    """Internal: a summary could not be made (turned into ``None`` at the public boundary).
    ``status``: the summary call's HTTP status, when it got an answer."""

    def __init__(self, message: str, *, status: int | None = None, no_summary: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.no_summary = no_summary  # the model answered, with no summary (empty, refused)

    @property
    def permanent(self) -> bool:
        """The endpoint or the credentials cannot work (no other span would fare better)."""
        return self.status in PERMANENT_STATUSES

    @property
    def refused(self) -> bool:
        """The credential was refused (another client's may work)."""
        return self.status in REFUSED_STATUSES


CallHook = Callable[[str, int, int], None]
"""``(outcome, tokens_in, tokens_out)`` of one summary call: ``ok``, ``timeout``, ``http_<status>``,
``empty``, ``rejected`` (refused by the summary checks) or ``failed``."""


@dataclass(frozen=True, slots=True)
class SummaryJob:
    """Whose summary a call makes and how big it may be (see the module contract)."""

    tenant: str
    credential: str
    window_tokens: int
    reply_tokens: int
    count_text: CountText

    @property
    def input_budget_tokens(self) -> int:
        return self.window_tokens - self.reply_tokens

    def problem(self) -> str | None:
        """Why this window cannot hold a summary request (too small for the prompt), else None."""
        smallest = prompt_tokens(merge_messages(["x", "x"], reply_tokens=self.reply_tokens), self.count_text)
        if self.input_budget_tokens < 2 * smallest:
            return (
                f"a summarizer window of {self.window_tokens} tokens ({self.reply_tokens} reserved "
                f"for the reply) is too small for its own prompt ({smallest} tokens)"
            )
        return None


def prompt_tokens(messages: Sequence[Mapping[str, Any]], count_text: CountText) -> int:
    """Input tokens of a summary request (chat accounting: per message, role, text, priming)."""
    total = REPLY_PRIMING_TOKENS
    for message in messages:
        total += TOKENS_PER_MESSAGE + count_text(str(message.get("role", "")))
        total += count_text(str(message.get("content") or ""))
    return total


def call_outcome(exc: BaseException) -> str:
    """The few-word outcome of a summary call that raised ``exc`` (a bounded label)."""
    if isinstance(exc, (TimeoutError, asyncio.CancelledError)):
        return "timeout"
    status = getattr(exc, "status", None)
    return f"http_{status}" if isinstance(status, int) else "failed"


def _cause(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {str(exc)[:300]}"


class Summarizer:
    """Writes handoff summaries with an injected ``complete`` call (see the module docstring)."""

    def __init__(
        self,
        complete: Complete,
        *,
        model: str,
        prompt_version: str = PROMPT_VERSION,
        timeout_s: float | None,
        identity: str = "",
        retry_after_s: float = 60.0,
        retry_max_s: float = 3600.0,
        on_call: CallHook | None = None,
        pace: Pace | None = None,
    ) -> None:
        self.complete = complete
        self.pace = pace
        self.on_call = on_call
        self.model = model
        self.prompt_version = prompt_version
        self.timeout_s = timeout_s
        self.identity = identity or model
        self.retry_after_s = max(0.001, retry_after_s)
        self.retry_max_s = max(self.retry_after_s, retry_max_s)
        self.calls = 0
        self.failures = 0
        self.rejected = 0  # answers the checks refused (each also a failure of its summary)
        self.tokens_in = 0
        self.tokens_out = 0
        self.last_error = ""
        # Bounded: LOGGED_SPANS_MAX keys, the least recently logged forgotten first.
        self._logged: OrderedDict[str, None] = OrderedDict()

    def span_key(self, span: Sequence[Message], tenant: str) -> str:
        return summary_key(
            span, summarizer_model=self.model, prompt_version=self.prompt_version, tenant=tenant
        )

    def chain_key(self, span: Sequence[Message], tenant: str) -> str:
        """The cache key of the chain of ``span``'s conversation (by its tenant and first message)."""
        return "chain:" + self.span_key(span[:1], tenant)

    # -- failures and back-off -------------------------------------------------------------

    def _off_keys(self, job: SummaryJob) -> tuple[str, str]:
        """The summarizer's back-off (the upstream's fault) and the job credential's (refused)."""
        upstream = f"{self.identity}\n{self.model}"
        return (
            "off:" + hashlib.sha256(upstream.encode()).hexdigest(),
            "off:" + hashlib.sha256(f"{upstream}\n{job.credential}".encode()).hexdigest(),
        )

    async def blocked(self, key: str, cache: SummaryCache, job: SummaryJob) -> str | None:
        """Why ``key`` is not summarized now (its own back-off, the job's credential refused, or
        the summarizer off), or None when it may be."""
        for name in (*self._off_keys(job), "fail:" + key):
            raw = await cache.get(name)
            if raw:
                try:
                    return str(json.loads(raw).get("cause", "failed earlier"))
                except (ValueError, AttributeError):
                    return "failed earlier"
        return None

    async def _failed(
        self, key: str, span: Sequence[Message], exc: BaseException, cache: SummaryCache, job: SummaryJob
    ) -> None:
        """Back off ``key`` (the credential or the whole summarizer after a permanent failure); log
        the cause once per span."""
        self.failures += 1
        cause = _cause(exc)
        self.last_error = cause
        permanent = isinstance(exc, SummaryError) and exc.permanent
        refused = isinstance(exc, SummaryError) and exc.refused
        upstream, credential = self._off_keys(job)
        name = (credential if refused else upstream) if permanent else "fail:" + key
        ttl_s = await self._back_off(cache, name, cause)
        if permanent:
            logger.warning(
                "summaries by %s are off for %.0fs%s: %s (the cut's note and placeholders stand alone)",
                self.identity,
                ttl_s,
                " for the key that was refused" if refused else "",
                cause,
            )
        elif key not in self._logged:
            self._logged[key] = None
            while len(self._logged) > LOGGED_SPANS_MAX:
                self._logged.popitem(last=False)
            logger.warning(
                "no summary of %d cut messages (%s); not asked again for %.0fs, the note stands in",
                len(span),
                cause,
                ttl_s,
            )
        else:
            self._logged.move_to_end(key)
            logger.debug("summary of %s failed again: %s", key[:12], cause)
        if isinstance(exc, SummaryError) and exc.no_summary:
            await self._no_summary(cache, job, cause)

    async def _back_off(self, cache: SummaryCache, name: str, cause: str) -> float:
        """Back off ``name`` (a span's ``fail:`` key or an ``off:`` key) for ``retry_after_s``
        doubled per failure in a row, at most ``retry_max_s``; the seconds it is off."""
        # The failures in a row outlive each back-off (so the next one doubles), not forever;
        # counted atomically, so failures on two replicas at once are two.
        attempts = await cache.incr("tries:" + name, ttl_s=4 * self.retry_max_s)
        ttl_s: float = min(self.retry_max_s, self.retry_after_s * 2 ** (attempts - 1))
        await cache.set(name, json.dumps({"attempts": attempts, "cause": cause}), ttl_s=ttl_s)
        return ttl_s

    def _streak_key(self, job: SummaryJob) -> str:
        """Where the job's credential's answers in a row that were no summary are counted."""
        return "streak:" + self._off_keys(job)[1]

    async def _no_summary(self, cache: SummaryCache, job: SummaryJob, cause: str) -> None:
        """One more answer in a row that was no summary for the job's credential (its streak, reset
        by a summary): at ``NO_SUMMARY_STREAK``, that credential's summaries are off for the next
        back-off (per credential: another client's spans cannot turn them off for this one)."""
        streak_key = self._streak_key(job)
        streak = await cache.incr(streak_key, ttl_s=4 * self.retry_max_s)
        if streak < NO_SUMMARY_STREAK:
            return
        await cache.set(streak_key, "0", ttl_s=4 * self.retry_max_s)
        why = f"{streak} answers in a row were no summary (the last: {cause})"
        ttl_s = await self._back_off(cache, self._off_keys(job)[1], why)
        logger.warning(
            "summaries by %s are off for %.0fs for this key: %s (the memory's index and the note stand in)",
            self.identity,
            ttl_s,
            why,
        )

    # -- summaries -------------------------------------------------------------------------

    async def memory_for(self, span: Sequence[Message], cache: SummaryCache, job: SummaryJob) -> str | None:
        if not span:
            return None
        key = self.span_key(span, job.tenant)
        try:
            cached = await cache.get(key)
            if cached:
                return cached
            if await self.blocked(key, cache, job) is not None:
                return None
            start, previous = await self.longest_summarized(span, cache, job.tenant)
            summary = await self._summarize_logged(span[start:], previous, job)
        except Exception as exc:  # a broken cache: fail open
            self.failures += 1
            self.last_error = _cause(exc)
            logger.warning("summary of %d cut messages failed: %s", len(span), self.last_error)
            return None
        if isinstance(summary, BaseException):
            await self._failed(key, span, summary, cache, job)
            return None
        await cache.set(key, summary)
        streak = self._streak_key(job)
        if await cache.get(streak) not in (None, "0"):  # a summary ends a streak of answers that were none
            await cache.set(streak, "0", ttl_s=4 * self.retry_max_s)
        # One atomic merge: a span another replica added meanwhile stays in the chain.
        await cache.merge_chain(self.chain_key(span, job.tenant), len(span), key, limit=CHAIN_LENGTH)
        return summary

    async def longest_summarized(
        self, span: Sequence[Message], cache: SummaryCache, tenant: str
    ) -> tuple[int, str | None]:
        """``(n, summary)``: the longest proper prefix of ``span`` (``n`` messages) already
        summarized in its chain, or ``(0, None)``."""
        raw = await cache.get(self.chain_key(span, tenant))
        try:
            chain = [(int(n), str(k)) for n, k in json.loads(raw)] if raw else []
        except (ValueError, TypeError):
            chain = []
        lengths = sorted({n for n, _ in chain if 0 < n < len(span)}, reverse=True)
        if not lengths:
            return 0, None
        keys = prefix_keys(
            [[m] for m in span[: lengths[0]]],
            summarizer_model=self.model,
            prompt_version=self.prompt_version,
            tenant=tenant,
        )
        known = dict(chain)
        for n in lengths:
            if known.get(n) == keys[n - 1] and (summary := await cache.get(keys[n - 1])):
                return n, summary
        return 0, None

    async def _summarize_logged(
        self, messages: Sequence[Message], previous: str | None, job: SummaryJob
    ) -> str | BaseException:
        """The summary, or the exception that stopped it (cancellation is never swallowed)."""
        pace = self.pace
        limit_s = pace.limit_s if pace is not None else self.timeout_s
        started = time.monotonic()
        try:
            problem = job.problem()
            if problem is not None:
                raise SummaryError(problem)
            async with asyncio.timeout(limit_s):
                summary = await self._summarize(render_messages(messages), previous, job)
        except TimeoutError as exc:
            if pace is not None:
                pace.timed_out()
            return exc
        except Exception as exc:
            return exc
        if pace is not None:
            pace.observed(time.monotonic() - started)
        return summary

    async def summarize_span(
        self, messages: Sequence[Message], job: SummaryJob, *, previous_summary: str | None = None
    ) -> str | None:
        if not messages:
            return previous_summary
        result = await self._summarize_logged(messages, previous_summary, job)
        if isinstance(result, BaseException):
            self.failures += 1
            self.last_error = _cause(result)
            logger.warning("summary of %d messages failed: %s", len(messages), self.last_error)
            return None
        return result

    async def _call(self, messages: list[dict[str, Any]], job: SummaryJob) -> str:
        tokens = prompt_tokens(messages, job.count_text)
        if tokens > job.input_budget_tokens:
            raise SummaryError(f"summary request of {tokens} tokens over budget {job.input_budget_tokens}")
        self.calls += 1
        self.tokens_in += tokens
        try:
            answer = await self.complete(messages, self.model, job.reply_tokens)
        except BaseException as exc:  # cancelled by the timeout too: reported, then re-raised
            self._report(call_outcome(exc), tokens, 0)
            raise
        if not isinstance(answer, str) or not answer.strip():
            self._report("empty", tokens, 0)
            raise SummaryError("the summarizer returned an empty answer", no_summary=True)
        # Held to its size by its sections (the lowest first), then checked before it is trusted.
        answer = truncate_sections(answer.strip(), cap_tokens=job.reply_tokens, count_text=job.count_text)
        out = job.count_text(answer)
        self.tokens_out += out
        rejection = check_summary(
            answer, request=messages, cap_tokens=job.reply_tokens, count_text=job.count_text
        )
        if rejection is not None:
            self.rejected += 1
            self._report("rejected", tokens, out)
            raise SummaryError(
                f"the answer is no summary ({rejection.cause}: {rejection.detail})", no_summary=True
            )
        self._report("ok", tokens, out)
        return answer

    def _report(self, outcome: str, tokens_in: int, tokens_out: int) -> None:
        if self.on_call is None:
            return
        try:
            self.on_call(outcome, tokens_in, tokens_out)
        except Exception:  # reporting must never fail a summary
            logger.debug("reporting a summary call failed", exc_info=True)

    @staticmethod
    def _fits(messages: list[dict[str, Any]], job: SummaryJob) -> bool:
        return prompt_tokens(messages, job.count_text) <= job.input_budget_tokens

    async def _summarize(self, pieces: list[str], previous: str | None, job: SummaryJob) -> str:
        reply = job.reply_tokens
        whole = summarize_messages("\n\n".join(pieces), previous_summary=previous, reply_tokens=reply)
        if self._fits(whole, job):
            return await self._call(whole, job)
        chunks = self._pack(pieces, partial(_render_chunk, reply_tokens=reply), job)
        partials: list[str] = []
        for number, chunk in enumerate(chunks, start=1):
            text = "\n\n".join(chunk)
            request = chunk_messages(text, part=number, parts=len(chunks), reply_tokens=reply)
            partials.append(await self._call(request, job))
        return await self._merge(([previous] if previous else []) + partials, job)

    async def _merge(self, items: list[str], job: SummaryJob, depth: int = 0) -> str:
        render = partial(merge_messages, reply_tokens=job.reply_tokens)
        request = render(items)
        if self._fits(request, job):
            return await self._call(request, job)
        if depth >= MAX_MERGE_DEPTH:
            raise SummaryError("partial summaries do not shrink enough to merge")
        groups = self._pack(items, render, job)
        merged = [await self._call(render(group), job) for group in groups]
        if sum(map(job.count_text, merged)) >= sum(map(job.count_text, items)):
            raise SummaryError("merging partial summaries does not make them shorter")
        return await self._merge(merged, job, depth + 1)

    def _pack(self, texts: Sequence[str], render: Render, job: SummaryJob) -> list[list[str]]:
        """Consecutive groups of ``texts`` whose ``render(group)`` each fits; big texts are split."""
        pieces: list[str] = []
        for text in texts:
            if self._fits(render([text]), job):
                pieces.append(text)
            else:
                pieces.extend(self._split_text(text, render, job))
        count = job.count_text
        base = prompt_tokens(render([]), count)
        per_item = max(1, prompt_tokens(render(["x", "x"]), count) - prompt_tokens(render(["x"]), count) - 1)
        room = job.input_budget_tokens - base
        groups: list[list[str]] = []
        current: list[str] = []
        used = 0
        for piece in pieces:
            cost = count(piece) + per_item + 1
            if current and used + cost > room:
                groups.append(current)
                current, used = [], 0
            current.append(piece)
            used += cost
        if current:
            groups.append(current)
        return [part for group in groups for part in self._verified(group, render, job)]

    def _verified(self, group: list[str], render: Render, job: SummaryJob) -> list[list[str]]:
        """``group`` as is if it really fits, else halves of it (the estimate above is additive)."""
        if len(group) == 1 or self._fits(render(group), job):
            return [group]
        middle = len(group) // 2
        return self._verified(group[:middle], render, job) + self._verified(group[middle:], render, job)

    def _split_text(self, text: str, render: Render, job: SummaryJob) -> list[str]:
        """``text`` cut into consecutive parts each of which fits ``render([part])``."""
        parts: list[str] = []
        rest = text
        while rest:
            if self._fits(render([rest]), job):
                parts.append(rest)
                break
            low, high = 0, len(rest)
            while low < high:  # the longest prefix that fits
                mid = (low + high + 1) // 2
                if self._fits(render([rest[:mid]]), job):
                    low = mid
                else:
                    high = mid - 1
            if low == 0:
                raise SummaryError("the summarizer's window cannot hold even one character of text")
            cut = low
            boundary = max(rest.rfind("\n", 0, low), rest.rfind(" ", 0, low))
            if boundary > low * 4 // 5:
                cut = boundary + 1  # prefer a line or word boundary near the limit
            parts.append(rest[:cut])
            rest = rest[cut:]
        return parts


def _render_chunk(group: Sequence[str], *, reply_tokens: int) -> list[dict[str, Any]]:
    return chunk_messages(
        "\n\n".join(group), part=_PART_PLACEHOLDER, parts=_PART_PLACEHOLDER, reply_tokens=reply_tokens
    )


class PrefetchedSummaries:
    """A synchronous ``SummaryProvider`` over summaries fetched before planning.

    ``mapping`` is keyed by ``summary_key`` of the span for ``tenant`` (the service gets it from
    ``Summarizer.span_key(span, tenant)`` of the plan's dropped span). ``asked`` lists the keys the engine
    asked for, ``missed`` those with no summary (the engine then writes its deterministic note).
    """

    def __init__(
        self,
        mapping: Mapping[str, str],
        *,
        summarizer_model: str,
        tenant: str,
        prompt_version: str = PROMPT_VERSION,
        lengths: Iterable[int] | None = None,
    ) -> None:
        self.mapping = dict(mapping)
        self.summarizer_model = summarizer_model
        self.tenant = tenant
        self.prompt_version = prompt_version
        # The lengths of the spans in ``mapping``, when known: a span of another length is a miss
        # without hashing it (the engine may offer many earlier spans).
        self.lengths = frozenset(lengths) if lengths is not None else None
        self.asked: list[str] = []
        self.missed: list[str] = []

    def key(self, span: Sequence[Message]) -> str:
        return summary_key(
            span,
            summarizer_model=self.summarizer_model,
            prompt_version=self.prompt_version,
            tenant=self.tenant,
        )

    def summary_for(self, span: Sequence[Message], /) -> str | None:
        if self.lengths is not None and len(span) not in self.lengths:
            return None
        key = self.key(span)
        self.asked.append(key)
        summary = self.mapping.get(key)
        if not summary or not summary.strip():
            self.missed.append(key)
            return None
        return summary
