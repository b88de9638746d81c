"""Size the emergency retry after an upstream context overflow.

INTERFACE CONTRACT:

``retry_cap_tokens(*, overflow, sent_tokens, budget, margin_ratio=0.05) -> int | None``: the input
cap (in our tokens, same unit as ``Budget.cap_tokens``: the whole input, tools included) for the
next attempt after ``overflow``, given ``sent_tokens`` (our count of the input just sent: messages +
reply priming + tool definitions, i.e. ``Plan.tokens_after``) and the ``Budget`` it was planned
with. Pure. The result is always strictly smaller than ``sent_tokens`` and never negative;
``None`` when a retry cannot help (the upstream's stated output alone fills its window, or the cap
would leave no room for a single message next to the tools).

``retry_size(*, overflow, sent_tokens, budget, spec, policy, requested_output_tokens=None,
sent_output_tokens=None, known_good_tokens=0, margin_ratio=0.05) -> RetrySize | None``: the whole
next attempt: the cap above, the window it is fitted to and, when the output reserve leaves no room,
a lower one (see "The window and the output" below). ``window_after_refusal(refused_tokens, *,
known_good_tokens=0) -> int``: the window to fit to after a refusal that states no numbers (the
same rule ``knowledge.Knowledge`` learns with).

``MAX_RETRIES``: how many emergency retries one request may make.

The formula, with ``L`` the limit the upstream states, ``P`` its own count of our prompt, ``O`` the
output it counted against ``L`` (``budget.reserve_tokens`` when it does not say), ``S`` =
``sent_tokens`` and ``m`` = ``margin_ratio``:

* ``L`` and ``P`` given (an exact count): ``ratio = clamp(P / S, 1.0, 4.0)`` (the upstream's tokenizer
  counts more than ours, never assumed to count less), ``cap = floor((L - O) / ratio * (1 - m))``,
  and at most ``floor(S * (1 - m))`` (numbers that do not explain the refusal still shrink it).
* ``L`` given, ``P`` missing or only a lower bound ("at least P"): ``ratio = clamp(P / S, 1.0, 4.0)``
  when ``P`` is a lower bound else 1.0, a wider margin ``w = clamp(2m, 0.10, 0.9)``,
  ``cap = min(floor((L - O) / ratio * (1 - w)), floor(S * 0.9))``.
* nothing given: ``cap = S // 2``.

Then ``cap = min(cap, S - 1)``; ``None`` if ``L - O <= 0`` or ``cap <= budget.tool_tokens +
REPLY_PRIMING_TOKENS``. For fixed other inputs the cap never decreases when ``L`` or ``S`` grows and
never increases when ``P``, ``O`` or ``m`` grows. ``output_tokens`` (when given) stands for ``O``.

The window and the output (``retry_size``):

* ``L`` stated: the retry is fitted to window ``L``. When ``O`` takes half of ``L`` or more (an
  output reserve at or over the window: a table that put the window at 131,072 and a reserve of
  4,096 in front of a 4,096-token server), ``O`` is lowered instead of giving up. Our own reserve
  (the client set no cap: the upstream never saw it) comes down to the window's default reserve. A
  client's cap, when ``policy.lower_output``, comes down to what keeps the upstream's stated prompt
  whole (``L - P - 1%`` of ``L``: the same prompt with a lower cap; ``cap_tokens`` is then ``S``
  and ``margin_tokens`` makes the plan keep it whole) when that is at least the policy's
  ``output_floor_tokens``, else to the larger of the floor and the window's default reserve (the
  input is cut to fit next to it); without ``lower_output``, None (the refusal is delivered).
* nothing stated: the upstream refused ``S`` plus the output cap it was sent, so its window is
  below that: the retry is fitted to ``window_after_refusal`` of it (``SHRINK`` of it, or the
  largest prompt the upstream took whole when that is more: geometric, so two refusals bring a
  wrong table's 131,072 down to a 4,096-token server's reach), with the cap ``S // 2``; an output
  cap over half that window is lowered the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .budget import Budget, Policy, default_reserve_tokens, margin_tokens_for
from .overflow import ContextOverflow
from .registry import ModelSpec
from .tokens import REPLY_PRIMING_TOKENS

MAX_RETRIES = 2

RATIO_MIN = 1.0
RATIO_MAX = 4.0
LIMIT_ONLY_SHARE = 0.9
LIMIT_ONLY_MARGIN_MIN = 0.10
MARGIN_MAX = 0.45
SHRINK = 0.5
OUTPUT_MAX_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class RetrySize:
    """The next attempt after an overflow: the input ``cap_tokens`` (our units, the whole input),
    the ``window_tokens`` it is fitted to, ``output_cap_tokens``, a lowered output reserve (None:
    as before), and ``margin_tokens``, set when only the output comes down (the prompt is kept
    whole: ``cap_tokens`` is then what was sent)."""

    cap_tokens: int
    window_tokens: int
    output_cap_tokens: int | None = None
    margin_tokens: int | None = None


def window_after_refusal(refused_tokens: int, *, known_good_tokens: int = 0) -> int:
    """The window to fit to once the upstream refused ``refused_tokens`` (input plus the output cap
    it was sent) without saying its window: ``SHRINK`` of it, or the largest input it took whole
    (``known_good_tokens``) when that is more and still below what it refused; at least 1."""
    shrunk = math.floor(refused_tokens * SHRINK)
    good = min(max(0, known_good_tokens), refused_tokens - 1)
    return max(1, shrunk, good)


def retry_cap_tokens(
    *,
    overflow: ContextOverflow,
    sent_tokens: int,
    budget: Budget,
    margin_ratio: float = 0.05,
    output_tokens: int | None = None,
) -> int | None:
    """The smaller input cap for the next attempt, or None (formula in the module docstring)."""
    if sent_tokens <= 1:
        return None
    margin = min(max(margin_ratio, 0.0), MARGIN_MAX) if math.isfinite(margin_ratio) else MARGIN_MAX
    limit = overflow.limit_tokens
    if limit is None or limit <= 0:
        cap = sent_tokens // 2
    else:
        output = overflow.output_tokens if overflow.output_tokens is not None else budget.reserve_tokens
        if output_tokens is not None:
            output = output_tokens
        available = limit - max(0, output)
        if available <= 0:
            return None
        prompt = overflow.prompt_tokens if overflow.prompt_tokens and overflow.prompt_tokens > 0 else None
        ratio = RATIO_MIN if prompt is None else min(max(prompt / sent_tokens, RATIO_MIN), RATIO_MAX)
        if prompt is not None and not overflow.prompt_at_least:
            cap = min(
                math.floor(available / ratio * (1.0 - margin)),
                math.floor(sent_tokens * (1.0 - margin)),
            )
        else:
            wide = min(max(2.0 * margin, LIMIT_ONLY_MARGIN_MIN), 0.9)
            cap = min(
                math.floor(available / ratio * (1.0 - wide)),
                math.floor(sent_tokens * LIMIT_ONLY_SHARE),
            )
    cap = min(cap, sent_tokens - 1)
    if cap <= max(0, budget.tool_tokens) + REPLY_PRIMING_TOKENS:
        return None
    return cap


def retry_size(
    *,
    overflow: ContextOverflow,
    sent_tokens: int,
    budget: Budget,
    spec: ModelSpec,
    policy: Policy,
    requested_output_tokens: int | None = None,
    sent_output_tokens: int | None = None,
    known_good_tokens: int = 0,
    margin_ratio: float = 0.05,
) -> RetrySize | None:
    """The next attempt after ``overflow`` (see the module docstring), or None when none can help.

    ``requested_output_tokens``: the client's own output cap (None: the reserve is ours, the
    upstream does not count it); ``sent_output_tokens``: the output cap the refused body carried
    (the client's, or one lowered before; defaults to the client's)."""
    if sent_tokens <= 1:
        return None
    sent_output = sent_output_tokens if sent_output_tokens is not None else requested_output_tokens
    limit = overflow.limit_tokens
    output: int | None = None
    if limit is not None and limit > 0:
        window = limit
        stated = overflow.output_tokens if overflow.output_tokens is not None else budget.reserve_tokens
        if stated >= window * OUTPUT_MAX_SHARE:
            prompt = overflow.prompt_tokens if not overflow.prompt_at_least else None
            whole = _whole_prompt_output(window, prompt, policy=policy, requested=sent_output)
            if whole is not None:
                # The prompt stays as it is; only the output cap comes down (Claude Code's own fix).
                margin = window - whole - sent_tokens
                return RetrySize(sent_tokens, window, output_cap_tokens=whole, margin_tokens=margin)
            output = _lowered_output(window, spec=spec, policy=policy, requested=sent_output)
            if output is None:
                return None
        cap = retry_cap_tokens(
            overflow=overflow,
            sent_tokens=sent_tokens,
            budget=budget,
            margin_ratio=margin_ratio,
            output_tokens=output,
        )
    else:
        window = window_after_refusal(
            sent_tokens + max(0, sent_output or 0), known_good_tokens=known_good_tokens
        )
        if sent_output is not None and sent_output >= window * OUTPUT_MAX_SHARE:
            output = _lowered_output(window, spec=spec, policy=policy, requested=sent_output)
            if output is None:
                return None
        cap = retry_cap_tokens(
            overflow=overflow, sent_tokens=sent_tokens, budget=budget, margin_ratio=margin_ratio
        )
    if cap is None:
        return None
    return RetrySize(cap_tokens=cap, window_tokens=window, output_cap_tokens=output)


def _whole_prompt_output(
    window_tokens: int, prompt_tokens: int | None, *, policy: Policy, requested: int | None
) -> int | None:
    """The client's output cap lowered so that the upstream's stated prompt stays whole, when that
    leaves at least the floor (else None)."""
    if requested is None or prompt_tokens is None or prompt_tokens <= 0 or not policy.lower_output:
        return None
    room = window_tokens - prompt_tokens - margin_tokens_for(window_tokens, policy, exact=True)
    if room < policy.output_floor_tokens or room >= requested:
        return None
    return room


def _lowered_output(
    window_tokens: int, *, spec: ModelSpec, policy: Policy, requested: int | None
) -> int | None:
    """The output reserve to retry with in ``window_tokens``: the window's default reserve (ours),
    or a client's cap lowered to the floor (at least the default), or None when not allowed or
    that would not leave half the window."""
    default = default_reserve_tokens(spec, policy, window_tokens=window_tokens)
    if requested is None:
        return default  # our own reserve: the upstream never saw it
    if not policy.lower_output:
        return None
    lowered = max(policy.output_floor_tokens, default)
    if lowered >= requested or lowered > window_tokens * OUTPUT_MAX_SHARE:
        return None
    return lowered
