"""Ahead-of-time compaction: summarize the span the next cut will forget in the background, once.

INTERFACE CONTRACT (the service relies on these):

* ``AheadOfTime(summarizer, cache, *, max_concurrency=2, max_pending=64, lock_ttl_s=60.0,
  poll_interval_s=0.1, semaphore=None, backlog=None)``; pass one ``asyncio.Semaphore`` to
  several instances (one per summarizer) to bound their running summaries together
  (``max_concurrency`` is then ignored), and one ``Backlog`` to bound their pending ones together
  (``max_pending`` is then ignored): a task holds its span (a conversation) until it ends, so
  work that arrives faster than it is done must be refused, not queued without end.
* ``schedule(span, job) -> bool``: synchronous, call it from a running event loop. Starts a
  background task that makes sure ``cache`` holds ``job.tenant``'s summary of ``span``
  (``memory_for``, sized by ``job``) and returns True; returns False when a task for the same
  span and tenant is already in flight in this process, when the backlog is full (``max_pending``
  tasks pending, or the shared ``Backlog``'s limit: the bound of the task map; a task leaves it
  when it ends), after ``aclose()``, or outside an event loop. The task checks
  the cache first (a cached span costs no call), takes the cache's lock on the span's key (so
  one replica summarizes while the others poll the cache for it) and runs at most
  ``max_concurrency`` summaries at a time.
* ``await wait_for(span, tenant, timeout_s) -> str | None``: ``tenant``'s summary of ``span`` if
  it is cached or its in-flight task finishes within ``timeout_s``; the task keeps running after
  a timeout. The in-line path of the service is ``schedule(span, job)`` then ``wait_for(span,
  job.tenant, t)``, which also deduplicates concurrent identical requests of one tenant.
* ``await aclose()``: cancels and awaits every task. ``in_flight``, ``running(span, tenant)``,
  ``stats()``.

Nothing here raises into the caller: failures are logged (``ctxproxy.compaction``) and give None.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..core.messages import Message
from .cache import SummaryCache
from .summarizer import Summarizer, SummaryJob

logger = logging.getLogger("ctxproxy.compaction")

Span = tuple[Message, ...]


class Backlog:
    """The summaries pending in one or more ``AheadOfTime`` (scheduled, not finished): at most
    ``limit`` together."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.pending = 0

    @property
    def full(self) -> bool:
        return self.pending >= self.limit


class AheadOfTime:
    """Background summaries, deduplicated per span key in-process and across replicas."""

    def __init__(
        self,
        summarizer: Summarizer,
        cache: SummaryCache,
        *,
        max_concurrency: int = 2,
        max_pending: int = 64,
        lock_ttl_s: float = 60.0,
        poll_interval_s: float = 0.1,
        semaphore: asyncio.Semaphore | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.summarizer = summarizer
        self.cache = cache
        self.max_concurrency = max_concurrency
        self.max_pending = max_pending
        self.lock_ttl_s = lock_ttl_s
        self.poll_interval_s = poll_interval_s
        self._semaphore = semaphore if semaphore is not None else asyncio.Semaphore(max_concurrency)
        self._backlog = backlog if backlog is not None else Backlog(max_pending)
        # span key -> its task, while it runs: bounded by the backlog (schedule refuses more).
        self._tasks: dict[str, asyncio.Task[str | None]] = {}
        self._closed = False
        self._counts = {"scheduled": 0, "deduplicated": 0, "rejected": 0, "done": 0, "failed": 0}

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def running(self, span: Sequence[Message], tenant: str) -> bool:
        """True while a task for ``tenant``'s ``span`` is in flight in this process."""
        return self.summarizer.span_key(span, tenant) in self._tasks

    def stats(self) -> dict[str, int]:
        return {**self._counts, "in_flight": len(self._tasks)}

    def schedule(self, span: Sequence[Message], job: SummaryJob) -> bool:
        try:
            return self._schedule(span, job)
        except Exception as exc:
            logger.warning("could not schedule a summary: %s: %.200s", type(exc).__name__, exc)
            return False

    def _schedule(self, span: Sequence[Message], job: SummaryJob) -> bool:
        if self._closed or not span:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        key = self.summarizer.span_key(span, job.tenant)
        if key in self._tasks:
            self._counts["deduplicated"] += 1
            return False
        if self._backlog.full:
            self._counts["rejected"] += 1
            logger.debug("ahead-of-time summary not scheduled: %d already pending", self._backlog.pending)
            return False
        task = loop.create_task(self._run(key, tuple(span), job), name=f"ctxproxy-summary-{key[:12]}")
        self._tasks[key] = task
        self._backlog.pending += 1
        self._counts["scheduled"] += 1
        task.add_done_callback(lambda finished: self._finished(key, finished))
        return True

    def _finished(self, key: str, task: asyncio.Task[str | None]) -> None:
        self._backlog.pending -= 1
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if task.cancelled():
            return
        if task.exception() is not None or task.result() is None:
            self._counts["failed"] += 1
        else:
            self._counts["done"] += 1

    async def _run(self, key: str, span: Span, job: SummaryJob) -> str | None:
        try:
            return await self._summarize_once(key, span, job)
        except Exception as exc:
            logger.warning("ahead-of-time summary failed: %s: %.200s", type(exc).__name__, exc)
            return None

    async def _summarize_once(self, key: str, span: Span, job: SummaryJob) -> str | None:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.lock_ttl_s
        while True:
            cached = await self.cache.get(key)
            if cached:
                return cached
            async with self._semaphore, self.cache.lock(key, ttl_s=self.lock_ttl_s) as acquired:
                if acquired:
                    return await self.summarizer.memory_for(span, self.cache, job)
            # another replica holds the lock: its summary lands in the shared cache
            if loop.time() >= give_up_at:
                logger.info("gave up waiting for another replica's summary of %s", key[:12])
                return None
            await asyncio.sleep(self.poll_interval_s)

    async def wait_for(self, span: Sequence[Message], tenant: str, timeout_s: float) -> str | None:
        try:
            key = self.summarizer.span_key(span, tenant)
            task = self._tasks.get(key)
            if task is None:
                return await self.cache.get(key)
            done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout_s))
            if task not in done or task.cancelled() or task.exception() is not None:
                return None
            return task.result()
        except Exception as exc:
            logger.warning("waiting for a summary failed: %s: %.200s", type(exc).__name__, exc)
            return None

    async def aclose(self) -> None:
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
