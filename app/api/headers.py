"""Parse and validate the per-request ``X-Context-*`` headers into ``RequestOptions``.

A bad value raises ``InvalidRequest`` whose ``param`` is the header's name, rendered as a 400
``invalid_request_error``. These headers are never forwarded upstream (``app.upstream.headers``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from starlette.datastructures import Headers

from ..core.budget import POLICY_MODES, PolicyMode
from ..core.errors import InvalidRequest
from ..service.request import RequestOptions

BUDGET = "X-Context-Budget"
RESERVE = "X-Context-Reserve"
WINDOW = "X-Context-Window"
POLICY = "X-Context-Policy"
KEEP_TURNS = "X-Context-Keep-Turns"
SUMMARIZE = "X-Context-Summarize"
CUT_TARGET = "X-Context-Cut-Target"
UPSTREAM_COUNT = "X-Context-Upstream-Count"
LOWER_OUTPUT = "X-Context-Lower-Output"
RECALL = "X-Context-Recall"
API = "X-Context-Api"  # the dry run's choice of wire API (app.api.routes.plan_dialect)
SWITCH_VALUES = {"on": True, "off": False}


def _int(headers: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    text = raw.strip()
    # int() alone would accept "+5", "1_000" and non-ASCII digits: only plain decimals pass.
    if not (text.isascii() and text.isdigit()) or len(text) > 12 or int(text) < minimum:
        kind = "a positive integer" if minimum > 0 else "an integer >= 0"
        raise InvalidRequest(f"Header {name} must be {kind}, got {raw!r}.", param=name)
    return int(text)


def _share(headers: Mapping[str, str], name: str) -> float | None:
    """A share in (0, 1] written as a plain decimal (``0.6``, ``1``); None when absent."""
    raw = headers.get(name)
    if raw is None:
        return None
    text = raw.strip()
    digits = text.replace(".", "", 1)
    value = float(text) if text.isascii() and digits.isdigit() and len(text) <= 12 else 0.0
    if not 0.0 < value <= 1.0:
        raise InvalidRequest(f"Header {name} must be a number in (0, 1], got {raw!r}.", param=name)
    return value


NO_OPTIONS = RequestOptions()
_PREFIX = b"x-context-"


def options_of(raw: Iterable[tuple[bytes, bytes]]) -> RequestOptions:
    """:func:`parse_context_headers` of ASGI header pairs, in one pass: a request with no
    ``X-Context-*`` header (nearly every one) gets :data:`NO_OPTIONS` without a lookup per option."""
    ours: list[tuple[bytes, bytes]] | None = None
    for name, value in raw:
        if name[:10].lower() == _PREFIX:
            if ours is None:
                ours = []
            ours.append((name.lower(), value))
    return NO_OPTIONS if ours is None else parse_context_headers(Headers(raw=ours))


def parse_context_headers(headers: Mapping[str, str]) -> RequestOptions:
    """``headers`` is case-insensitive (Starlette's ``Headers``); absent headers stay None."""
    mode: PolicyMode | None = None
    raw_mode = headers.get(POLICY)
    if raw_mode is not None:
        value = raw_mode.strip().lower()
        if value not in POLICY_MODES:
            raise InvalidRequest(
                f"Header {POLICY} must be one of {'|'.join(POLICY_MODES)}, got {raw_mode!r}.", param=POLICY
            )
        mode = value
    return RequestOptions(
        budget_tokens=_int(headers, BUDGET, minimum=1),
        reserve_tokens=_int(headers, RESERVE, minimum=0),
        window_tokens=_int(headers, WINDOW, minimum=1),
        mode=mode,
        keep_turns=_int(headers, KEEP_TURNS, minimum=0),
        summarize=_switch(headers, SUMMARIZE),
        cut_target=_share(headers, CUT_TARGET),
        upstream_count=_switch(headers, UPSTREAM_COUNT),
        lower_output=_switch(headers, LOWER_OUTPUT),
        recall=_switch(headers, RECALL),
    )


def _switch(headers: Mapping[str, str], name: str) -> bool | None:
    """``on`` / ``off`` (any case); None when absent."""
    raw = headers.get(name)
    if raw is None:
        return None
    switch = raw.strip().lower()
    if switch not in SWITCH_VALUES:
        raise InvalidRequest(f"Header {name} must be on or off, got {raw!r}.", param=name)
    return SWITCH_VALUES[switch]
