"""Pure ASGI middleware: request ID, in-flight count, timings and the per-request record.

The outermost of the app's own middlewares, so that:

* every response carries ``X-Request-ID`` (the client's when valid, else a new one), errors and
  404s included; an ``X-Request-ID`` the upstream answered with (OpenAI's ``req_...``, which its
  support asks for) is kept as ``X-Upstream-Request-ID``;
* the ID is in the contextvar of :mod:`app.observability.context` while the request runs, so log
  records (``ctxproxy.access`` included) and upstream calls carry it;
* after the last byte, the request is recorded from what the routes put into the scope (the
  access fields and the dialect, see :mod:`app.observability.context`) and from our
  ``X-Context-*`` response headers: its ``route`` and ``api`` labels come from the dialect its
  route recorded, so every wire API is labelled by its name without a table of paths here.

Timings: ``latency`` is start to last byte; ``overhead`` (fitted and pass-through) is the time from
the request body's last chunk to our response start, minus the time spent waiting for upstream
response headers; ``upstream`` is that waiting time summed over the request's upstream calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..upstream.headers import REQUEST_ID_HEADER
from .context import (
    ACCESS_SCOPE_KEY,
    RELAYED_SCOPE_KEY,
    RequestContext,
    current_request,
    new_request_id,
    valid_request_id,
)
from .labels import PASSTHROUGH, proxied
from .observer import Observability, parse_actions
from .status import RecentRequest

logger = logging.getLogger("ctxproxy.observability")

_RID = REQUEST_ID_HEADER.lower().encode("latin-1")
_RID_LENGTH = len(_RID)
_UPSTREAM_RID = b"x-upstream-request-id"
_X = frozenset(b"xX")  # the first byte of every header name looked at here
_CONTEXT_HEADERS = {
    b"x-context-tokens-before": "tokens_before",
    b"x-context-tokens-after": "tokens_after",
    b"x-context-actions": "actions",
    b"x-context-retries": "retries",
    b"x-context-memory": "memory",
}


def client_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if len(name) == _RID_LENGTH and name.lower() == _RID:
            try:
                return bytes(value).decode("ascii")
            except UnicodeDecodeError:
                return None
    return None


def outcome_of(
    status: int | None, fields: dict[str, Any], answered: dict[str, str], *, completed: bool = True
) -> str:
    """The bounded ``outcome`` label of a finished request. ``completed``: the last body byte was
    sent (a disconnect noticed after that is not the client closing early)."""
    if fields.get("client_disconnected") and not completed:
        return "client_closed"
    upstream_status = fields.get("upstream_status")
    if isinstance(upstream_status, int):
        return "ok" if upstream_status < 400 else "upstream_error"
    if status is None:
        return "error"
    if status == 400 and "tokens_before" in answered:
        return "rejected"  # CannotFit: the proxy answered with its X-Context-* headers
    if status < 400:
        return "ok"
    if status in (502, 504):
        return "upstream_failed"
    if status == 503:
        return "unavailable"  # the proxy's own 503: overloaded or not ready
    if status < 500:
        return "invalid"
    return "error"


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


_access_logger = logging.getLogger("ctxproxy.access")
# Per (thread, process): the attributes of an access record that do not change between lines.
_PROTOTYPES: dict[tuple[int, int], dict[str, Any]] = {}


def access_record(fields: dict[str, Any]) -> logging.LogRecord:
    """The ``ctxproxy.access`` record of one request (``record.access = fields``), as
    ``Logger.makeRecord`` makes it: a copy of one made by ``LogRecord`` itself in this thread and
    process, with its own time (``LogRecord.__init__`` re-derives the file name, module, thread
    and process names on every call: most of its cost). A custom record factory
    (``logging.setLogRecordFactory``) makes every record itself."""
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return _access_logger.makeRecord(
            _access_logger.name, logging.INFO, __file__, 0, "request", (), None, extra={"access": fields}
        )
    key = (threading.get_ident(), os.getpid())
    prototype = _PROTOTYPES.get(key)
    if prototype is None:
        made = logging.LogRecord(_access_logger.name, logging.INFO, __file__, 0, "request", (), None)
        prototype = dict(vars(made))
        if len(_PROTOTYPES) >= 64:  # threads come and go (a test's servers): keep it bounded
            _PROTOTYPES.clear()
        _PROTOTYPES[key] = prototype
    record = logging.LogRecord.__new__(logging.LogRecord)
    attributes = record.__dict__
    attributes.update(prototype)
    now = time.time()
    attributes["created"] = now
    attributes["msecs"] = int((now - int(now)) * 1000) + 0.0
    attributes["relativeCreated"] = prototype["relativeCreated"] + (now - prototype["created"]) * 1000
    attributes["access"] = fields
    return record


class ObservabilityMiddleware:
    """``access_log=True`` also writes the ``ctxproxy.access`` line (the fields the routes put
    in ``access_fields``, with method, path, status and latency; request ID set), from this one
    wrapper: one ``send`` wrapper less on every request."""

    def __init__(self, app: ASGIApp, *, observability: Observability, access_log: bool = False) -> None:
        self.app = app
        self.observability = observability
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        obs = self.observability
        client_id = client_request_id(scope)
        rid = client_id if client_id is not None and valid_request_id(client_id) else new_request_id()
        path = str(scope.get("path") or "")
        ctx = RequestContext(
            request_id=rid,
            started_s=time.perf_counter(),
            route=obs.routes.before(path),
            scope=scope,
            deferred=[],
        )
        token = current_request.set(ctx)
        tracked = proxied(path)
        status: int | None = None
        completed = False
        answered: dict[str, str] = {}
        rid_header = (_RID, rid.encode("ascii"))

        async def receive_timed() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                ctx.body_done_s = time.perf_counter()
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, completed
            if message["type"] == "http.response.start":
                status = message["status"]
                ctx.response_start_s = time.perf_counter()
                if scope.get(RELAYED_SCOPE_KEY):
                    message = {**message, "headers": [*message.get("headers", ()), rid_header]}
                    await send(message)
                    return
                headers = []
                for name, value in message.get("headers") or ():
                    if name and name[0] in _X:  # X-Request-ID and ours: the rest pass untouched
                        lname = bytes(name).lower()
                        if lname == _RID:
                            name = _UPSTREAM_RID
                        field = _CONTEXT_HEADERS.get(lname)
                        if field is not None:
                            answered[field] = bytes(value).decode("latin-1")
                    headers.append((name, value))
                headers.append(rid_header)
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                if not message.get("more_body", False):
                    completed = True  # the bookkeeping of the calls waits for the write (finally)
                elif ctx.deferred is not None:
                    await send(message)
                    obs.flush_upstream(ctx)  # the first body byte is out: the calls' bookkeeping
                    return
            await send(message)

        if tracked:
            obs.request_started()
        try:
            await self.app(scope, receive_timed, send_with_id)
            if completed:
                # The server's write of the last bytes may wait for the event loop's next turn
                # (uvloop writes a turn's queued data after its callbacks): let it go out before
                # the bookkeeping, which is then off the client's latency.
                await asyncio.sleep(0)
        finally:
            if tracked:
                obs.request_finished()
            try:
                if ctx.deferred is not None:
                    obs.flush_upstream(ctx)  # no body sent (an error, a client gone)
                if self.access_log:
                    self._log_access(scope, ctx, status)
                self._record(scope, ctx, status, answered, tracked, completed)
            except Exception:  # bookkeeping must never turn a served request into an error
                logger.exception("observability: recording the request failed")
            current_request.reset(token)

    @staticmethod
    def _log_access(scope: Scope, ctx: RequestContext, status: int | None) -> None:
        if not _access_logger.isEnabledFor(logging.INFO):
            return  # the line would be filtered out: build nothing
        record = {
            "method": scope.get("method"),
            "path": scope.get("path"),
            "status": status,
            **(scope.get(ACCESS_SCOPE_KEY) or {}),
            "latency_ms": round((time.perf_counter() - ctx.started_s) * 1000, 1),
        }
        # ``Logger.info`` without its search of the caller's frame (the line never shows it):
        # the same record otherwise, through the same filters and handlers.
        _access_logger.handle(access_record(record))

    def _record(
        self,
        scope: Scope,
        ctx: RequestContext,
        status: int | None,
        answered: dict[str, str],
        tracked: bool,
        completed: bool,
    ) -> None:
        now = time.perf_counter()
        route, api = self.observability.labels(scope)
        ctx.route = route
        fields: dict[str, Any] = scope.get(ACCESS_SCOPE_KEY) or {}
        outcome = outcome_of(status, fields, answered, completed=completed)
        tokens_before = _int(fields.get("tokens_before", answered.get("tokens_before")))
        tokens_after = _int(fields.get("tokens_after", answered.get("tokens_after")))
        retries = _int(fields.get("retries", answered.get("retries"))) or 0
        actions_header = fields.get("actions", answered.get("actions"))
        actions = parse_actions(actions_header if isinstance(actions_header, str) else None)
        if outcome == "rejected" and "rejected" not in actions:
            actions["rejected"] = 1
        overhead_s: float | None = None
        # Overhead of fitted requests (route == api) and pass-through; not of our own endpoints.
        if route in (api, PASSTHROUGH) and ctx.response_start_s is not None:
            begin = ctx.body_done_s if ctx.body_done_s is not None else ctx.started_s
            overhead_s = max(0.0, ctx.response_start_s - begin - ctx.upstream_s)
        model = fields.get("model")
        upstream_status = fields.get("upstream_status")
        entry = RecentRequest(
            at_s=round(time.time(), 3),
            request_id=ctx.request_id,
            method=str(scope.get("method") or ""),
            route=route,
            model=model if isinstance(model, str) else None,
            status=status,
            outcome=outcome,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            budget_tokens=_int(fields.get("budget")),
            actions=actions_header if isinstance(actions_header, str) else None,
            retries=retries,
            latency_ms=round((now - ctx.started_s) * 1000, 3),
            upstream_ms=round(ctx.upstream_s * 1000, 3) if ctx.upstream_calls else None,
            overhead_ms=round(overhead_s * 1000, 3) if overhead_s is not None else None,
            stream=fields.get("stream") is True,
            api=api,
        )
        memory = fields.get("memory", answered.get("memory"))
        self.observability.record(
            entry,
            prefix_reused_tokens=_int(fields.get("prefix_reused_tokens")),
            actions=actions,
            final_upstream_status=upstream_status if isinstance(upstream_status, int) else None,
            tracked=tracked,
            memory=memory if isinstance(memory, str) else None,
        )
