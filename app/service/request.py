"""What a request brings, worked out once: its options, its body, and the request value.

* ``RequestOptions``: the validated ``X-Context-*`` request headers (``upstream_count`` and
  ``lower_output``: the ``X-Context-Upstream-Count`` / ``X-Context-Lower-Output`` switches of
  ``app.service.boundary``); ``summaries_wanted(policy, requested, default=)``: whether a request
  wants LLM summaries (its ``X-Context-Summarize``, else the operator's switch; policy ``auto``).
* ``parse_body(raw) -> dict`` turns bad JSON or a non-object into ``InvalidRequest``;
  ``dump_body(body) -> bytes`` writes a rewritten body back (``app.wire``).
* ``ProxyRequest``: one request as everything downstream sees it, made once at the top of the
  request (``Service.prepare``): the raw bytes and parsed body, the dialect, the matched route
  (``app.core.routes.RouteMatch``: path parameters, where it goes upstream, the client's query)
  and the neutral conversation, the effective model spec, the policy refined by the options, the counter, the
  upstream base URL and the headers. Planning (``ProxyRequest.plan``), summaries, learning and
  the observers all take it; nothing resolves the model or builds the policy a second time.
  Its ``plan`` logs (ERROR) a plan the fit pipeline's final structural guard had to undo
  (``Plan.broken``: a strategy bug; the fallback plan is used).
  ``limits`` (``budget.Limits``): what the request learned before it was (re)planned, a window, an
  output cap, a margin (``app.service.boundary``, a retry); ``limited(limits)`` is the same request
  with them, so every later plan of it (summaries too) applies them.
* ``Forwarded``: what one plan sends (the body as a mapping and its bytes), built once per plan.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..core.body_memo import BodyMemo
from ..core.budget import Limits, Policy, PolicyMode
from ..core.conversation import Conversation
from ..core.dialect import Dialect
from ..core.errors import InvalidRequest
from ..core.fit import SummaryProvider, plan_request
from ..core.plan import Plan
from ..core.registry import ModelSpec
from ..core.routes import RouteMatch
from ..core.tokens import MessageCounter
from ..upstream.headers import Header
from ..wire import dump_json

logger = logging.getLogger("ctxproxy.fit")


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """The request's validated ``X-Context-*`` headers; None means "not given"."""

    budget_tokens: int | None = None
    reserve_tokens: int | None = None
    window_tokens: int | None = None
    mode: PolicyMode | None = None
    keep_turns: int | None = None
    summarize: bool | None = None
    cut_target: float | None = None
    upstream_count: bool | None = None
    lower_output: bool | None = None


def summaries_wanted(policy: Policy, requested: bool | None, *, default: bool) -> bool:
    """Whether a request under ``policy`` wants LLM summaries: its own ``X-Context-Summarize``
    (``requested``), else the operator's switch (``default``); only under policy ``auto``."""
    enabled = default if requested is None else requested
    return enabled and policy.mode == "auto"


