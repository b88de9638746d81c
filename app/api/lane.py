"""The chat route's short way in: ``POST /v1/chat/completions`` skips FastAPI's router.

Every chat request is on the critical path of an LLM call, and FastAPI's routing layers
(exception middleware, exit stack, route matching, ``request_response``) cost about an eighth of
the proxy's CPU on a small request (``bench/``: py-spy). :class:`ChatLane` is a pure ASGI
middleware, innermost of ours (inside ``LastResortMiddleware``): it calls the same route function,
``app.api.routes.chat_completions``, and renders the errors the route raises on purpose with the
same handler the app registers for them (``app.api.errors``). Anything else (a bug) propagates to
``LastResortMiddleware`` as from the router. Every other request goes on to FastAPI unchanged; the
route stays registered there too (and answers if the lane is not installed).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import KNOWN_ERRORS, handle_known
from .routes import chat_completions

CHAT_ROUTE = "/v1/chat/completions"


class ChatLane:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or get_route_path(scope) != CHAT_ROUTE:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await chat_completions(request)
        except KNOWN_ERRORS as exc:
            response = await handle_known(request, exc)
        await response(scope, receive, send)
