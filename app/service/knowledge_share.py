"""Share what one replica learned about a model with the others, through the cache backend.

``KnowledgeShare(cache, knowledge, *, publish_delay_s=5.0, refresh_every_s=60.0, timeout_s=0.5)``
sits on a ``SummaryCache`` (``app.compaction.cache``; the app builds it only when the backend is
shared, i.e. Redis: an in-process cache would share nothing) or on the workers' files
(``app.service.worker_store``). Knowledge is per tenant (``app.core.knowledge``), and so is what
is shared: one entry per tenant and model.

* ``await sync(model, *, tenant)`` (before planning): the first time this process sees ``model``
  for ``tenant``, read what the other replicas published (waiting at most ``timeout_s``);
  afterwards a background refresh every ``refresh_every_s``. ``Knowledge.absorb`` decides what to
  take (a smaller learned window; the calibration samples only when this replica has none).
* ``changed(model, *, tenant)`` (after learning): publish this replica's knowledge of ``model``
  within ``publish_delay_s`` (one write per model and tenant per delay, whatever the request
  rate), in the background. A publish is a compare-and-set (``compare_and_set``): what another
  replica published meanwhile is absorbed first and the merge written over exactly what was read,
  so two replicas publishing at once never lose each other's knowledge (a lost race is retried,
  at most ``PUBLISH_ATTEMPTS`` times; then the next change publishes again).
* ``aclose()`` cancels pending work.

Bounded: the models fetched and published are remembered for at most ``MAX_TRACKED_MODELS`` (model,
tenant) pairs each (least recently used out: such a pair is fetched again); background tasks are
at most ``MAX_TASKS`` (past that, a refresh or a publish is skipped: the next request or change
asks again).

What is written is numbers only (``Knowledge.export``: the learned window, its origin, the
calibration ratios) under ``knowledge:<sha256 of the tenant and the model name>``; never a prompt,
a header or a key. The cache never raises; a slow one costs the first request for a model at most
``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from ..core.knowledge import Knowledge

logger = logging.getLogger("ctxproxy.learning")

KEY_PREFIX = "knowledge:"
TTL_S = 7 * 86400.0
MAX_TRACKED_MODELS = 4096
MAX_TASKS = 256
PUBLISH_ATTEMPTS = 4


class SharedCache(Protocol):
    """The part of ``app.compaction.cache.SummaryCache`` sharing needs (knowledge, sessions)."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None: ...

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool: ...


def share_key(model: str, tenant: str) -> str:
    subject = f"{tenant}\n{model}".encode("utf-8", "surrogatepass")
    return KEY_PREFIX + hashlib.sha256(subject).hexdigest()[:40]


class KnowledgeShare:
    """See the module docstring."""

    def __init__(
        self,
        cache: SharedCache,
        knowledge: Knowledge,
        *,
        publish_delay_s: float = 5.0,
        refresh_every_s: float = 60.0,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.knowledge = knowledge
        self.publish_delay_s = publish_delay_s
        self.refresh_every_s = refresh_every_s
        self.timeout_s = timeout_s
        self._clock = clock
        # (model, tenant) -> when it was last fetched / the version last published; bounded.
        self._fetched: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._published: OrderedDict[tuple[str, str], int] = OrderedDict()
        # At most MAX_TASKS; a task leaves the map when it ends.
        self._tasks: dict[tuple[str, str, str], asyncio.Task[None]] = {}

    async def sync(self, model: str, *, tenant: str) -> None:
        subject = (model, tenant)
        fetched = self._fetched.get(subject)
        if fetched is None:
            _remember(self._fetched, subject, self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fetch(model, tenant), self.timeout_s)
        elif self._clock() - fetched >= self.refresh_every_s:
            _remember(self._fetched, subject, self._clock())
            self._spawn("fetch", subject, lambda: self._fetch(model, tenant))

    def changed(self, model: str, *, tenant: str) -> None:
        self._spawn("publish", (model, tenant), lambda: self._publish_later(model, tenant))

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(
        self, kind: str, subject: tuple[str, str], work: Callable[[], Coroutine[Any, Any, None]]
    ) -> None:
        key = (kind, *subject)
        if key in self._tasks or len(self._tasks) >= MAX_TASKS:
            return  # already on its way, or too much at once: the next call asks again
        task = asyncio.create_task(work(), context=contextvars.Context())  # no request's context kept
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _fetch(self, model: str, tenant: str) -> None:
        try:
            raw = await self.cache.get(share_key(model, tenant))
            if raw is None:
                return
            if self.knowledge.absorb(model, json.loads(raw), tenant=tenant):
                logger.info("took what other replicas learned about %r", model)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bad shared value is ignored, never an error for a request
            logger.debug("shared knowledge of %r unreadable (%s)", model, type(exc).__name__)

    async def _publish_later(self, model: str, tenant: str) -> None:
        await asyncio.sleep(self.publish_delay_s)
        subject = (model, tenant)
        if self._published.get(subject) == self.knowledge.version(model, tenant=tenant):
            return
        key = share_key(model, tenant)
        try:
            for _ in range(PUBLISH_ATTEMPTS):
                shared = await self.cache.get(key)
                if shared is not None:
                    with contextlib.suppress(ValueError):
                        self.knowledge.absorb(model, json.loads(shared), tenant=tenant)
                version = self.knowledge.version(model, tenant=tenant)
                data = self.knowledge.export(model, tenant=tenant)
                if data is None:
                    return
                value = json.dumps(data)
                if value == shared or await self.cache.compare_and_set(key, shared, value, ttl_s=TTL_S):
                    _remember(self._published, subject, version)
                    return
            logger.debug(
                "publishing the knowledge of %r lost %d races; the next change retries",
                model,
                PUBLISH_ATTEMPTS,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("publishing the knowledge of %r failed (%s)", model, type(exc).__name__)


def _remember(table: OrderedDict[tuple[str, str], Any], subject: tuple[str, str], value: Any) -> None:
    table[subject] = value
    table.move_to_end(subject)
    while len(table) > MAX_TRACKED_MODELS:
        table.popitem(last=False)
