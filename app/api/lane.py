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
"""

from __future__ import annotations

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
