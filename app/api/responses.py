"""Turn upstream answers into client responses, passing the body through untouched.

:class:`UpstreamStreamResponse` sends the upstream's raw bytes as they arrive (no buffering, no
re-encoding), stops when the client disconnects (which cancels the upstream read) and closes the
upstream response in ``finally`` on every path. Chat responses carry our ``X-Context-*`` headers.

Backpressure: each chunk is handed to the server with ``await send(...)``, which (uvicorn) waits
while the client's socket buffer is full, and the next chunk is read from the upstream only after
that; so a slow client slows the upstream read instead of growing a buffer in the proxy.

When the upstream fails after the headers went out (it closed the connection, or went silent for
longer than the stream idle timeout), an event stream (``text/event-stream``) ends with one
error event in the request's API's shape (``Dialect.stream_error``; the app's fallback dialect's
on a route of no dialect), and is then closed; any other body ends with the API's own closing error
when it has one (``Dialect.json_stream_error``: Gemini's JSON array gets an error element), else
it is cut short (no final chunk), so the client sees an error or a truncated body, never a
complete one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..core.dialect import Dialect, ErrorInfo
from ..core.plan import Plan
from ..core.reuse import PrefixReuse
from ..observability.context import ACCESS_SCOPE_KEY, RELAYED_SCOPE_KEY
from ..service.outcome import Outcome
from ..service.recall_stream import RecallStreamResponse
from ..service.report import request_budget_tokens
from ..upstream.client import UpstreamResponse
from ..upstream.errors import UpstreamError, UpstreamTimeout
from ..upstream.headers import CONTEXT_PREFIX, REQUEST_ID_HEADER, Header, client_response_raw

logger = logging.getLogger("ctxproxy.stream")
_CONTEXT_PREFIX = CONTEXT_PREFIX.encode("latin-1")
_RID = REQUEST_ID_HEADER.lower().encode("latin-1")
_UPSTREAM_RID = b"x-upstream-" + _RID[2:]


def context_headers(
    plan: Plan, *, retries: int, warnings: Iterable[str] = (), prefix_reuse: PrefixReuse | None = None
) -> list[Header]:
    """Our response headers for a fitted request (``X-Context-Count`` is ``exact``, ``estimate`` or
    ``calibrated``; ``X-Context-Warning`` only when there is a warning, e.g. ``upstream-truncated``;
    ``X-Context-Prefix-Reuse``, when known, the share of the forwarded message tokens that the
    previous forwarded request of the conversation already sent as its prefix, 3 decimals;
    ``X-Context-Output-Lowered``, the output cap forwarded when it was lowered below the client's;
    ``X-Context-Upstream-Tokens``, the upstream's own count of the whole request when the plan was
    decided by it; ``X-Context-Memory``: ``summary``, ``note`` or ``none``, what stands in for what
    was cut). Window and budget are the ones the forwarded plan was fitted to (a retry's learned
    window, an exact count's margin). A plan that does not fit (the request is refused: nothing
    is forwarded) has no ``X-Context-Tokens-After``; the refusal's message says how far the plan
    got."""
    raw = context_raw_headers(plan, retries=retries, warnings=warnings, prefix_reuse=prefix_reuse)
    # Every name is hyphenated words: title case is its display form (x-context-window -> X-Context-Window).
    return [(name.decode("latin-1").title(), value.decode("latin-1")) for name, value in raw]


def context_raw_headers(
    plan: Plan, *, retries: int, warnings: Iterable[str] = (), prefix_reuse: PrefixReuse | None = None
) -> list[tuple[bytes, bytes]]:
    """:func:`context_headers` as ASGI sends them (names lowercased, values latin-1 bytes), made
    as bytes directly: a fitted response's path."""
    headers = [
        (b"x-context-window", b"%d" % plan.budget.window_tokens),
        (b"x-context-budget", b"%d" % request_budget_tokens(plan.budget)),
        (b"x-context-tokens-before", b"%d" % plan.tokens_before),
    ]
    if plan.fits:  # else nothing was forwarded: no figure of what was
        headers.append((b"x-context-tokens-after", b"%d" % plan.tokens_after))
    headers += [
        (b"x-context-count", plan.count_kind.encode("latin-1")),
        (b"x-context-actions", plan.actions_header().encode("latin-1")),
        (b"x-context-retries", b"%d" % retries),
        # What stands in for what the cut forgot: ``summary``, ``note`` (note and placeholders), ``none``.
        (b"x-context-memory", plan.memory_kind.encode("latin-1")),
    ]
    if plan.output_cap_tokens is not None:
        headers.append((b"x-context-output-lowered", b"%d" % plan.output_cap_tokens))
    if plan.upstream_tokens is not None:
        headers.append((b"x-context-upstream-tokens", b"%d" % plan.upstream_tokens))
    if warnings:
        headers.append((b"x-context-warning", ",".join(dict.fromkeys(warnings)).encode("latin-1")))
    if prefix_reuse is not None:
        headers.append((b"x-context-prefix-reuse", b"%.3f" % prefix_reuse.share))
    return headers


