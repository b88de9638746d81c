"""Summary caches: in-process (bounded LRU) and Redis (shared across replicas), and their keys.

INTERFACE CONTRACT (the summarizer, ahead-of-time compaction and the service rely on these):

* ``summary_key(span_messages, *, summarizer_model, prompt_version) -> str``: hex sha256 over a
  canonical JSON of the exact span plus the model and prompt version; ``prefix_keys(blocks, ...)``
  gives the keys of blocks ``0..j`` for every ``j`` in one pass (``prefix_keys(b)[j] ==
  summary_key(concat(b[:j+1]))``).
* ``SummaryCache`` protocol: ``async get(key) -> str | None``, ``async set(key, value, *,
  ttl_s=None)`` (``None``: the cache's own TTL), ``lock(key, *, ttl_s)`` an async context manager
  yielding ``True`` when this caller holds the lock (never blocks waiting for it), ``stats() ->
  CacheStats``, ``async aclose()``. No method raises: a broken backend is a miss, a no-op set and
  a lock not acquired (or, for Redis, the in-process fallback).
* ``MemoryCache(max_entries, ttl_s, *, clock=time.monotonic, max_chars=None)`` (``max_chars``:
  a bound on the characters of all its values too, the least recently used go first),
  ``RedisCache(url, ttl_s, prefix="ctxproxy:summary:", *, max_entries=..., retry_after_s=...,
  max_chars=None, ...)`` and ``cache_from_url(url, *, ttl_s, max_entries, prefix=...,
  max_chars=None) -> SummaryCache``.

The summary caches hold summaries only: the key is a hash (the span's text cannot be read back
from it), the value is the summary text. Prompts and API keys are never stored. The recall store
(``app.service.recall``) is another cache of these classes, under its own prefix: its values are
what cuts removed from a conversation, its keys hashes of the credential, the conversation and
the content's id.

Nothing here raises on purpose; a Redis failure is logged once (logger ``ctxproxy.compaction``)
and the cache carries on in memory until a retry after ``retry_after_s`` succeeds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger("ctxproxy.compaction")

KEY_SCHEME = 1
Clock = Callable[[], float]


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr).encode(
        "utf-8"
    )


def _key_hasher(summarizer_model: str, prompt_version: str) -> Any:
    hasher = hashlib.sha256()
    header = {"scheme": KEY_SCHEME, "model": summarizer_model, "prompt_version": prompt_version}
    hasher.update(_canonical(header) + b"\n")
    return hasher


def summary_key(
    span_messages: Iterable[Mapping[str, Any]], *, summarizer_model: str, prompt_version: str
) -> str:
    """The cache key of a summary of exactly ``span_messages`` by that model and prompt version.

    Every key and value of every message counts (a changed tool argument is a different span); the
    canonical JSON sorts keys, so dict ordering does not. Newline-separated encodings make the
    hash of a span the same whether computed at once or block by block (``prefix_keys``).
    """
    hasher = _key_hasher(summarizer_model, prompt_version)
    for message in span_messages:
        hasher.update(_canonical(message) + b"\n")
    return str(hasher.hexdigest())


def prefix_keys(
    blocks: Sequence[Sequence[Mapping[str, Any]]], *, summarizer_model: str, prompt_version: str
) -> list[str]:
    """``keys[j]`` = ``summary_key`` of blocks ``0..j`` concatenated, for every ``j``, in one pass."""
    hasher = _key_hasher(summarizer_model, prompt_version)
    keys: list[str] = []
    for block in blocks:
        for message in block:
            hasher.update(_canonical(message) + b"\n")
        keys.append(str(hasher.copy().hexdigest()))
    return keys


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was made; ``degraded`` is True while Redis is not in use."""

    hits: int
    misses: int
    errors: int
    sets: int
    entries: int
    backend: str
    degraded: bool = False

    def as_dict(self) -> dict[str, int | str | bool]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "sets": self.sets,
            "entries": self.entries,
            "backend": self.backend,
            "degraded": self.degraded,
        }


