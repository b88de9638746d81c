"""Optional proxy keys (``CTXPROXY_API_KEYS``): pure ASGI middleware in front of every route.

When keys are configured, every request except ``GET /healthz``, ``GET /readyz`` and ``HEAD /``
(probes carry no key) must present one in a key slot of any served API (``Dialect.key_slots``,
in registry order: ``Authorization: Bearer KEY`` for OpenAI's SDKs, ``x-api-key: KEY`` for
Anthropic's clients, a query parameter for an API that takes one); otherwise it gets a 401, before
its body is read, in the shape of the API whose route (or path) it is (``RouteTable.owner``), else
the default dialect's. The presented key is compared with :func:`hmac.compare_digest` against
*every* configured key (no early exit), so the time taken does not tell which key, or how much of
one, matched. The client's key is then dropped on the way upstream and the operator's
``CTXPROXY_UPSTREAM_API_KEY`` sent instead (``app.upstream.headers``); the settings refuse proxy
keys without an upstream key. Neither key is ever logged or echoed.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.dialect import Dialect, ErrorInfo
from ..core.routes import AUTHORIZATION, KeySlot, RouteTable
from .errors import dialect_of, json_stream_of, render_info

OPEN_PATHS: frozenset[str] = frozenset({"/healthz", "/readyz"})


def _query_value(query: bytes, name: str) -> bytes | None:
    for pair in query.split(b"&"):
        key, _, value = pair.partition(b"=")
        if unquote_to_bytes(key.replace(b"+", b" ")).decode("latin-1").lower() == name:
            return unquote_to_bytes(value.replace(b"+", b" "))
    return None


def presented_key(
    headers: Sequence[tuple[bytes, bytes]], query: bytes = b"", *, slots: Sequence[KeySlot] = (AUTHORIZATION,)
) -> bytes | None:
    """The key in the first of ``slots`` the request fills (its first header of that name, or its
    query parameter); None when it fills none, or the first one it fills is malformed (a
    ``Authorization`` that is not ``Bearer``, an empty value)."""
    first: dict[bytes, bytes] = {}
    for name, value in headers:
        first.setdefault(name.lower(), value)
    for slot in slots:
        raw: bytes | None
        if slot.in_query:
            raw = _query_value(query, slot.name) if query else None
        else:
            raw = first.get(slot.name.encode("latin-1"))
        if raw is None:
            continue
        found = slot.key_in(raw.decode("latin-1"))
        return found.encode("latin-1") if found is not None else None
    return None


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


def _where(slot: KeySlot) -> str:
    if slot.in_query:
        return f"'?{slot.name}=<key>'"
    name = slot.name.title() if slot.scheme else slot.name  # "Authorization: Bearer <key>"
    return f"'{name}: {slot.value('<key>')}'"


def unauthorized_info(dialect: Dialect) -> ErrorInfo:
    """The 401 of ``dialect``'s clients, naming where they put a key."""
    places = [_where(slot) for slot in dialect.key_slots] or [_where(AUTHORIZATION)]
    rest = f" (or {', '.join(places[1:])})" if len(places) > 1 else ""
    message = (
        f"Missing or incorrect API key for this proxy. Send one of the proxy's keys as {places[0]}{rest}."
    )
    return ErrorInfo(status=401, code="invalid_api_key", message=message)


class ProxyKeyMiddleware:
    """401 unless the request presents one of ``keys`` in one of ``slots`` (does nothing when
    ``keys`` is empty); the 401 is in the shape of the dialect ``table`` says owns the path."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: Sequence[str],
        slots: Sequence[KeySlot] = (AUTHORIZATION,),
        table: RouteTable | None = None,
        granted: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.keys = tuple(key.encode("utf-8") for key in keys)
        self.slots = tuple(slots)
        self.table = table
        # Another way in for some requests (the status page's session, app.api.login): it decides.
        self.granted = granted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or scope.get("path") in OPEN_PATHS or _probe(scope):
            await self.app(scope, receive, send)
            return
        presented = presented_key(scope.get("headers", []), scope.get("query_string", b""), slots=self.slots)
        if key_matches(presented, self.keys) or (self.granted is not None and self.granted(scope)):
            await self.app(scope, receive, send)
            return
        owner = self.table.owner(str(scope.get("path") or "")) if self.table is not None else None
        dialect = owner or dialect_of(scope)
        json_stream = json_stream_of(scope, self.table)
        response = render_info(unauthorized_info(dialect), dialect, json_stream=json_stream)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
