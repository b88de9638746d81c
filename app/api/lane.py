"""The fitted routes' short way in: ``POST /v1/chat/completions`` (and every other fitted API's
route) skips FastAPI's router.

Every such request is on the critical path of an LLM call, and FastAPI's routing layers
(exception middleware, exit stack, route matching, ``request_response``) cost about an eighth of
the proxy's CPU on a small request (``bench/``: py-spy). :class:`FittedLane` is a pure ASGI
middleware, innermost of ours (inside ``LastResortMiddleware``): it calls the same route function
(``app.api.routes.fitted_route``), and renders the errors the route raises on purpose with the
same handler the app registers for them (``app.api.errors``). Anything else (a bug) propagates to
``LastResortMiddleware`` as from the router. Every other request goes on to FastAPI unchanged; the
routes stay registered there too (and answer if the lane is not installed).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import KNOWN_ERRORS, handle_known
from .routes import FittedRoute, chat_completions

CHAT_ROUTE = "/v1/chat/completions"


def route_path(scope: Scope) -> str:
    """The path the router matches: ``path`` under the app's ``root_path`` (Starlette's rule)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :]
    return path


class FittedLane:
    """``routes``: route path -> route function (default: the chat route only)."""

    def __init__(self, app: ASGIApp, *, routes: Mapping[str, FittedRoute] | None = None) -> None:
        self.app = app
        default: dict[str, FittedRoute] = {CHAT_ROUTE: chat_completions}
        self.routes: dict[str, FittedRoute] = default if routes is None else dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST":
            route = self.routes.get(route_path(scope))
        if route is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        response: Response
        try:
            response = await route(request)
        except KNOWN_ERRORS as exc:
            response = await handle_known(request, exc)
        await response(scope, receive, send)
