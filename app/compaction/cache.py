"""Summary caches: in-process (bounded LRU) and Redis (shared across replicas), and their keys.

INTERFACE CONTRACT (the summarizer, ahead-of-time compaction and the service rely on these):

* ``summary_key(span_messages, *, summarizer_model, prompt_version, tenant) -> str``: hex sha256
  over a canonical JSON of the exact span plus the model, the prompt version and the tenant
  (``app.core.tenant``: a summary is its owner's; a hit never tells one client what another
  sent, by a header or by its speed); ``prefix_keys(blocks, ...)``
  gives the keys of blocks ``0..j`` for every ``j`` in one pass (``prefix_keys(b)[j] ==
  summary_key(concat(b[:j+1]))``).
* ``SummaryCache`` protocol: ``async get(key) -> str | None``, ``async set(key, value, *,
  ttl_s=None)`` (``None``: the cache's own TTL), ``lock(key, *, ttl_s)`` an async context manager
  yielding ``True`` when this caller holds the lock (never blocks waiting for it), ``stats() ->
  CacheStats``, ``async aclose()``; and the atomic read-modify-writes of state that replicas change
  together (no other read can slip between their read and their write, in process or on Redis):
  ``async incr(key, *, ttl_s) -> int`` (the counter under ``key`` plus one, its TTL set to
  ``ttl_s``; a value that is not a count starts again at 1), ``async merge_chain(key, length,
  span_key, *, limit) -> None`` (the chain under ``key``, a JSON list of ``[length, span_key]``
  newest first, with this entry first, an older entry of the same ``span_key`` dropped, at most
  ``limit`` entries; a value that is not such a list starts again) and ``async
  compare_and_set(key, expected, value, *, ttl_s=None) -> bool`` (``value`` stored only while the
  key holds ``expected``, None: absent; True when it was). No method raises: a broken backend is
  a miss, a no-op set and a lock not acquired (or, for Redis, the in-process fallback); there,
  ``incr`` counts in process, ``merge_chain`` merges in process and ``compare_and_set`` compares
  with the in-process copy.
* ``MemoryCache(max_entries, ttl_s, *, clock=time.monotonic, max_bytes=None)`` (``max_bytes``:
  a bound on the memory all its values take too, ``sys.getsizeof`` of each (a character of CJK
  text takes two bytes, of an emoji's text four), the least recently used go first),
  ``RedisCache(url, ttl_s, prefix="ctxproxy:summary:", *, max_entries=..., retry_after_s=...,
  max_bytes=None, ...)`` and ``cache_from_url(url, *, ttl_s, max_entries, prefix=...,
  max_bytes=None) -> SummaryCache``.

The caches hold summaries and the state around them (chains of span keys, back-offs, failure
counts): the key is a hash (the span's text or a client's key cannot be read back from it), the
value a summary text or numbers. Prompts and API keys are never stored.
The recall store (``app.service.recall``) is another cache of these classes, under its own
prefix: its values are what cuts removed from a conversation, its keys hashes of the credential,
the conversation and the content's id.

Nothing here raises on purpose; a Redis failure is logged once (logger ``ctxproxy.compaction``)
and the cache carries on in memory until a retry after ``retry_after_s`` succeeds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

logger = logging.getLogger("ctxproxy.compaction")

KEY_SCHEME = 2
Clock = Callable[[], float]


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr).encode(
        "utf-8"
    )


def _key_hasher(summarizer_model: str, prompt_version: str, tenant: str) -> Any:
    hasher = hashlib.sha256()
    header = {
        "scheme": KEY_SCHEME,
        "model": summarizer_model,
        "prompt_version": prompt_version,
        "tenant": tenant,
    }
    hasher.update(_canonical(header) + b"\n")
    return hasher


def summary_key(
    span_messages: Iterable[Mapping[str, Any]], *, summarizer_model: str, prompt_version: str, tenant: str
) -> str:
    """The cache key of ``tenant``'s summary of exactly ``span_messages`` by that model and prompt
    version.

    Every key and value of every message counts (a changed tool argument is a different span); the
    canonical JSON sorts keys, so dict ordering does not. Newline-separated encodings make the
    hash of a span the same whether computed at once or block by block (``prefix_keys``).
    """
    hasher = _key_hasher(summarizer_model, prompt_version, tenant)
    for message in span_messages:
        hasher.update(_canonical(message) + b"\n")
    return str(hasher.hexdigest())


def prefix_keys(
    blocks: Sequence[Sequence[Mapping[str, Any]]], *, summarizer_model: str, prompt_version: str, tenant: str
) -> list[str]:
    """``keys[j]`` = ``summary_key`` of blocks ``0..j`` concatenated, for every ``j``, in one pass."""
    hasher = _key_hasher(summarizer_model, prompt_version, tenant)
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

    async def incr(self, key: str, *, ttl_s: float) -> int: ...

    async def merge_chain(self, key: str, length: int, span_key: str, *, limit: int) -> None: ...

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool: ...

    def stats(self) -> CacheStats: ...

    async def aclose(self) -> None: ...


def merged_chain(raw: str | None, length: int, span_key: str, *, limit: int) -> str:
    """The chain ``raw`` (a JSON list of ``[length, span_key]``, newest first) with this entry
    first (see ``SummaryCache.merge_chain``); what ``_MERGE_CHAIN_SCRIPT`` computes on Redis."""
    try:
        chain = [[int(n), str(k)] for n, k in json.loads(raw)] if raw else []
    except (ValueError, TypeError):
        chain = []
    return json.dumps([[length, span_key], *(e for e in chain if e[1] != span_key)][: max(1, limit)])


class MemoryCache:
    """A bounded LRU with per-entry expiry, for one process.

    Every operation runs without an ``await`` in the middle, so on one event loop it is atomic
    (``incr``, ``merge_chain`` and ``compare_and_set`` included): no lock is needed. Bounded:
    at most ``max_entries`` entries, the least recently used dropped first (expired ones before
    them); a lock lives while it is held (one per summary being written), or until it expires.
    """

    backend = "memory"

    def __init__(
        self,
        max_entries: int = 4096,
        ttl_s: float = 86400.0,
        *,
        clock: Clock = time.monotonic,
        max_bytes: int | None = None,
    ):
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._bytes = 0
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
        size = sys.getsizeof(value)
        if ttl <= 0 or (self.max_bytes is not None and size > self.max_bytes):
            return
        self._drop(key)
        self._entries[key] = (value, self._clock() + ttl)
        self._bytes += size
        self._sets += 1
        self._evict()

    def incr_now(self, key: str, *, ttl_s: float) -> int:
        """``incr`` without the coroutine."""
        raw = self.peek(key)
        count = int(raw) + 1 if raw is not None and raw.isdigit() else 1
        self.set_now(key, str(count), ttl_s=ttl_s)
        return count

    def merge_chain_now(self, key: str, length: int, span_key: str, *, limit: int) -> None:
        """``merge_chain`` without the coroutine."""
        self.set_now(key, merged_chain(self.peek(key), length, span_key, limit=limit))

    def compare_and_set_now(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        """``compare_and_set`` without the coroutine."""
        if self.peek(key) != expected:
            return False
        self.set_now(key, value, ttl_s=ttl_s)
        return True

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= sys.getsizeof(entry[0])

    def _over(self) -> bool:
        return len(self._entries) > self.max_entries or (
            self.max_bytes is not None and self._bytes > self.max_bytes
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

    async def incr(self, key: str, *, ttl_s: float) -> int:
        return self.incr_now(key, ttl_s=ttl_s)

    async def merge_chain(self, key: str, length: int, span_key: str, *, limit: int) -> None:
        self.merge_chain_now(key, length, span_key, limit=limit)

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        return self.compare_and_set_now(key, expected, value, ttl_s=ttl_s)

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
        self._bytes = 0
        self._locks.clear()


_RELEASE_SCRIPT = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
end
return 0
"""
# KEYS[1] the counter, ARGV[1] its TTL in ms. A value INCR refuses (not a count) starts again.
_INCR_SCRIPT = """
local ok, count = pcall(redis.call, "incr", KEYS[1])
if not ok then
    redis.call("set", KEYS[1], 1)
    count = 1
end
redis.call("pexpire", KEYS[1], ARGV[1])
return count
"""
# KEYS[1] the chain, ARGV: length, span key, limit, TTL in ms (as ``merged_chain`` in Python).
_MERGE_CHAIN_SCRIPT = """
local chain = {}
local raw = redis.call("get", KEYS[1])
if raw then
    local ok, decoded = pcall(cjson.decode, raw)
    if ok and type(decoded) == "table" then chain = decoded end
end
local merged = {{tonumber(ARGV[1]), ARGV[2]}}
local limit = tonumber(ARGV[3])
for _, entry in ipairs(chain) do
    if #merged >= limit then break end
    if type(entry) == "table" and type(entry[1]) == "number" and type(entry[2]) == "string"
        and entry[2] ~= ARGV[2] then
        merged[#merged + 1] = {entry[1], entry[2]}
    end
end
redis.call("set", KEYS[1], cjson.encode(merged), "px", ARGV[4])
return #merged
"""
# KEYS[1], ARGV: whether a value is expected ("1"/"0"), the expected value, the new one, TTL in ms.
_COMPARE_AND_SET_SCRIPT = """
local current = redis.call("get", KEYS[1])
if ARGV[1] == "1" then
    if current ~= ARGV[2] then return 0 end
elseif current then
    return 0
end
redis.call("set", KEYS[1], ARGV[3], "px", ARGV[4])
return 1
"""


