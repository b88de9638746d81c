"""The proxy's engine for a gateway that does its own forwarding (agentgateway, llm-d).

Two contracts (``docs/gateways.md`` has their sources; ``app.api.compress`` serves them over HTTP):

* **Messages** (agentgateway's ``contextCompression``, Headroom's ``POST /v1/compress``):
  :meth:`Compressor.compress_messages` takes the provider-native message objects of one request and
  its model, and returns the fitted message objects in the same API's shape plus
  ``tokens_saved``. The gateway keeps aside what it does not send (the system prompt of an
  Anthropic or Responses request, every request's tool definitions and output cap): the budget
  leaves ``aside_tokens`` for it (:func:`aside_tokens_for`): the caller's figure (the
  ``X-Context-Aside-Tokens`` header), else ``CTXPROXY_COMPRESS_ASIDE_TOKENS``, else 10% of the
  model's window. The output reserve is the policy's (the request's own cap is not sent), none
  for an API whose window limits the input alone (``Dialect.output_in_window`` False: Gemini).
* **Whole body** (llm-d's request-inline compaction): :meth:`Compressor.compact_body` takes a
  whole request body of one API and returns a body of the same shape: the client's own bytes when
  it fits, else the body the proxy would forward. Everything the budget needs is in the body.

Both decide through the proxy's one decision (``Service.decide``, ``app.service.decision``) on the
proxy's own request value (``Planner.request``), as the live routes do: exact counts where the
tokenizer is public, the calibrated estimate elsewhere, cuts anchored at the conversation's start
(the same history gives the same bytes on every replica, so prompt caches keep hitting), the
refinements near the budget (the upstream's own count: its counting endpoint may be asked; an
output cap that leaves no room lowered in a whole body), LLM summaries when they are on, and every
structural guarantee of the dialect (a call is never parted from its results, signed reasoning
and compaction items are never edited, pinned messages stay). The messages contract's budget is
the request's own capped by what is kept aside (``X-Context-Budget`` and the aside's cap, the
smaller, on every plan of it). A request that cannot fit raises ``PlanCannotFit`` (the gateway
then fails open and forwards the original, or fails closed, as configured); bad input
``InvalidRequest``.

Which API a bare message list is in (:func:`messages_api`): named by the caller (``?api=`` or
``X-Context-Api``), else the registered dialect that recognises the items most surely
(``Dialect.recognition`` of ``{items_key: messages}`` with the request's headers: Anthropic's
``anthropic-version``, which agentgateway forwards by default, or its own content blocks; typed
Responses items), else the registry's first (chat).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..core.budget import request_budget
from ..core.dialect import Dialect
from ..core.errors import InvalidRequest
from ..core.exchange import refusal_reason
from ..core.plan import Plan
from ..core.routes import RouteMatch
from ..upstream.headers import Header
from .outcome import PlanCannotFit
from .request import Forwarded, RequestOptions

if TYPE_CHECKING:
    from .driver import Service

DEFAULT_ASIDE_SHARE = 0.10
"""Share of the window left for what a gateway keeps aside when nobody says how much: a coding
agent's system prompt and tools are ~15-20K tokens, about 10% of a 128-200K window."""


@dataclass(frozen=True, slots=True)
class Compressed:
    """What compressing one request decided: ``plan`` (every figure and action), ``dialect``,
    ``items`` (the fitted message objects, for the messages contract), ``body`` and ``content``
    (the whole body and its bytes, for the whole-body contract: the caller's own bytes when nothing
    changed) and ``aside_tokens`` (left for what the caller kept aside)."""

    plan: Plan
    dialect: Dialect
    items: Sequence[Any]
    body: Mapping[str, Any]
    content: bytes
    aside_tokens: int = 0

    @property
    def tokens_saved(self) -> int:
        """Input tokens the fitted request has fewer than the one received (0 when unchanged)."""
        return max(0, self.plan.tokens_before - self.plan.tokens_after) if self.plan.changed else 0


def messages_api(
    messages: Sequence[Any], *, named: str | None, headers: Mapping[str, str], dialects: Mapping[str, Dialect]
) -> Dialect:
    """The API a bare message list is in (see the module docstring): the one named, else the
    dialect that recognises ``{items_key: messages}`` most surely (``Dialect.recognition``: a
    mark only that API has beats a shape several share; ties go to the registry's order);
    ``InvalidRequest`` when the name is unknown."""
    if named is not None:
        found = dialects.get(named.strip().lower())
        if found is None:
            known = ", ".join(sorted(dialects))
            raise InvalidRequest(f"Unknown api {named!r}; known: {known}.", param="api")
        return found
    lowered = {name.lower(): value for name, value in headers.items()}
    best = next(iter(dialects.values()))
    best_score = 0
    for dialect in dialects.values():
        score = dialect.recognition({dialect.items_key: list(messages)}, lowered)
        if score > best_score:
            best, best_score = dialect, score
    return best


