"""Ask the upstream what it knows about its models' windows (the I/O half of ``app.core.discovered``).

``Discovery(upstream, knowledge, *, timeout_s=1.5, retry_after_s=300.0, on_call=None)``; the app
gives it an ``UpstreamClient`` of its own over the chat client's sender (same pool, without the
instrumentation: out of the chat traffic's upstream metrics) and reports each call through
``on_call(method, path, status)`` (``status`` None: unreachable) to the discovery metric:

* ``start()`` (from the app's lifespan, returns at once): in the background, for every upstream
  base URL, ``GET {base}/models`` (vLLM, SGLang, OpenRouter, LM Studio, Groq fields),
  ``GET {root}/props`` (llama.cpp) and ``GET {root}/api/v0/models`` (LM Studio's REST API), where
  ``root`` is the base URL without its trailing ``/v1``. Every listed model's figures go into the
  :class:`app.core.knowledge.Knowledge` table.
* ``await ensure(model, base_url)`` (before planning a chat request): the first time a model is
  seen, waits for that base's discovery and, when it told us no window for the model, for Ollama's
  ``POST {root}/api/show {"model": name}``; never longer than ``timeout_s`` in all. The discovery
  itself carries on in the background when the request stops waiting, and its result is cached.
* ``settled(model, base_url)``: whether that is known already (a dry run, which asks nothing,
  says its window is an estimate otherwise).
* ``aclose()`` cancels what is still running.

A model list refused (401/403) with the operator's key in the first key slot (``Authorization``)
is asked again with the key in each other slot the proxy serves, in order, until one is not
refused (Google's ``GET /v1/models`` takes ``x-goog-api-key``, and answers ``models[]`` with
``inputTokenLimit``/``outputTokenLimit``: ``app.core.discovered``); the slot that worked is kept
for that base's later calls.

Each HTTP call has its own ``timeout_s``. A base that could not be reached (or answered nothing
useful) is logged once, at WARNING, and asked again at most every ``retry_after_s``; a 404 on an
endpoint a server does not have is normal and not logged. Requests to discovery endpoints carry no
client header, only the operator's API key when one is configured; nothing learned is secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from ..core.discovered import (
    combine,
    figures_from_model_list,
    figures_from_ollama_show,
    figures_from_props,
    listed_ids,
    root_url,
)
from ..core.knowledge import DiscoveredFigures, Knowledge
from ..core.routes import KeySlot
from ..upstream.client import UpstreamClient, join_url

logger = logging.getLogger("ctxproxy.discovery")

DEFAULT_TIMEOUT_S = 1.5
DEFAULT_RETRY_AFTER_S = 300.0
REFUSED = frozenset({401, 403})
MAX_TRACKED_MODELS = 4096


def safe_url(url: str) -> str:
    """``url`` without user info (never log a password)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


class _Base:
    """What one upstream base URL told us."""

    __slots__ = (
        "done_at",
        "ids",
        "key_slot",
        "listed",
        "reached",
        "server",
        "show_missing",
        "task",
        "url",
    )

    def __init__(self, url: str) -> None:
        self.url = url
        self.key_slot: KeySlot | None = None  # where the operator's key went when not the first slot
        self.task: asyncio.Task[None] | None = None
        self.ids: tuple[str, ...] = ()
        self.listed: dict[str, DiscoveredFigures] = {}
        self.server: DiscoveredFigures | None = None
        self.reached = False
        self.done_at = 0.0
        self.show_missing = False


