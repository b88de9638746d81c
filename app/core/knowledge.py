"""What the proxy knows about each model beyond its table: figures the upstream told us when asked
(discovery), windows learned from context errors and silent truncations, and the calibrated
correction of the estimate. Pure and in memory; the I/O lives in ``app.service.discovery`` and
``app.service.learning``.

INTERFACE CONTRACT (the service, the CLI and the learning glue rely on these):

* ``DiscoveredFigures`` (frozen): ``window_tokens`` and ``max_output_tokens`` (either may be None),
  ``effective`` (True for the server's runtime figure: vLLM ``max_model_len``, llama.cpp ``n_ctx``,
  Ollama ``num_ctx``, LM Studio ``loaded_context_length``; False for a declared maximum such as
  OpenRouter's ``context_length`` or Ollama's ``model_info`` ``*.context_length``) and ``detail``
  (which endpoint and field, e.g. ``"GET /v1/models max_model_len"``: never a host or a secret).
* ``Knowledge(*, max_models=MAX_MODELS)``, keyed by the model name as the client sends it:
  ``set_discovered(model, figures)``, ``discovered(model)``,
  ``effective(spec, *, header_window_tokens=None) -> ModelSpec`` (the precedence below),
  ``observe_usage(model, *, prompt_tokens, fixed_tokens, text_tokens, exact, window_tokens=None)
  -> UsageVerdict``,
  ``observe_overflow(model, overflow, *, fixed_tokens, text_tokens, exact, sent_tokens=None,
  output_tokens=None) -> None`` (an error without numbers teaches an upper bound of the window from
  ``sent_tokens`` + ``output_tokens``, see below),
  ``observe_count(model, *, input_tokens, fixed_tokens, text_tokens, exact) -> bool`` (the upstream's
  counting endpoint: a calibration sample, never a truncation),
  ``take_warning(model) -> bool`` (a truncation seen on a streamed response, reported once),
  ``precision(model, *, exact) -> Precision | None`` (how far the upstream's counts strayed from
  ours, once ``PRECISION_MIN_SAMPLES`` samples are in: what ``app.core.boundary`` sizes the
  margin and the uncertainty zone with),
  ``facts(model) -> ModelFacts | None`` and ``models()`` (every model with knowledge, oldest first).
* ``is_truncated(*, prompt_tokens, expected_tokens, calibrated) -> bool``: the silent-truncation rule.
* Sharing between replicas (``app.service.knowledge_share``): ``export(model) -> dict | None`` (the learned
  window and the calibration samples: numbers only) and ``absorb(model, data) -> bool``, which
  validates ``data`` and takes a shared learned window when it is smaller than ours (or we have
  none) and the shared samples only when we have none of our own (so nothing is counted twice);
  ``version(model) -> int`` grows with every change ``export`` would show.

Precedence of each figure (each spec carries the source of each in ``ModelSpec.sources``):

* window: the request's own (``X-Context-Window``, source ``request``) > operator table > learned
  (from an upstream context error, or a silent truncation) > discovered > built-in table >
  default. An error that states no window (OpenAI
  Responses: "Your input exceeds the context window of this model") proves the window is below
  what was sent; the window learned from it is ``retry.window_after_refusal`` of that (half of it,
  or the largest prompt the upstream took whole when that is more), source ``learned:bound``, and
  each such error halves it again; the retry that then succeeds proves a window enough for what it
  carried (``observe_proven``), and that is what the next requests are fitted to: the same model
  never fails the same way twice. A learned
  window is a fact the upstream stated by refusing or cutting, so it also caps an operator's larger
  window (never raises it).
* max output: operator table > discovered > built-in table > default; never above the window.
* encoding: the table's (discovery does not name tokenizers).
* correction (models counted by ``estimate`` only): the median of the last ``CALIBRATION_SAMPLES``
  ratios ``(upstream_prompt_tokens - fixed_tokens) / text_tokens`` from usage and from errors that
  state the upstream's count, bounded to ``[MIN_CORRECTION, MAX_CORRECTION]``: robust to outliers,
  and older samples fall out (decay). Exact (tiktoken) models record the ratio of the upstream's
  count to ours for display; it is not applied (their overflows are caught by the emergency retry).

Silent truncation, two signs:

* far below: ``usage.prompt_tokens`` under ``TRUNCATION_RATIO_CALIBRATED`` (an exact or calibrated
  count) or ``TRUNCATION_RATIO_UNCALIBRATED`` (an uncalibrated estimate: no correction in bounds
  explains it) of what we forwarded, by at least ``TRUNCATION_MIN_TOKENS``: the upstream cut a prompt
  that fitted the window we believed. It is no calibration sample, and is warned about. A server
  that reports only the prompt tokens its cache did not hold looks the same once, so the window is
  learned only when the cut is confirmed (``_cut_confirmed``: a count pinned at a round or a
  repeated value), and never below the largest prompt the upstream took whole.
* at the window: ``usage.prompt_tokens`` at least the (known, not guessed) window the request was
  planned for, which a server that refuses would have refused: it cut our prompt to its window
  because it counts more than we thought. The upstream's count is then only a lower bound of the
  full prompt's: the ratio it gives, times ``LOWER_BOUND_BOOST``, becomes a sample when above the
  current factor (the next request then fits).

Thread-safe (planning may run in a worker thread): every method holds the table's lock briefly.
"""

