"""The service's memory of models: effective specs, calibrated counters, discovery and learning.

``Learner(*, knowledge=None, discovery=None)`` is what ``app.service.Service`` calls around a chat
request (a handful of hooks, so the send loop stays readable):

* ``effective(spec, *, header_window_tokens)``: the table's spec with discovered/learned figures and
  the calibrated correction applied (``app.core.knowledge`` holds the precedence rules).
* ``counter(spec, shared)``: the ``MessageCounter`` to plan with. Exact encodings use the shared
  per-encoding counter; each model counted by ``estimate`` gets its own (bounded LRU of
  ``MAX_MODEL_COUNTERS``, each cache bounded by ``MODEL_COUNTER_CACHE_CHARS``) whose correction
  is the model's calibrated factor, applied after the per-message cache (so a new factor never
  serves stale counts).
* ``calibrated(spec)``: True when a calibrated factor applies (``X-Context-Count: calibrated``).
* ``await discover(model, base_url)``: the first time a model is seen, wait (at most the discovery's
  short timeout) for what the upstream says about it, and (with a ``KnowledgeShare``, when the
  cache backend is shared) for what other replicas learned. ``aclose()`` stops both.
* ``learn_proven_window(model, window_tokens)``: a retry after such an error succeeded in that
  window (``Knowledge.observe_proven``).
* ``learn_from_overflow(model, overflow, *, counter, forwarded, sent_tokens=None,
  output_tokens=None)``: an upstream context error stated the window and/or its count of our
  prompt; one that states nothing teaches an upper bound of the window from what was sent (our
  count ``sent_tokens`` and the body's output cap ``output_tokens``, ``Knowledge.observe_overflow``).
* ``await observe(response, *, model, counter, forwarded, stream, usage=None, usage_needles=...,
  on_usage=None) -> (response, warnings)``: a successful non-streaming response is read (its bytes
  are replayed unchanged) and its ``usage.prompt_tokens`` (or what ``usage``, a dialect's
  ``input_tokens_used``, finds in the answer or in the events holding every one of its
  ``usage_needles``) compared with our count of ``forwarded``; a silent truncation adds the warning
  ``upstream-truncated`` to *this* response (``window_tokens``: the window the request was planned
  for, None when it was a guess; a usage at or over it is a cut too). A streamed response is
  wrapped so its SSE lines (or, for a stream typed ``application/json``, the elements of its JSON
  array: Gemini's ``streamGenerateContent`` without ``alt=sse``) are scanned as they pass (never
  buffered nor changed); its usage arrives
  after the headers, so a truncation found there is logged and reported on the *next* response for
  that model. Either way the window is learned at once. ``on_usage`` (optional) is called with the
  upstream's count of the prompt once it is known and is not a truncation (the anchors of
  ``app.service.boundary``).

* ``report(resolve) -> list[dict]``: every model the proxy knows something about, with its
  effective figures, the source of each, the correction and what was learned (``GET
  /v1/context/models``, ``ctxproxy models --proxy URL``). Figures only: nothing secret.

Logs (logger ``ctxproxy.learning``) never contain prompt text, only model names and counts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from functools import partial
from typing import Any

from ..core.estimate import EstimateCounter
from ..core.knowledge import Knowledge, ModelFacts, UsageVerdict, exact_usage_truncated
from ..core.overflow import ContextOverflow
from ..core.registry import ModelSpec
from ..core.tokens import MessageCounter
from ..core.usage import (
    CHAT_NEEDLES,
    Extract,
    JsonArrayUsageScanner,
    SseUsageScanner,
    input_tokens_from_json,
    prompt_tokens_from_json,
)
from ..upstream.client import UpstreamResponse, WrappedResponse
from .discovery import Discovery
from .knowledge_share import KnowledgeShare
from .request import load_json

logger = logging.getLogger("ctxproxy.learning")

MAX_API_EVENT_BYTES = 4 * 1024 * 1024

# Each estimate-counted model has its own counter (and cache); bounded so that many model names
# cannot hold much memory: at most MAX_MODEL_COUNTERS * MODEL_COUNTER_CACHE_CHARS cached characters.
MAX_MODEL_COUNTERS = 32
MODEL_COUNTER_CACHE_SIZE = 16384
MODEL_COUNTER_CACHE_CHARS = 4 * 1024 * 1024
TRUNCATED_WARNING = "upstream-truncated"


class ObservedResponse(WrappedResponse):
    """An upstream response whose raw chunks are shown to ``on_chunk`` as they pass to the client,
    and ``on_end`` called once the body has been delivered in full (not on a broken stream or a
    client that left). Everything else is the wrapped response's."""

    def __init__(
        self,
        inner: UpstreamResponse,
        *,
        on_chunk: Callable[[bytes], None],
        on_end: Callable[[], None],
    ) -> None:
        super().__init__(inner)
        self._on_chunk = on_chunk
        self._on_end = on_end

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner.aiter_raw():
            try:
                self._on_chunk(chunk)
            except Exception:  # observing must never break the response
                logger.exception("usage scan failed")
            yield chunk
        try:
            self._on_end()
        except Exception:
            logger.exception("learning from usage failed")


