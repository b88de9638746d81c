"""Size the emergency retry after an upstream context overflow.

INTERFACE CONTRACT:

``retry_cap_tokens(*, overflow, sent_tokens, budget, margin_ratio=0.05) -> int | None``: the input
cap (in our tokens, same unit as ``Budget.cap_tokens``: the whole input, tools included) for the
next attempt after ``overflow``, given ``sent_tokens`` (our count of the input just sent: messages +
reply priming + tool definitions, i.e. ``Plan.tokens_after``) and the ``Budget`` it was planned
with. Pure. The result is always strictly smaller than ``sent_tokens`` and never negative;
``None`` when a retry cannot help (the upstream's stated output alone fills its window, or the cap
would leave no room for a single message next to the tools).

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
never increases when ``P``, ``O`` or ``m`` grows.
"""

from __future__ import annotations

import math

from .budget import Budget
from .overflow import ContextOverflow
from .tokens import REPLY_PRIMING_TOKENS

MAX_RETRIES = 2

RATIO_MIN = 1.0
RATIO_MAX = 4.0
LIMIT_ONLY_SHARE = 0.9
LIMIT_ONLY_MARGIN_MIN = 0.10
MARGIN_MAX = 0.45


def retry_cap_tokens(
    *,
    overflow: ContextOverflow,
    sent_tokens: int,
    budget: Budget,
    margin_ratio: float = 0.05,
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