def access_fields(scope: MutableMapping[str, Any]) -> dict[str, Any]:
    """The per-request dict the access log line is built from (routes fill it in)."""
    fields: dict[str, Any] = scope.setdefault(ACCESS_SCOPE_KEY, {})
    return fields


def record_plan(
    scope: MutableMapping[str, Any], plan: Plan, *, retries: int, prefix_reuse: PrefixReuse | None = None
) -> None:
    """The plan's figures into the request's access fields (:func:`plan_fields`)."""
    access_fields(scope).update(plan_fields(plan, retries=retries, prefix_reuse=prefix_reuse))


def plan_fields(plan: Plan, *, retries: int, prefix_reuse: PrefixReuse | None = None) -> dict[str, Any]:
    """The access fields of a plan (the access line and the metrics read them)."""
    fields: dict[str, Any] = {}
    if prefix_reuse is not None:
        fields["prefix_reused_tokens"] = prefix_reuse.reused_tokens
    fields.update(
        api=plan.api,
        model=plan.model,
        tokens_before=plan.tokens_before,
        tokens_after=plan.tokens_after,
        budget=request_budget_tokens(plan.budget),
        window=plan.budget.window_tokens,
        count=plan.count_kind,
        actions=plan.actions_header(),
        retries=retries,
        memory=plan.memory_kind,
    )
    return fields


@dataclass(frozen=True, slots=True)
class Rendered:
    """A fitted response's headers and access fields, made while the upstream worked
    (``Service.handle(render=)``, :func:`render_ahead`)."""

    raw_headers: list[tuple[bytes, bytes]]
    fields: dict[str, Any]


def render_ahead(plan: Plan, prefix_reuse: PrefixReuse) -> Rendered:
    """What :func:`fitted_response` and :func:`record_plan` make of ``plan`` answered as it was
    sent (no retry, no warning but its own)."""
    return Rendered(
        context_raw_headers(plan, retries=0, warnings=plan.warnings, prefix_reuse=prefix_reuse),
        plan_fields(plan, retries=0, prefix_reuse=prefix_reuse),
    )