def load_json(raw: bytes) -> Any:
    """A JSON value; ``ValueError`` (or ``RecursionError``) for malformed JSON."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # orjson is stricter than the JSON the upstream accepts (escaped lone surrogates, ...):
        # fall back to the standard library before calling the body malformed.
        return json.loads(raw)


def parse_body(raw: bytes, *, memo: BodyMemo | None = None, key: str = "") -> dict[str, Any]:
    """The request body as a dict; ``InvalidRequest`` for malformed JSON or a non-object. With
    ``memo`` and ``key`` (the dialect's ``items_key``), a resent body is parsed only where it
    changed from a remembered one (``BodyMemo``); the result is equal either way."""
    try:
        body = memo.parse(raw, key=key, loads=load_json) if memo is not None and key else load_json(raw)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({exc}). "
            "The body must be a JSON object (Content-Type: application/json)."
        ) from exc
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"The request body must be a JSON object, not {type(body).__name__}.", param=None
        )
    return body


def dump_body(body: Mapping[str, Any]) -> bytes:
    """Serialize a rewritten body compactly (lone surrogates survive, see ``app.wire``)."""
    return dump_json(body)


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """One request, resolved once (see the module docstring). ``policy`` is the operator's policy
    refined by ``options``; ``calibrated``: the counter's estimate is corrected by usage."""

    raw: bytes
    body: Mapping[str, Any]
    dialect: Dialect
    route: RouteMatch
    conversation: Conversation
    spec: ModelSpec
    policy: Policy
    counter: MessageCounter
    base_url: str
    options: RequestOptions
    headers: tuple[Header, ...] = ()
    calibrated: bool = False
    limits: Limits | None = None

    @property
    def model(self) -> str:
        return self.conversation.model

    @property
    def stream(self) -> bool:
        return self.conversation.stream

    def limited(self, limits: Limits | None) -> ProxyRequest:
        """This request with ``limits`` (None: the same request)."""
        return self if limits is None or limits == self.limits else replace(self, limits=limits)

    def plan(
        self,
        *,
        cap_tokens: int | None = None,
        summaries: SummaryProvider | None = None,
        limits: Limits | None = None,
        headroom_tokens: int = 0,
    ) -> Plan:
        """The plan of this request (no I/O), capped by ``X-Context-Budget`` and ``cap_tokens``,
        under ``limits`` (default: the request's own); ``summaries`` puts an LLM summary in place
        of what the cut forgot; ``headroom_tokens`` plans the next cut (``app.core.fit``). Never
        raises ``CannotFit``."""
        caps = [c for c in (self.options.budget_tokens, cap_tokens) if c is not None]
        policy = self.policy if summaries is None else replace(self.policy, summarize=True)
        plan = plan_request(
            self.body,
            spec=self.spec,
            policy=policy,
            counter=self.counter,
            cap_tokens=min(caps) if caps else None,
            summaries=summaries,
            dialect=self.dialect,
            conversation=self.conversation,
            limits=self.limits if limits is None else limits,
            headroom_tokens=headroom_tokens,
        )
        if plan.broken:
            logger.error(
                "the fit pipeline broke the %s structure of a %r request (%s): a strategy bug; "
                "fell back to %s",
                self.dialect.name,
                self.model,
                "; ".join(plan.broken),
                "the deterministic cut" if plan.changed else "the unchanged request",
            )
        return replace(plan, count_kind="calibrated") if self.calibrated else plan


@dataclass(frozen=True, slots=True)
class Forwarded:
    """What one plan sends: ``body``, ``content`` (the bytes on the wire) and ``counted``, the same
    conversation as the chat accounting counts it, which learning compares usage with (the
    dialect's ``accounting_view`` of the body, its neutral messages and its tools' tokens)."""

    plan: Plan | None
    body: Mapping[str, Any]
    content: bytes
    counted: Mapping[str, Any]

    @classmethod
    def of(cls, request: ProxyRequest, plan: Plan | None) -> Forwarded:
        """The client's own bytes when ``plan`` changed nothing (or is not made yet), else the
        plan's body rendered and serialized, once."""
        if plan is None or not plan.changed:
            body, content = request.body, request.raw
        else:
            body = plan.body(request.body)
            content = dump_body(body)
        messages = request.conversation.messages if plan is None else plan.messages
        # The upstream's usage counts the tool definitions too: a view that prices them by the
        # dialect's own rule (a body with many tools, Claude Code's ~11K tokens, would otherwise
        # teach a correction of about 2 from its first answer).
        tools = (
            request.dialect.tool_tokens(request.body, request.counter)
            if plan is None
            else plan.budget.tool_tokens
        )
        return cls(plan, body, content, request.dialect.accounting_view(body, messages, tools))

    @classmethod
    def sent_first(cls, request: ProxyRequest, plan: Plan) -> Forwarded:
        """The fast path's: the client's own bytes went out before ``plan`` (their exact plan) was
        made. ``of(request, plan)`` when it changed nothing (the tools priced from its budget, not
        counted again), else ``of(request, None)`` (what was sent is the client's request)."""
        return cls.of(request, None if plan.changed else plan)
