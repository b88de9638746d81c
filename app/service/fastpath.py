"""Keep the event loop free and the upstream call early: the chat path's speed helpers.

Counting is CPU work in tiktoken, which holds the GIL: a thread does not make it faster, but a
count running in a worker thread lets the event loop serve other requests between the thread's
slices (an 80 ms count inline stalls every other request for 80 ms). So:

* ``run_plan(fn, *, size_bytes)``: plan inline for a small body (a thread hop would cost more
  than the count), in a worker thread (``asyncio.to_thread``) from ``OFFLOAD_MIN_BYTES`` up.
* The fast path (``Service.run``): when ``app.core.ceiling.fitting_ceiling`` says a body cannot
  be over its budget, and the boundary keeps a request of that ceiling as it is
  (``Service.surely_fits``: the one decision forwards it unchanged), its original bytes go
  upstream at once and the exact plan is computed
  meanwhile: a large body's in a worker thread (``start_plan``), a small body's on the event loop
  once the request is out, while the upstream works (``plan_soon``: the plan leaves the
  critical path of a small request); ``finish_plan`` takes it when the upstream has answered,
  before any response header is sent, so the ``X-Context-*`` headers are always exact.
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


class SoonPlan:
    """``fn()`` made on the event loop two turns from now: after the upstream client's own write
    of the request (aiohttp writes a body from a task of its own, scheduled while sending), so
    while the upstream works; :meth:`result` makes it at once if the answer came first. An
    error ``fn`` raises is kept and raised by :meth:`result`."""

    __slots__ = ("_error", "_fn", "_handle", "_plan")

    def __init__(self, fn: Callable[[], Plan]) -> None:
        self._fn: Callable[[], Plan] | None = fn
        self._plan: Plan | None = None
        self._error: Exception | None = None
        loop = asyncio.get_running_loop()
        self._handle: asyncio.Handle | None = loop.call_soon(self._second_turn, loop)

    def _second_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = loop.call_soon(self._make)

    def _make(self) -> None:
        fn, self._fn, self._handle = self._fn, None, None
        if fn is None:
            return
        try:
            self._plan = fn()
        except Exception as exc:  # raised where the plan is taken (result), not in the loop
            self._error = exc

    def result(self) -> Plan:
        if self._handle is not None:
            self._handle.cancel()
        self._make()
        if self._error is not None:
            raise self._error
        assert self._plan is not None
        return self._plan

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._fn = self._handle = None


def plan_soon(fn: Callable[[], Plan]) -> SoonPlan:
    """Make ``fn()`` while the upstream works (see :class:`SoonPlan`)."""
    return SoonPlan(fn)


Pending = asyncio.Future[Plan] | SoonPlan


async def finish_plan(pending: Pending, response: UpstreamResponse) -> Plan:
    """The plan started with :func:`start_plan` or :func:`plan_soon`; closes ``response`` if it
    failed."""
    try:
        return pending.result() if isinstance(pending, SoonPlan) else await pending
    except BaseException:
        await response.aclose()
        raise


def abandon_plan(pending: Pending | None) -> None:
    """Drop a started plan nobody will await (the send failed): its result is discarded."""
    if pending is None:
        return
    if isinstance(pending, SoonPlan):
        pending.cancel()
        return
    if pending.done():
        if not pending.cancelled():
            pending.exception()  # retrieved: not reported as "never retrieved"
        return
    pending.cancel()
