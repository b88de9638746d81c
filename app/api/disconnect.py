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


# A request answered within this long never starts a watcher (no task per small request); a
# client that left before it is noticed when the watcher starts, at once.
WATCH_AFTER_S = 0.05


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_client_leaves(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """``work()`` run in the calling task; if the client disconnects first, the task is cancelled
    (only its ``work``) and :class:`ClientLeft` raised. The listener on ``receive`` starts only
    after :data:`WATCH_AFTER_S` (a small request is answered before: no second task)."""
    current = asyncio.current_task()
    if current is None:  # not in a task: nothing to cancel, just the work
        return await work()
    left = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal left
        await _disconnected(receive)
        left = True
        current.cancel()  # delivered inside ``work``: the only place this task can be waiting

    def start() -> None:
        nonlocal watcher
        watcher = asyncio.ensure_future(watch())

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, start)
    try:
        return await work()
    except asyncio.CancelledError:
        # Ours alone (no cancellation of the caller pending besides): the client left.
        if left and current.uncancel() == 0:
            raise ClientLeft from None
        raise
    finally:
        timer.cancel()
        if watcher is not None and not watcher.done():
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