from __future__ import annotations

import functools
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Concatenate, ParamSpec, TypeVar

from .estimate import MAX_CORRECTION, MIN_CORRECTION
from .overflow import ContextOverflow
from .registry import ModelSpec
from .retry import window_after_refusal

MAX_MODELS = 4096
# Effective specs kept for reuse (a few per model: with and without an X-Context-Window).
EFFECTIVE_MEMO_MAX = 1024
CALIBRATION_SAMPLES = 9
MIN_SAMPLE_TEXT_TOKENS = 32
TRUNCATION_RATIO_CALIBRATED = 0.8
TRUNCATION_RATIO_UNCALIBRATED = 0.5
TRUNCATION_MIN_TOKENS = 64
MIN_TRUNCATION_WINDOW_TOKENS = 256
CALIBRATED_MIN_SAMPLES = 2
LOWER_BOUND_BOOST = 1.1
CUT_ROUND_TOKENS = 1024
CUT_SAME_RATIO = 0.02
CUT_DIFFERENT_RATIO = 0.1
PRECISION_MIN_SAMPLES = 3

_TABLE_SOURCES = frozenset({"builtin", "default"})
_LEARNED_SOURCES = frozenset({"learned:overflow", "learned:truncation", "learned:bound"})


@dataclass(frozen=True, slots=True)
class DiscoveredFigures:
    """What an upstream said about one model when asked (see the module contract)."""

    window_tokens: int | None = None
    max_output_tokens: int | None = None
    effective: bool = False
    detail: str = ""


@dataclass(frozen=True, slots=True)
class UsageVerdict:
    """What one response's usage taught: ``truncated`` (and the window learned from it, if any),
    ``sampled`` (it became a calibration sample)."""

    truncated: bool = False
    learned_window_tokens: int | None = None
    sampled: bool = False
    expected_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Precision:
    """How far the upstream's counts strayed from ours over the model's samples, as shares of
    ours: ``under`` the most it counted above us (what a margin must cover), ``over`` the most it
    counted below us (how far above the budget a request may still fit), after the calibrated
    correction for an estimate (exact counts: against 1)."""

    under: float
    over: float
    samples: int


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """A snapshot of one model's knowledge, for reports."""

    model: str
    discovered: DiscoveredFigures | None
    learned_window_tokens: int | None
    learned_from: str | None
    factor: float | None
    samples: int
    factor_source: str | None
    truncations: int


