"""The only package that speaks HTTP to the upstream (httpx API; the transport is injected).

Imports no FastAPI, Starlette, ``app.api`` or ``app.service`` (``tests/test_architecture.py``).
"""

from .client import UpstreamClient, UpstreamResponse, route_base_url
from .errors import (
    UpstreamBusy,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .limits import ConcurrencyLimiter

__all__ = [
    "ConcurrencyLimiter",
    "UpstreamBusy",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamResponse",
    "UpstreamTimeout",
    "UpstreamUnreachable",
    "route_base_url",
]
