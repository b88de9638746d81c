"""Stop waiting for the upstream when the client has gone away before the answer starts.

A long prompt can keep the upstream busy for seconds before its first byte, and a non-streaming
answer arrives only when the whole completion is done. If the client disconnects meanwhile, the
upstream request is cancelled (its connection closed) at once, instead of running to the end for
nobody. Once the answer starts, :class:`app.api.responses.UpstreamStreamResponse` watches instead.

``await until_client_leaves(receive, work)`` runs ``work()`` while listening on ``receive`` (whose
request body must already have been read, so the next message can only be ``http.disconnect``);
it returns ``work()``'s result, or raises :class:`ClientLeft` after cancelling it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..core.errors import CtxproxyError

T = TypeVar("T")


class ClientLeft(CtxproxyError):
    """The client disconnected before the answer started; nothing can be sent to it."""


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_client_leaves(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    task: asyncio.Future[T] = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(_disconnected(receive))
    # The client leaving cancels the work (a no-op once it is done): no asyncio.wait per request.
    watcher.add_done_callback(lambda _: task.cancel())
    try:
        return await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is None or not current.cancelling():  # not us being cancelled: the work was
            raise ClientLeft from None
        raise
    finally:
        if not task.done():
            task.cancel()  # we were cancelled: the work goes too
        if not watcher.done():
            watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


class NoResponse(Response):
    """What a route returns for a client that left: sends nothing (there is no one to send to).
    A ``Response`` subclass only so that FastAPI returns it as is."""

    def __init__(self) -> None:
        self.status_code = 499  # nginx's "client closed request", for the access log only
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        return None
