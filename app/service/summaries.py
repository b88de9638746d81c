"""LLM summaries on the request path: what a cut forgot, summarized in the request's own wire API.

INTERFACE CONTRACT (``app.service`` and ``app.main`` rely on these):

* ``Summaries(*, settings, registry, vocabularies, upstream, cache=None)``: one per app, built in
  the lifespan; ``cache`` defaults to ``cache_from_url(settings.cache_url, ...)`` (a Redis that is
  down degrades to the in-process cache with one warning). ``await aclose()`` cancels background
  summaries, then closes the cache.
* ``wanted(policy, summarize) -> bool``: summaries apply under policy ``auto`` only, when the
  request's ``X-Context-Summarize`` (``summarize``: True/False/None) or else
  ``settings.summarize`` (on by default) turns them on. ``truncate``, ``reject`` and ``off``
  never call an LLM. The service plans such a request with ``policy.summarize`` set, so its cut
  leaves room for the memory (``app.core.memory``) whether or not a summary comes.
* ``await refine(request, plan, *, cap_tokens=None, writes=True) -> Plan``: ``plan`` is the
  engine's plan of ``request`` (an ``app.service.request.ProxyRequest``) without a summary
  provider, made under ``cap_tokens`` (an emergency retry's, which also bounds the summary call;
  ``writes=False`` there: when the request's own model writes the summaries, only summaries
  already cached, nothing asked of an upstream whose window was just found smaller than
  thought). When it forgot something (``plan.memory``), the summary of that span is looked up
  in the cache, else made (or joined, when another request or replica is making it) and awaited
  for at most ``settings.summary_timeout_s`` (not at all when the summarizer's answers take longer,
  or when its upstream yields to client requests, ``app.upstream.traffic``: the request itself
  holds it, so the call goes after it); the request value plans itself again with it
  (``summarized``); without it (late, failed, backing off) with the summary of the span's
  ``earlier`` memory when one is cached (what the conversation had), else with nothing
  (``summary_failed``: the note and placeholders stand in).
  Then, when the plan fits but uses more than ``settings.summary_ahead_ratio`` of the budget, the
  span the next cut will forget (``app.core.fit.next_cut_headroom``) is summarized in the
  background. Never raises: compaction never fails a request. A request that forgot nothing and
  is under the ratio costs one comparison.
* Isolation: a summary is its tenant's (``ProxyRequest.tenant``): its cache key, its chain, its
  in-flight work and the back-off of its span are the tenant's, so one client never waits on,
  reads or learns of another's; a summary call refused for the credential (401, 403) turns
  summaries off for that credential only (``UpstreamClient.credential_of``: the client's key, or
  the operator's when it replaces it), a route the upstream lacks (404, 405) for the summarizer.
* Bounded: one summarizer (with its ``AheadOfTime``) per summary API, model and upstream, at most
  ``MAX_SUMMARIZERS`` (the least recently used idle one goes first; its counters stay in
  ``stats``); the reply and the window of each call travel with it (``SummaryJob``). At most
  ``MAX_PENDING_SUMMARIES`` summaries are pending in all of them together (a ``Backlog``): work
  that arrives faster than ``summary_concurrency`` calls do it is refused (the note stands in),
  not queued without end.
* The summary call speaks the request's own wire API (``Dialect.summary_request`` /
  ``summary_text``) on the request model's upstream, with the client's headers and query
  parameters the dialect names (its key where the client put it, ``anthropic-version``) held only
  while that summary is written; the operator's key, when set, replaces the client's (in the
  header its API uses). Neither the query nor a key is ever logged (a failure names the URL
  without its query). ``CTXPROXY_SUMMARY_MODEL``,
  ``CTXPROXY_SUMMARY_BASE_URL`` and ``CTXPROXY_SUMMARY_API`` override the model, the upstream and
  the API (one of ``dialects``, the app's registry, injected by the composition root).
* ``stats() -> dict``: per wire API of the summary calls (``by_api``: calls, failures, rejected
  (refused by the checks), tokens_in, tokens_out; requests whose memory was ``cached``,
  ``waited`` for, ``failed``, stood in by an ``earlier`` one, ``too_large``, ``backing_off``;
  summaries made ``ahead``), totals of the same, in-flight work, ``preempted`` (summary calls a
  client request cancelled), ``abandoned`` (those given up after ``MAX_PREEMPTIONS``) and the
  cache's counters.
* ``events`` (keyword, optional, :class:`~app.service.ports.SummaryEvents`: the app's
  observability): told of every summary call by the API it was asked in (outcome, tokens in and
  out) and of every cut request's lookup of its memory in the cache (hit or miss), for the
  metrics and the status page.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from functools import partial
from typing import Any
from urllib.parse import unquote_plus

import orjson

from ..compaction.ahead import AheadOfTime, Backlog
from ..compaction.cache import SummaryCache, cache_from_url
from ..compaction.pace import Pace
from ..compaction.summarizer import CallHook, PrefetchedSummaries, Summarizer, SummaryError, SummaryJob
from ..core.budget import Policy
from ..core.dialect import Dialect
from ..core.fit import cut_tool_tokens, next_cut_headroom
from ..core.memory import MemorySpan, memory_tokens_for, span_messages
from ..core.plan import Plan
from ..settings import Settings
from ..upstream.client import UpstreamClient, join_url, origin_url
from ..upstream.headers import Header
from ..wire import dump_json
from .fastpath import run_plan
from .ports import ModelResolver, SummaryEvents, Vocabularies
from .report import request_budget_tokens
from .request import ProxyRequest, summaries_wanted

logger = logging.getLogger("ctxproxy.compaction")

MIN_REPLY_TOKENS = 64
# A summary is asked for in a little less than the memory's room: the summary model may count
# its tokens differently from the request's counter.
REPLY_SHARE = 0.85
# A model counted by estimate keeps this share of its window free in a summary request.
ESTIMATE_MARGIN = 0.1
# Summarizers kept (one per summary API, model and upstream; the model may be the client's).
MAX_SUMMARIZERS = 64
# Summaries pending (scheduled, in line or ahead of time, not finished) in all summarizers
# together: each holds its conversation until it ends; past this, the note stands in.
MAX_PENDING_SUMMARIES = 64

_carried: ContextVar[tuple[Header, ...]] = ContextVar("ctxproxy_summary_headers", default=())
_carried_query: ContextVar[str] = ContextVar("ctxproxy_summary_query", default="")

COUNTERS = ("calls", "failures", "rejected", "tokens_in", "tokens_out")
EVENTS = ("cached", "waited", "failed", "earlier", "too_large", "ahead", "backing_off")


class SummaryUpstreamError(SummaryError):
    """The summarizer's upstream answered with an error or something that is not an answer."""


