"""The dialects' routes, served without FastAPI's router: every ``POST`` to a route of a
registered dialect (``Dialect.routes``: ``/v1/chat/completions``, its counting endpoints, path
templates such as ``/v1beta/models/{model}:generateContent``).

Every such request is on the critical path of an LLM call, and FastAPI's routing layers
(exception middleware, exit stack, route matching, ``request_response``) cost about an eighth of
the proxy's CPU on a small request (``bench/``: py-spy). :class:`DialectLane` is a pure ASGI
middleware, innermost of ours (inside ``LastResortMiddleware``): it matches the path against the
registry's ``app.core.routes.RouteTable`` (a dict lookup for literal paths; the precompiled
templates only when none matches), calls the route function of the route's kind
(``app.api.routes.fitted`` or ``app.api.counting.count``) with the match, and renders the errors
it raises on purpose with the same handler the app registers for them (``app.api.errors``).
Anything else (a bug) propagates to ``LastResortMiddleware`` as from the router. Every other
request goes on to FastAPI unchanged (a ``GET`` of a dialect's path is passed through there, and
is our 405 in that API's shape when the upstream refuses the method: ``app.api.routes.passthrough``).

:class:`ProxyApp` is the app itself (a ``FastAPI``): it takes every ``POST`` (the lane's, and the
pass-through's and the dry run's) straight to the app's outermost middleware of its own (the
observability's), past FastAPI's three outer layers (``ServerErrorMiddleware``, its exception
telemetry, its body-size limit), which do nothing for this app: ``LastResortMiddleware`` renders
every unhandled error as a 500 in the request's API's shape before they would see it, no body
limit is set on the app (``Settings.max_body_bytes`` is the routes'), and FastAPI's native
OpenTelemetry instrumentation is off unless an OpenTelemetry SDK is configured, in which case
nothing is skipped (checked when the first request comes).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core.errors import InvalidRequest
from ..core.routes import RouteTable
from .counting import count
from .disconnect import NoResponse
from .errors import KNOWN_ERRORS, handle_known
from .responses import UpstreamStreamResponse
from .routes import fitted


def route_path(scope: Scope) -> str:
    """The path the router matches: ``path`` under the app's ``root_path`` (Starlette's rule)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


def _raw_path(scope: Scope) -> str | None:
    """The path as the client sent it (percent-encoding kept), under the ``root_path``."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return None
    text = raw.split(b"?", 1)[0].decode("latin-1")
    root: str = scope.get("root_path", "")
    return text[len(root) :] if root and text.startswith(root) else text


class DialectLane:
    """Serves every route in ``table`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, table: RouteTable) -> None:
        self.app = app
        self.table = table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        raw_query: bytes = scope.get("query_string", b"")
        query = raw_query.decode("latin-1") if raw_query else ""
        path = route_path(scope)
        response: Response | UpstreamStreamResponse | NoResponse
        try:
            match = self.table.literal(path, query)
            if match is None:
                match = self.table.match(path, query, _raw_path(scope))
        except InvalidRequest as exc:  # a dot segment in a templated path
            response = await handle_known(Request(scope, receive), exc)
            await response(scope, receive, send)
            return
        if match is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            if match.route.kind == "count":
                response = await count(request, match)
            else:
                response = await fitted(request, match)
        except KNOWN_ERRORS as exc:
            response = await handle_known(request, exc)
        await response(scope, receive, send)


# How deep FastAPI's own layers may sit above the app's first middleware.
_OUTER_LAYERS_MAX = 8


class ProxyApp(FastAPI):
    """``FastAPI`` whose ``POST`` requests skip FastAPI's outer layers (see the module docstring);
    every other request, and every request of an app with no middleware of its own, goes the
    whole way."""

    _door: ASGIApp | None = None
    _door_checked = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            door = self._door if self._door_checked else self._find_door()
            if door is not None:
                if self.root_path:
                    scope["root_path"] = self.root_path
                scope["app"] = self
                await door(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _find_door(self) -> ASGIApp | None:
        """The app's outermost middleware of its own inside the built stack, when skipping what
        is above it changes nothing (no body limit, FastAPI's telemetry off); else None."""
        self._door_checked = True
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        if not self.user_middleware or getattr(self, "max_body_size", None) is not None:
            return None
        telemetry: Any = getattr(self, "_native_telemetry", None)
        if telemetry is None or telemetry.enabled():
            return None
        first: Any = self.user_middleware[0].cls
        node: Any = self.middleware_stack
        for _ in range(_OUTER_LAYERS_MAX):
            if type(node) is first:
                door: ASGIApp = node
                self._door = door
                return door
            node = getattr(node, "app", None)
        return None
