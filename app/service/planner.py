"""The request value of a body, made one way for every door, and the dry run of its decision.

``Planner(*, policy, registry, vocabularies, boundary, summarize=None, base_url_for=None,
offline=False)`` holds what a request value is made from: the operator's ``policy`` (refined
per request by its options), the model table (``registry``), the vocabularies, the ``boundary``
(``app.service.boundary``) and what the proxy learned (its ``learner``: windows, calibration),
whether summaries exist (``summarize``: the operator's switch, None for a door with no summaries
at all) and where a model's requests go (``base_url_for``). The live ``Service`` is a planner with an
upstream; a door outside the proxy's process (``ctxproxy plan``, ``ctxproxy.fit``) makes its own
with :func:`offline_planner`, so every door gets the same request value for the same inputs:

* ``counter(encoding)`` / ``counter_for_spec(spec)``: the counters (one per encoding for the
  planner's life; an estimate-counted model's own, calibrated, from the learner);
* ``policy(options) -> Policy``: the operator's policy refined by the request's options, with
  summaries' room for the memory when they are wanted (``request.summaries_wanted``), lowering off
  when the boundary's setting is;
* ``request(body, options, *, route, raw=b"", headers=(), model=None) -> ProxyRequest``: the
  request value (no I/O): ``InvalidRequest`` for a bad model first, then for what the route's
  dialect refuses in the conversation;
* ``dry_run(request) -> Decision``: the one decision (``app.service.decision``) without I/O,
  with what this planner could not know named (``offline``: no view of the proxy's own memory).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core.budget import Policy
from ..core.conversation import Conversation
from ..core.parse_memo import ParseMemo
from ..core.registry import ModelSpec
from ..core.routes import RouteMatch
from ..core.tokens import MessageCounter
from ..upstream.headers import Header
from .boundary import Boundary
from .decision import Decision, dry_run
from .learning import Learner
from .ports import ModelResolver, Vocabularies
from .request import ProxyRequest, RequestOptions, summaries_wanted


class Planner:
    """See the module docstring."""

    def __init__(
        self,
        *,
        policy: Policy,
        registry: ModelResolver,
        vocabularies: Vocabularies,
        boundary: Boundary,
        summarize: bool | None = None,
        base_url_for: Callable[[str | None], str] | None = None,
        offline: bool = False,
    ) -> None:
        self.registry = registry
        self.vocabularies = vocabularies
        self.learner = boundary.learner
        self.boundary = boundary
        self.summarize = summarize
        self.offline = offline
        self._policy = policy
        self._remembering: Policy | None = None  # the operator's policy with summaries wanted
        self._base_url_for = base_url_for
        self._counters: dict[str, MessageCounter] = {}
        # The dialects' parses of recent requests: a resent history is not converted again.
        self.parses = ParseMemo()

    def counter(self, encoding: str) -> MessageCounter:
        counter = self._counters.get(encoding)
        if counter is None:
            counter = self._counters[encoding] = MessageCounter(self.vocabularies.counter_for(encoding))
        return counter

    def counter_for_spec(self, spec: ModelSpec) -> MessageCounter:
        """The counter to plan ``spec`` with (per model, calibrated, for the estimate)."""
        return self.learner.counter(spec, self.counter)

    def policy(self, options: RequestOptions) -> Policy:
        policy = self._policy.refined(
            mode=options.mode,
            keep_turns=options.keep_turns,
            reserve_tokens=options.reserve_tokens,
            cut_target=options.cut_target,
            lower_output=options.lower_output,
        )
        # With summaries wanted, every plan of the request (the first one too) leaves the cut room
        # for the memory: the same cut whether or not its summary comes.
        wanted = self.summarize is not None and summaries_wanted(
            policy, options.summarize, default=self.summarize
        )
        if not wanted or policy.summarize:
            return self.boundary.policy_for(policy)
        if policy is self._policy:  # the common case: no per-request override, made once
            if self._remembering is None:
                self._remembering = self.boundary.policy_for(replace(policy, summarize=True))
            return self._remembering
        return self.boundary.policy_for(replace(policy, summarize=True))

    def base_url_for(self, model: str | None) -> str:
        """Where ``model``'s requests go ("" for a planner without an upstream)."""
        return "" if self._base_url_for is None else self._base_url_for(model)

    def request(
        self,
        body: Mapping[str, Any],
        options: RequestOptions,
        *,
        route: RouteMatch,
        raw: bytes = b"",
        headers: Sequence[Header] = (),
        model: str | None = None,
    ) -> ProxyRequest:
        """The request value of ``body`` on ``route`` (no I/O; see the module docstring): the
        route gives the dialect, the path's parameters and where the request goes; ``model``: the
        dialect's ``model_of`` the body, when the caller read it already."""
        dialect = route.dialect
        if model is None:
            model = dialect.model_of(body, route.params)
        table_spec = dialect.refine_spec(self.registry.resolve(model), headers)
        spec = self.learner.effective(table_spec, header_window_tokens=options.window_tokens)
        conversation = dialect.parse(body, memo=self.parses)
        stream = conversation.stream if route.route.stream is None else route.route.stream
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
        return ProxyRequest(
            raw=raw,
            body=body,
            dialect=dialect,
            route=route,
            conversation=conversation,
            spec=spec,
            policy=self.policy(options),
            counter=self.counter_for_spec(spec),
            base_url=self.base_url_for(model),
            options=options,
            headers=tuple(headers),
            calibrated=self.learner.calibrated(spec),
        )

    def dry_run(self, request: ProxyRequest) -> Decision:
        """The decision for ``request`` without I/O, naming what it could not know."""
        window_known = request.options.window_tokens is not None or (
            not self.offline and self.learner.settled(request.model, request.base_url)
        )
        return dry_run(request, boundary=self.boundary, offline=self.offline, window_known=window_known)


def offline_planner(
    *,
    policy: Policy,
    registry: ModelResolver,
    vocabularies: Vocabularies,
    summarize: bool | None = None,
    boundary_exact: bool = True,
    lower_output: bool = True,
    upstream_count: bool = True,
) -> Planner:
    """A planner for a door outside the proxy's process: nothing learned, no upstream; the
    proxy's settings it mirrors given (``summarize``: the operator's summaries switch, None: no
    summaries; ``boundary_exact``, ``lower_output``, ``upstream_count``: the settings of the same
    names)."""
    boundary = Boundary(
        learner=Learner(),
        exact=boundary_exact,
        lower_output=lower_output,
        asking=boundary_exact and upstream_count,
    )
    return Planner(
        policy=policy,
        registry=registry,
        vocabularies=vocabularies,
        boundary=boundary,
        summarize=summarize,
        offline=True,
    )
