"""Ask the upstream's own token-counting endpoint how many input tokens a request holds.

``UpstreamCounts(upstream, *, timeout_s=1.0, max_entries=1024, unsupported_s=600.0)``:

* ``await count(request) -> int | None``: the upstream's count of ``request``'s input, from its
  dialect's counting endpoint (``Dialect.count_request``: where it goes, under the base URL or at
  its origin, and its body; read back with ``Dialect.upstream_count``), sent with the client's
  headers (its key, its version headers) and the query parameters that carry its key, to the
  request's upstream. None when the dialect has
  no such endpoint, the upstream answered anything but a count, or no answer came within
  ``timeout_s`` (the whole call: connection, answer, body).
* Answers are cached by the exact bytes of the count request, its upstream and its tenant
  (``ProxyRequest.tenant``: a hit, answered faster, never tells one client that another sent
  that body), at most ``max_entries`` (least recently used out): a client that resends the
  same body is counted once.
* An upstream that answers 404 or 405 (a server without the endpoint: vLLM, llama.cpp behind an
  OpenAI or Anthropic front) is not asked again for ``unsupported_s``, by any client: a route
  is the upstream's, not a credential's (a refused key answers 401/403, which is not kept).
  At most one entry per upstream base URL and counting path (the operator's URLs; a path may
  hold a model name, so the least recently refused ones go first past ``max_entries``).
* ``calls`` / ``hits``: how many requests went to counting endpoints / were answered from the cache.

Nothing here raises for the upstream's sake: a failed count is None, and the caller plans without
it (a cut, the safe side).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import orjson

from ..core.endpoints import UpstreamTarget
from ..core.errors import CtxproxyError
from ..upstream.client import UpstreamClient
from .request import ProxyRequest, dump_body

logger = logging.getLogger("ctxproxy.boundary")

UNSUPPORTED_STATUSES = frozenset({404, 405})
MAX_ANSWER_BYTES = 64 * 1024


class UpstreamCounts:
    """See the module docstring."""

    def __init__(
        self,
        upstream: UpstreamClient,
        *,
        timeout_s: float = 1.0,
        max_entries: int = 1024,
        unsupported_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self.timeout_s = timeout_s
        self.max_entries = max(1, max_entries)
        self.unsupported_s = unsupported_s
        self._clock = clock
        # Both bounded by max_entries, the least recently used (refused) out (module docstring).
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._unsupported: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.calls = 0
        self.hits = 0

    async def count(self, request: ProxyRequest) -> int | None:
        call = request.dialect.count_request(request.body, request.route.path)
        if call is None:
            return None
        target, body = call
        where = (request.base_url, target.path)
        until = self._unsupported.get(where)
        if until is not None:
            if self._clock() < until:
                return None
            del self._unsupported[where]
        content = dump_body(body)
        head = f"{request.tenant}\n{request.base_url}\n{target.path}\n"
        key = hashlib.sha256(head.encode() + content).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached
        self.calls += 1
        try:
            tokens = await asyncio.wait_for(self._ask(request, target, content), self.timeout_s)
        except TimeoutError:
            logger.info(
                "the upstream's count of a %r request took over %.1f s", request.model, self.timeout_s
            )
            return None
        except CtxproxyError as exc:
            logger.info("the upstream's count of a %r request failed: %s", request.model, exc)
            return None
        if tokens is None:
            return None
        self._cache[key] = tokens
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return tokens

    async def _ask(self, request: ProxyRequest, target: UpstreamTarget, content: bytes) -> int | None:
        response = await self.upstream.send(
            "POST",
            target.path,
            content=content,
            headers=request.headers,
            stream=True,
            base_url=request.base_url,
            query=key_query(request),
            key_slot=request.route.key_slot,
            at_origin=target.at_origin,
            limited=False,
        )
        try:
            if response.status_code in UNSUPPORTED_STATUSES:
                self._unsupported[(request.base_url, target.path)] = self._clock() + self.unsupported_s
                while len(self._unsupported) > self.max_entries:
                    self._unsupported.popitem(last=False)
                return None
            if response.status_code != 200:
                return None
            await response.aread()
            answer = response.decoded_body()
        finally:
            await response.aclose()
        if len(answer) > MAX_ANSWER_BYTES:
            return None
        try:
            data = orjson.loads(answer)
        except orjson.JSONDecodeError:
            return None
        return request.dialect.upstream_count(data) if isinstance(data, dict) else None


def key_query(request: ProxyRequest) -> str:
    """The client's query parameters that carry its key (its dialect's ``in_query`` key slots),
    for a count request of its own: the rest of its query (a stream format, ...) is about the
    answer it asked for, not about counting."""
    names = {slot.name for slot in request.dialect.key_slots if slot.in_query}
    if not names or not request.route.query:
        return ""
    return "&".join(part for part in request.route.query.split("&") if part.split("=", 1)[0] in names)