def model_report(spec: ModelSpec, facts: ModelFacts | None) -> dict[str, Any]:
    """One model's effective figures and what the proxy learned about it, as JSON-ready data."""
    discovered = facts.discovered if facts is not None else None
    applied = spec.source_of("correction") != "none" if spec.sources else False
    return {
        "model": spec.name,
        "window_tokens": spec.window_tokens,
        "max_output_tokens": spec.max_output_tokens,
        "encoding": spec.encoding,
        "sources": dict(spec.sources),
        "correction": spec.correction if applied else None,
        "upstream_ratio": facts.factor if facts is not None else None,
        "calibration_samples": facts.samples if facts is not None else 0,
        "learned_window_tokens": facts.learned_window_tokens if facts is not None else None,
        "learned_from": facts.learned_from if facts is not None else None,
        "truncations": facts.truncations if facts is not None else 0,
        "discovered": None
        if discovered is None
        else {
            "window_tokens": discovered.window_tokens,
            "max_output_tokens": discovered.max_output_tokens,
            "effective": discovered.effective,
            "detail": discovered.detail,
        },
    }


def _json_typed(response: UpstreamResponse) -> bool:
    """A body typed JSON: a stream of that type is one JSON array sent element by element."""
    return any(
        name.lower() == "content-type" and value.strip().lower().startswith("application/json")
        for name, value in response.headers
    )


def _identity_encoded(response: UpstreamResponse) -> bool:
    return all(
        name.lower() != "content-encoding" or value.strip().lower() in ("", "identity")
        for name, value in response.headers
    )


def _quietly(record: Callable[[], object], model: str) -> None:
    """``record()`` as a loop callback: a failure is logged, never raised into the loop."""
    try:
        record()
    except Exception:
        logger.exception("learning from the usage of %r failed", model)