class SummaryCache(Protocol):
    """Where summaries live between requests (see the module docstring for the contract)."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None: ...

    def lock(self, key: str, *, ttl_s: float) -> AbstractAsyncContextManager[bool]: ...

    def stats(self) -> CacheStats: ...

    async def aclose(self) -> None: ...


class MemoryCache:
    """A bounded LRU with per-entry expiry, for one process.

    Every operation runs without an ``await`` in the middle, so on one event loop it is atomic:
    no lock is needed. Expired entries are dropped when touched and when the bound is enforced.
    """

    backend = "memory"

    def __init__(
        self,
        max_entries: int = 4096,
        ttl_s: float = 86400.0,
        *,
        clock: Clock = time.monotonic,
        max_chars: int | None = None,
    ):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.ttl_s = ttl_s
        self._clock = clock
        self._chars = 0
        self._entries: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._locks: dict[str, tuple[str, float]] = {}
        self._hits = self._misses = self._sets = 0

    def peek(self, key: str) -> str | None:
        """Synchronous lookup without touching the counters or the LRU order."""
        entry = self._entries.get(key)
        if entry is None or entry[1] <= self._clock():
            return None
        return entry[0]

    def get_now(self, key: str) -> str | None:
        """``get`` without the coroutine (the value, or None if absent or expired)."""
        entry = self._entries.get(key)
        if entry is not None and entry[1] <= self._clock():
            self._drop(key)
            entry = None
        if entry is None:
            self._misses += 1
            return None
        self._entries.move_to_end(key)
        self._hits += 1
        return entry[0]

    def set_now(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        ttl = self.ttl_s if ttl_s is None else ttl_s
        if ttl <= 0 or (self.max_chars is not None and len(value) > self.max_chars):
            return
        self._drop(key)
        self._entries[key] = (value, self._clock() + ttl)
        self._chars += len(value)
        self._sets += 1
        self._evict()

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._chars -= len(entry[0])

    def _over(self) -> bool:
        return len(self._entries) > self.max_entries or (
            self.max_chars is not None and self._chars > self.max_chars
        )

    def _evict(self) -> None:
        if not self._over():
            return
        now = self._clock()
        for stale in [k for k, (_, expires) in self._entries.items() if expires <= now]:
            self._drop(stale)
        while self._over():
            self._drop(next(iter(self._entries)))

    async def get(self, key: str) -> str | None:
        return self.get_now(key)

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        self.set_now(key, value, ttl_s=ttl_s)

    def try_acquire(self, key: str, *, ttl_s: float) -> str | None:
        """Take the lock on ``key`` for ``ttl_s`` seconds; the owner token, or None if held."""
        now = self._clock()
        held = self._locks.get(key)
        if held is not None and held[1] > now:
            return None
        token = secrets.token_hex(8)
        self._locks[key] = (token, now + ttl_s)
        return token

    def release(self, key: str, token: str) -> None:
        """Release the lock on ``key`` if ``token`` still owns it (an expired lock may be retaken)."""
        held = self._locks.get(key)
        if held is not None and held[0] == token:
            del self._locks[key]

    @asynccontextmanager
    async def _lock(self, key: str, ttl_s: float) -> AsyncIterator[bool]:
        token = self.try_acquire(key, ttl_s=ttl_s)
        try:
            yield token is not None
        finally:
            if token is not None:
                self.release(key, token)

    def lock(self, key: str, *, ttl_s: float) -> AbstractAsyncContextManager[bool]:
        return self._lock(key, ttl_s)

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self._hits,
            misses=self._misses,
            errors=0,
            sets=self._sets,
            entries=len(self._entries),
            backend=self.backend,
        )

    async def aclose(self) -> None:
        self._entries.clear()
        self._chars = 0
        self._locks.clear()


_RELEASE_SCRIPT = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
end
return 0
"""