@dataclass(slots=True)
class _Entry:
    discovered: DiscoveredFigures | None = None
    learned_window_tokens: int | None = None
    learned_from: str | None = None
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=CALIBRATION_SAMPLES))
    factor_source: str | None = None
    truncations: int = 0
    warning: bool = False
    version: int = 0
    max_prompt_tokens: int = 0
    pending_cut: tuple[int, int] | None = None

    def factor(self) -> float | None:
        if not self.samples:
            return None
        return min(MAX_CORRECTION, max(MIN_CORRECTION, statistics.median(self.samples)))


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(method: Callable[Concatenate[Knowledge, _P], _R]) -> Callable[Concatenate[Knowledge, _P], _R]:
    @functools.wraps(method)
    def locked(self: Knowledge, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def exact_usage_truncated(*, prompt_tokens: int, forwarded_tokens: int, window_tokens: int | None) -> bool:
    """What :meth:`Knowledge.observe_usage` finds of an exact count (``forwarded_tokens``) that the
    upstream counted ``prompt_tokens`` for, planned for ``window_tokens``: ``truncated`` or not. A
    pure function of its arguments (an exact count is never corrected), so it can be known before
    the observation is recorded."""
    return reaches_window(prompt_tokens, window_tokens) or is_truncated(
        prompt_tokens=prompt_tokens, expected_tokens=forwarded_tokens, calibrated=True
    )


def reaches_window(prompt_tokens: int, window_tokens: int | None) -> bool:
    """The upstream counted the whole window planned for (None: that window was a guess)."""
    return window_tokens is not None and prompt_tokens >= window_tokens


def is_truncated(*, prompt_tokens: int, expected_tokens: int, calibrated: bool) -> bool:
    """True when the upstream's count is far enough below ours that only a cut explains it."""
    if prompt_tokens < 0 or expected_tokens - prompt_tokens < TRUNCATION_MIN_TOKENS:
        return False
    ratio = TRUNCATION_RATIO_CALIBRATED if calibrated else TRUNCATION_RATIO_UNCALIBRATED
    return prompt_tokens < expected_tokens * ratio


# Where a calibration factor's samples came from (``ModelSpec`` source ``calibrated:<source>``).
FACTOR_SOURCES = frozenset({"usage", "overflow", "truncation", "count"})


class Knowledge:
    """The per-model knowledge table (bounded: the least recently used model is forgotten)."""

    def __init__(self, *, max_models: int = MAX_MODELS) -> None:
        self.max_models = max(1, max_models)
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.RLock()
        self._effective: dict[Hashable, ModelSpec] = {}

    # -- storage ------------------------------------------------------------------------------

    def _entry(self, model: str) -> _Entry:
        entry = self._entries.get(model)
        if entry is None:
            entry = self._entries[model] = _Entry()
            while len(self._entries) > self.max_models:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(model)
        return entry

    @_locked
    def models(self) -> tuple[str, ...]:
        return tuple(self._entries)

    @_locked
    def set_discovered(self, model: str, figures: DiscoveredFigures) -> None:
        if figures.window_tokens is None and figures.max_output_tokens is None:
            return
        self._entry(model).discovered = figures

    @_locked
    def discovered(self, model: str) -> DiscoveredFigures | None:
        entry = self._entries.get(model)
        return entry.discovered if entry is not None else None

    @_locked
    def facts(self, model: str) -> ModelFacts | None:
        entry = self._entries.get(model)
        if entry is None:
            return None
        return ModelFacts(
            model=model,
            discovered=entry.discovered,
            learned_window_tokens=entry.learned_window_tokens,
            learned_from=entry.learned_from,
            factor=entry.factor(),
            samples=len(entry.samples),
            factor_source=entry.factor_source,
            truncations=entry.truncations,
        )

    @_locked
    def correction(self, model: str) -> float | None:
        """The calibrated factor for ``model`` (None before the first sample)."""
        entry = self._entries.get(model)
        return entry.factor() if entry is not None else None

    # -- the effective spec -------------------------------------------------------------------

    @_locked
    def effective(self, spec: ModelSpec, *, header_window_tokens: int | None = None) -> ModelSpec:
        """``spec`` (the table's answer for ``spec.name``) with what we know applied. The answer
        is a pure function of ``spec``, the header and the entry's figures it reads: the same
        object comes back while they are the same (``EFFECTIVE_MEMO_MAX`` kept)."""
        entry = self._entries.get(spec.name)
        estimate = spec.encoding == "estimate"
        factor = entry.factor() if entry is not None and estimate else None
        key = (
            spec,
            header_window_tokens,
            None
            if entry is None
            else (
                entry.discovered,
                entry.learned_window_tokens,
                entry.learned_from,
                factor,
                entry.factor_source,
            ),
        )
        made = self._effective.get(key)
        if made is None:
            made = self._effective_spec(spec, entry, factor, header_window_tokens=header_window_tokens)
            if len(self._effective) >= EFFECTIVE_MEMO_MAX:
                self._effective.clear()
            self._effective[key] = made
        return made

    @staticmethod
    def _effective_spec(
        spec: ModelSpec, entry: _Entry | None, factor: float | None, *, header_window_tokens: int | None
    ) -> ModelSpec:
        table = "default" if spec.guessed else spec.source
        operator = table not in _TABLE_SOURCES
        window, window_source = spec.window_tokens, table
        max_output, max_output_source = spec.max_output_tokens, table
        discovered = entry.discovered if entry is not None else None
        learned = entry.learned_window_tokens if entry is not None else None
        learned_from = (entry.learned_from if entry is not None else None) or "learned:overflow"
        if header_window_tokens is not None:
            window, window_source = header_window_tokens, "request"
        elif operator:
            if learned is not None and learned < window:
                window, window_source = learned, learned_from
        elif learned is not None:
            window, window_source = learned, learned_from
        elif discovered is not None and discovered.window_tokens is not None:
            window, window_source = discovered.window_tokens, "discovered"
        if not operator and discovered is not None and discovered.max_output_tokens is not None:
            max_output, max_output_source = discovered.max_output_tokens, "discovered"
        max_output = max(1, min(max_output, window))
        correction, correction_source = 1.0, "none"
        if spec.encoding == "estimate" and factor is not None and entry is not None:
            correction, correction_source = factor, f"calibrated:{entry.factor_source or 'usage'}"
        guessed = spec.guessed and window_source not in _LEARNED_SOURCES | {"discovered"}
        return replace(
            spec,
            window_tokens=window,
            max_output_tokens=max_output,
            source=window_source,
            guessed=guessed,
            sources=(
                ("window", window_source),
                ("max_output", max_output_source),
                ("encoding", table),
                ("correction", correction_source),
            ),
            correction=correction,
        )

    # -- learning -----------------------------------------------------------------------------

    @_locked
    def observe_usage(
        self,
        model: str,
        *,
        prompt_tokens: int,
        fixed_tokens: int,
        text_tokens: int,
        exact: bool,
        window_tokens: int | None = None,
    ) -> UsageVerdict:
        """Learn from a successful response's ``usage.prompt_tokens`` for what we forwarded (our
        ``fixed_tokens`` and uncorrected ``text_tokens``, see ``MessageCounter.request_parts``),
        planned for ``window_tokens`` (None when that window was a guess)."""
        entry = self._entry(model)
        factor = None if exact else entry.factor()  # an exact count is never corrected
        if exact:
            expected = fixed_tokens + text_tokens
            calibrated = True
        else:
            expected = fixed_tokens + round(text_tokens * (factor if factor is not None else 1.0))
            calibrated = len(entry.samples) >= CALIBRATED_MIN_SAMPLES
        at_window = reaches_window(prompt_tokens, window_tokens)
        far_below = is_truncated(prompt_tokens=prompt_tokens, expected_tokens=expected, calibrated=calibrated)
        if at_window or far_below:
            entry.truncations += 1
            entry.version += 1
            if at_window and not exact and text_tokens >= MIN_SAMPLE_TEXT_TOKENS:
                bound = (prompt_tokens - fixed_tokens) / text_tokens * LOWER_BOUND_BOOST
                if factor is None or bound > factor:
                    entry.samples.append(bound)
                    entry.factor_source = "truncation"

            entry.warning = True
            learned: int | None = None
            if prompt_tokens >= MIN_TRUNCATION_WINDOW_TOKENS and (
                at_window or self._cut_confirmed(entry, prompt_tokens, expected)
            ):
                # Never below a prompt the upstream took whole: a cut is at the window, not under it.
                window = max(prompt_tokens, entry.max_prompt_tokens)
                current = entry.learned_window_tokens
                learned = window if current is None else min(current, window)
                entry.learned_window_tokens, entry.learned_from = learned, "learned:truncation"
            return UsageVerdict(truncated=True, learned_window_tokens=learned, expected_tokens=expected)
        entry.max_prompt_tokens = max(entry.max_prompt_tokens, prompt_tokens)
        sampled = self._sample(entry, prompt_tokens, fixed_tokens, text_tokens, exact=exact, source="usage")
        return UsageVerdict(sampled=sampled, expected_tokens=expected)

    @staticmethod
    def _cut_confirmed(entry: _Entry, prompt_tokens: int, expected_tokens: int) -> bool:
        """A count far below ours is a cut at the window, or a server reporting only the prompt
        tokens its cache did not hold. A cut pins the count: it is confirmed by a count that is a
        whole multiple of ``CUT_ROUND_TOKENS`` (how Ollama's ``num_ctx`` values look) or by a second
        observation reporting the same count (within ``CUT_SAME_RATIO``) for a prompt of ours that
        differs by at least ``CUT_DIFFERENT_RATIO``."""
        previous = entry.pending_cut
        entry.pending_cut = (prompt_tokens, expected_tokens)
        if prompt_tokens % CUT_ROUND_TOKENS == 0:
            return True
        if previous is None:
            return False
        same = abs(prompt_tokens - previous[0]) <= CUT_SAME_RATIO * prompt_tokens
        different = abs(expected_tokens - previous[1]) >= CUT_DIFFERENT_RATIO * expected_tokens
        return same and different

    @_locked
    def observe_overflow(
        self,
        model: str,
        overflow: ContextOverflow,
        *,
        fixed_tokens: int,
        text_tokens: int,
        exact: bool,
        sent_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """Learn from a context-length error: the window it states, and its count of our prompt;
        an error that states no window, the upper bound ``sent_tokens`` (our count of the input
        sent) plus ``output_tokens`` (the output cap sent, None when the body had none) proves."""
        entry = self._entry(model)
        entry.version += 1
        if overflow.limit_tokens is not None and overflow.limit_tokens > 0:
            entry.learned_window_tokens, entry.learned_from = overflow.limit_tokens, "learned:overflow"
        elif sent_tokens is not None and sent_tokens > 0:
            bound = window_after_refusal(
                sent_tokens + max(0, output_tokens or 0), known_good_tokens=entry.max_prompt_tokens
            )
            current = entry.learned_window_tokens
            if current is None or bound < current:
                entry.learned_window_tokens, entry.learned_from = bound, "learned:bound"
        prompt = overflow.prompt_tokens
        if prompt is not None and prompt > 0 and not overflow.prompt_at_least:
            self._sample(entry, prompt, fixed_tokens, text_tokens, exact=exact, source="overflow")

    @_locked
    def observe_count(
        self, model: str, *, input_tokens: int, fixed_tokens: int, text_tokens: int, exact: bool
    ) -> bool:
        """Learn from the upstream's own count of a request (Anthropic's ``count_tokens``, OpenAI's
        ``input_tokens``): the same sample a response's usage gives, but nothing was sent to the
        model, so a count far below ours is our over-estimate, never a cut. True when sampled."""
        if input_tokens <= 0:
            return False
        entry = self._entry(model)
        return self._sample(entry, input_tokens, fixed_tokens, text_tokens, exact=exact, source="count")

    @_locked
    def observe_proven(self, model: str, window_tokens: int) -> bool:
        """A success after a refusal that stated no window proved ``window_tokens`` enough for what
        it carried (``exchange.Deliver.proven_window_tokens``): a window learned from such a
        refusal (a geometric guess, possibly above the real one) comes down to it. True when it did."""
        entry = self._entries.get(model)
        if entry is None or entry.learned_from != "learned:bound" or window_tokens <= 0:
            return False
        current = entry.learned_window_tokens
        if current is not None and window_tokens >= current:
            return False
        entry.learned_window_tokens = window_tokens
        entry.version += 1
        return True

    @_locked
    def precision(self, model: str, *, exact: bool) -> Precision | None:
        """How far the upstream's counts strayed from ours (None before ``PRECISION_MIN_SAMPLES``)."""
        entry = self._entries.get(model)
        if entry is None or len(entry.samples) < PRECISION_MIN_SAMPLES:
            return None
        applied = 1.0 if exact else (entry.factor() or 1.0)
        high = max(entry.samples) / applied
        low = min(entry.samples) / applied
        return Precision(under=max(0.0, high - 1.0), over=max(0.0, 1.0 - low), samples=len(entry.samples))

    @_locked
    def version(self, model: str) -> int:
        entry = self._entries.get(model)
        return entry.version if entry is not None else 0

    @_locked
    def export(self, model: str) -> dict[str, object] | None:
        entry = self._entries.get(model)
        if entry is None or (entry.learned_window_tokens is None and not entry.samples):
            return None
        return {
            "model": model,
            "learned_window_tokens": entry.learned_window_tokens,
            "learned_from": entry.learned_from,
            "samples": list(entry.samples),
            "factor_source": entry.factor_source,
        }

    @_locked
    def absorb(self, model: str, data: object) -> bool:
        """Take what another replica learned about ``model`` (see the module contract); False when
        ``data`` is malformed or taught nothing new."""
        if not isinstance(data, dict) or data.get("model") != model:
            return False
        window = data.get("learned_window_tokens")
        learned_from = data.get("learned_from")
        samples = data.get("samples")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
            return False
        if learned_from is not None and learned_from not in _LEARNED_SOURCES:
            return False
        if (
            not isinstance(samples, list)
            or len(samples) > CALIBRATION_SAMPLES
            or not all(
                isinstance(s, int | float) and not isinstance(s, bool) and 0 < s <= 10 for s in samples
            )
        ):
            return False
        source = data.get("factor_source")
        entry = self._entry(model)
        changed = False
        current = entry.learned_window_tokens
        if window is not None and (current is None or window < current):
            entry.learned_window_tokens = window
            entry.learned_from = learned_from if isinstance(learned_from, str) else "learned:overflow"
            changed = True
        if samples and not entry.samples:
            entry.samples.extend(float(s) for s in samples)
            entry.factor_source = source if source in FACTOR_SOURCES else "usage"
            changed = True
        return changed

    def take_warning(self, model: str) -> bool:
        entry = self._entries.get(model)
        if entry is None or not entry.warning:  # nearly always: no lock taken to say so
            return False
        with self._lock:
            if not entry.warning:
                return False
            entry.warning = False
            return True

    @staticmethod
    def _sample(
        entry: _Entry, prompt_tokens: int, fixed_tokens: int, text_tokens: int, *, exact: bool, source: str
    ) -> bool:
        if exact:
            total = fixed_tokens + text_tokens
            if total < MIN_SAMPLE_TEXT_TOKENS:
                return False
            ratio = prompt_tokens / total
        else:
            if text_tokens < MIN_SAMPLE_TEXT_TOKENS:
                return False
            ratio = (prompt_tokens - fixed_tokens) / text_tokens
        if not ratio > 0:
            return False
        entry.samples.append(ratio)
        entry.factor_source = source
        entry.version += 1
        return True
