"""LLM handoff summaries of the span the engine cuts: rolling, chunked, cached, fail-open.

INTERFACE CONTRACT (the service and ahead-of-time compaction rely on these):

* ``Complete = Callable[[list[dict], str], Awaitable[str]]``: the injected upstream call,
  ``(messages, model) -> text``; the service builds it over its upstream client (and should send
  ``max_tokens=summarizer.reply_tokens``). It may raise anything: the summarizer fails open.
* ``Summarizer(complete, *, model, window_tokens, count_text, prompt_version=PROMPT_VERSION,
  timeout_s, reply_tokens=None)``:

  - ``await summarize_span(blocks, *, previous_summary=None) -> str | None``: one handoff summary
    of the blocks' messages (folding in ``previous_summary``). A span whose request would not fit
    the summarizer's window is cut into parts that each fit, summarized part by part, and the
    parts' summaries are merged (hierarchically if even they do not fit). Every request it sends
    fits ``window_tokens - reply_tokens``. Any exception, a timeout (``timeout_s`` for the whole
    call) or an empty answer gives ``None`` (logged, never raised).
  - ``await summary_for_blocks(blocks, cache) -> str | None``: rolling compaction. Looks up the
    longest prefix of blocks ``0..j`` already summarized in ``cache`` and extends it one block at
    a time (``summary(0..k) = summarize(summary(0..k-1) + block k)``), caching every step, so a
    growing conversation costs one summary call per new block. ``timeout_s`` bounds each step.
  - ``key_for(blocks)`` / ``span_key(span)``: the cache key of blocks ``0..k`` / of a flat span
    (equal for the same messages), ``prefix_keys(blocks)``, ``prompt_tokens(messages)``,
    ``calls`` / ``failures`` counters.

* ``blocks_from_spans(messages, plan.dropped) -> list[list[Message]]``: the blocks of what the
  engine dropped, ready for ``summary_for_blocks`` / ``key_for``.
* ``PrefetchedSummaries(mapping, *, summarizer_model, prompt_version=PROMPT_VERSION)``: the
  synchronous ``app.core.fit.SummaryProvider`` the engine calls; answers ``summary_for(span)``
  from ``mapping`` (span key -> summary) that the service filled beforehand, records the keys it
  was asked for and those it missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from ..core.errors import CtxproxyError
from ..core.messages import Message
from ..core.plan import DroppedSpan
from .cache import SummaryCache, prefix_keys, summary_key
from .prompts import (
    PROMPT_VERSION,
    chunk_messages,
    merge_messages,
    render_messages,
    summarize_messages,
)

logger = logging.getLogger("ctxproxy.compaction")

Complete = Callable[[list[dict[str, Any]], str], Awaitable[str]]
CountText = Callable[[str], int]
Render = Callable[[list[str]], list[dict[str, Any]]]

TOKENS_PER_MESSAGE = 3
REPLY_PRIMING_TOKENS = 3
MAX_MERGE_DEPTH = 4
_PART_PLACEHOLDER = 99999


class SummaryError(CtxproxyError):
    """Internal: a summary could not be made (turned into ``None`` at the public boundary)."""


def _flatten(blocks: Sequence[Sequence[Message]]) -> list[Message]:
    return [message for block in blocks for message in block]


def blocks_from_spans(messages: Sequence[Message], spans: Sequence[DroppedSpan]) -> list[list[Message]]:
    """The blocks of ``Plan.dropped`` (indices into the *input* ``messages``), oldest first.

    Their concatenation is exactly the span the engine passes to ``SummaryProvider.summary_for``,
    so ``Summarizer.key_for(blocks)`` is the key ``PrefetchedSummaries`` will be asked for.
    """
    blocks: list[list[Message]] = []
    for span in spans:
        start = span.start
        for stop in span.block_stops or (span.stop,):
            if stop > start:
                blocks.append(list(messages[start:stop]))
                start = stop
        if start < span.stop:
            blocks.append(list(messages[start : span.stop]))
    return blocks


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
    ) -> None:
        self.complete = complete
        self.model = model
        self.window_tokens = window_tokens
        self.count_text = count_text
        self.prompt_version = prompt_version
        self.timeout_s = timeout_s
        self.reply_tokens = reply_tokens if reply_tokens is not None else min(2048, window_tokens // 4)
        self.input_budget_tokens = window_tokens - self.reply_tokens
        self.calls = 0
        self.failures = 0
        smallest = self.prompt_tokens(merge_messages(["x", "x"]))
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

    def prefix_keys(self, blocks: Sequence[Sequence[Message]]) -> list[str]:
        return prefix_keys(blocks, summarizer_model=self.model, prompt_version=self.prompt_version)

    def key_for(self, blocks: Sequence[Sequence[Message]]) -> str:
        """The key of the summary of all ``blocks`` (same as ``span_key`` of their messages)."""
        return self.span_key(_flatten(blocks))

    async def summarize_span(
        self, blocks: Sequence[Sequence[Message]], *, previous_summary: str | None = None
    ) -> str | None:
        messages = _flatten(blocks)
        if not messages:
            return previous_summary
        try:
            async with asyncio.timeout(self.timeout_s):
                text = await self._summarize(render_messages(messages), previous_summary)
        except TimeoutError:
            self.failures += 1
            logger.warning("summary of %d messages timed out after %ss", len(messages), self.timeout_s)
            return None
        except Exception as exc:
            self.failures += 1
            logger.warning(
                "summary of %d messages failed: %s: %.200s", len(messages), type(exc).__name__, exc
            )
            return None
        return text

    async def summary_for_blocks(
        self, blocks: Sequence[Sequence[Message]], cache: SummaryCache
    ) -> str | None:
        if not blocks:
            return None
        try:
            keys = self.prefix_keys(blocks)
            start, summary = 0, None
            for j in range(len(blocks) - 1, -1, -1):
                cached = await cache.get(keys[j])
                if cached:
                    start, summary = j + 1, cached
                    break
            for i in range(start, len(blocks)):
                summary = await self.summarize_span([blocks[i]], previous_summary=summary)
                if summary is None:
                    return None
                await cache.set(keys[i], summary)
            return summary
        except Exception as exc:
            self.failures += 1
            logger.warning("rolling summary failed: %s: %.200s", type(exc).__name__, exc)
            return None

    async def _call(self, messages: list[dict[str, Any]]) -> str:
        tokens = self.prompt_tokens(messages)
        if tokens > self.input_budget_tokens:
            raise SummaryError(f"summary request of {tokens} tokens over budget {self.input_budget_tokens}")
        self.calls += 1
        answer = await self.complete(messages, self.model)
        if not isinstance(answer, str) or not answer.strip():
            raise SummaryError("the summarizer returned an empty answer")
        return answer.strip()

    def _fits(self, messages: list[dict[str, Any]]) -> bool:
        return self.prompt_tokens(messages) <= self.input_budget_tokens

    async def _summarize(self, pieces: list[str], previous: str | None) -> str:
        whole = summarize_messages("\n\n".join(pieces), previous_summary=previous)
        if self._fits(whole):
            return await self._call(whole)
        chunks = self._pack(pieces, _render_chunk)
        partials: list[str] = []
        for number, chunk in enumerate(chunks, start=1):
            text = "\n\n".join(chunk)
            partials.append(await self._call(chunk_messages(text, part=number, parts=len(chunks))))
        return await self._merge(([previous] if previous else []) + partials)

    async def _merge(self, items: list[str], depth: int = 0) -> str:
        request = merge_messages(items)
        if self._fits(request):
            return await self._call(request)
        if depth >= MAX_MERGE_DEPTH:
            raise SummaryError("partial summaries do not shrink enough to merge")
        groups = self._pack(items, merge_messages)
        merged = [await self._call(merge_messages(group)) for group in groups]
        if sum(map(self.count_text, merged)) >= sum(map(self.count_text, items)):
            raise SummaryError("merging partial summaries does not make them shorter")
        return await self._merge(merged, depth + 1)

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


def _render_chunk(group: list[str]) -> list[dict[str, Any]]:
    return chunk_messages("\n\n".join(group), part=_PART_PLACEHOLDER, parts=_PART_PLACEHOLDER)


class PrefetchedSummaries:
    """A synchronous ``SummaryProvider`` over summaries fetched before planning.

    ``mapping`` is keyed by ``summary_key`` of the span (the service gets it from
    ``Summarizer.key_for(blocks)`` of the plan's dropped span). ``asked`` lists the keys the engine
    asked for, ``missed`` those with no summary (the engine then writes its deterministic note).
    """

    def __init__(
        self, mapping: Mapping[str, str], *, summarizer_model: str, prompt_version: str = PROMPT_VERSION
    ) -> None:
        self.mapping = dict(mapping)
        self.summarizer_model = summarizer_model
        self.prompt_version = prompt_version
        self.asked: list[str] = []
        self.missed: list[str] = []

    def key(self, span: Sequence[Message]) -> str:
        return summary_key(span, summarizer_model=self.summarizer_model, prompt_version=self.prompt_version)

    def summary_for(self, span: Sequence[Message], /) -> str | None:
        key = self.key(span)
        self.asked.append(key)
        summary = self.mapping.get(key)
        if not summary or not summary.strip():
            self.missed.append(key)
            return None
        return summary
