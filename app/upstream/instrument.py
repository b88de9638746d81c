"""Hooks the upstream client calls around every request: the request ID out, the wait reported.

``Instrumentation(request_id=..., on_response=...)`` is handed to ``UpstreamClient`` by the layer
above (observability), so this package stays free of it. Before sending, the client sets
``X-Request-ID`` to ``request_id()`` when that returns one (replacing whatever the client sent, so
the upstream sees the same ID as our logs and the client's response); once the upstream's response
headers are in, or the send failed, it calls ``on_response(method, url, waited_s, status)`` (url
without its query; status None when the send raised). A callback that raises is a bug there and
is not allowed to break the request.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("ctxproxy.upstream")


@dataclass(frozen=True, slots=True)
class Instrumentation:
    request_id: Callable[[], str | None]
    on_response: Callable[[str, str, float, int | None], None]

    def report(self, method: str, url: str, waited_s: float, status: int | None) -> None:
        try:
            self.on_response(method, url, waited_s, status)
        except Exception:  # observability must never fail a request
            logger.exception("upstream instrumentation callback failed")
