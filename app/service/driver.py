"""Where the budget engine meets the upstream: the short driver of a request's exchange.

``Service.handle(raw, headers, *, options, route) -> Outcome`` is the whole path of one request of
any wire API (``route``: the matched ``app.core.routes.RouteMatch``, its dialect and path
parameters; ``dialect=`` alone stands for that dialect's first route):

1. parse the body (bad JSON, a non-object body or a bad model -> ``InvalidRequest``);
2. make the request value once (``Service.prepare`` -> ``app.service.request.ProxyRequest``):
   the model (``Dialect.model_of``: the body's or the path's) resolved and refined by the
   dialect (``refine_spec``; ``X-Context-Window`` overrides the window), the policy refined by the
   request's ``X-Context-*`` options, the counter, the dialect's neutral conversation;
3. plan it (``ProxyRequest.plan``); a plan that does not fit raises ``CannotFit`` (the
   ``off`` policy never fails). A large body is planned in a worker thread, and one that
   ``app.core.ceiling`` proves fits is sent first and planned meanwhile (``app.service.fastpath``:
   a large body in a worker thread, a small one on the event loop while the upstream works); the
   exact plan is always ready before the outcome is returned;
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
from ..core.budget import Policy
from ..core.ceiling import conversation_surely_fits
from ..core.conversation import Conversation
from ..core.dialect import Dialect
from ..core.dialects import DEFAULT_DIALECT
from ..core.exchange import Command, Deliver, Exchange, Fail, Replan, Send
from ..core.overflow import ContextOverflow
from ..core.parse_memo import ParseMemo
from ..core.plan import Plan
from ..core.registry import ModelSpec
from ..core.reuse import PrefixMemory, PrefixReuse
from ..core.routes import KeySlot, RouteMatch
from ..core.tokens import MessageCounter
from ..settings import Settings
from ..upstream.client import UpstreamClient, UpstreamResponse
from ..upstream.headers import Header
from .boundary import build_boundary
from .fastpath import OFFLOAD_MIN_BYTES, Pending, abandon_plan, finish_plan, plan_soon, run_plan, start_plan
from .learning import Learner
from .outcome import Ahead, Outcome, PlanCannotFit, Readiness, Render
from .peek import is_event_stream, read_preamble
from .ports import REQUIRED_ENCODINGS, ModelResolver, Vocabularies
from .request import Forwarded, ProxyRequest, RequestOptions, dump_body, parse_body


def identity_encoded(headers: Sequence[Header]) -> tuple[Header, ...]:
    """``headers`` asking for an uncompressed answer: a plan that offers ``ctx_recall`` has its
    answer read (and a stream edited) by the proxy."""
    return (*(h for h in headers if h[0].lower() != "accept-encoding"), ("Accept-Encoding", "identity"))

if TYPE_CHECKING:
    from .recall import Recall
    from .summaries import Summaries


class Service:
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
        self.settings = settings
        self.registry = registry
        self.vocabularies = vocabularies
        self.upstream = upstream
        self.required_encodings = tuple(required_encodings)
        self._policy = settings.fit_policy()
        if recall is None and self._policy.recall != "off":
            self._policy = replace(self._policy, recall="off")  # nobody would answer the tool's calls
        self._remembering: Policy | None = None  # the operator's policy with summaries wanted
        self._counters: dict[str, MessageCounter] = {}
        self.summaries = summaries
        self.recall = recall
        self.learner = learner if learner is not None else Learner()
        self.prefixes = PrefixMemory()
        # The dialects' parses of recent requests: a resent history is not converted again.
        self.parses = ParseMemo()
        # Recent bodies: a resent one is parsed only where it changed (its history's newest end).
        self.bodies = BodyMemo()
        # Near the boundary: exact counts, lowered output caps, anchors (app.service.boundary).
        self.boundary = build_boundary(settings, learner=self.learner, upstream=upstream)

    def counter(self, encoding: str) -> MessageCounter:
        counter = self._counters.get(encoding)
        if counter is None:
            counter = self._counters[encoding] = MessageCounter(self.vocabularies.counter_for(encoding))
        return counter

    def policy(self, options: RequestOptions) -> Policy:
        policy = self._policy.refined(
            mode=options.mode,
            keep_turns=options.keep_turns,
            reserve_tokens=options.reserve_tokens,
            cut_target=options.cut_target,
            lower_output=options.lower_output,
            recall=None if options.recall is None else "tool" if options.recall and self.recall else "off",
        )
        # With summaries wanted, every plan of the request (the first one too) leaves the cut room
        # for the memory: the same cut whether or not its summary comes.
        wanted = self.summaries is not None and self.summaries.wanted(policy, options.summarize)
        if not wanted or policy.summarize:
            return policy
        if policy is self._policy:  # the common case: no per-request override, made once
            if self._remembering is None:
                self._remembering = replace(policy, summarize=True)
            return self._remembering
        return replace(policy, summarize=True)

    def counter_for_spec(self, spec: ModelSpec) -> MessageCounter:
        """The counter to plan ``spec`` with (per model, calibrated, for the estimate)."""
        return self.learner.counter(spec, self.counter)

    # -- the request value --------------------------------------------------------------------

    def request(
        self,
        body: Mapping[str, Any],
        options: RequestOptions,
        *,
        raw: bytes = b"",
        headers: Sequence[Header] = (),
        dialect: Dialect = DEFAULT_DIALECT,
        route: RouteMatch | None = None,
        model: str | None = None,
    ) -> ProxyRequest:
        """The request value of ``body`` (no I/O): ``InvalidRequest`` for a bad model first, then
        for what the dialect refuses in the conversation. ``route`` (else ``dialect``'s first
        route) gives the dialect, the path's parameters and where the request goes; ``model``: the
        route dialect's ``model_of`` the body, when the caller read it already."""
        match = route if route is not None else RouteMatch.first(dialect)
        dialect = match.dialect
        if model is None:
            model = dialect.model_of(body, match.params)
        table_spec = dialect.refine_spec(self.registry.resolve(model), headers)
        spec = self.learner.effective(table_spec, header_window_tokens=options.window_tokens)
        conversation = dialect.parse(body, memo=self.parses)
        stream = conversation.stream if match.route.stream is None else match.route.stream
        if conversation.model != model or conversation.stream != stream:
            # The path's model and stream (Gemini's); the constructor, not ``replace`` (which
            # walks the fields on every call).
            conversation = Conversation(
                model=model,
                messages=conversation.messages,
                tool_tokens=conversation.tool_tokens,
                requested_output_tokens=conversation.requested_output_tokens,
                stream=stream,
                fittable=conversation.fittable,
                unfittable_reason=conversation.unfittable_reason,
            )
        policy = self.boundary.policy_for(self.policy(options))
        if policy.recall == "tool" and match.json_stream:
            policy = replace(policy, recall="ids")  # the answer's JSON array stream is not edited
        return ProxyRequest(
            raw=raw,
            body=body,
            dialect=dialect,
            route=match,
            conversation=conversation,
            spec=spec,
            policy=policy,
            counter=self.counter_for_spec(spec),
            base_url=self.upstream.base_url_for(model),
            options=options,
            headers=tuple(headers),
            calibrated=self.learner.calibrated(spec),
        )

    async def prepare(
        self,
        raw: bytes,
        headers: Sequence[Header],
        *,
        options: RequestOptions,
        dialect: Dialect = DEFAULT_DIALECT,
        route: RouteMatch | None = None,
    ) -> ProxyRequest:
        """Parse ``raw``, learn about a model seen for the first time (``Learner.discover``), and
        make the request value."""
        match = route if route is not None else RouteMatch.first(dialect)
        body = parse_body(raw, memo=self.bodies, key=match.dialect.items_key)
        model = match.dialect.model_of(body, match.params)
        await self.learner.discover(model, self.upstream.base_url_for(model))
        return self.request(body, options, raw=raw, headers=headers, route=match, model=model)

    def plan(
        self,
        body: Mapping[str, Any],
        options: RequestOptions,
        *,
        dialect: Dialect = DEFAULT_DIALECT,
        headers: Sequence[Header] = (),
    ) -> Plan:
        """The plan for ``body`` (no I/O, no summaries); ``InvalidRequest`` on a bad body. Never
        raises ``CannotFit``: the dry run reports ``fits=False``."""
        return self.request(body, options, dialect=dialect, headers=headers).plan()

    def plan_raw(self, raw: bytes, options: RequestOptions, *, dialect: Dialect = DEFAULT_DIALECT) -> Plan:
        return self.plan(parse_body(raw), options, dialect=dialect)

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
            plan.model, input_tokens, counter=request.counter, counted=Forwarded.of(request, plan).counted
        )

    def models_report(self) -> list[dict[str, Any]]:
        """What the proxy knows about every model it has seen or discovered (``app.service.learning``)."""
        return self.learner.report(self.registry.resolve)

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

    @staticmethod
    def surely_fits(request: ProxyRequest) -> bool:
        """True when the exact plan is certain to fit unchanged (``app.core.ceiling``; exact
        counters only)."""
        if not request.counter.exact or not request.conversation.fittable:
            return False
        cap_tokens = request.options.budget_tokens
        return conversation_surely_fits(
            request.body,
            request.conversation,
            dialect=request.dialect,
            spec=request.spec,
            policy=request.policy,
            cap_tokens=cap_tokens,
        )

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
        dialect: Dialect = DEFAULT_DIALECT,
        route: RouteMatch | None = None,
        render: Render | None = None,
    ) -> Outcome:
        """Plan and send one request of ``route`` (else of ``dialect``'s first route); see
        the module docstring. ``render(plan, prefix_reuse)``: what the caller will make of the
        answered plan (its response headers), made on the fast path while the upstream works and
        given back as ``Outcome.rendered`` when that plan is answered as it was.

        Raises ``InvalidRequest``, ``CannotFit`` or an ``UpstreamError``.
        """
        request = await self.prepare(raw, headers, options=options, dialect=dialect, route=route)
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
        """Drive the request's ``Exchange``: do what each command says, feed back what happened."""
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
            plan = await run_plan(request.plan, size_bytes=size_bytes)
            request, plan = await self.boundary.refine(request, plan)
            # A recall round uses the summaries there are: it asks for none (its spans pass).
            command = exchange.start(await self.summarized(request, plan, writes=request.round == 0))
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
                    self.learner.learn_proven_window(request.model, command.proven_window_tokens)
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
        reuse = self._prefix_reuse(plan)
        ahead.append(Ahead(plan, reuse, None if render is None else render(plan, reuse)))
        return plan

    def _prefix_reuse(self, plan: Plan) -> PrefixReuse:
        # What an upstream prompt cache could reuse: the previous forwarded request of this
        # conversation, compared message by message (``X-Context-Prefix-Reuse``).
        return self.prefixes.observe(plan.messages, plan.message_tokens, model=plan.model, api=plan.api)

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
            reuse = self._prefix_reuse(plan)
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