def carried_headers(headers: Sequence[Header], names: Sequence[str]) -> tuple[Header, ...]:
    """The client's headers named in ``names`` (any case), in the client's order."""
    wanted = {name.lower() for name in names}
    return tuple((name, value) for name, value in headers if name.lower() in wanted)


def carried_query(query: str, names: Sequence[str]) -> str:
    """The parameters of the client's raw ``query`` named in ``names``, as the client wrote them
    (percent-encoding kept), in its order."""
    if not query or not names:
        return ""
    wanted = set(names)
    kept = [pair for pair in query.split("&") if unquote_plus(pair.partition("=")[0]) in wanted]
    return "&".join(kept)


class UpstreamComplete:
    """``(messages, model, max_tokens) -> text`` over the upstream client: one non-streaming call
    in ``dialect``'s wire API (``Dialect.summary_request``)."""

    def __init__(self, upstream: UpstreamClient, *, dialect: Dialect, base_url: str) -> None:
        self.upstream = upstream
        self.dialect = dialect
        self.base_url = base_url

    async def __call__(self, messages: list[dict[str, Any]], model: str, max_tokens: int) -> str:
        call = self.dialect.summary_request(messages, model=model, max_tokens=max_tokens)
        headers: list[Header] = [("Content-Type", "application/json"), ("Accept", "application/json")]
        client = carried_headers(_carried.get(), call.carry)
        headers += client
        sent = {name.lower() for name, _ in client}
        headers += [(name, value) for name, value in call.defaults if name.lower() not in sent]
        response = await self.upstream.send(
            "POST",
            call.path,
            content=dump_json(call.body),
            headers=headers,
            stream=False,
            base_url=self.base_url,
            query=carried_query(_carried_query.get(), call.carry_query),
            key_slot=self.dialect.key_slots[0] if self.dialect.key_slots else None,
            at_origin=call.at_origin,
            background=True,  # client requests first on an upstream with few slots
        )
        raw = response.decoded_body()
        where = f"POST {(origin_url if call.at_origin else join_url)(self.base_url, call.path)}"
        if response.status_code >= 400:
            raise SummaryUpstreamError(
                f"{where} answered HTTP {response.status_code}: {raw[:200]!r}", status=response.status_code
            )
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SummaryUpstreamError(f"{where} answered no JSON: {raw[:200]!r}") from exc
        text = self.dialect.summary_text(answer) if isinstance(answer, Mapping) else None
        if text is None:
            raise SummaryUpstreamError(f"{where} answered no {self.dialect.name} text: {raw[:200]!r}")
        return text


