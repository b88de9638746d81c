"""Where the budget engine meets the upstream: the short driver of a request's exchange.

``Service`` is the ``app.service.planner.Planner`` of the app with an upstream.
``Service.handle(raw, headers, *, options, route) -> Outcome`` is the whole path of one request of
any wire API (``route``: the matched ``app.core.routes.RouteMatch``, its dialect and path
parameters; ``RouteMatch.first(dialect)`` for a dialect's first route):

1. parse the body (bad JSON, a non-object body or a bad model -> ``InvalidRequest``);
2. make the request value once (``Service.prepare`` -> ``Planner.request``): the model
   (``Dialect.model_of``: the body's or the path's) resolved and refined by the dialect
   (``refine_spec``; ``X-Context-Window`` overrides the window), the policy refined by the
   request's ``X-Context-*`` options, the counter, the dialect's neutral conversation;
3. decide (``Service.decide``: ``app.service.decision``, the one decision of every door: the
   plan, the boundary's refinements, the memory); a plan that does not fit raises ``CannotFit``
   (the ``off`` policy never fails). A large body is planned in a worker thread, and one that
   ``app.core.ceiling`` proves fits, and that the boundary keeps as it is, is sent first and
   planned meanwhile (``app.service.fastpath``: a large body in a worker thread, a small one on
   the event loop while the upstream works); the exact plan is always ready before the outcome is
   returned;
4. send: the client's *original bytes* when the plan did not change anything, else the plan's
   body serialized once, to where the route says (``RouteMatch.target``), with the client's
   query string, the operator's key in the dialect's first key slot;
5. when the upstream answers with an error status (always before the first body byte, streaming
   or not), classify it; a context overflow is re-planned with the retry cap sized from the
   error's numbers and resent, at most ``MAX_RETRIES`` times; any other answer, and the last
   overflow, goes back to the client as is.

Every decision in 3-5 is ``app.core.exchange.Exchange``'s (pure, tested with scripted events);
``Service.run`` only does what its commands say.

The caller owns the returned upstream response and must close it. Nothing here knows HTTP
frameworks; the API layer renders errors and responses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..core.body_memo import BodyMemo
from ..core.ceiling import fitting_ceiling
from ..core.exchange import Command, Deliver, Exchange, Fail, Replan, Send
from ..core.overflow import ContextOverflow
from ..core.plan import Plan
from ..core.reuse import PrefixMemory, PrefixReuse
from ..core.routes import KeySlot, RouteMatch
from ..core.tenant import tenant_of
from ..settings import Settings
from ..upstream.client import UpstreamClient, UpstreamResponse
from ..upstream.headers import Header
from .boundary import build_boundary
from .decision import decide
from .fastpath import OFFLOAD_MIN_BYTES, Pending, abandon_plan, finish_plan, plan_soon, run_plan, start_plan
from .learning import Learner
from .outcome import Ahead, Outcome, PlanCannotFit, Readiness, Render
from .peek import is_event_stream, read_preamble
from .planner import Planner
from .ports import REQUIRED_ENCODINGS, ModelResolver, Vocabularies
from .request import Forwarded, ProxyRequest, RequestOptions, dump_body, parse_body


def identity_encoded(headers: Sequence[Header]) -> tuple[Header, ...]:
    """``headers`` asking for an uncompressed answer: a plan that offers ``ctx_recall`` has its
    answer read (and a stream edited) by the proxy."""
    return (*(h for h in headers if h[0].lower() != "accept-encoding"), ("Accept-Encoding", "identity"))

if TYPE_CHECKING:
    from .recall import Recall
    from .summaries import Summaries


class Service(Planner):
    """The proxy's state and request path; one per app (``app.state.service``), no globals.

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
        recall: Recall | None = None,
    ) -> None:
        learner = learner if learner is not None else Learner()
        policy = settings.fit_policy()
        super().__init__(
            # Without a Recall nothing would answer the tool's calls: recall stays off.
            policy=policy if recall is not None else replace(policy, recall="off"),
            registry=registry,
            vocabularies=vocabularies,
            # Near the boundary: exact counts, lowered output caps, anchors (app.service.boundary).
            boundary=build_boundary(settings, learner=learner, upstream=upstream),
            summarize=settings.summarize if summaries is not None else None,
            base_url_for=upstream.base_url_for,
            recall=recall is not None,
        )
        self.settings = settings
        self.upstream = upstream
        self.required_encodings = tuple(required_encodings)
        self.summaries = summaries
        self.recall = recall
        self.prefixes = PrefixMemory()
        # Recent bodies: a resent one is parsed only where it changed (its history's newest end).
        self.bodies = BodyMemo()

    # -- the request value --------------------------------------------------------------------

    async def prepare(
        self, raw: bytes, headers: Sequence[Header], *, options: RequestOptions, route: RouteMatch
    ) -> ProxyRequest:
        """Parse ``raw``, learn about a model seen for the first time (``Learner.discover``), and
        make the request value."""
        body = parse_body(raw, memo=self.bodies, key=route.dialect.items_key)
        model = route.dialect.model_of(body, route.params)
        tenant = tenant_of(headers, route.query, route.dialect.key_slots)
        await self.learner.discover(model, self.upstream.base_url_for(model), tenant=tenant)
        return self.request(body, options, raw=raw, headers=headers, route=route, model=model, tenant=tenant)

    def count(
        self, raw: bytes, options: RequestOptions, *, route: RouteMatch, headers: Sequence[Header] = ()
    ) -> tuple[ProxyRequest, Plan] | None:
        """Our count of a request as its upstream would count its input (``Plan.tokens_before``,
        ``Plan.count_kind``) with the request value it was made from, for the counting endpoints;
        None when the conversation is not all here (its history lives upstream). Plans under
        policy ``off``: counts, changes nothing."""
        request = self.request(
            parse_body(raw), replace(options, mode="off"), raw=raw, headers=headers, route=route
        )
        if not request.conversation.fittable:
            return None
        return request, request.plan()

    def learn_from_count(self, request: ProxyRequest, plan: Plan, input_tokens: int) -> bool:
        """The upstream's own count of ``request`` (its counting endpoint answered ``input_tokens``)
        calibrates the model's estimate, as a response's usage would. True when it did."""
        return self.learner.learn_from_count(
            plan.model,
            input_tokens,
            tenant=request.tenant,
            counter=request.counter,
            counted=Forwarded.of(request, plan).counted,
        )

    def models_report(self, *, tenant: str) -> list[dict[str, Any]]:
        """What the proxy knows about every model it discovered or ``tenant`` used
        (``app.service.learning``)."""
        return self.learner.report(self.registry.resolve, tenant=tenant)

    # -- the request path ---------------------------------------------------------------------

    async def summarized(
        self, request: ProxyRequest, plan: Plan, *, cap_tokens: int | None = None, writes: bool = True
    ) -> Plan:
        """``plan`` with LLM summaries in place of its dropped spans when they are on
        (``app.service.summaries``); without ``writes`` (an emergency retry: the upstream just
        refused what it was sent, so the window a summary call must fit is a guess), only summaries
        already made."""
        if self.summaries is None:
            return plan
        return await self.summaries.refine(request, plan, cap_tokens=cap_tokens, writes=writes)

    def surely_fits(self, request: ProxyRequest) -> bool:
        """True when the decision is certain to forward the request unchanged without counting
        it: the ceiling (``app.core.ceiling``; exact counters only) fits the budget and the
        boundary keeps a request of that size as it is (``Boundary.keeps``)."""
        if not request.counter.exact or not request.conversation.fittable:
            return False
        if request.policy.mode == "off":  # forwarded unchanged whatever it counts
            return True
        ceiling = fitting_ceiling(
            request.body,
            request.conversation,
            dialect=request.dialect,
            spec=request.spec,
            policy=request.policy,
            cap_tokens=request.options.budget_tokens,
            limits=request.limits,
        )
        return ceiling is not None and self.boundary.keeps(request, ceiling.tokens, ceiling.budget)

    async def decide(
        self, request: ProxyRequest, *, size_bytes: int | None = None
    ) -> tuple[ProxyRequest, Plan]:
        """The one decision (``app.service.decision``) with the proxy's I/O: the request with the
        limits its plan was made under, and the plan (``fits`` False: refused). ``size_bytes``:
        what planning it may cost, when its body did not come as ``request.raw``."""
        size = self.counting_size(request) if size_bytes is None else size_bytes
        return await decide(request, boundary=self.boundary, summaries=self.summaries, size_bytes=size)

    @staticmethod
    def counting_size(request: ProxyRequest) -> int:
        """What planning the request may cost, in bytes: all of it, or only the tail of a
        conversation the counter remembers (a resent history: cheap to plan inline)."""
        size_bytes = len(request.raw)
        if size_bytes < OFFLOAD_MIN_BYTES:
            return size_bytes
        tail = request.counter.unremembered_chars(request.conversation.messages)
        return size_bytes if tail is None else tail

    async def handle(
        self,
        raw: bytes,
        headers: Sequence[Header],
        *,
        options: RequestOptions,
        route: RouteMatch,
        render: Render | None = None,
    ) -> Outcome:
        """Plan and send one request of ``route``; see the module docstring.
        ``render(plan, prefix_reuse)``: what the caller will make of the answered plan (its
        response headers), made on the fast path while the upstream works and given back as
        ``Outcome.rendered`` when that plan is answered as it was.

        Raises ``InvalidRequest``, ``CannotFit`` or an ``UpstreamError``.
        """
        request = await self.prepare(raw, headers, options=options, route=route)
        outcome = await self.run(request, render=render)
        if outcome.plan.recall and self.recall is not None:
            # What the cut removed is kept for ctx_recall; the tool's calls are answered here.
            self.recall.remember(request, outcome.plan)
            outcome = await self.recall.settle(self, request, outcome)
        return outcome

    def continued(self, request: ProxyRequest, body: Mapping[str, Any]) -> ProxyRequest:
        """``request`` continued with ``body`` (the same route, options, headers and what it learned),
        for the recall rounds (``app.service.recall``)."""
        continued = self.request(
            body,
            request.options,
            raw=dump_body(body),
            headers=request.headers,
            route=request.route,
            model=request.model,
        )
        return replace(continued.limited(request.limits), round=request.round + 1)

    async def run(self, request: ProxyRequest, *, render: Render | None = None) -> Outcome:
        """Drive the request's ``Exchange``: do what each command says, feed back what happened.

        The request holds its place at its upstream from its decision on (``Traffic.client``; each
        send holds its own until its response is closed): on an upstream with few slots, a summary
        call in flight gives way now (the upstream lets go of it while the request is planned), none
        goes out while it is decided, and it does not wait in line for its own summary
        (``app.service.summaries``: that call would only go after it)."""
        traffic = self.upstream.traffic
        place = traffic.client(request.base_url) if traffic is not None else None
        try:
            return await self._run(request, render=render)
        finally:
            if place is not None:
                place.release()

    async def _run(self, request: ProxyRequest, *, render: Render | None) -> Outcome:
        exchange = Exchange(
            dialect=request.dialect,
            mode=request.policy.mode,
            policy=request.policy,
            requested_output_tokens=request.conversation.requested_output_tokens,
        )
        size_bytes = self.counting_size(request)
        pending: Pending | None = None
        command: Command
        # Fast path (app.service.fastpath): a body the ceiling proves fits goes now and its exact
        # count is finished meanwhile: a large new one's in a thread, a small one's on the loop
        # while the upstream works (a resent large body is cheap to plan: no ceiling walk).
        small = len(request.raw) < OFFLOAD_MIN_BYTES
        ahead: list[Ahead] = []
        if (small or size_bytes >= OFFLOAD_MIN_BYTES) and self.surely_fits(request):
            plan_ahead = partial(self._plan_ahead, request, ahead, render)
            pending = plan_soon(plan_ahead) if small else start_plan(plan_ahead)
            command = exchange.start_unplanned()
        else:
            request, plan = await self.decide(request)
            command = exchange.start(plan)
        response: UpstreamResponse | None = None
        # Made by the first ``Send`` (``start`` answers ``Send`` or ``Fail``; ``Deliver`` and
        # ``Replan`` only follow an answer): not priced before it is needed.
        forwarded: Forwarded | None = None
        while True:
            if isinstance(command, Fail):
                raise PlanCannotFit(command.plan, reason=command.reason)
            if isinstance(command, Deliver):
                assert response is not None and exchange.plan is not None and forwarded is not None
                if command.overflow is not None:
                    self._learn(request, command.overflow, forwarded, exchange.plan)
                if command.proven_window_tokens is not None and request.conversation.fittable:
                    self.learner.learn_proven_window(
                        request.model, command.proven_window_tokens, tenant=request.tenant
                    )
                return await self._outcome(
                    request, exchange, forwarded, response, ahead=ahead[0] if ahead else None
                )
            if isinstance(command, Send):
                if response is not None:
                    await response.aclose()
                if command.plan is None:  # the fast path: the client's bytes, the plan made meanwhile
                    response, command = await self._send(request, exchange, request.raw, pending)
                    assert exchange.plan is not None  # finished by _send before any answer is read
                    forwarded = Forwarded.sent_first(request, exchange.plan)
                else:
                    forwarded = Forwarded.of(request, command.plan)
                    headers = identity_encoded(request.headers) if command.plan.recall_tool else None
                    response, command = await self._send(
                        request, exchange, forwarded.content, pending, headers=headers
                    )
                pending = None
                continue
            assert response is not None and exchange.plan is not None and forwarded is not None
            sent = exchange.plan
            request = request.limited(command.limits)
            try:
                retry = await run_plan(
                    partial(request.plan, cap_tokens=command.cap_tokens), size_bytes=len(request.raw)
                )
                retry = await self.summarized(request, retry, cap_tokens=command.cap_tokens, writes=False)
            except BaseException:  # cancelled (client gone, shutdown) or failed: nobody else closes it
                await response.aclose()
                raise
            finally:
                # Learned after sizing the retry (which has its own arithmetic); used from the next
                # request on.
                self._learn(request, command.overflow, forwarded, sent)
            command = exchange.replanned(retry)

    def _plan_ahead(self, request: ProxyRequest, ahead: list[Ahead], render: Render | None) -> Plan:
        """The fast path's plan, made while the upstream works, with what a prompt cache could
        reuse of it (the prefix memory remembers it as sent, which it is) and the caller's
        rendering of both: none of them waits for the answer, so the answer's way to the client
        is shorter by all three."""
        plan = request.plan()
        reuse = self._prefix_reuse(request, plan)
        ahead.append(Ahead(plan, reuse, None if render is None else render(plan, reuse)))
        return plan

    def _prefix_reuse(self, request: ProxyRequest, plan: Plan) -> PrefixReuse:
        # What an upstream prompt cache could reuse: the previous forwarded request of this
        # client's conversation, compared message by message (``X-Context-Prefix-Reuse``).
        return self.prefixes.observe(
            plan.messages, plan.message_tokens, model=plan.model, api=plan.api, tenant=request.tenant
        )

    async def _send(
        self,
        request: ProxyRequest,
        exchange: Exchange,
        content: bytes,
        pending: Pending | None,
        *,
        headers: Sequence[Header] | None = None,
    ) -> tuple[UpstreamResponse, Deliver | Replan]:
        """Send ``content`` (with ``headers``, else the request's); finish a fast-path plan; read an
        error answer the exchange wants."""
        target = request.route.target
        try:
            response = await self.upstream.send(
                "POST",
                target.path,
                content=content,
                headers=request.headers if headers is None else headers,
                stream=True,
                base_url=request.base_url,
                query=request.route.query,
                key_slot=request.route.key_slot,
                at_origin=target.at_origin,
            )
        except BaseException:
            abandon_plan(pending)
            raise
        if pending is not None:
            plan = await finish_plan(pending, response)
            if self.summaries is not None and not self.summaries.idle_for(request, plan):
                try:
                    # Nothing is cut here; this only lets summaries prepare the next cut.
                    plan = await self.summarized(request, plan)
                except BaseException:  # cancelled: nobody else closes it
                    await response.aclose()
                    raise
            exchange.sent(plan)
        body: bytes | None = None
        if exchange.reads_answer(response.status_code):
            try:
                await response.aread()  # small; the response stays replayable for the client
            except BaseException:
                await response.aclose()
                raise
            body = response.decoded_body()
        elif self._peeks(request, exchange, response):
            # An API that may report the overflow inside a 200 stream (app.core.preamble).
            try:
                response, head = await read_preamble(response, request.dialect.preamble_events)
            except BaseException:
                await response.aclose()
                raise
            return response, exchange.answered_stream(head)
        return response, exchange.answered(response.status_code, body)

    @staticmethod
    def _peeks(request: ProxyRequest, exchange: Exchange, response: UpstreamResponse) -> bool:
        return (
            request.stream
            and response.status_code == 200
            and bool(request.dialect.preamble_events)
            and exchange.peeks()
            and is_event_stream(response)
        )

    def _learn(
        self, request: ProxyRequest, overflow: ContextOverflow, forwarded: Forwarded, sent: Plan
    ) -> None:
        if not request.conversation.fittable:
            return  # the upstream counted a history we never saw: its numbers are not about ours
        self.learner.learn_from_overflow(
            request.model,
            overflow,
            tenant=request.tenant,
            counter=request.counter,
            forwarded=forwarded.counted,
            sent_tokens=sent.tokens_after,
            output_tokens=sent.output_cap_tokens or request.conversation.requested_output_tokens,
        )

    async def _outcome(
        self,
        request: ProxyRequest,
        exchange: Exchange,
        forwarded: Forwarded,
        response: UpstreamResponse,
        *,
        ahead: Ahead | None = None,
    ) -> Outcome:
        """The outcome, after the learner has seen the response (usage, silent truncation);
        ``ahead``: the fast path's plan, its prefix reuse and rendering, made while the upstream
        worked (used when that plan is the one answered, the rendering when nothing was added to
        it: no retry, no warning)."""
        plan = exchange.plan
        assert plan is not None
        if not request.conversation.fittable:
            # The upstream counts a history we never saw: its usage says nothing about our counts.
            return Outcome(
                plan=plan,
                response=response,
                retries=exchange.retries,
                stream=request.stream,
                warnings=plan.warnings,
            )
        try:
            observed, warnings = await self.learner.observe(
                response,
                model=plan.model,
                tenant=request.tenant,
                counter=request.counter,
                forwarded=forwarded.counted,
                stream=request.stream,
                window_tokens=None if plan.spec.guessed else plan.budget.window_tokens,
                forwarded_tokens=plan.tokens_after,
                usage=request.dialect.input_tokens_used,
                usage_needles=request.dialect.usage_needles,
                on_usage=self.boundary.on_usage(request, plan),
            )
        except BaseException:
            await response.aclose()
            raise
        rendered: object | None = None
        if ahead is not None and ahead.plan is plan:
            reuse = ahead.prefix_reuse
            if not warnings and exchange.retries == 0:
                rendered = ahead.rendered
        else:
            reuse = self._prefix_reuse(request, plan)
        return Outcome(
            plan=plan,
            response=observed,
            retries=exchange.retries,
            stream=request.stream,
            warnings=(*plan.warnings, *warnings),
            prefix_reuse=reuse,
            rendered=rendered,
        )

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
        key_slot: KeySlot | None = None,
        at_origin: bool = False,
    ) -> UpstreamResponse:
        """Forward any other request untouched (routed by ``model`` when known): ``path`` under the
        base URL, or from its origin when ``at_origin``; the operator's key in ``key_slot`` (None:
        where the client put its own)."""
        return await self.upstream.send(
            method,
            path,
            content=content,
            headers=headers,
            stream=True,
            base_url=self.upstream.base_url_for(model),
            query=query,
            content_length=content_length,
            key_slot=key_slot,
            at_origin=at_origin,
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