class Learner:
    """See the module docstring."""

    def __init__(
        self,
        *,
        knowledge: Knowledge | None = None,
        discovery: Discovery | None = None,
        share: KnowledgeShare | None = None,
    ) -> None:
        self.knowledge = knowledge if knowledge is not None else Knowledge()
        self.discovery = discovery
        self.share = share
        self._counters: OrderedDict[str, MessageCounter] = OrderedDict()
        self._lock = threading.Lock()  # plans may be made in worker threads (app.service.fastpath)

    # -- planning -----------------------------------------------------------------------------

    def effective(self, spec: ModelSpec, *, header_window_tokens: int | None = None) -> ModelSpec:
        return self.knowledge.effective(spec, header_window_tokens=header_window_tokens)

    @staticmethod
    def calibrated(spec: ModelSpec) -> bool:
        return spec.encoding == "estimate" and spec.source_of("correction").startswith("calibrated")

    def counter(self, spec: ModelSpec, shared: Callable[[str], MessageCounter]) -> MessageCounter:
        if spec.encoding != "estimate":
            return shared(spec.encoding)
        with self._lock:
            counter = self._counters.get(spec.name)
            if counter is None:
                counter = MessageCounter(
                    EstimateCounter(),
                    cache_size=MODEL_COUNTER_CACHE_SIZE,
                    cache_max_chars=MODEL_COUNTER_CACHE_CHARS,
                )
                self._counters[spec.name] = counter
                while len(self._counters) > MAX_MODEL_COUNTERS:
                    self._counters.popitem(last=False)
            else:
                self._counters.move_to_end(spec.name)
            # A new factor applies from the next count on (the cache holds raw counts); a plan
            # made concurrently may mix the old and the new factor, a difference the margin covers.
            estimate = counter.counter
            if isinstance(estimate, EstimateCounter) and estimate.correction != spec.correction:
                estimate.correction = spec.correction
            return counter

    def report(self, resolve: Callable[[str], ModelSpec]) -> list[dict[str, Any]]:
        """Every model with knowledge, resolved through the table (``resolve``) and made effective."""
        rows = []
        for model in sorted(self.knowledge.models()):
            rows.append(model_report(self.effective(resolve(model)), self.knowledge.facts(model)))
        return rows

    async def discover(self, model: str, base_url: str) -> None:
        """Before planning: discovery, and what other replicas learned (both bounded, cached)."""
        if self.discovery is not None and self.share is not None:
            await asyncio.gather(self.discovery.ensure(model, base_url), self.share.sync(model))
        elif self.discovery is not None:
            await self.discovery.ensure(model, base_url)
        elif self.share is not None:
            await self.share.sync(model)

    def settled(self, model: str, base_url: str) -> bool:
        """True when ``discover`` would find nothing new about ``model`` at the upstream."""
        return self.discovery is None or self.discovery.settled(model, base_url)

    async def aclose(self) -> None:
        if self.discovery is not None:
            await self.discovery.aclose()
        if self.share is not None:
            await self.share.aclose()

    # -- learning -----------------------------------------------------------------------------

    def learn_from_overflow(
        self,
        model: str,
        overflow: ContextOverflow,
        *,
        counter: MessageCounter,
        forwarded: Mapping[str, Any],
        sent_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        fixed, text = counter.request_parts(forwarded)
        self.knowledge.observe_overflow(
            model,
            overflow,
            fixed_tokens=fixed,
            text_tokens=text,
            exact=counter.exact,
            sent_tokens=sent_tokens,
            output_tokens=output_tokens,
        )
        if self.share is not None:
            self.share.changed(model)
        if overflow.limit_tokens is not None:
            logger.info(
                "learned from a context error: %r has a %d-token window (upstream %s)",
                model,
                overflow.limit_tokens,
                overflow.dialect,
            )
        elif sent_tokens is not None:
            facts = self.knowledge.facts(model)
            if facts is not None and facts.learned_window_tokens is not None:
                logger.info(
                    "a context error without numbers: %r now taken to have at most a %d-token window",
                    model,
                    facts.learned_window_tokens,
                )

    def learn_proven_window(self, model: str, window_tokens: int) -> None:
        """A success after an error without numbers proved ``window_tokens`` enough (see
        ``Knowledge.observe_proven``)."""
        if self.knowledge.observe_proven(model, window_tokens):
            if self.share is not None:
                self.share.changed(model)
            logger.info(
                "%r: a %d-token window is proven enough after an error without numbers", model, window_tokens
            )

    def learn_from_count(
        self, model: str, input_tokens: int, *, counter: MessageCounter, counted: Mapping[str, Any]
    ) -> bool:
        """The upstream's count of ``counted`` (a body as the chat accounting counts it, see
        ``Forwarded.counted``) from its counting endpoint calibrates ``model``'s estimate like
        usage does. True when it did."""
        fixed, text = counter.request_parts(counted)
        sampled = self.knowledge.observe_count(
            model, input_tokens=input_tokens, fixed_tokens=fixed, text_tokens=text, exact=counter.exact
        )
        if sampled:
            if self.share is not None:
                self.share.changed(model)
            logger.info("calibrated %r from the upstream's count: %d input tokens", model, input_tokens)
        return sampled

    async def observe(
        self,
        response: UpstreamResponse,
        *,
        model: str,
        counter: MessageCounter,
        forwarded: Mapping[str, Any],
        stream: bool,
        window_tokens: int | None = None,
        forwarded_tokens: int | None = None,
        usage: Extract | None = None,
        usage_needles: tuple[bytes, ...] = (b'"usage"',),
        on_usage: Callable[[int], None] | None = None,
    ) -> tuple[UpstreamResponse, tuple[str, ...]]:
        warnings: list[str] = []
        if self.knowledge.take_warning(model):
            warnings.append(TRUNCATED_WARNING)
        if response.status_code != 200:
            return response, tuple(warnings)
        # Recorded with the upstream's prompt tokens and whether they came from a stream.
        usage_of = partial(
            self._usage,
            model,
            counter=counter,
            forwarded=forwarded,
            window_tokens=window_tokens,
            forwarded_tokens=forwarded_tokens,
            on_usage=on_usage,
        )
        if not stream:
            await response.aread()
            answer = response.decoded_body()
            if usage is None:
                tokens = prompt_tokens_from_json(answer, loads=load_json)
            else:
                tokens = input_tokens_from_json(answer, usage, loads=load_json)
            if tokens is None:
                return response, tuple(warnings)
            record = partial(usage_of, tokens, streamed=False)
            if (
                counter.exact
                and forwarded_tokens is not None
                and not exact_usage_truncated(
                    prompt_tokens=tokens, forwarded_tokens=forwarded_tokens, window_tokens=window_tokens
                )
            ):
                # Nothing for this response's headers (the verdict of an exact count is known now):
                # the observation is recorded on the loop's next turn, after the answer's bytes are
                # written (before a next request of this client can be read).
                asyncio.get_running_loop().call_soon(_quietly, record, model)
                return response, tuple(warnings)
            verdict = record()
            if verdict.truncated:
                self.knowledge.take_warning(model)  # reported on this response
                if TRUNCATED_WARNING not in warnings:
                    warnings.append(TRUNCATED_WARNING)
            return response, tuple(warnings)
        if not _identity_encoded(response):
            return response, tuple(warnings)
        # Other APIs carry usage in bigger events (Responses' response.completed holds the whole
        # response): a larger line bound, and only "usage" to look for.
        scanner: SseUsageScanner | JsonArrayUsageScanner
        if _json_typed(response):
            needles = usage_needles if usage is not None else CHAT_NEEDLES
            scanner = JsonArrayUsageScanner(usage, needles=needles, max_element_bytes=MAX_API_EVENT_BYTES)
        elif usage is None:
            scanner = SseUsageScanner()
        else:
            scanner = SseUsageScanner(usage, needles=usage_needles, max_line_bytes=MAX_API_EVENT_BYTES)

        def on_end() -> None:
            if scanner.prompt_tokens is not None:
                usage_of(scanner.prompt_tokens, streamed=True)

        return ObservedResponse(response, on_chunk=scanner.feed, on_end=on_end), tuple(warnings)

    def _usage(
        self,
        model: str,
        prompt_tokens: int,
        *,
        counter: MessageCounter,
        forwarded: Mapping[str, Any],
        streamed: bool,
        window_tokens: int | None,
        forwarded_tokens: int | None,
        on_usage: Callable[[int], None] | None = None,
    ) -> UsageVerdict:
        if counter.exact and forwarded_tokens is not None:
            # An exact count is only ever used whole (no correction splits it), and the plan
            # already holds it: no second tally of a large body after every response.
            fixed, text = forwarded_tokens, 0
        else:
            fixed, text = counter.request_parts(forwarded)
        verdict = self.knowledge.observe_usage(
            model,
            prompt_tokens=prompt_tokens,
            fixed_tokens=fixed,
            text_tokens=text,
            exact=counter.exact,
            window_tokens=window_tokens,
        )
        if self.share is not None and (verdict.sampled or verdict.truncated):
            self.share.changed(model)
        if on_usage is not None and not verdict.truncated:
            on_usage(prompt_tokens)
        if verdict.truncated:
            learned = (
                f"; its window is now taken to be {verdict.learned_window_tokens} tokens"
                if verdict.learned_window_tokens is not None
                else ""
            )
            later = " (streamed: the next response carries X-Context-Warning)" if streamed else ""
            logger.warning(
                "upstream-truncated: the upstream counted %d prompt tokens for %r where the proxy "
                "forwarded about %d: it cut the prompt silently%s%s",
                prompt_tokens,
                model,
                verdict.expected_tokens,
                learned,
                later,
            )
        return verdict
