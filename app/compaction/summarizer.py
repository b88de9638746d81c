"""LLM handoff summaries of what a cut forgot: incremental, cached, chunked, fail-open, backing off.

INTERFACE CONTRACT (the service and ahead-of-time compaction rely on these):

* ``Complete = Callable[[list[dict], str], Awaitable[str]]``: the injected upstream call,
  ``(messages, model) -> text``; the service builds it over its upstream client in the request's
  own wire API (and sends ``max_tokens=summarizer.reply_tokens``). It may raise anything: the
  summarizer fails open. A ``SummaryError`` with an HTTP ``status`` tells it what kind of failure
  it was (``SummaryError.permanent``: the endpoint or the credentials cannot work).
* ``Summarizer(complete, *, model, window_tokens, count_text, prompt_version=PROMPT_VERSION,
  timeout_s, reply_tokens=None, identity="", retry_after_s=60.0, retry_max_s=3600.0, pace=None)``:
  ``pace`` (``app.compaction.pace.Pace``, shared by the summarizers of one model at one upstream):
  the time limit of a summary follows the model's observed latency instead of ``timeout_s``.
  Every answer is held to ``reply_tokens`` by its sections (``prompts.truncate_sections``) and
  checked (``checks.check_summary``): a refused one fails the summary (outcome ``rejected``, its
  cause logged once, not cached, backing off like any failure).

  - ``await memory_for(span, cache) -> str | None``: the summary of exactly ``span`` (the
    messages a memory stands for, ``app.core.memory.span_messages``). Incremental: a session's
    spans grow from the same start, so the longest prefix of ``span`` already summarized (found
    through the conversation's *chain*, one cache entry per first message listing the spans
    summarized from it) is folded with the messages after it: one call per cut step, each
    forgotten message summarized about once. The result is cached under ``span_key(span)`` and
    joins the chain. A failed span is not asked for again before its back-off ends (``fail:``
    entries in the cache, ``retry_after_s`` doubling up to ``retry_max_s``; shared by replicas
    through a shared cache) and its cause is logged once; a ``permanent`` failure turns the
    summarizer (``identity``: the API, base URL and model) off for the same back-off.
  - ``await summarize_span(messages, *, previous_summary=None) -> str | None``: one handoff
    summary of ``messages`` (folding in ``previous_summary``). A span whose request would not fit
    the summarizer's window is cut into parts that each fit, summarized part by part, and the
    parts' summaries are merged (hierarchically if even they do not fit). Every request it sends
    fits ``window_tokens - reply_tokens``. Any exception, a timeout (``timeout_s`` for the whole
    call) or an empty answer gives ``None``.
  - ``await longest_summarized(span, cache) -> (n, summary)``: the longest proper prefix of
    ``span`` its chain has a summary of (``(0, None)`` when none).
  - ``span_key(span)``; ``prompt_tokens(messages)``; counters ``calls``, ``failures``,
    ``rejected``, ``tokens_in``, ``tokens_out`` (its own counts of what it sent and got), ``last_error``;
    ``on_call`` (keyword, optional): told ``(outcome, tokens_in, tokens_out)`` of every call
    (:data:`CallHook`; never allowed to fail the summary).

* ``PrefetchedSummaries(mapping, *, summarizer_model, prompt_version=PROMPT_VERSION)``: the
  synchronous ``app.core.fit.SummaryProvider`` the engine calls; answers ``summary_for(span)``
  from ``mapping`` (span key -> summary) that the service filled beforehand, records the keys it
  was asked for and those it missed; with ``lengths`` (of the mapped spans), a span of another
  length is a miss at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
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

Complete = Callable[[list[dict[str, Any]], str], Awaitable[str]]
CountText = Callable[[str], int]
Render = Callable[[list[str]], list[dict[str, Any]]]

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
MAX_MERGE_DEPTH = 4
_PART_PLACEHOLDER = 99999


# HTTP statuses that say the summary endpoint or its credentials cannot work: no span can succeed.
PERMANENT_STATUSES: frozenset[int] = frozenset({401, 403, 404, 405})
CHAIN_LENGTH = 16


class SummaryError(CtxproxyError):
    """Internal: a summary could not be made (turned into ``None`` at the public boundary).
    ``status``: the summary call's HTTP status, when it got an answer."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def permanent(self) -> bool:
        """The endpoint or the credentials cannot work (no other span would fare better)."""
        return self.status in PERMANENT_STATUSES