class RedisCache:
    """Summaries in Redis (``redis.asyncio``), shared by every replica that uses the same URL.

    Values are ``SET key value PX ttl``; the lock is ``SET prefix+"lock:"+key token NX PX ttl`` and
    is released by a compare-and-delete script, so a replica never frees a lock it lost to expiry.
    ``incr``, ``merge_chain`` and ``compare_and_set`` are Lua scripts (``EVALSHA``): Redis runs
    each whole before any other command, so two replicas never lose each other's update.
    Redis is read first while it answers (chains, back-offs and shared knowledge change under
    their keys); a small in-process ``MemoryCache`` keeps what was read and written, each until
    Redis would expire it, and takes over while Redis is down: the first failure logs ONE warning
    and switches to memory; Redis is tried again after ``retry_after_s``; recovery is logged at
    INFO. Commands time out after ``socket_timeout_s`` and are not retried with back-off, so a dead
    Redis costs a request at most about one timeout, once per ``retry_after_s``.
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
        max_bytes: int | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.url = url
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.retry_after_s = retry_after_s
        self.socket_timeout_s = socket_timeout_s
        self._clock = clock
        self.local = MemoryCache(max_entries, ttl_s, clock=clock, max_bytes=max_bytes)
        self._client: Any = None
        self._scripts: dict[str, Any] = {}  # the three Lua scripts, registered with the client
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
        client = self._redis()
        if client is not None:
            try:
                async with client.pipeline(transaction=False) as pipe:
                    value, ttl_ms = await pipe.get(self.prefix + key).pttl(self.prefix + key).execute()
            except Exception as exc:
                self._failed(exc, "GET")
            else:
                self._ok()
                if isinstance(value, str):
                    # Kept for as long as Redis keeps it (a back-off read here ends when it ends there).
                    self.local.set_now(key, value, ttl_s=ttl_ms / 1000 if ttl_ms > 0 else None)
                    self._hits += 1
                    return value
        value = self.local.get_now(key)
        if value is not None:
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
            await client.set(self.prefix + key, value, px=_ms(ttl))
        except Exception as exc:
            self._failed(exc, "SET")
        else:
            self._ok()

    async def _script(self, source: str, operation: str, key: str, *args: str | int) -> Any:
        """The result of the Lua ``source`` run on ``prefix + key`` with ``args``, or ``_FAILED``
        (Redis down or failing: the caller does it in process)."""
        client = self._redis()
        if client is None:
            return _FAILED
        try:
            script = self._scripts.get(source)
            if script is None:
                script = self._scripts[source] = client.register_script(source)
            result = await script(keys=[self.prefix + key], args=list(args))
        except Exception as exc:
            self._failed(exc, operation)
            return _FAILED
        self._ok()
        return result

    async def incr(self, key: str, *, ttl_s: float) -> int:
        count = await self._script(_INCR_SCRIPT, "INCR", key, _ms(ttl_s))
        if count is _FAILED:
            return self.local.incr_now(key, ttl_s=ttl_s)
        return int(count)

    async def merge_chain(self, key: str, length: int, span_key: str, *, limit: int) -> None:
        self._sets += 1
        merged = await self._script(
            _MERGE_CHAIN_SCRIPT, "chain", key, length, span_key, max(1, limit), _ms(self.ttl_s)
        )
        if merged is _FAILED:
            self.local.merge_chain_now(key, length, span_key, limit=limit)

    async def compare_and_set(
        self, key: str, expected: str | None, value: str, *, ttl_s: float | None = None
    ) -> bool:
        ttl = self.ttl_s if ttl_s is None else ttl_s
        swapped = await self._script(
            _COMPARE_AND_SET_SCRIPT,
            "compare-and-set",
            key,
            "0" if expected is None else "1",
            expected or "",
            value,
            _ms(ttl),
        )
        if swapped is _FAILED:
            return self.local.compare_and_set_now(key, expected, value, ttl_s=ttl)
        if swapped:
            self._sets += 1
            self.local.set_now(key, value, ttl_s=ttl)
        return bool(swapped)

    @asynccontextmanager
    async def _lock(self, key: str, ttl_s: float) -> AsyncIterator[bool]:
        name = self.prefix + "lock:" + key
        token = secrets.token_hex(16)
        client = self._redis()
        acquired: bool | None = None
        if client is not None:
            try:
                acquired = bool(await client.set(name, token, nx=True, px=_ms(ttl_s)))
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
        self._scripts.clear()
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:  # closing a dead connection is not worth an error
                logger.debug("summary cache: closing Redis failed (%s)", type(exc).__name__)
        await self.local.aclose()


_FAILED = object()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def cache_from_url(
    url: str | None,
    *,
    ttl_s: float,
    max_entries: int,
    prefix: str = "ctxproxy:summary:",
    max_bytes: int | None = None,
) -> SummaryCache:
    """``redis://``/``rediss://``/``unix://`` URLs give a :class:`RedisCache` (keys under
    ``prefix``), anything empty memory; ``max_bytes`` bounds the in-process values' memory.

    Raises ``ValueError`` for another scheme (a configuration error, found at startup).
    """
    if not url or url.strip() in {"", "memory", "memory://"}:
        return MemoryCache(max_entries, ttl_s, max_bytes=max_bytes)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in {"redis", "rediss", "unix"}:
        return RedisCache(url, ttl_s, prefix=prefix, max_entries=max_entries, max_bytes=max_bytes)
    raise ValueError(f"unsupported summary cache URL scheme {scheme!r}: use redis://, rediss:// or unix://")