class Discovery:
    """Window discovery with a per-base and per-model cache (see the module docstring)."""

    def __init__(
        self,
        upstream: UpstreamClient,
        knowledge: Knowledge,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        on_call: Callable[[str, str, int | None], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self._on_call = on_call
        self.knowledge = knowledge
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._bases: dict[str, _Base] = {}
        self._models: OrderedDict[tuple[str, str], tuple[asyncio.Task[bool], float]] = OrderedDict()
        self._logged: set[str] = set()
        self._closed = False

    # -- public -------------------------------------------------------------------------------

    def start(self) -> None:
        for base_url in self.upstream.base_urls():
            self._base_task(base_url)

    async def ensure(self, model: str, base_url: str) -> None:
        """Wait (at most ``timeout_s``) until what can be discovered about ``model`` is known."""
        if self._closed:
            return
        task = self._model_task(model, base_url)
        if task.done():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), self.timeout_s)

    def settled(self, model: str, base_url: str) -> bool:
        """True when what can be discovered about ``model`` is known without asking (its
        discovery finished, or discovery is closed): ``ensure`` would not wait for an answer."""
        found = self._models.get((base_url, model))
        return self._closed or (found is not None and found[0].done())

    async def discover_listed(self, base_url: str, *, limit: int = 64) -> tuple[str, ...]:
        """Discover every model ``base_url`` lists (at most ``limit``; the CLI's table), each
        within the timeout; returns the listed ids."""
        await asyncio.shield(self._base_task(base_url))
        ids = self._bases[base_url].ids[:limit]
        await asyncio.gather(*(self.ensure(model, base_url) for model in ids))
        return ids

    async def wait_idle(self) -> None:
        """Wait until every discovery started so far has finished (tests, the CLI)."""
        tasks: list[asyncio.Task[Any]] = [b.task for b in self._bases.values() if b.task is not None]
        tasks += [t for t, _ in self._models.values()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self) -> None:
        self._closed = True
        tasks: list[asyncio.Task[Any]] = [
            b.task for b in self._bases.values() if b.task is not None and not b.task.done()
        ]
        tasks += [t for t, _ in self._models.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- tasks --------------------------------------------------------------------------------

    def _base_task(self, base_url: str) -> asyncio.Task[None]:
        base = self._bases.get(base_url)
        if base is None:
            base = self._bases[base_url] = _Base(base_url)
        stale = base.task is not None and base.task.done() and not base.reached
        if base.task is None or (stale and self._clock() - base.done_at >= self.retry_after_s):
            base.task = asyncio.create_task(self._discover_base(base_url, base))
        return base.task

    def _model_task(self, model: str, base_url: str) -> asyncio.Task[bool]:
        key = (base_url, model)
        found = self._models.get(key)
        if found is not None:
            task, started = found
            self._models.move_to_end(key)
            retry = task.done() and not task.cancelled() and task.exception() is None and not task.result()
            if not retry or self._clock() - started < self.retry_after_s:
                return task
        task = asyncio.create_task(self._discover_model(model, base_url))
        self._models[key] = (task, self._clock())
        while len(self._models) > MAX_TRACKED_MODELS:
            _, (old, _) = self._models.popitem(last=False)
            if not old.done():
                old.cancel()
        return task

    async def _discover_base(self, base_url: str, base: _Base) -> None:
        root = root_url(base_url)
        try:
            await self._discover_base_once(base_url, root, base)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("model discovery at %s failed", safe_url(base_url))
        finally:
            base.done_at = self._clock()

    async def _discover_base_once(self, base_url: str, root: str, base: _Base) -> None:
        listing, props, lmstudio = await asyncio.gather(
            self._list_models(base_url, base),
            self._get_json(root, "props", base=base),
            self._get_json(root, "api/v0/models", base=base),
        )
        base.ids = listed_ids(listing)
        listed = figures_from_model_list(listing, detail=f"GET {urlsplit(base_url).path.rstrip('/')}/models")
        for model, figures in figures_from_model_list(lmstudio, detail="GET /api/v0/models").items():
            listed[model] = combine([listed.get(model), figures]) or figures
        base.listed = listed
        base.server = figures_from_props(props)
        for model, figures in listed.items():
            merged = combine([figures, base.server]) or figures
            self.knowledge.set_discovered(model, merged)
        if listed or base.server is not None:
            logger.info(
                "discovered context windows for %d model(s) at %s%s",
                len(listed),
                safe_url(base_url),
                " (llama.cpp /props n_ctx)" if base.server is not None else "",
            )

    async def _list_models(self, base_url: str, base: _Base) -> Any:
        """``GET {base}/models``; refused with the operator's key in the first slot, asked again
        with it in each other key slot until one is not refused (see the module docstring)."""
        others = self.upstream.key_slots[1:] if self.upstream.has_api_key else ()
        status, listing = await self._call("GET", base_url, "models", None, base=base, quiet=bool(others))
        if status not in REFUSED or not others:
            return listing
        for n, slot in enumerate(others, start=1):
            last = n == len(others)
            status, listing = await self._call(
                "GET", base_url, "models", None, base=base, key_slot=slot, quiet=not last
            )
            if status not in REFUSED:
                base.key_slot = slot
                return listing
        return None

    async def _discover_model(self, model: str, base_url: str) -> bool:
        """True when the upstream answered (whatever it said), False when it could not be asked."""
        try:
            return await self._discover_model_once(model, base_url)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must never fail a chat request: log it, use the table
            logger.exception("model discovery for %r failed", model)
            return False

    async def _discover_model_once(self, model: str, base_url: str) -> bool:
        base_task = self._base_task(base_url)
        await asyncio.shield(base_task)
        base = self._bases[base_url]
        figures = base.listed.get(model)
        if figures is None:
            folded = model.lower()
            figures = next((f for m, f in base.listed.items() if m.lower() == folded), None)
        found = combine([figures, base.server])
        if (found is None or found.window_tokens is None) and base.reached and not base.show_missing:
            show = await self._post_json(
                root_url(base_url), "api/show", {"model": model}, base=base, missing_ok=True
            )
            found = combine([found, figures_from_ollama_show(show)])
        if found is not None and (found.window_tokens is not None or found.max_output_tokens is not None):
            self.knowledge.set_discovered(model, found)
        elif base.reached:
            self._log_once(
                f"none:{base_url}",
                "the upstream at %s does not say the window of %r (nor, probably, of its other models): "
                "the model table applies, and context errors and usage teach the rest",
                safe_url(base_url),
                model,
                level=logging.INFO,
            )
        return base.reached

    # -- HTTP ---------------------------------------------------------------------------------

    async def _get_json(self, base_url: str, path: str, *, base: _Base) -> Any:
        return (await self._call("GET", base_url, path, None, base=base))[1]

    async def _post_json(
        self, base_url: str, path: str, payload: Any, *, base: _Base, missing_ok: bool = False
    ) -> Any:
        return (await self._call("POST", base_url, path, payload, base=base, missing_ok=missing_ok))[1]

    async def _call(
        self,
        method: str,
        base_url: str,
        path: str,
        payload: Any,
        *,
        base: _Base,
        missing_ok: bool = False,
        key_slot: KeySlot | None = None,
        quiet: bool = False,
    ) -> tuple[int | None, Any]:
        """``(status, JSON answer)``: status None when unreachable, the JSON None unless a 200
        answered it. ``quiet``: a refusal is not logged (the caller asks again elsewhere)."""
        content = json.dumps(payload).encode() if payload is not None else None
        headers = [("Content-Type", "application/json")] if content is not None else []
        try:
            response = await self.upstream.send(
                method,
                path,
                content=content,
                headers=headers,
                stream=False,
                base_url=base_url,
                timeout=httpx.Timeout(self.timeout_s),
                key_slot=key_slot or base.key_slot,
            )
        except Exception as exc:  # UpstreamError, or a broken transport: unreachable, for discovery
            self._report(method, join_url(base_url, path), None)
            self._log_once(
                f"fail:{base.url}",
                "model discovery could not reach %s (%s %s: %s); windows come from the model "
                "table until it answers (asked again in %.0f s at the earliest)",
                safe_url(base_url),
                method,
                path,
                type(exc).__name__,
                self.retry_after_s,
            )
            return None, None
        base.reached = True
        status = response.status_code
        self._report(method, join_url(base_url, path), status)
        if status in (404, 405, 501) and missing_ok:
            base.show_missing = True
        if status != 200:
            if status >= 500:
                self._log_once(
                    f"status:{base.url}",
                    "model discovery at %s failed (%s %s: HTTP %d); windows come from the model table",
                    safe_url(base_url),
                    method,
                    path,
                    status,
                )
            if status in REFUSED and not quiet:
                self._log_once(
                    f"auth:{base.url}",
                    "model discovery at %s was refused (%s %s: HTTP %d): without CTXPROXY_UPSTREAM_API_KEY "
                    "the proxy has no key of its own to ask with; the model table applies",
                    safe_url(base_url),
                    method,
                    path,
                    status,
                    level=logging.INFO,  # normal when clients bring their own keys
                )
            return status, None
        try:
            return status, json.loads(response.decoded_body())
        except (ValueError, RecursionError):
            return status, None

    def _report(self, method: str, url: str, status: int | None) -> None:
        if self._on_call is None:
            return
        try:
            self._on_call(method, urlsplit(url).path, status)
        except Exception:  # metrics must never break discovery
            logger.exception("discovery metrics hook failed")

    def _log_once(self, key: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        if key in self._logged:
            return
        self._logged.add(key)
        logger.log(level, message, *args)
