"""Share what one replica learned about a model with the others, through the cache backend.

``KnowledgeShare(cache, knowledge, *, publish_delay_s=5.0, refresh_every_s=60.0, timeout_s=0.5)``
sits on a ``SummaryCache`` (``app.compaction.cache``; the app builds it only when the backend is
shared, i.e. Redis: an in-process cache would share nothing):

* ``await sync(model)`` (before planning): the first time this process sees ``model``, read what the
  other replicas published (waiting at most ``timeout_s``); afterwards a background refresh every
  ``refresh_every_s``. ``Knowledge.absorb`` decides what to take (a smaller learned window; the
  calibration samples only when this replica has none).
* ``changed(model)`` (after learning): publish this replica's knowledge of ``model`` within
  ``publish_delay_s`` (one write per model per delay, whatever the request rate), in the background.
* ``aclose()`` cancels pending work.

What is written is numbers only (``Knowledge.export``: the learned window, its origin, the
calibration ratios) under ``knowledge:<sha256 of the model name>``; never a prompt, a header or a
key. The cache never raises; a slow one costs the first request for a model at most ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
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


class SharedCache(Protocol):
    """The part of ``app.compaction.cache.SummaryCache`` sharing needs."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None: ...


def share_key(model: str) -> str:
    return KEY_PREFIX + hashlib.sha256(model.encode("utf-8", "surrogatepass")).hexdigest()[:40]


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
        self._fetched: OrderedDict[str, float] = OrderedDict()
        self._published: OrderedDict[str, int] = OrderedDict()
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def sync(self, model: str) -> None:
        fetched = self._fetched.get(model)
        if fetched is None:
            _remember(self._fetched, model, self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fetch(model), self.timeout_s)
        elif self._clock() - fetched >= self.refresh_every_s:
            _remember(self._fetched, model, self._clock())
            self._spawn("fetch", model, lambda: self._fetch(model))

    def changed(self, model: str) -> None:
        self._spawn("publish", model, lambda: self._publish_later(model))

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, kind: str, model: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        key = (kind, model)
        if key in self._tasks:
            return  # already on its way
        task = asyncio.create_task(work())
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _fetch(self, model: str) -> None:
        try:
            raw = await self.cache.get(share_key(model))
            if raw is None:
                return
            if self.knowledge.absorb(model, json.loads(raw)):
                logger.info("took what other replicas learned about %r", model)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bad shared value is ignored, never an error for a request
            logger.debug("shared knowledge of %r unreadable (%s)", model, type(exc).__name__)

    async def _publish_later(self, model: str) -> None:
        await asyncio.sleep(self.publish_delay_s)
        version = self.knowledge.version(model)
        if self._published.get(model) == version:
            return
        data = self.knowledge.export(model)
        if data is None:
            return
        try:
            await self.cache.set(share_key(model), json.dumps(data), ttl_s=TTL_S)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.debug("publishing the knowledge of %r failed (%s)", model, type(exc).__name__)
            return
        _remember(self._published, model, version)


def _remember(table: OrderedDict[str, Any], model: str, value: Any) -> None:
    table[model] = value
    table.move_to_end(model)
    while len(table) > MAX_TRACKED_MODELS:
        table.popitem(last=False)