CallHook = Callable[[str, int, int], None]
"""``(outcome, tokens_in, tokens_out)`` of one summary call: ``ok``, ``timeout``, ``http_<status>``,
``empty``, ``rejected`` (refused by the summary checks) or ``failed``."""


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
        window_tokens: int,
        count_text: CountText,
        prompt_version: str = PROMPT_VERSION,
        timeout_s: float | None,
        reply_tokens: int | None = None,
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
        self.window_tokens = window_tokens
        self.count_text = count_text
        self.prompt_version = prompt_version
        self.timeout_s = timeout_s
        self.reply_tokens = reply_tokens if reply_tokens is not None else min(2048, window_tokens // 4)
        self.input_budget_tokens = window_tokens - self.reply_tokens
        self.identity = identity or model
        self.retry_after_s = max(0.001, retry_after_s)
        self.retry_max_s = max(self.retry_after_s, retry_max_s)
        self.calls = 0
        self.failures = 0
        self.rejected = 0  # answers the checks refused (each also a failure of its summary)
        self.tokens_in = 0
        self.tokens_out = 0
        self.last_error = ""
        # Spans whose failure was logged (a span backing off is logged once, not per request).
        self._logged: set[str] = set()
        smallest = self.prompt_tokens(merge_messages(["x", "x"], reply_tokens=self.reply_tokens))
        if self.input_budget_tokens < 2 * smallest:
            raise ValueError(
                f"summarizer window of {window_tokens} tokens ({self.reply_tokens} reserved for the "
                f"reply) is too small for its own prompt ({smallest} tokens)"
            )

    def prompt_tokens(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Input tokens of a summary request (chat accounting: per message, role, text, priming)."""
        total = REPLY_PRIMING_TOKENS
        for message in messages:
            total += TOKENS_PER_MESSAGE + self.count_text(str(message.get("role", "")))
            total += self.count_text(str(message.get("content") or ""))
        return total

    def span_key(self, span: Sequence[Message]) -> str:
        return summary_key(span, summarizer_model=self.model, prompt_version=self.prompt_version)

    def chain_key(self, span: Sequence[Message]) -> str:
        """The cache key of the chain of ``span``'s conversation (by its first message)."""
        return "chain:" + self.span_key(span[:1])

    # -- failures and back-off -------------------------------------------------------------

    def _off_key(self) -> str:
        return "off:" + hashlib.sha256(f"{self.identity}\n{self.model}".encode()).hexdigest()

    async def blocked(self, key: str, cache: SummaryCache) -> str | None:
        """Why ``key`` is not summarized now (its own back-off, or the summarizer is off), or
        None when it may be."""
        for name in (self._off_key(), "fail:" + key):
            raw = await cache.get(name)
            if raw:
                try:
                    return str(json.loads(raw).get("cause", "failed earlier"))
                except (ValueError, AttributeError):
                    return "failed earlier"
        return None

    async def _failed(
        self, key: str, span: Sequence[Message], exc: BaseException, cache: SummaryCache
    ) -> None:
        """Back off ``key`` (and the whole summarizer after a permanent failure); log the cause
        once per span."""
        self.failures += 1
        cause = _cause(exc)
        self.last_error = cause
        permanent = isinstance(exc, SummaryError) and exc.permanent
        name = self._off_key() if permanent else "fail:" + key
        # The failures in a row outlive each back-off (so the next one doubles), not forever.
        raw = await cache.get("tries:" + name)
        attempts = int(raw) + 1 if raw and raw.isdigit() else 1
        ttl_s = min(self.retry_max_s, self.retry_after_s * 2 ** (attempts - 1))
        await cache.set("tries:" + name, str(attempts), ttl_s=4 * self.retry_max_s)
        await cache.set(name, json.dumps({"attempts": attempts, "cause": cause}), ttl_s=ttl_s)
        if permanent:
            logger.warning(
                "summaries by %s are off for %.0fs: %s (the cut's note and placeholders stand alone)",
                self.identity,
                ttl_s,
                cause,
            )
        elif key not in self._logged:
            self._logged.add(key)
            logger.warning(
                "no summary of %d cut messages (%s); not asked again for %.0fs, the note stands in",
                len(span),
                cause,
                ttl_s,
            )
        else:
            logger.debug("summary of %s failed again: %s", key[:12], cause)

    # -- summaries -------------------------------------------------------------------------

    async def memory_for(self, span: Sequence[Message], cache: SummaryCache) -> str | None:
        if not span:
            return None
        key = self.span_key(span)
        try:
            cached = await cache.get(key)
            if cached:
                return cached
            if await self.blocked(key, cache) is not None:
                return None
            start, previous = await self.longest_summarized(span, cache)
            summary = await self._summarize_logged(span[start:], previous)
        except Exception as exc:  # a broken cache: fail open
            self.failures += 1
            self.last_error = _cause(exc)
            logger.warning("summary of %d cut messages failed: %s", len(span), self.last_error)
            return None
        if isinstance(summary, BaseException):
            await self._failed(key, span, summary, cache)
            return None
        await cache.set(key, summary)
        await self._extend_chain(span, key, cache)
        return summary

    async def longest_summarized(
        self, span: Sequence[Message], cache: SummaryCache
    ) -> tuple[int, str | None]:
        """``(n, summary)``: the longest proper prefix of ``span`` (``n`` messages) already
        summarized in its chain, or ``(0, None)``."""
        raw = await cache.get(self.chain_key(span))
        try:
            chain = [(int(n), str(k)) for n, k in json.loads(raw)] if raw else []
        except (ValueError, TypeError):
            chain = []
        lengths = sorted({n for n, _ in chain if 0 < n < len(span)}, reverse=True)
        if not lengths:
            return 0, None
        keys = prefix_keys(
            [[m] for m in span[: lengths[0]]], summarizer_model=self.model, prompt_version=self.prompt_version
        )
        known = dict(chain)
        for n in lengths:
            if known.get(n) == keys[n - 1] and (summary := await cache.get(keys[n - 1])):
                return n, summary
        return 0, None

    async def _extend_chain(self, span: Sequence[Message], key: str, cache: SummaryCache) -> None:
        name = self.chain_key(span)
        raw = await cache.get(name)
        try:
            chain = [[int(n), str(k)] for n, k in json.loads(raw)] if raw else []
        except (ValueError, TypeError):
            chain = []
        entries = [[len(span), key], *(e for e in chain if e[1] != key)][:CHAIN_LENGTH]
        await cache.set(name, json.dumps(entries))

    async def _summarize_logged(
        self, messages: Sequence[Message], previous: str | None
    ) -> str | BaseException:
        """The summary, or the exception that stopped it (cancellation is never swallowed)."""
        pace = self.pace
        limit_s = pace.limit_s if pace is not None else self.timeout_s
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit_s):
                summary = await self._summarize(render_messages(messages), previous)
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
        self, messages: Sequence[Message], *, previous_summary: str | None = None
    ) -> str | None:
        if not messages:
            return previous_summary
        result = await self._summarize_logged(messages, previous_summary)
        if isinstance(result, BaseException):
            self.failures += 1
            self.last_error = _cause(result)
            logger.warning("summary of %d messages failed: %s", len(messages), self.last_error)
            return None
        return result

    async def _call(self, messages: list[dict[str, Any]]) -> str:
        tokens = self.prompt_tokens(messages)
        if tokens > self.input_budget_tokens:
            raise SummaryError(f"summary request of {tokens} tokens over budget {self.input_budget_tokens}")
        self.calls += 1
        self.tokens_in += tokens
        try:
            answer = await self.complete(messages, self.model)
        except BaseException as exc:  # cancelled by the timeout too: reported, then re-raised
            self._report(call_outcome(exc), tokens, 0)
            raise
        if not isinstance(answer, str) or not answer.strip():
            self._report("empty", tokens, 0)
            raise SummaryError("the summarizer returned an empty answer")
        # Held to its size by its sections (the lowest first), then checked before it is trusted.
        answer = truncate_sections(answer.strip(), cap_tokens=self.reply_tokens, count_text=self.count_text)
        out = self.count_text(answer)
        self.tokens_out += out
        rejection = check_summary(
            answer, request=messages, cap_tokens=self.reply_tokens, count_text=self.count_text
        )
        if rejection is not None:
            self.rejected += 1
            self._report("rejected", tokens, out)
            raise SummaryError(f"the answer is no summary ({rejection.cause}: {rejection.detail})")
        self._report("ok", tokens, out)
        return answer

    def _report(self, outcome: str, tokens_in: int, tokens_out: int) -> None:
        if self.on_call is None:
            return
        try:
            self.on_call(outcome, tokens_in, tokens_out)
        except Exception:  # reporting must never fail a summary
            logger.debug("reporting a summary call failed", exc_info=True)

    def _fits(self, messages: list[dict[str, Any]]) -> bool:
        return self.prompt_tokens(messages) <= self.input_budget_tokens

    async def _summarize(self, pieces: list[str], previous: str | None) -> str:
        reply = self.reply_tokens
        whole = summarize_messages("\n\n".join(pieces), previous_summary=previous, reply_tokens=reply)
        if self._fits(whole):
            return await self._call(whole)
        chunks = self._pack(pieces, self._render_chunk)
        partials: list[str] = []
        for number, chunk in enumerate(chunks, start=1):
            text = "\n\n".join(chunk)
            request = chunk_messages(text, part=number, parts=len(chunks), reply_tokens=reply)
            partials.append(await self._call(request))
        return await self._merge(([previous] if previous else []) + partials)

    async def _merge(self, items: list[str], depth: int = 0) -> str:
        request = self._render_merge(items)
        if self._fits(request):
            return await self._call(request)
        if depth >= MAX_MERGE_DEPTH:
            raise SummaryError("partial summaries do not shrink enough to merge")
        groups = self._pack(items, self._render_merge)
        merged = [await self._call(self._render_merge(group)) for group in groups]
        if sum(map(self.count_text, merged)) >= sum(map(self.count_text, items)):
            raise SummaryError("merging partial summaries does not make them shorter")
        return await self._merge(merged, depth + 1)

    def _render_chunk(self, group: list[str]) -> list[dict[str, Any]]:
        text = "\n\n".join(group)
        return chunk_messages(
            text, part=_PART_PLACEHOLDER, parts=_PART_PLACEHOLDER, reply_tokens=self.reply_tokens
        )

    def _render_merge(self, group: Sequence[str]) -> list[dict[str, Any]]:
        return merge_messages(group, reply_tokens=self.reply_tokens)

    def _pack(self, texts: Sequence[str], render: Render) -> list[list[str]]:
        """Consecutive groups of ``texts`` whose ``render(group)`` each fits; big texts are split."""
        pieces: list[str] = []
        for text in texts:
            if self._fits(render([text])):
                pieces.append(text)
            else:
                pieces.extend(self._split_text(text, render))
        base = self.prompt_tokens(render([]))
        per_item = max(1, self.prompt_tokens(render(["x", "x"])) - self.prompt_tokens(render(["x"])) - 1)
        room = self.input_budget_tokens - base
        groups: list[list[str]] = []
        current: list[str] = []
        used = 0
        for piece in pieces:
            cost = self.count_text(piece) + per_item + 1
            if current and used + cost > room:
                groups.append(current)
                current, used = [], 0
            current.append(piece)
            used += cost
        if current:
            groups.append(current)
        return [part for group in groups for part in self._verified(group, render)]

    def _verified(self, group: list[str], render: Render) -> list[list[str]]:
        """``group`` as is if it really fits, else halves of it (the estimate above is additive)."""
        if len(group) == 1 or self._fits(render(group)):
            return [group]
        middle = len(group) // 2
        return self._verified(group[:middle], render) + self._verified(group[middle:], render)

    def _split_text(self, text: str, render: Render) -> list[str]:
        """``text`` cut into consecutive parts each of which fits ``render([part])``."""
        parts: list[str] = []
        rest = text
        while rest:
            if self._fits(render([rest])):
                parts.append(rest)
                break
            low, high = 0, len(rest)
            while low < high:  # the longest prefix that fits
                mid = (low + high + 1) // 2
                if self._fits(render([rest[:mid]])):
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


class PrefetchedSummaries:
    """A synchronous ``SummaryProvider`` over summaries fetched before planning.

    ``mapping`` is keyed by ``summary_key`` of the span (the service gets it from
    ``Summarizer.key_for(blocks)`` of the plan's dropped span). ``asked`` lists the keys the engine
    asked for, ``missed`` those with no summary (the engine then writes its deterministic note).
    """

    def __init__(
        self,
        mapping: Mapping[str, str],
        *,
        summarizer_model: str,
        prompt_version: str = PROMPT_VERSION,
        lengths: Iterable[int] | None = None,
    ) -> None:
        self.mapping = dict(mapping)
        self.summarizer_model = summarizer_model
        self.prompt_version = prompt_version
        # The lengths of the spans in ``mapping``, when known: a span of another length is a miss
        # without hashing it (the engine may offer many earlier spans).
        self.lengths = frozenset(lengths) if lengths is not None else None
        self.asked: list[str] = []
        self.missed: list[str] = []

    def key(self, span: Sequence[Message]) -> str:
        return summary_key(span, summarizer_model=self.summarizer_model, prompt_version=self.prompt_version)

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
