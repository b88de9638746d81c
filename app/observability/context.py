"""The per-request observability context: request ID and timings, carried in a contextvar.

:class:`RequestContext` is created by the observability middleware for every HTTP request and set
in :data:`current_request`; everything that runs for that request (the route, the service, the
upstream transport, log records, and asyncio tasks started from them, which copy the context) sees
the same mutable object. Outside a request :func:`current` returns None.

``upstream_s`` sums the time spent waiting for upstream response headers (every upstream call of
the request: retries and summaries included), so that the proxy's own overhead is the time to our
response start minus the time the request body took to arrive minus ``upstream_s``.

The ASGI scope keys through which the routes tell observability what they did (defined here, on
the observability side, so that ``app.observability`` never imports ``app.api``; the API layer
imports them):

* :data:`ACCESS_SCOPE_KEY`: a dict of access fields (model, token figures, actions, retries,
  upstream status, ...) the routes fill in (``app.api.responses.access_fields``);
* :data:`DIALECT_SCOPE_KEY`: the dialect of the route that took the request (an object with a
  ``name``: the wire API), recorded before anything can fail. Observability labels a request by
  that name, so a new dialect needs no edit here;
* :data:`SESSION_SCOPE_KEY`: True when the status page's login (``app.api.login``) found a valid
  session cookie on the request: the page then offers to sign out;
* :data:`RELAYED_SCOPE_KEY`: True when the response is an upstream's answer relayed by
  ``app.api.responses.UpstreamStreamResponse``: its headers need no look (an upstream's
  ``X-Request-ID`` is already ``X-Upstream-Request-ID``, and our ``X-Context-*`` figures are in
  the access fields), the middleware only adds ``X-Request-ID``.
"""

from __future__ import annotations

import contextvars
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ACCESS_SCOPE_KEY = "ctxproxy.access"
DIALECT_SCOPE_KEY = "ctxproxy.dialect"
SESSION_SCOPE_KEY = "ctxproxy.status_session"
RELAYED_SCOPE_KEY = "ctxproxy.relayed"

_VALID_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def valid_request_id(value: str | None) -> bool:
    """A client's ID is reused only when it is 1-128 characters of ``[A-Za-z0-9._-]`` (log- and
    header-safe: no spaces, quotes, newlines or non-ASCII)."""
    return value is not None and _VALID_ID.fullmatch(value) is not None


def new_request_id() -> str:
    """A fresh ID: 32 random hex digits (like a uuid4's hex, without building a UUID object)."""
    return os.urandom(16).hex()


@dataclass(slots=True)
class RequestContext:
    """Mutable on purpose: the middleware, the upstream transport and log filters share it."""

    request_id: str
    started_s: float
    route: str = "other"
    body_done_s: float | None = None
    response_start_s: float | None = None
    upstream_s: float = 0.0
    upstream_calls: int = 0
    scope: Mapping[str, Any] = field(default_factory=dict)
    # The upstream calls whose bookkeeping (metrics, status board) waits until the response's
    # first body byte is out (``Observability.upstream_call``, ``flush_upstream``): None when
    # calls are recorded as they happen (outside the middleware, or once it flushed).
    deferred: list[tuple[str, str, float, int | None]] | None = None

    def add_upstream(self, waited_s: float) -> None:
        self.upstream_s += waited_s
        self.upstream_calls += 1


current_request: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "ctxproxy_request", default=None
)


def api_of(scope: Mapping[str, Any]) -> str | None:
    """The name of the wire API the route recorded in ``scope`` (:data:`DIALECT_SCOPE_KEY`): the
    dialect's ``name``, or its ``dialect``'s for a value that carries one (a matched route), else
    None. A value with no ``name`` string is ignored (bookkeeping never fails a request)."""
    value = scope.get(DIALECT_SCOPE_KEY)
    if value is None:
        return None
    name = getattr(value, "name", None)
    if name is None:
        name = getattr(getattr(value, "dialect", None), "name", None)
    return name if isinstance(name, str) and name else None


def current() -> RequestContext | None:
    return current_request.get()


def current_request_id() -> str | None:
    ctx = current_request.get()
    return ctx.request_id if ctx is not None else None
