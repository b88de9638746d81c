"""The upstream package's error tree; httpx errors are translated into it at this boundary.

::

    UpstreamError              anything that kept us from getting an HTTP answer from the upstream
     ├── UpstreamUnreachable   connect refused, DNS failure, connection dropped before an answer (502)
     ├── UpstreamTimeout       connect, write, read or pool timeout (504)
     ├── UpstreamProtocolError the upstream answered with something that is not valid HTTP, or broke
     │                         the connection mid-answer (502)
     ├── UpstreamBusy          the proxy's cap on concurrent upstream requests is reached and the
     │                         brief queue did not free a place (503 with Retry-After)
     └── UpstreamPreempted     a background call (a summary) given up after client requests
                               cancelled it ``MAX_PREEMPTIONS`` times (never reaches a client)

The tree hangs under ``CtxproxyError`` (``app/core/errors.py`` draws it whole). An HTTP answer
with an error status is *not* an ``UpstreamError``: it is a response, passed back.
The HTTP status of each error is decided in ``app/api/errors.py`` only.
"""

from __future__ import annotations

from ..core.errors import CtxproxyError


class UpstreamError(CtxproxyError):
    """Base class: ``message`` is safe to show to the client (no secrets, no request body)."""

    def __init__(self, message: str, *, base_url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.base_url = base_url


class UpstreamUnreachable(UpstreamError):
    """We could not reach the upstream (or it closed the connection before answering)."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer (or did not go on answering) in time."""


class UpstreamProtocolError(UpstreamError):
    """The upstream's answer was not valid HTTP, or the connection broke mid-answer."""


class UpstreamBusy(UpstreamError):
    """Not sent: the proxy's concurrency cap is full (``app.upstream.limits``); retry later."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UpstreamPreempted(UpstreamError):
    """A background call given up: client requests to its upstream cancelled it too often
    (``app.upstream.traffic``). Only background calls raise it; the summarizer backs off the span."""
