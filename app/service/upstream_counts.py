"""Ask the upstream's own token-counting endpoint how many input tokens a request holds.

``UpstreamCounts(upstream, *, timeout_s=1.0, max_entries=1024, unsupported_s=600.0)``:

* ``await count(request) -> int | None``: the upstream's count of ``request``'s input, from its
  dialect's counting endpoint (``Dialect.count_request``: Anthropic ``POST messages/count_tokens``,
  OpenAI ``POST responses/input_tokens``), sent with the client's headers (its key, its
  ``anthropic-version``/``anthropic-beta``) to the request's upstream. None when the dialect has
  no such endpoint, the upstream answered anything but a count, or no answer came within
  ``timeout_s`` (the whole call: connection, answer, body).
* Answers are cached by the exact bytes of the count request (and its upstream), at most
  ``max_entries`` (least recently used out): a client that resends the same body is counted once.
* An upstream that answers 404 or 405 (a server without the endpoint: vLLM, llama.cpp behind an
  OpenAI or Anthropic front) is not asked again for ``unsupported_s``.
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
        self._cache: OrderedDict[bytes, int] = OrderedDict()
        self._unsupported: dict[tuple[str, str], float] = {}
        self.calls = 0
        self.hits = 0

    async def count(self, request: ProxyRequest) -> int | None:
        call = request.dialect.count_request(request.body)
        if call is None:
            return None
        path, body = call
        where = (request.base_url, path)
        until = self._unsupported.get(where)
        if until is not None:
            if self._clock() < until:
                return None
            del self._unsupported[where]
        content = dump_body(body)
        key = hashlib.sha256(f"{request.base_url}\n{path}\n".encode() + content).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return cached
        self.calls += 1
        try:
            tokens = await asyncio.wait_for(self._ask(request, path, content), self.timeout_s)
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

    async def _ask(self, request: ProxyRequest, path: str, content: bytes) -> int | None:
        response = await self.upstream.send(
            "POST",
            path,
            content=content,
            headers=request.headers,
            stream=True,
            base_url=request.base_url,
            key_slot=request.route.key_slot,
            limited=False,
        )
        try:
            if response.status_code in UNSUPPORTED_STATUSES:
                self._unsupported[(request.base_url, path)] = self._clock() + self.unsupported_s
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
        tokens = data.get("input_tokens") if isinstance(data, dict) else None
        return tokens if type(tokens) is int and tokens > 0 else None