class UpstreamStreamResponse(Response):
    """An ASGI response whose status, headers and body are the upstream's (plus ``extra_headers``).

    A ``Response`` subclass only so that FastAPI returns it as is; it never buffers a body.
    """

    def __init__(
        self,
        upstream: UpstreamResponse,
        *,
        dialect: Dialect,
        extra_headers: Iterable[Header] = (),
        raw_extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """``extra_headers`` (text), or ``raw_extra`` (as ASGI sends them: names lowercased), are
        added to the upstream's; when there are any, the upstream's ``X-Context-*`` are dropped."""
        self.upstream = upstream
        self.dialect = dialect
        self.background = None
        extra = raw_extra if raw_extra is not None else []
        extra += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in extra_headers]
        ours = {name for name, _ in extra}
        passed = [
            # The upstream's request ID is kept under its own name: X-Request-ID is ours.
            (_UPSTREAM_RID if name == _RID else name, value)
            for name, value in client_response_raw(upstream.raw_headers)
            if not (extra and (name in ours or name.startswith(_CONTEXT_PREFIX)))
        ]
        self._delivered = False
        self.status_code = upstream.status_code
        self.raw_headers = passed + extra
        if upstream.body is not None:
            self.raw_headers.append((b"content-length", str(len(upstream.body)).encode("ascii")))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        access_fields(scope)["upstream_status"] = self.status_code
        scope[RELAYED_SCOPE_KEY] = True
        if self.upstream.body is not None:
            await self._send_whole(send, self.upstream.body)
            return
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    await self._stream(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self._wait_for_disconnect(receive)
                # A client that read the stream to its end and then hung up did not leave early:
                # its disconnect can arrive before the relay task notices that it is done.
                if not self._delivered:
                    access_fields(scope)["client_disconnected"] = True
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()

    async def _send_whole(self, send: Send, body: bytes) -> None:
        """A body read already (a non-streaming answer, an error): one message, nothing to watch."""
        start = {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        try:
            await send(start)
            await send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            pass  # the client is gone: nothing to deliver
        finally:
            if not self.upstream.closed:  # (a body read whole from aiohttp released it already)
                with anyio.CancelScope(shield=True):
                    await self.upstream.aclose()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        tail = b"\n\n"
        started = False
        try:
            async for chunk in self.upstream.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                tail = (tail + chunk)[-2:]
                started = True
        except UpstreamError as exc:
            logger.warning("upstream failed mid-response: %s", exc.message)
            if not self._is_event_stream():
                # The status is already sent: end the response with the API's own closing error
                # (a JSON array's last element) or without its final chunk, so the client sees
                # an error or a truncated body rather than a complete-looking one.
                ending = self.dialect.json_stream_error(stream_error_info(exc), started=started)
                if ending is not None:
                    with contextlib.suppress(OSError):
                        await send({"type": "http.response.body", "body": ending, "more_body": False})
                return
            # Close an event the upstream left half-sent, so ours is parsed on its own.
            event = (b"" if tail == b"\n\n" else b"\n\n") + stream_error_event(exc, self.dialect)
            with contextlib.suppress(OSError):  # the client may be gone too
                await send({"type": "http.response.body", "body": event, "more_body": False})
            return
        except OSError:
            return  # the server reports the client gone on send (ASGI 2.4): nothing to deliver
        self._delivered = True  # every byte the upstream sent is with the client
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _is_event_stream(self) -> bool:
        return any(
            name == b"content-type" and value.split(b";")[0].strip().lower() == b"text/event-stream"
            for name, value in self.raw_headers
        )

    @staticmethod
    async def _wait_for_disconnect(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return


async def read_whole(upstream: UpstreamResponse) -> None:
    """Read a non-streaming answer whole before responding: it is small and arrives at once, and
    the client then gets it in one message with its Content-Length instead of a chunk relay (less
    work per request). An upstream that breaks off mid-body becomes our 502/504, not a cut 200."""
    try:
        await upstream.aread()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await upstream.aclose()
        raise


def stream_error_info(exc: UpstreamError) -> ErrorInfo:
    """A stream the upstream broke off, as our error: 504 after a silence, else 502."""
    timeout = isinstance(exc, UpstreamTimeout)
    code = "upstream_timeout" if timeout else "upstream_protocol_error"
    return ErrorInfo(status=504 if timeout else 502, code=code, message=exc.message)


def stream_error_event(exc: UpstreamError, dialect: Dialect) -> bytes:
    """The SSE event that ends a stream the upstream broke off (the SDKs raise it as an APIError),
    in the shape of the request's API."""
    return dialect.stream_error(stream_error_info(exc))


def fitted_response(
    outcome: Outcome, dialect: Dialect, *, scope: MutableMapping[str, Any] | None = None
) -> UpstreamStreamResponse:
    """The upstream's answer to a fitted request, with our ``X-Context-*`` headers; the plan's
    access fields recorded in ``scope`` when given (:func:`record_plan`). What was rendered while
    the upstream worked (``outcome.rendered``, :func:`render_ahead`) is used as it is. An answer
    read whole after the plan offered ``ctx_recall`` carries ``X-Context-Recalls: N`` (the rounds
    the proxy answered the tool in; 0: it was offered, not called); a stream's rounds, known only
    at its end, go to the access line's ``recalls`` field and the metrics."""
    rendered = outcome.rendered
    if isinstance(rendered, Rendered):
        raw_extra, fields = rendered.raw_headers, rendered.fields
    else:
        raw_extra = context_raw_headers(
            outcome.plan,
            retries=outcome.retries,
            warnings=outcome.warnings,
            prefix_reuse=outcome.prefix_reuse,
        )
        fields = plan_fields(outcome.plan, retries=outcome.retries, prefix_reuse=outcome.prefix_reuse)
    if outcome.recalls is not None:
        # The rounds the proxy answered ctx_recall in (a whole answer: known before the headers).
        raw_extra = [*raw_extra, (b"x-context-recalls", b"%d" % outcome.recalls)]
        fields = {**fields, "recalls": outcome.recalls}
    if scope is not None:
        access_fields(scope).update(fields)
        if isinstance(outcome.response, RecallStreamResponse):
            # A stream's rounds are known at its end: the access line and the metrics get them.
            outcome.response.on_end = partial(_record_recalls, access_fields(scope))
    return UpstreamStreamResponse(outcome.response, raw_extra=raw_extra, dialect=dialect)


def _record_recalls(fields: dict[str, Any], rounds: int) -> None:
    fields["recalls"] = rounds
