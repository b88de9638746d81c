"""Request IDs in log lines: a ``logging.Filter`` that stamps every record with the current ID.

The ID itself is chosen by the observability middleware (the client's ``X-Request-ID`` when valid,
else a new one, see :mod:`app.observability.context`), returned on every response and sent
upstream by the instrumented transport. The filter sets ``record.request_id`` (None outside a
request) and never drops a record; ``app.main``'s formatter prints it.
"""

from __future__ import annotations

import logging

from .context import current_request_id


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record passing through the handler it is attached to."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = current_request_id()
        return True
