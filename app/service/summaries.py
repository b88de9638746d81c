"""LLM summaries in the chat path: the upstream ``complete`` call, in-line summaries, ahead of time.

INTERFACE CONTRACT (``app.service`` and ``app.main`` rely on these):

* ``Summaries(*, settings, registry, vocabularies, upstream, cache=None)``: one per app, built in
  the lifespan; ``cache`` defaults to ``cache_from_url(settings.cache_url, ...)`` (a Redis that is
  down degrades to the in-process cache with one warning). ``await aclose()`` cancels background
  summaries, then closes the cache.
* ``wanted(policy, summarize) -> bool``: summaries apply under policy ``auto`` only, when the
  request's ``X-Context-Summarize`` (``summarize``: True/False/None) or else
  ``settings.summarize`` turns them on. ``truncate``, ``reject`` and ``off`` never call an LLM.
* ``await refine(request, plan, *, cap_tokens=None) -> Plan``: ``plan`` is the engine's plan of
  ``request`` (an ``app.service.request.ProxyRequest``: policy, options, counter, headers, the
  neutral conversation) without summaries, made under ``cap_tokens``; the request value plans
  itself again with a ``SummaryProvider`` (``request.plan(cap_tokens=..., summaries=...)``), so
  nothing calls back into the driver. When the plan dropped spans, the rolling
  summary of the dropped blocks is looked up in the cache, else made (or joined, when another
  request is already making it) and awaited for at most ``settings.summary_timeout_s``; the
  re-plan puts it where the span was (``summarized``), or the deterministic note when there is
  none (``summary_failed``, logged). Then, when the final plan fits but uses more than
  ``settings.summary_ahead_ratio`` of the budget, the blocks the next overflow would cut are
  summarized in the background (:func:`next_cut_blocks`). Never raises: compaction never fails a
  request.
* ``UpstreamComplete(upstream, *, base_url, max_tokens)``: the summarizer's ``Complete`` over the
  app's :class:`~app.upstream.client.UpstreamClient` (non-streaming ``chat/completions``). Its
  Authorization is the configured upstream key (the client adds it), else the Authorization of
  the request that triggered the summary, carried in a context variable for the life of that
  summary's task and never stored.
* ``stats() -> dict``: in-line ``cached``/``waited``/``failed``, ``too_large`` (a summary the
  engine could not fit in the room its cut left: the note was used), ``ahead`` scheduled,
  summarizer calls, the cache's and the background work's counters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import orjson

from ..compaction.ahead import AheadOfTime
from ..compaction.cache import SummaryCache, cache_from_url
from ..compaction.summarizer import PrefetchedSummaries, Summarizer, SummaryError, blocks_from_spans
from ..core.budget import Policy
from ..core.fit import SummaryProvider, preview_next_cut
from ..core.messages import Message
from ..core.plan import Plan
from ..core.tokens import MessageCounter
from ..settings import Settings
from ..upstream.client import UpstreamClient
from ..upstream.headers import Header
from ..wire import dump_json
from .ports import CHAT_PATH, ModelResolver, Vocabularies
from .report import request_budget_tokens
from .request import ProxyRequest

logger = logging.getLogger("ctxproxy.compaction")

BACKGROUND_TIMEOUT_S = 60.0
"""Bound on each summary call made in the background (the in-line wait is the settings')."""
MAX_REPLY_TOKENS = 2048

_authorization: ContextVar[str | None] = ContextVar("ctxproxy_summary_authorization", default=None)

Replan = Callable[[SummaryProvider], Plan]


class SummaryUpstreamError(SummaryError):
    """The summarizer's upstream answered with an error or something that is not a completion."""


def authorization_of(headers: Sequence[Header]) -> str | None:
    for name, value in headers:
        if name.lower() == "authorization":
            return value
    return None


class UpstreamComplete:
    """``(messages, model) -> text`` over the upstream client: one non-streaming completion."""

    def __init__(self, upstream: UpstreamClient, *, base_url: str, max_tokens: int) -> None:
        self.upstream = upstream
        self.base_url = base_url
        self.max_tokens = max_tokens

    async def __call__(self, messages: list[dict[str, Any]], model: str) -> str:
        body = {"model": model, "messages": messages, "max_tokens": self.max_tokens, "stream": False}
        headers: list[Header] = [("Content-Type", "application/json"), ("Accept", "application/json")]
        authorization = _authorization.get()
        if authorization:
            headers.append(("Authorization", authorization))
        response = await self.upstream.send(
            "POST",
            CHAT_PATH,
            content=dump_json(body),
            headers=headers,
            stream=False,
            base_url=self.base_url,
        )
        raw = response.decoded_body()
        if response.status_code >= 400:
            raise SummaryUpstreamError(f"HTTP {response.status_code}: {raw[:200]!r}")
        try:
            answer = orjson.loads(raw)
            content = answer["choices"][0]["message"]["content"]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise SummaryUpstreamError(f"not a chat completion: {raw[:200]!r}") from exc
        if not isinstance(content, str):
            raise SummaryUpstreamError("the completion has no text content")
        return content


def next_cut_blocks(
    body: Mapping[str, Any],
    messages: Sequence[Message],
    plan: Plan,
    *,
    policy: Policy,
    counter: MessageCounter,
) -> list[list[Message]]:
    """The blocks the next cut of this conversation will summarize (everything it drops, as
    ``blocks_from_spans`` gives them: one block per level), from the engine's one next-cut rule
    (``app.core.fit.preview_next_cut``); empty when no complete level is left to cut."""
    extra = {"dialect": plan.dialect} if plan.dialect is not None else {}
    spans = preview_next_cut(
        body, spec=plan.spec, policy=policy, counter=counter, cap_tokens=plan.budget.cap_tokens, **extra
    )
    return blocks_from_spans(messages, spans) if spans else []


def _too_large(plan: Plan) -> bool:
    """The plan fell back to the note although a summary was offered (it did not fit its room)."""
    return any(action.kind == "summary_failed" for action in plan.actions)


class Summaries:
    """The app's summary machinery: cache, one summarizer per summary model, background work."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: ModelResolver,
        vocabularies: Vocabularies,
        upstream: UpstreamClient,
        cache: SummaryCache | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.vocabularies = vocabularies
        self.upstream = upstream
        self.cache: SummaryCache = cache or cache_from_url(
            settings.cache_url, ttl_s=settings.cache_ttl_s, max_entries=settings.cache_max_entries
        )
        self._semaphore = asyncio.Semaphore(settings.summary_concurrency)
        self._ahead: dict[str, AheadOfTime | None] = {}
        self._counts = {"cached": 0, "waited": 0, "failed": 0, "too_large": 0, "ahead": 0}

    def wanted(self, policy: Policy, summarize: bool | None) -> bool:
        enabled = self.settings.summarize if summarize is None else summarize
        return enabled and policy.mode == "auto"

    def ahead_for(self, model: str) -> AheadOfTime | None:
        """The background worker (and its summarizer) for ``model``; None if it cannot summarize."""
        if model in self._ahead:
            return self._ahead[model]
        ahead: AheadOfTime | None = None
        try:
            spec = self.registry.resolve(model)
            count_text = self.vocabularies.counter_for(spec.encoding).count_text
            reply_tokens = max(1, min(MAX_REPLY_TOKENS, spec.window_tokens // 4, spec.max_output_tokens))
            base_url = self.settings.summary_base_url or self.upstream.base_url_for(model)
            complete = UpstreamComplete(self.upstream, base_url=base_url, max_tokens=reply_tokens)
            summarizer = Summarizer(
                complete,
                model=model,
                window_tokens=spec.window_tokens,
                count_text=count_text,
                timeout_s=BACKGROUND_TIMEOUT_S,
                reply_tokens=reply_tokens,
            )
            ahead = AheadOfTime(
                summarizer,
                self.cache,
                max_concurrency=self.settings.summary_concurrency,
                lock_ttl_s=2 * BACKGROUND_TIMEOUT_S,
                semaphore=self._semaphore,
            )
        except Exception as exc:
            logger.warning(
                "summaries with model %r are not possible: %s: %.200s", model, type(exc).__name__, exc
            )
        self._ahead[model] = ahead
        return ahead

    async def refine(self, request: ProxyRequest, plan: Plan, *, cap_tokens: int | None = None) -> Plan:
        policy, counter = request.policy, request.counter
        if not self.wanted(policy, request.options.summarize):
            return plan
        if not plan.dropped and plan.tokens_after <= self._ahead_threshold(plan):
            return plan  # the common case: nothing cut, nothing to prepare
        model = self.settings.summary_model or plan.model

        def replan(provider: SummaryProvider) -> Plan:
            return request.plan(cap_tokens=cap_tokens, summaries=provider)

        token = _authorization.set(authorization_of(request.headers))
        try:
            body, messages = request.body, request.conversation.messages
            ahead = self.ahead_for(model)
            ready = True
            if plan.dropped:
                plan, ready = await self._summarized(
                    body, messages, plan, ahead, model=model, replan=replan, policy=policy, counter=counter
                )
            if ahead is not None and ready and plan.fits:
                await self._schedule_next(body, messages, plan, ahead, policy=policy, counter=counter)
            return plan
        except Exception as exc:  # never fail a request because of compaction
            logger.warning("summaries skipped for this request: %s: %.200s", type(exc).__name__, exc)
            return plan
        finally:
            _authorization.reset(token)

    async def _summarized(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        plan: Plan,
        ahead: AheadOfTime | None,
        *,
        model: str,
        replan: Replan,
        policy: Policy,
        counter: MessageCounter,
    ) -> tuple[Plan, bool]:
        blocks = blocks_from_spans(messages, plan.dropped)
        deadline = asyncio.get_running_loop().time() + self.settings.summary_timeout_s
        summary: str | None = None
        mapping: dict[str, str] = {}
        longer: list[list[Message]] = []
        if ahead is not None:
            key = ahead.summarizer.key_for(blocks)
            summary = await self.cache.get(key)
            if summary:
                self._counts["cached"] += 1
            else:
                self._counts["waited"] += 1
                ahead.schedule(blocks)
                summary = await ahead.wait_for(blocks, self.settings.summary_timeout_s)
            if summary:
                mapping[key] = summary
                # The span one block longer, when already summarized (ahead of time): offered to
                # the engine too, for when the summary of the planned span does not fit its room.
                longer = next_cut_blocks(body, messages, plan, policy=policy, counter=counter)
                if longer:
                    longer_key = ahead.summarizer.key_for(longer)
                    if longer_summary := await self.cache.get(longer_key):
                        mapping[longer_key] = longer_summary
        if not summary:
            self._counts["failed"] += 1
            logger.warning(
                "no summary of %d cut messages within %ss; forwarding with the note instead",
                sum(len(b) for b in blocks),
                self.settings.summary_timeout_s,
            )
        replanned = replan(PrefetchedSummaries(mapping, summarizer_model=model))
        if summary and ahead is not None and longer and _too_large(replanned):
            # A cold cache (a long conversation arriving whole): the summary is longer than the
            # room the note's cut left, and the engine's next try, the span one block longer, has
            # no summary yet. Make it in line (one rolling call on top of the one just made)
            # within what is left of the timeout.
            longer_key = ahead.summarizer.key_for(longer)
            remaining_s = deadline - asyncio.get_running_loop().time()
            if longer_key not in mapping and remaining_s > 0:
                ahead.schedule(longer)
                if longer_summary := await ahead.wait_for(longer, remaining_s):
                    mapping[longer_key] = longer_summary
                    replanned = replan(PrefetchedSummaries(mapping, summarizer_model=model))
        if summary and _too_large(replanned):
            self._counts["too_large"] += 1
            cut = sum(len(block) for block in blocks)
            logger.warning("the summary of %d cut messages does not fit; forwarding with the note", cut)
        return replanned, bool(summary)

    async def _schedule_next(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        plan: Plan,
        ahead: AheadOfTime,
        *,
        policy: Policy,
        counter: MessageCounter,
    ) -> None:
        if plan.tokens_after <= self._ahead_threshold(plan):
            return
        blocks = next_cut_blocks(body, messages, plan, policy=policy, counter=counter)
        if not blocks or await self.cache.get(ahead.summarizer.key_for(blocks)):
            return
        if ahead.schedule(blocks):
            self._counts["ahead"] += 1

    def _ahead_threshold(self, plan: Plan) -> float:
        return self.settings.summary_ahead_ratio * request_budget_tokens(plan.budget)

    def stats(self) -> dict[str, Any]:
        workers = [a for a in self._ahead.values() if a is not None]
        return {
            **self._counts,
            "calls": sum(a.summarizer.calls for a in workers),
            "in_flight": sum(a.in_flight for a in workers),
            "cache": self.cache.stats().as_dict(),
        }

    async def aclose(self) -> None:
        for ahead in self._ahead.values():
            if ahead is not None:
                await ahead.aclose()
        await self.cache.aclose()