def reply_tokens_for(memory: MemorySpan, room_tokens: int) -> int:
    """The reply a summary of ``memory`` is asked for: a little under the size its room was
    sized for (``MemorySpan.summary_tokens``; ``room_tokens``, the most room, when none was), in
    steps of ``MIN_REPLY_TOKENS`` (a few summarizers per conversation, not one per size)."""
    share = int((memory.summary_tokens or room_tokens) * REPLY_SHARE)
    return max(MIN_REPLY_TOKENS, share // MIN_REPLY_TOKENS * MIN_REPLY_TOKENS)


def _summary_failed(plan: Plan, detail: str) -> bool:
    return any(a.kind == "summary_failed" and a.detail == detail for a in plan.actions)


class Summaries:
    """The app's summary machinery: cache, one summarizer per summary API, model and upstream
    (bounded), background work."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: ModelResolver,
        vocabularies: Vocabularies,
        upstream: UpstreamClient,
        dialects: Mapping[str, Dialect],
        cache: SummaryCache | None = None,
        events: SummaryEvents | None = None,
    ) -> None:
        self.settings = settings
        self.dialects = dialects  # the app's registry: CTXPROXY_SUMMARY_API names one of them
        self.events = events
        self.registry = registry
        self.vocabularies = vocabularies
        self.upstream = upstream
        self.cache: SummaryCache = cache or cache_from_url(
            settings.cache_url, ttl_s=settings.cache_ttl_s, max_entries=settings.cache_max_entries
        )
        self._semaphore = asyncio.Semaphore(settings.summary_concurrency)
        self._backlog = Backlog(MAX_PENDING_SUMMARIES)
        # (summary API, model, upstream) -> its background worker, None when it cannot be made (so
        # that is logged once). Bounded: MAX_SUMMARIZERS, the least recently used idle one dropped
        # first (one with work in flight stays until it is idle, and the shared backlog allows at
        # most MAX_PENDING_SUMMARIES such); what it counted moves to _retired.
        self._ahead: OrderedDict[tuple[str, str, str], AheadOfTime | None] = OrderedDict()
        # Per registered API name (a closed set): the events, and the calls of dropped summarizers.
        self._events: dict[str, dict[str, int]] = {}
        self._retired: dict[str, dict[str, int]] = {}

    def wanted(self, policy: Policy, summarize: bool | None) -> bool:
        return summaries_wanted(policy, summarize, default=self.settings.summarize)

    def _count(self, api: str, event: str) -> None:
        counts = self._events.setdefault(api, dict.fromkeys(EVENTS, 0))
        counts[event] += 1

    def _call_hook(self, api: str) -> CallHook | None:
        events = self.events
        if events is None:
            return None

        def report(outcome: str, tokens_in: int, tokens_out: int) -> None:
            events.record_summary(api=api, outcome=outcome, tokens_in=tokens_in, tokens_out=tokens_out)

        return report

    def _looked_up(self, api: str, *, hit: bool) -> None:
        if self.events is not None:
            try:
                self.events.record_summary_cache(api=api, hit=hit)
            except Exception:  # reporting must never fail a request
                logger.debug("reporting a summary cache lookup failed", exc_info=True)

    def dialect_for(self, request: ProxyRequest) -> Dialect:
        """The wire API summaries of ``request`` are asked in (``CTXPROXY_SUMMARY_API`` or its own)."""
        name = self.settings.summary_api
        return self.dialects[name] if name else request.dialect

    def base_url_for(self, request: ProxyRequest) -> str:
        """The upstream that writes ``request``'s summaries (``CTXPROXY_SUMMARY_BASE_URL`` or the
        summary model's own)."""
        model = self.settings.summary_model or request.model
        return self.settings.summary_base_url or self.upstream.base_url_for(model)

    def ahead_for(
        self,
        request: ProxyRequest,
        *,
        reply_tokens: int,
        cap_tokens: int | None = None,
        room_tokens: int | None = None,
    ) -> tuple[AheadOfTime, SummaryJob] | None:
        """The background worker (and its summarizer) for ``request``'s summaries and the job its
        calls are sized and owned by; None if it cannot summarize (an unknown model, a window too
        small for the prompt). Summaries by the request's own model are sized with what the proxy
        knows of it now (the window it learned or discovered, the window this very request learned
        from a refusal, ``request.limits``, and in an emergency retry the cap the upstream's
        refusal set, ``cap_tokens``, and the input room of the request's own budget,
        ``room_tokens``: a summary call, prompt and reply, is no bigger than the input the proxy
        forwards for the model, which its upstream takes even where the window is only a learned
        bound; the counter it calibrated); another summary model by the model table. In an API
        whose window limits the input alone (``output_in_window`` False: Gemini) the prompt alone
        is held to that size, the reply is not counted in it."""
        dialect = self.dialect_for(request)
        model = self.settings.summary_model or request.model
        base_url = self.base_url_for(request)
        key = (dialect.name, model, base_url)
        if key in self._ahead and self._ahead[key] is None:
            return None
        try:
            if model == request.model:
                spec = request.spec
                # The tokenizer itself (calibrated when it is the estimate), not the request
                # counter's cache: a span cut into parts counts many long prefixes once each.
                count_text: Callable[[str], int] = request.counter.counter.count_text
                exact = request.counter.exact
            else:
                spec = self.registry.resolve(model)
                counter = self.vocabularies.counter_for(spec.encoding)
                count_text, exact = counter.count_text, counter.exact
        except Exception as exc:
            logger.warning(
                "summaries with model %r are not possible: %s: %.200s", model, type(exc).__name__, exc
            )
            self._keep(key, None)
            return None
        window = spec.window_tokens
        if model == request.model:
            learned = request.limits.window_tokens if request.limits is not None else None
            window = min(w for w in (window, learned, cap_tokens, room_tokens) if w is not None)
        window = window if exact else math.floor(window * (1 - ESTIMATE_MARGIN))
        reply = max(MIN_REPLY_TOKENS, min(reply_tokens, spec.max_output_tokens, window // 4))
        if not dialect.output_in_window:
            # Its window limits the input alone (Gemini's inputTokenLimit): the summary's prompt may
            # fill it, the reply is not counted against it (the summarizer keeps it off the window).
            window += reply
        job = SummaryJob(
            tenant=request.tenant,
            credential=self.upstream.credential_of(request.tenant),
            window_tokens=window,
            reply_tokens=reply,
            count_text=count_text,
        )
        problem = job.problem()
        if problem is not None:  # a request whose room is this small: the note stands in
            logger.debug("no summary for a %r request: %s", request.model, problem)
            return None
        ahead = self._ahead.get(key)
        if ahead is None:
            summarizer = Summarizer(
                UpstreamComplete(self.upstream, dialect=dialect, base_url=base_url),
                model=model,
                timeout_s=self.settings.summary_background_max_s,
                identity=f"{dialect.name} summaries by {model} at {base_url}",
                retry_after_s=self.settings.summary_retry_after_s,
                on_call=self._call_hook(dialect.name),
                pace=Pace(
                    floor_s=self.settings.summary_background_timeout_s,
                    ceiling_s=self.settings.summary_background_max_s,
                ),
            )
            ahead = AheadOfTime(
                summarizer,
                self.cache,
                max_concurrency=self.settings.summary_concurrency,
                lock_ttl_s=2 * self.settings.summary_background_max_s,
                semaphore=self._semaphore,
                backlog=self._backlog,
            )
        self._keep(key, ahead)
        return ahead, job

    def _keep(self, key: tuple[str, str, str], ahead: AheadOfTime | None) -> None:
        """``ahead`` as the most recently used of ``_ahead``, the bound enforced (see __init__)."""
        self._ahead[key] = ahead
        self._ahead.move_to_end(key)
        if len(self._ahead) <= MAX_SUMMARIZERS:
            return
        for old in list(self._ahead)[: len(self._ahead) - MAX_SUMMARIZERS]:
            found = self._ahead[old]
            if found is not None and found.in_flight:
                continue  # its tasks finish first: dropped when idle
            del self._ahead[old]
            if found is not None:
                retired = self._retired.setdefault(old[0], dict.fromkeys(COUNTERS, 0))
                for name in COUNTERS:
                    retired[name] += int(getattr(found.summarizer, name))

    def idle_for(self, request: ProxyRequest, plan: Plan) -> bool:
        """True when :meth:`refine` returns ``plan`` as it is without a look (summaries not
        wanted, or nothing forgotten and nothing to prepare): the caller need not await it."""
        if not self.wanted(request.policy, request.options.summarize):
            return True
        return plan.memory is None and plan.tokens_after <= self._ahead_threshold(plan)

    async def refine(
        self, request: ProxyRequest, plan: Plan, *, cap_tokens: int | None = None, writes: bool = True
    ) -> Plan:
        policy = request.policy
        if self.idle_for(request, plan):
            return plan  # the common case: nothing forgotten, nothing to prepare
        room = memory_tokens_for(plan.budget, policy)
        if room <= 0:
            return plan
        if not writes and (self.settings.summary_model or request.model) != request.model:
            writes = True  # another model writes the summaries: the refusal says nothing of its window
        token = _carried.set(request.headers)
        query_token = _carried_query.set(request.route.query)
        api = self.dialect_for(request).name
        try:
            budget = plan.budget
            sized = partial(
                self.ahead_for,
                request,
                cap_tokens=cap_tokens,
                room_tokens=budget.window_tokens - budget.reserve_tokens - budget.margin_tokens,
            )
            ready = True
            first = plan
            if plan.memory is not None:
                found = sized(reply_tokens=reply_tokens_for(plan.memory, room))
                if found is None:
                    return plan
                ahead, job = found
                plan, ready = await self._remembered(
                    request, plan, ahead, job, api=api, cap_tokens=cap_tokens, writes=writes
                )
            if writes and ready and plan.fits and plan.tokens_after > self._ahead_threshold(plan):
                await self._prepare_next(request, first, sized, room, api=api, cap_tokens=cap_tokens)
            return plan
        except Exception as exc:  # never fail a request because of compaction
            logger.warning("summaries skipped for this request: %s: %.200s", type(exc).__name__, exc)
            return plan
        finally:
            _carried.reset(token)
            _carried_query.reset(query_token)

    async def _remembered(
        self,
        request: ProxyRequest,
        plan: Plan,
        ahead: AheadOfTime,
        job: SummaryJob,
        *,
        api: str,
        cap_tokens: int | None,
        writes: bool = True,
    ) -> tuple[Plan, bool]:
        """``plan`` again with its memory's summary (or ``summary_failed``), and whether the
        summary was there; without ``writes``, only what the cache already holds."""
        assert plan.memory is not None and plan.source is not None
        summarizer = ahead.summarizer
        span = span_messages(plan.source, plan.memory)
        tenant = job.tenant
        key = summarizer.span_key(span, tenant)
        summary = await self.cache.get(key)
        self._looked_up(api, hit=bool(summary))
        if summary:
            self._count(api, "cached")
        elif await summarizer.blocked(key, self.cache, job) is not None:
            self._count(api, "backing_off")
        elif not writes:
            self._count(api, "failed")
        else:
            self._count(api, "waited")
            ahead.schedule(span, job)
            wait_s = self.settings.summary_timeout_s
            expected_s = summarizer.pace.expected_s if summarizer.pace is not None else None
            if expected_s is not None and expected_s > wait_s:
                wait_s = 0.0  # this summarizer's answers take longer than the wait: none comes in it
            traffic = self.upstream.traffic
            if traffic is not None and traffic.busy(self.base_url_for(request)):
                # An upstream with few slots that a client request holds (this one's own place:
                # ``Service.run``): the summary call goes after it, so none comes in the wait.
                wait_s = 0.0
            summary = await ahead.wait_for(span, tenant, wait_s)
            if not summary:
                self._count(api, "failed")
                if ahead.running(span, tenant):  # a failure was logged by the summarizer, with its cause
                    logger.info(
                        "no summary of %d cut messages within %ss (still being written); the note "
                        "stands in for this request",
                        len(span),
                        wait_s,
                    )
        mapping = {key: summary} if summary else {}
        lengths = [len(span)]
        if not summary:
            # The summary of an earlier, shorter span (an earlier cut step's, the longest its chain
            # has) stands in: a late summary never takes away the memory the conversation had.
            length, earlier = await summarizer.longest_summarized(span, self.cache, tenant)
            if earlier:
                mapping[summarizer.span_key(span[:length], tenant)] = earlier
                lengths.append(length)
                self._count(api, "earlier")
        provider = PrefetchedSummaries(
            mapping, summarizer_model=summarizer.model, tenant=tenant, lengths=lengths
        )
        replanned = await run_plan(
            partial(request.plan, cap_tokens=cap_tokens, summaries=provider), size_bytes=len(request.raw)
        )
        if summary and _summary_failed(replanned, "summary too large to fit"):
            self._count(api, "too_large")
            logger.warning("the summary of %d cut messages does not fit; forwarding with the note", len(span))
        return replanned, bool(summary)

    async def _prepare_next(
        self,
        request: ProxyRequest,
        plan: Plan,
        sized: Callable[..., tuple[AheadOfTime, SummaryJob] | None],
        room: int,
        *,
        api: str,
        cap_tokens: int | None,
    ) -> None:
        """Summarize in the background what the next cut will forget (``plan``: this request's
        plan without a provider; ``sized(reply_tokens=)``: the worker for a summary of that size
        and its job)."""
        tools = cut_tool_tokens(
            request.body,
            request.conversation,
            dialect=request.dialect,
            policy=request.policy,
            counter=request.counter,
        )
        headroom = next_cut_headroom(plan, request.policy, cut_tool_tokens=tools)
        upcoming = await run_plan(
            partial(request.plan, cap_tokens=cap_tokens, headroom_tokens=headroom),
            size_bytes=len(request.raw),
        )
        if upcoming.memory is None or upcoming.source is None:
            return
        if plan.memory is not None and upcoming.memory.indices == plan.memory.indices:
            return
        found = sized(reply_tokens=reply_tokens_for(upcoming.memory, room))
        if found is None:
            return
        ahead, job = found
        span = span_messages(upcoming.source, upcoming.memory)
        key = ahead.summarizer.span_key(span, job.tenant)
        if await self.cache.get(key) or await ahead.summarizer.blocked(key, self.cache, job) is not None:
            return
        if ahead.schedule(span, job):
            self._count(api, "ahead")

    def _ahead_threshold(self, plan: Plan) -> float:
        return self.settings.summary_ahead_ratio * request_budget_tokens(plan.budget)

    def stats(self) -> dict[str, Any]:
        """Counters per wire API of the summary calls, their totals, background work, the cache."""
        by_api: dict[str, dict[str, int]] = {}

        def counts_of(api: str) -> dict[str, int]:
            return by_api.setdefault(api, {**dict.fromkeys(COUNTERS, 0), **dict.fromkeys(EVENTS, 0)})

        in_flight = 0
        for (api, _, _), ahead in self._ahead.items():
            if ahead is None:
                continue
            counts = counts_of(api)
            for name in COUNTERS:
                counts[name] += int(getattr(ahead.summarizer, name))
            in_flight += ahead.in_flight
        for table in (self._retired, self._events):
            for api, values in table.items():
                counts = counts_of(api)
                for name, value in values.items():
                    counts[name] += value
        totals = {name: sum(c[name] for c in by_api.values()) for name in (*COUNTERS, *EVENTS)}
        traffic = self.upstream.traffic
        return {
            **totals,
            "by_api": by_api,
            "in_flight": in_flight,
            # Summary calls a client request cancelled (sent again after it: not failures), and
            # those given up after being cancelled too often (their spans back off).
            "preempted": traffic.preempted if traffic is not None else 0,
            "abandoned": traffic.abandoned if traffic is not None else 0,
            "cache": self.cache.stats().as_dict(),
        }

    async def aclose(self) -> None:
        for ahead in self._ahead.values():
            if ahead is not None:
                await ahead.aclose()
        await self.cache.aclose()


__all__ = [
    "Summaries",
    "SummaryUpstreamError",
    "UpstreamComplete",
    "carried_headers",
    "carried_query",
]
