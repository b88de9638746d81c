"""A cap on concurrent upstream requests, with a short, bounded queue in front of it.

``ConcurrencyLimiter(max_concurrent=N, queue_timeout_s=T)``: :meth:`ConcurrencyLimiter.acquire`
returns a :class:`Slot` at once while fewer than ``N`` upstream requests are open; otherwise it
waits up to ``T`` seconds for one to close. At most ``max_waiting`` (default ``N``) requests wait;
any more, and any wait that times out, raise :class:`~app.upstream.errors.UpstreamBusy` (503 with
``Retry-After``). So the proxy holds at most ``N + max_waiting`` requests past this point, whatever
the offered load: memory stays bounded by that times the body limit.

A slot is held from just before the request is sent until its response is closed (the end of a
stream included); :meth:`Slot.release` is idempotent.
"""

from __future__ import annotations

import asyncio
import math

from .errors import UpstreamBusy


class Slot:
    """One held place under the cap; release it exactly once (extra calls do nothing)."""

    __slots__ = ("_limiter", "_released")

    def __init__(self, limiter: ConcurrencyLimiter) -> None:
        self._limiter = limiter
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._limiter._release()

    def __del__(self) -> None:
        # A safety net: a response dropped without being closed (a cancelled task that held it)
        # must not take its place under the cap with it forever.
        self.release()


class ConcurrencyLimiter:
    def __init__(
        self, *, max_concurrent: int, queue_timeout_s: float, max_waiting: int | None = None
    ) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be >= 1")
        self.max_concurrent = max_concurrent
        self.queue_timeout_s = queue_timeout_s
        self.max_waiting = max_concurrent if max_waiting is None else max_waiting
        self._semaphore = asyncio.Semaphore(max_concurrent)
        self.in_flight = 0
        self.waiting = 0

    @property
    def retry_after_s(self) -> int:
        """What a refused client is told to wait (whole seconds, at least 1)."""
        return max(1, math.ceil(self.queue_timeout_s))

    def _busy(self) -> UpstreamBusy:
        return UpstreamBusy(
            f"The proxy is at its limit of {self.max_concurrent} concurrent upstream requests; "
            f"retry after {self.retry_after_s} s.",
            retry_after_s=self.retry_after_s,
        )

    async def acquire(self) -> Slot:
        if self._semaphore.locked():
            if self.waiting >= self.max_waiting or self.queue_timeout_s <= 0:
                raise self._busy()
            self.waiting += 1
            try:
                async with asyncio.timeout(self.queue_timeout_s):
                    await self._semaphore.acquire()
            except TimeoutError:
                raise self._busy() from None
            finally:
                self.waiting -= 1
        else:
            await self._semaphore.acquire()
        self.in_flight += 1
        return Slot(self)

    def _release(self) -> None:
        self.in_flight -= 1
        self._semaphore.release()