class RedisCache:
    """Summaries in Redis (``redis.asyncio``), shared by every replica that uses the same URL.

    Values are ``SET key value PX ttl``; the lock is ``SET prefix+"lock:"+key token NX PX ttl`` and
    is released by a compare-and-delete script, so a replica never frees a lock it lost to expiry.
    A small in-process ``MemoryCache`` sits in front (summaries never change once written, so it
    cannot go stale) and takes over while Redis is down: the first failure logs ONE warning and
    switches to memory; Redis is tried again after ``retry_after_s``; recovery is logged at INFO.
    Commands time out after ``socket_timeout_s`` and are not retried with back-off, so a dead Redis
    costs a request at most about one timeout, once per ``retry_after_s``.
    """

    backend = "redis"

    def __init__(
        self,
        url: str,
        ttl_s: float = 86400.0,
        prefix: str = "ctxproxy:summary:",
        *,
        max_entries: int = 4096,
        retry_after_s: float = 30.0,
        socket_timeout_s: float = 0.5,
        clock: Clock = time.monotonic,
        max_chars: int | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.url = url
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.retry_after_s = retry_after_s
        self.socket_timeout_s = socket_timeout_s
        self._clock = clock
        self.local = MemoryCache(max_entries, ttl_s, clock=clock, max_chars=max_chars)
        self._client: Any = None
        self._down_until: float | None = None
        self._hits = self._misses = self._errors = self._sets = 0

    @property
    def degraded(self) -> bool:
        """True while Redis is considered down (reads and writes go to memory only)."""
        return self._down_until is not None

    def _redis(self) -> Any | None:
        """The client, or None while in back-off after a failure (or if it cannot be built)."""
        if self._down_until is not None and self._clock() < self._down_until:
            return None
        if self._client is None:
            try:
                from redis.asyncio import Redis
                from redis.asyncio.retry import Retry
                from redis.backoff import NoBackoff

                self._client = Redis.from_url(
                    self.url,
                    decode_responses=True,
                    socket_timeout=self.socket_timeout_s,
                    socket_connect_timeout=self.socket_timeout_s,
                    retry=Retry(NoBackoff(), 1),
                )
            except Exception as exc:  # a bad URL or a missing ``redis`` package
                self._failed(exc, "setup")
                return None
        return self._client

    def _ok(self) -> None:
        if self._down_until is not None:
            self._down_until = None
            logger.info("summary cache: Redis is reachable again; using it")

    def _failed(self, exc: BaseException, operation: str) -> None:
        self._errors += 1
        first = self._down_until is None
        self._down_until = self._clock() + self.retry_after_s
        if first:
            logger.warning(
                "summary cache: Redis %s failed (%s: %s); using the in-process cache, retrying "
                "Redis in %.0fs",
                operation,
                type(exc).__name__,
                exc,
                self.retry_after_s,
            )
        else:
            logger.debug("summary cache: Redis still unavailable (%s)", type(exc).__name__)

    async def get(self, key: str) -> str | None:
        value = self.local.get_now(key)
        if value is not None:
            self._hits += 1
            return value
        client = self._redis()
        if client is not None:
            try:
                value = await client.get(self.prefix + key)
            except Exception as exc:
                self._failed(exc, "GET")
            else:
                self._ok()
                if isinstance(value, str):
                    self.local.set_now(key, value)
                    self._hits += 1
                    return value
        self._misses += 1
        return None

    async def set(self, key: str, value: str, *, ttl_s: float | None = None) -> None:
        ttl = self.ttl_s if ttl_s is None else ttl_s
        if ttl <= 0:
            return
        self._sets += 1
        self.local.set_now(key, value, ttl_s=ttl)
        client = self._redis()
        if client is None:
            return
        try:
            await client.set(self.prefix + key, value, px=max(1, int(ttl * 1000)))
        except Exception as exc:
            self._failed(exc, "SET")
        else:
            self._ok()

    @asynccontextmanager
    async def _lock(self, key: str, ttl_s: float) -> AsyncIterator[bool]:
        name = self.prefix + "lock:" + key
        token = secrets.token_hex(16)
        client = self._redis()
        acquired: bool | None = None
        if client is not None:
            try:
                acquired = bool(await client.set(name, token, nx=True, px=max(1, int(ttl_s * 1000))))
            except Exception as exc:
                self._failed(exc, "lock")
            else:
                self._ok()
        if acquired is None:
            async with self.local.lock(key, ttl_s=ttl_s) as local_acquired:
                yield local_acquired
            return
        try:
            yield acquired
        finally:
            if acquired:
                await self._release(name, token)

    async def _release(self, name: str, token: str) -> None:
        client = self._redis()
        if client is None:
            return  # the lock expires on its own
        try:
            await client.eval(_RELEASE_SCRIPT, 1, name, token)
        except Exception as exc:
            self._failed(exc, "unlock")

    def lock(self, key: str, *, ttl_s: float) -> AbstractAsyncContextManager[bool]:
        return self._lock(key, ttl_s)

    def stats(self) -> CacheStats:
        return CacheStats(
            hits=self._hits,
            misses=self._misses,
            errors=self._errors,
            sets=self._sets,
            entries=len(self.local),
            backend=self.backend,
            degraded=self.degraded,
        )

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:  # closing a dead connection is not worth an error
                logger.debug("summary cache: closing Redis failed (%s)", type(exc).__name__)
        await self.local.aclose()


def cache_from_url(
    url: str | None,
    *,
    ttl_s: float,
    max_entries: int,
    prefix: str = "ctxproxy:summary:",
    max_chars: int | None = None,
) -> SummaryCache:
    """``redis://``/``rediss://``/``unix://`` URLs give a :class:`RedisCache` (keys under
    ``prefix``), anything empty memory; ``max_chars`` bounds the in-process values' characters.

    Raises ``ValueError`` for another scheme (a configuration error, found at startup).
    """
    if not url or url.strip() in {"", "memory", "memory://"}:
        return MemoryCache(max_entries, ttl_s, max_chars=max_chars)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in {"redis", "rediss", "unix"}:
        return RedisCache(url, ttl_s, prefix=prefix, max_entries=max_entries, max_chars=max_chars)
    raise ValueError(f"unsupported summary cache URL scheme {scheme!r}: use redis://, rediss:// or unix://")
