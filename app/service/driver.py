"""Where the budget engine meets the upstream: resolve, plan, send, classify, maybe retry.

``Service.handle_chat(raw, headers, *, options) -> ChatOutcome`` is the whole chat path:

1. parse the body (bad JSON, a non-object body or a bad ``model`` -> ``InvalidRequest``);
2. resolve the model (``X-Context-Window`` overrides the window) and build the policy from the
   settings refined by the request's ``X-Context-*`` options;
3. plan with ``app.core.fit.plan_request``; a plan that does not fit raises ``CannotFit`` (the
   ``off`` policy never fails). A large body is planned in a worker thread, and one that
   ``app.core.ceiling`` proves fits is sent first and planned meanwhile (``app.service.fastpath``); the
   exact plan is always ready before the outcome is returned;
4. send: the client's *original bytes* when the plan did not change anything, else the plan's
   body serialized once;
5. when the upstream answers with an error status (always before the first body byte, streaming
   or not), classify it; a context overflow is re-planned with the retry cap sized from the
   error's numbers and resent, at most ``MAX_RETRIES`` times; any other answer, and the last
   overflow, goes back to the client as is.

The caller owns the returned upstream response and must close it. Nothing here knows HTTP
frameworks; the API layer renders errors and responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..core.budget import Policy
from ..core.ceiling import surely_fits
from ..core.errors import CannotFit, InvalidRequest
from ..core.fit import SummaryProvider, plan_request
from ..core.overflow import ContextOverflow, classify_overflow
from ..core.plan import Plan
from ..core.registry import ModelSpec
from ..core.retry import MAX_RETRIES, retry_cap_tokens
from ..core.tokens import MessageCounter
from ..settings import Settings
from ..upstream.client import UpstreamClient, UpstreamResponse
from ..upstream.headers import Header
from .fastpath import OFFLOAD_MIN_BYTES, abandon_plan, finish_plan, run_plan, start_plan
from .learning import Learner
from .ports import CHAT_PATH, REQUIRED_ENCODINGS, ModelResolver, Vocabularies
from .report import request_budget_tokens
from .request import RequestOptions, dump_body, parse_body

if TYPE_CHECKING:
    from .summaries import Summaries


@dataclass(frozen=True, slots=True)
class ChatOutcome:
    """The answer to one chat request: the final plan, the upstream's response, the retries.

    ``response`` is open (body unread for a streamed success, already read otherwise) and
    must be closed by the caller. ``warnings`` are ``X-Context-Warning`` values
    (``upstream-truncated``, see ``app.service.learning``).
    """

    plan: Plan
    response: UpstreamResponse
    retries: int
    stream: bool
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Readiness:
    """``ready`` when every required vocabulary is loaded and every upstream gave an HTTP answer."""

    vocabularies: tuple[str, ...]
    vocabularies_ready: bool
    upstreams: Mapping[str, int | None]

    @property
    def ready(self) -> bool:
        return self.vocabularies_ready and all(status is not None for status in self.upstreams.values())


class PlanCannotFit(CannotFit):
    """``CannotFit`` raised by the service, carrying the plan (the API adds its X-Context-* headers)."""

    def __init__(self, plan: Plan, *, reason: str) -> None:
        self.plan = plan
        super().__init__(
            tokens=plan.tokens_after,
            budget_tokens=request_budget_tokens(plan.budget),
            window_tokens=plan.budget.window_tokens,
            reserve_tokens=plan.budget.reserve_tokens,
            reason=reason,
        )


class Service:
    """The proxy's state and chat path; one per app (``app.state.service``), no globals.

    Keeps one :class:`MessageCounter` per encoding for the app's life (their caches are per
    instance).
    """

    def __init__(
        self,
        *,
        settings: Settings,
        registry: ModelResolver,
        vocabularies: Vocabularies,
        upstream: UpstreamClient,
        required_encodings: Sequence[str] = REQUIRED_ENCODINGS,
        summaries: Summaries | None = None,
        learner: Learner | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.vocabularies = vocabularies
        self.upstream = upstream
        self.required_encodings = tuple(required_encodings)
        self._policy = settings.fit_policy()
        self._counters: dict[str, MessageCounter] = {}
        self.summaries = summaries
        self.learner = learner if learner is not None else Learner()

    def counter(self, encoding: str) -> MessageCounter:
        counter = self._counters.get(encoding)
        if counter is None:
            counter = self._counters[encoding] = MessageCounter(self.vocabularies.counter_for(encoding))
        return counter

    def policy(self, options: RequestOptions) -> Policy:
        return self._policy.refined(
            mode=options.mode,
            keep_turns=options.keep_turns,
            reserve_tokens=options.reserve_tokens,
            cut_target=options.cut_target,
        )

    def resolve(self, body: Mapping[str, Any], options: RequestOptions) -> ModelSpec:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' must be a non-empty string naming the model.", param="model")
        spec = self.registry.resolve(model)
        return self.learner.effective(spec, header_window_tokens=options.window_tokens)

    def counter_for_spec(self, spec: ModelSpec) -> MessageCounter:
        """The counter to plan ``spec`` with (per model, calibrated, for the estimate)."""
        return self.learner.counter(spec, self.counter)

    def plan(
        self,
        body: Mapping[str, Any],
        options: RequestOptions,
        *,
        cap_tokens: int | None = None,
        summaries: SummaryProvider | None = None,
    ) -> Plan:
        """The plan for ``body`` (no I/O); ``InvalidRequest`` on bad messages. Never raises
        ``CannotFit``: the dry run reports ``fits=False``. ``summaries`` (with ``policy.summarize``)
        puts LLM summaries in place of dropped spans."""
        spec = self.resolve(body, options)
        caps = [c for c in (options.budget_tokens, cap_tokens) if c is not None]
        policy = self.policy(options)
        plan = plan_request(
            body,
            spec=spec,
            policy=replace(policy, summarize=True) if summaries is not None else policy,
            counter=self.counter_for_spec(spec),
            cap_tokens=min(caps) if caps else None,
            summaries=summaries,
        )
        return replace(plan, count_kind="calibrated") if self.learner.calibrated(spec) else plan

    async def summarized(
        self,
        body: Mapping[str, Any],
        options: RequestOptions,
        plan: Plan,
        headers: Sequence[Header],
        *,
        cap_tokens: int | None = None,
    ) -> Plan:
        """``plan`` with LLM summaries in place of its dropped spans when they are on
        (``app.service.summaries``)."""
        if self.summaries is None:
            return plan
        return await self.summaries.refine(
            body,
            plan,
            policy=self.policy(options),
            summarize=options.summarize,
            counter=self.counter_for_spec(plan.spec),
            headers=headers,
            replan=lambda provider: self.plan(body, options, cap_tokens=cap_tokens, summaries=provider),
        )

    def models_report(self) -> list[dict[str, Any]]:
        """What the proxy knows about every model it has seen or discovered (``app.service.learning``)."""
        return self.learner.report(self.registry.resolve)

    def plan_raw(self, raw: bytes, options: RequestOptions) -> Plan:
        return self.plan(parse_body(raw), options)

    def surely_fits(self, body: Mapping[str, Any], options: RequestOptions) -> bool:
        """True when the exact plan is certain to fit unchanged (``app.core.ceiling``; exact
        counters only); validates the model and messages like :meth:`plan`."""
        spec = self.resolve(body, options)
        if not self.counter_for_spec(spec).exact:
            return False
        return surely_fits(body, spec=spec, policy=self.policy(options), cap_tokens=options.budget_tokens)

    def counting_size(self, body: Mapping[str, Any], options: RequestOptions, *, size_bytes: int) -> int:
        """What planning ``body`` may cost, in bytes: all of it, or only the tail of a conversation
        the counter remembers (a resent history: cheap to plan inline, nothing to gain early)."""
        messages = body.get("messages")
        if size_bytes < OFFLOAD_MIN_BYTES or not isinstance(messages, list):
            return size_bytes
        tail = self.counter_for_spec(self.resolve(body, options)).unremembered_chars(messages)
        return size_bytes if tail is None else tail

    async def handle_chat(
        self, raw: bytes, headers: Sequence[Header], *, options: RequestOptions
    ) -> ChatOutcome:
        """Plan and send one chat-completions request; see the module docstring.

        Raises ``InvalidRequest``, ``CannotFit`` or an ``UpstreamError``.
        """
        body = parse_body(raw)
        model = body.get("model")
        if isinstance(model, str) and model:
            await self.learner.discover(model, self.upstream.base_url_for(model))
        plan: Plan | None = None
        pending: asyncio.Future[Plan] | None = None
        size = self.counting_size(body, options, size_bytes=len(raw))
        if size >= OFFLOAD_MIN_BYTES and self.surely_fits(body, options):
            # Fast path (app.service.fastpath): forward now, finish the exact count meanwhile.
            pending = start_plan(partial(self.plan, body, options))
        else:
            first = await run_plan(partial(self.plan, body, options), size_bytes=size)
            plan = await self.summarized(body, options, first, headers)
            policy = self.policy(options)
            if not plan.fits and policy.mode != "off":
                raise self._cannot_fit(plan, policy)
        stream = body.get("stream") is True
        base_url = self.upstream.base_url_for(str(body["model"]))
        retries = 0
        while True:
            content = dump_body(plan.body(body)) if plan is not None and plan.changed else raw
            try:
                response = await self.upstream.send(
                    "POST", CHAT_PATH, content=content, headers=headers, stream=True, base_url=base_url
                )
            except BaseException:
                abandon_plan(pending)
                raise
            if plan is None:
                assert pending is not None
                plan = await finish_plan(pending, response)
                # Nothing is cut here; this only lets summaries prepare the next cut.
                plan = await self.summarized(body, options, plan, headers)
            if response.status_code < 400 or retries >= MAX_RETRIES:
                return await self._outcome(plan, body, response, retries=retries, stream=stream)
            try:
                retry_plan = await self._retry_plan(
                    response, body, plan, options, headers, size_bytes=len(raw)
                )
            except BaseException:  # cancelled (client gone, shutdown) or failed: nobody else closes it
                await response.aclose()
                raise
            if retry_plan is None:
                return await self._outcome(plan, body, response, retries=retries, stream=stream)
            await response.aclose()
            plan, retries = retry_plan, retries + 1

    async def _outcome(
        self, plan: Plan, body: Mapping[str, Any], response: UpstreamResponse, *, retries: int, stream: bool
    ) -> ChatOutcome:
        """The outcome, after the learner has seen the response (usage, silent truncation)."""
        try:
            observed, warnings = await self.learner.observe(
                response,
                model=plan.model,
                counter=self.counter_for_spec(plan.spec),
                forwarded=plan.body(body) if plan.changed else body,
                stream=stream,
                window_tokens=None if plan.spec.guessed else plan.budget.window_tokens,
                forwarded_tokens=plan.tokens_after,
            )
        except BaseException:
            await response.aclose()
            raise
        return ChatOutcome(plan=plan, response=observed, retries=retries, stream=stream, warnings=warnings)

    async def _retry_plan(
        self,
        response: UpstreamResponse,
        body: Mapping[str, Any],
        plan: Plan,
        options: RequestOptions,
        headers: Sequence[Header] = (),
        *,
        size_bytes: int = 0,
    ) -> Plan | None:
        """The smaller plan to resend after a context overflow, or None to return the error.

        Reads the (small) error body; the response stays replayable for the client.
        """
        await response.aread()
        overflow = classify_overflow(response.status_code, response.decoded_body())
        if overflow is None:
            return None
        try:
            return await self._retry_from(overflow, body, plan, options, headers, size_bytes=size_bytes)
        finally:
            # Learned after sizing the retry (which has its own arithmetic), used from the next request on.
            self.learner.learn_from_overflow(
                plan.model,
                overflow,
                counter=self.counter_for_spec(plan.spec),
                forwarded=plan.body(body) if plan.changed else body,
            )

    async def _retry_from(
        self,
        overflow: ContextOverflow,
        body: Mapping[str, Any],
        plan: Plan,
        options: RequestOptions,
        headers: Sequence[Header],
        *,
        size_bytes: int,
    ) -> Plan | None:
        cap = retry_cap_tokens(overflow=overflow, sent_tokens=plan.tokens_after, budget=plan.budget)
        if cap is None:
            return None
        retry = await run_plan(partial(self.plan, body, options, cap_tokens=cap), size_bytes=size_bytes)
        retry = await self.summarized(body, options, retry, headers, cap_tokens=cap)
        # A retry that is not smaller than what the upstream just refused cannot help.
        if not retry.fits or not retry.changed or retry.tokens_after >= plan.tokens_after:
            return None
        return retry

    @staticmethod
    def _cannot_fit(plan: Plan, policy: Policy) -> PlanCannotFit:
        reason = (
            "the context policy is 'reject', so the proxy does not shorten conversations"
            if policy.mode == "reject"
            else "shortening the conversation as far as the policy allows does not bring it under"
        )
        return PlanCannotFit(plan, reason=reason)

    async def passthrough(
        self,
        method: str,
        path: str,
        *,
        query: str,
        headers: Sequence[Header],
        content: bytes | AsyncIterable[bytes] | None,
        content_length: int | None = None,
        model: str | None = None,
    ) -> UpstreamResponse:
        """Forward any other ``/v1/{path}`` request untouched (routed by ``model`` when known)."""
        return await self.upstream.send(
            method,
            path,
            content=content,
            headers=headers,
            stream=True,
            base_url=self.upstream.base_url_for(model),
            query=query,
            content_length=content_length,
        )

    async def readiness(self) -> Readiness:
        loaded = tuple(self.vocabularies.loaded_encodings())
        bases = self.upstream.base_urls()
        timeout_s = self.settings.readiness_timeout_s
        statuses = await asyncio.gather(*(self.upstream.probe(b, timeout_s=timeout_s) for b in bases))
        return Readiness(
            vocabularies=loaded,
            vocabularies_ready=all(name in loaded for name in self.required_encodings),
            upstreams=dict(zip(bases, statuses, strict=True)),
        )
