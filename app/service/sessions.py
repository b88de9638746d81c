"""Server-side sessions of the status page's login (``app.api.login``): which signed cookies are live.

A cookie's MAC proves the proxy made it; whether its session is still live is kept here, so that a
sign-out ends it at once for every copy of the cookie. The sessions are shared the way learned
facts are (``app.service.knowledge_share``): through the cache backend when it is shared (Redis:
every replica on it), else through the files of ``CTXPROXY_WORKER_DIR`` (``WorkerStore``: the
workers of one ``ctxproxy serve --workers N``), else in this process.

INTERFACE CONTRACT:

* ``Sessions(*, max_local=1024, clock=time.time)``: in this process until ``share(cache)`` (the
  composition root, when the app starts) gives it a shared store (``get``/``set``, the part of a
  ``SummaryCache`` sharing needs; it never raises).
* ``await start(session_id, *, expires_s)``: a session is live from now until ``expires_s`` (wall
  clock, seconds). ``await live(session_id) -> bool``: started, not ended, not expired.
  ``await end(session_id, *, expires_s)``: not live any more, anywhere the store is shared (kept as
  ended until it would have expired).
* Bounded and expiring with the session: a shared entry carries its expiry (Redis drops it then;
  ``WorkerStore`` keeps files for the server's run only, and an expired one is not live); the
  local table keeps at most ``max_local`` sessions, the oldest started dropped first (its holder
  signs in again). Only a person with a proxy key creates one (``app.api.login``).
* Stored: ``session:<sha256 of the id>`` -> ``live <expires_s>`` when it starts and
  ``session-ended:<sha256 of the id>`` -> ``ended`` when it ends; never the id itself (the cookie
  is not readable from the store) and never a key. Each value is written once and never changed:
  a replica's in-process copy of the shared cache's values (``RedisCache`` keeps one in front of
  Redis) can then never hold a stale one, and a miss is not kept, so the end of a session is
  asked of Redis every time and seen at once.
* A Redis that is down: the cache carries on in this process (``RedisCache``), so a replica that
  knew a session keeps taking it until Redis is back; an end written meanwhile stays in the
  replica that wrote it. Sign out again once Redis is back.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

from .knowledge_share import SharedCache

KEY_PREFIX = "session:"
ENDED_PREFIX = "session-ended:"
LIVE = "live"
ENDED = "ended"
MAX_LOCAL_SESSIONS = 1024


def session_key(session_id: str, *, prefix: str = KEY_PREFIX) -> str:
    return prefix + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:40]


class Sessions:
    """See the module docstring."""

    def __init__(
        self, *, max_local: int = MAX_LOCAL_SESSIONS, clock: Callable[[], float] = time.time
    ) -> None:
        self.max_local = max_local
        self.clock = clock
        self.shared: SharedCache | None = None
        self._local: OrderedDict[str, float] = OrderedDict()  # key -> expires_s, oldest first

    def share(self, cache: SharedCache) -> None:
        """Keep the sessions in ``cache`` from now on (every replica or worker on it agrees)."""
        self.shared = cache

    async def start(self, session_id: str, *, expires_s: float) -> None:
        key = session_key(session_id)
        if self.shared is not None:
            await self.shared.set(key, f"{LIVE} {int(expires_s)}", ttl_s=self._left(expires_s))
            return
        self._local[key] = expires_s
        self._local.move_to_end(key)
        while len(self._local) > self.max_local:
            self._local.popitem(last=False)

    async def live(self, session_id: str) -> bool:
        key = session_key(session_id)
        if self.shared is None:
            expires_s = self._local.get(key)
        else:
            state, _, expires = (await self.shared.get(key) or "").partition(" ")
            expires_s = float(expires) if state == LIVE and expires.isdigit() else None
            if expires_s is not None and await self.shared.get(session_key(session_id, prefix=ENDED_PREFIX)):
                return False
        return expires_s is not None and expires_s > self.clock()

    async def end(self, session_id: str, *, expires_s: float) -> None:
        self._local.pop(session_key(session_id), None)
        if self.shared is not None:
            ended = session_key(session_id, prefix=ENDED_PREFIX)
            await self.shared.set(ended, ENDED, ttl_s=self._left(expires_s))

    def _left(self, expires_s: float) -> float:
        """Seconds until ``expires_s``, at least one (a TTL must be positive)."""
        return max(1.0, expires_s - self.clock())


__all__ = ["ENDED", "ENDED_PREFIX", "KEY_PREFIX", "LIVE", "MAX_LOCAL_SESSIONS", "Sessions", "session_key"]
