"""DialectLane: POST /v1/chat/completions (and every route of every dialect, literal or templated,
fit or count) is served by the route function without FastAPI's router."""

from __future__ import annotations

from typing import Any

import httpx
import respx
from starlette.types import Receive, Scope, Send

from tests.api import UPSTREAM, chat_ok, proxy

CHAT = f"{UPSTREAM}/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


class RouterSpy:
    """Stands in for the app's router (before the first request builds the middleware stack) and
    records what reaches it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append((scope["method"], scope["path"]))
        await self.inner(scope, receive, send)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def spy_on_the_router(app: Any) -> RouterSpy:
    assert app.middleware_stack is None  # not built yet: it will wrap the spy
    spy = app.router = RouterSpy(app.router)
    return spy


async def test_chat_is_served_and_planned_without_reaching_the_router() -> None:
    router = respx.Router()
    route = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    async with proxy(router) as (client, app):
        spy = spy_on_the_router(app)
        response = await client.post("/v1/chat/completions", json=BODY)
        await client.get("/healthz")
        assert spy.seen == [("GET", "/healthz")]  # the chat request never reached the router
        assert response.status_code == 200
        assert response.headers["x-context-tokens-before"] == response.headers["x-context-tokens-after"]
        assert route.calls.last.request.headers["x-request-id"] == response.headers["x-request-id"]


async def test_known_errors_are_rendered_like_the_routers() -> None:
    router = respx.Router()
    router.post(CHAT).mock(side_effect=httpx.ConnectError("refused"))
    async with proxy(router) as (client, app):
        spy = spy_on_the_router(app)
        bad = await client.post("/v1/chat/completions", content=b"{not json")
        too_big = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "w " * 5000}]},
            headers={"X-Context-Policy": "reject"},
        )
        unreachable = await client.post("/v1/chat/completions", json=BODY)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert too_big.status_code == 400 and too_big.json()["error"]["code"] == "context_length_exceeded"
    assert too_big.headers["x-context-tokens-before"]  # the plan's headers, as the router's handler adds
    assert unreachable.status_code == 502 and unreachable.json()["error"]["type"] == "upstream_error"
    assert spy.seen == []


async def test_other_methods_and_paths_go_on_to_the_router() -> None:
    router = respx.Router()
    models = router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    get_chat = router.get(CHAT).mock(return_value=httpx.Response(405))
    async with proxy(router) as (client, app):
        spy = spy_on_the_router(app)
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.get("/v1/chat/completions")).status_code == 405  # passed through
    assert models.called and get_chat.called
    assert spy.seen == [("GET", "/v1/models"), ("GET", "/v1/chat/completions")]


async def test_templated_and_counting_routes_are_served_by_the_lane_too() -> None:
    from dataclasses import replace

    from app.core.dialects import CHAT as CHAT_DIALECT
    from app.core.dialects import DIALECTS
    from app.core.routes import Route

    versioned = replace(
        CHAT_DIALECT,
        name="versioned",
        routes=(
            Route("/v9/models/{name}:go", upstream="chat/completions"),
            Route("/v9/models/{name}:count", kind="count", upstream="count/{name}", upstream_first=True),
        ),
    )
    router = respx.Router()
    fitted = router.post(CHAT).mock(return_value=httpx.Response(200, json=chat_ok()))
    counted = router.post(f"{UPSTREAM}/count/m%201").mock(
        return_value=httpx.Response(200, json={"input_tokens": 7})
    )
    async with proxy(router, dialects={**DIALECTS, "versioned": versioned}) as (client, app):
        spy = spy_on_the_router(app)
        go = await client.post("/v9/models/any:go", json=BODY)
        count = await client.post("/v9/models/m%201:count", json=BODY)
    assert go.status_code == 200 and fitted.called and go.headers["x-context-tokens-before"]
    assert count.status_code == 200 and count.json() == {"input_tokens": 7} and counted.called
    assert spy.seen == []


async def test_posts_enter_at_the_apps_own_outermost_middleware_and_bugs_stay_in_the_api_shape() -> None:
    from starlette.middleware.errors import ServerErrorMiddleware

    from app.api.lane import ProxyApp
    from app.observability.middleware import ObservabilityMiddleware

    router = respx.Router()
    router.post(CHAT).mock(side_effect=RuntimeError("a bug below the lane"))
    router.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    async with proxy(router) as (client, app):
        assert isinstance(app, ProxyApp)
        entered: list[str] = []
        original = ServerErrorMiddleware.__call__

        async def spying(self: Any, scope: Scope, receive: Receive, send: Send) -> None:
            entered.append(scope["method"])
            await original(self, scope, receive, send)

        ServerErrorMiddleware.__call__ = spying  # type: ignore[method-assign]
        try:
            bug = await client.post("/v1/chat/completions", json=BODY)
            listed = await client.get("/v1/models")
        finally:
            ServerErrorMiddleware.__call__ = original  # type: ignore[method-assign]
        assert type(app._door) is ObservabilityMiddleware
    assert entered == ["GET"]  # the POST went past FastAPI's outer layers
    assert bug.status_code == 500 and bug.json()["error"]["type"] == "server_error"
    assert bug.headers["x-request-id"]  # observability saw it all the same
    assert listed.status_code == 200
