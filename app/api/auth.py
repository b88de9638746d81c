"""Optional proxy keys (``CTXPROXY_API_KEYS``): pure ASGI middleware in front of every route.

When keys are configured, every request except ``GET /healthz``, ``GET /readyz`` and ``HEAD /``
(probes carry no key) must present one as ``Authorization: Bearer KEY`` (what the OpenAI SDKs
send) or ``x-api-key: KEY`` (Anthropic's clients); otherwise it gets a 401, before its body is
read, in OpenAI's shape or, on a fitted API's route, in that API's. The presented key is compared with
:func:`hmac.compare_digest` against *every* configured key (no early exit), so the time taken does
not tell which key, or how much of one, matched. The client's key is then dropped on the way
upstream and the operator's ``CTXPROXY_UPSTREAM_API_KEY`` sent instead (``app.upstream.headers``);
the settings refuse proxy keys without an upstream key. Neither key is ever logged or echoed.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping, Sequence

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.dialect import Dialect, ErrorInfo
from ..core.dialects import CHAT
from .errors import error_response

OPEN_PATHS: frozenset[str] = frozenset({"/healthz", "/readyz"})


def presented_key(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The key in the request's first ``Authorization: Bearer KEY`` header, else in its first
    ``x-api-key`` header (Anthropic's clients, e.g. Claude Code, send their key there)."""
    api_key: bytes | None = None
    for name, value in headers:
        lower = name.lower()
        if lower == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and token.strip():
                return token.strip()
            return None
        if lower == b"x-api-key" and api_key is None:
            api_key = value.strip() or None
    return api_key


def key_matches(presented: bytes | None, keys: Sequence[bytes]) -> bool:
    """Constant time in the presented key: every configured key is compared, always."""
    candidate = presented if presented is not None else b""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(candidate, key)
    return matched and presented is not None


def _probe(scope: Scope) -> bool:
    """``HEAD /``: a client's connectivity check (Claude Code's), which answers nothing secret."""
    return scope.get("method") == "HEAD" and scope.get("path") == "/"


def dialect_for(path: str, routes: Mapping[str, Dialect]) -> Dialect | None:
    """The dialect of a fitted route ``path`` is (or is under, like its counting endpoint)."""
    for route, dialect in routes.items():
        if path == route or path.startswith(route + "/"):
            return dialect
    return None


class ProxyKeyMiddleware:
    """401 unless the request presents one of ``keys`` (does nothing when ``keys`` is empty); on a
    fitted API's route (``routes``: path -> dialect) the 401 is in that API's error shape."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Sequence[str],
        routes: Mapping[str, Dialect] | None = None,
        granted: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.keys = tuple(key.encode("utf-8") for key in keys)
        self.routes: Mapping[str, Dialect] = routes or {}
        # Another way in for some requests (the status page's session, app.api.login): it decides.
        self.granted = granted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope.get("path") in OPEN_PATHS or _probe(scope):
            await self.app(scope, receive, send)
            return
        if key_matches(presented_key(scope.get("headers", [])), self.keys) or (
            self.granted is not None and self.granted(scope)
        ):
            await self.app(scope, receive, send)
            return
        message = (
            "Missing or incorrect API key for this proxy. Send one of the proxy's keys as "
            "'Authorization: Bearer <key>' (or 'x-api-key: <key>')."
        )
        dialect = dialect_for(str(scope.get("path") or ""), self.routes)
        if dialect is None or dialect is CHAT:
            response = error_response(401, message, type="invalid_request_error", code="invalid_api_key")
        else:
            info = ErrorInfo(status=401, code="invalid_api_key", message=message)
            response = Response(
                orjson.dumps(dialect.error_body(info)), status_code=401, media_type="application/json"
            )
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
