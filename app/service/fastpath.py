"""Keep the event loop free and the upstream call early: the chat path's speed helpers.

Counting is CPU work in tiktoken, which holds the GIL: a thread does not make it faster, but a
count running in a worker thread lets the event loop serve other requests between the thread's
slices (an 80 ms count inline stalls every other request for 80 ms). So:

* ``run_plan(fn, *, size_bytes)``: plan inline for a small body (a thread hop would cost more
  than the count), in a worker thread (``asyncio.to_thread``) from ``OFFLOAD_MIN_BYTES`` up.
* The fast path (``Service.run``): when ``app.core.ceiling.surely_fits`` says a large
  body cannot be over its budget, its original bytes go upstream at once and the exact plan is
  computed meanwhile (``start_plan``); ``finish_plan`` awaits it when the upstream has answered,
  before any response header is sent, so the ``X-Context-Tokens-*`` headers are always exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..core.plan import Plan
from ..upstream.client import UpstreamResponse

# 64 KiB of JSON is about 16K tokens: a cold count of ~5-10 ms, the point where keeping it off the
# event loop is worth a thread hop (~0.1 ms).
OFFLOAD_MIN_BYTES = 64 * 1024


async def run_plan(fn: Callable[[], Plan], *, size_bytes: int) -> Plan:
    """``fn()``, in a worker thread when the body is at least ``OFFLOAD_MIN_BYTES``."""
    if size_bytes >= OFFLOAD_MIN_BYTES:
        return await asyncio.to_thread(fn)
    return fn()


def start_plan(fn: Callable[[], Plan]) -> asyncio.Future[Plan]:
    """Start ``fn()`` in a worker thread now; await the future with :func:`finish_plan`."""
    return asyncio.ensure_future(asyncio.to_thread(fn))


async def finish_plan(pending: asyncio.Future[Plan], response: UpstreamResponse) -> Plan:
    """The plan started with :func:`start_plan`; closes ``response`` if it failed."""
    try:
        return await pending
    except BaseException:
        await response.aclose()
        raise


def abandon_plan(pending: asyncio.Future[Plan] | None) -> None:
    """Drop a started plan nobody will await (the send failed): its result is discarded."""
    if pending is None:
        return
    if pending.done():
        if not pending.cancelled():
            pending.exception()  # retrieved: not reported as "never retrieved"
        return
    pending.cancel()