def aside_tokens_for(window_tokens: int, *, requested: int | None, configured: int | None) -> int:
    """Tokens left for what the gateway keeps aside (system prompt, tool definitions): the
    request's figure, else the operator's, else ``DEFAULT_ASIDE_SHARE`` of the window."""
    if requested is not None:
        return requested
    if configured is not None:
        return configured
    return round(window_tokens * DEFAULT_ASIDE_SHARE)


class Compressor:
    """The two contracts on one ``Service`` (its model table, knowledge, counters, summaries)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def compress_messages(
        self,
        messages: Any,
        *,
        model: Any,
        dialect: Dialect,
        options: RequestOptions,
        headers: Sequence[Header] = (),
        aside_tokens: int | None = None,
        size_bytes: int = 0,
    ) -> Compressed:
        """Fit ``messages`` (``dialect``'s message objects) for ``model``; see the module doc.
        ``size_bytes``: the size of the JSON they came in (large ones are planned off the loop)."""
        if not isinstance(messages, list):
            raise InvalidRequest("'messages' must be an array of message objects.", param="messages")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' must be a non-empty string naming the model.", param="model")
        body = {"model": model, dialect.items_key: messages}
        service = self.service
        await service.learner.discover(model, service.upstream.base_url_for(model))
        request = service.request(body, options, headers=headers, route=RouteMatch.first(dialect))
        aside = aside_tokens_for(
            request.spec.window_tokens,
            requested=aside_tokens,
            configured=service.settings.compress_aside_tokens,
        )
        # The input budget the full request would have, less what the gateway keeps aside (no
        # output reserve where the upstream does not count the output against the window): a cap
        # on every plan of the request, as X-Context-Budget is.
        room = request_budget(
            body,
            request.conversation,
            dialect=dialect,
            spec=request.spec,
            policy=request.policy,
            counter=request.counter,
            exact=request.counter.exact,
        )
        cap_tokens = max(0, room.window_tokens - room.reserve_tokens - room.margin_tokens - aside)
        if options.budget_tokens is not None:
            cap_tokens = min(cap_tokens, options.budget_tokens)
        request = replace(request, options=replace(options, budget_tokens=cap_tokens))
        request, plan = await service.decide(request, size_bytes=size_bytes)
        if not plan.fits:
            raise PlanCannotFit(plan, reason=refusal_reason(plan, mode=request.policy.mode))
        if not plan.changed:
            return Compressed(plan, dialect, messages, body, b"", aside_tokens=aside)
        fitted = plan.body(body)
        return Compressed(plan, dialect, fitted[dialect.items_key], fitted, b"", aside_tokens=aside)

    async def compact_body(
        self, raw: bytes, *, route: RouteMatch, options: RequestOptions, headers: Sequence[Header] = ()
    ) -> Compressed:
        """Fit a whole request body of the API of ``route`` (a fitted route matched on the path
        after the endpoint's prefix); see the module doc."""
        service = self.service
        dialect = route.dialect
        request = await service.prepare(raw, headers, options=options, route=route)
        request, plan = await service.decide(request)
        if not plan.fits:
            raise PlanCannotFit(plan, reason=refusal_reason(plan, mode=request.policy.mode))
        if not plan.changed:
            items = request.body.get(dialect.items_key) or []
            return Compressed(plan, dialect, items, request.body, raw)
        forwarded = Forwarded.of(request, plan)
        items = forwarded.body.get(dialect.items_key) or []
        return Compressed(plan, dialect, items, forwarded.body, forwarded.content)


def compress_answer(result: Compressed) -> dict[str, Any]:
    """The messages contract's JSON answer: ``messages`` and ``tokens_saved`` (what agentgateway
    reads), plus ctxproxy's own figures (unknown fields, which the gateway ignores)."""
    plan = result.plan
    return {
        "messages": list(result.items),
        "tokens_saved": result.tokens_saved,
        "model": plan.model,
        "api": result.dialect.name,
        "tokens_before": plan.tokens_before,
        "tokens_after": plan.tokens_after if plan.changed else plan.tokens_before,
        "aside_tokens": result.aside_tokens,
        "actions": plan.actions_header(),
    }


__all__ = [
    "DEFAULT_ASIDE_SHARE",
    "Compressed",
    "Compressor",
    "aside_tokens_for",
    "compress_answer",
    "messages_api",
]
