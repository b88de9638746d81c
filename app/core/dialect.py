"""The dialect seam: one adapter per wire API between its JSON and the neutral conversation.

INTERFACE CONTRACT (the service drives a request through it; ``app/core/dialects/`` implements it):

* ``Dialect`` (a protocol; implementations are stateless, frozen, pure):

  - ``name``: ``"chat"``, ``"responses"`` or ``"messages"`` (metrics label, headers, plan report);
  - ``upstream_path``: the path under the upstream base URL (``"chat/completions"``, ...);
  - ``items_key``: the top-level key of the array a client's history grows at the end of
    (``"messages"``, ``"input"``): a resent body is parsed only from where it changed near that
    array's end (``body_memo.BodyMemo``);
  - ``parse(body, *, memo=None) -> Conversation``: validate what planning relies on (raise
    ``InvalidRequest`` with ``param`` naming the field) and build the neutral messages
    (``conversation.py``). Never mutates ``body``; unknown fields are the upstream's business.
    ``memo`` (a ``parse_memo.ParseMemo``, owned by the caller) lets a dialect reuse what it built
    for the strictly equal leading items of an earlier request; the result equals a fresh parse;
  - ``tool_tokens(body, counter) -> int``: tokens of what the body sends besides its messages
    (tool definitions, ...), by this API's rules;
  - ``render(body, messages) -> dict``: ``body`` with its conversation replaced by the fitted
    neutral ``messages``. A kept message whose dict is the one ``parse`` made (identity) is written
    back as its original wire JSON, untouched; a changed one (same ``ORIGIN_KEY``) replaces only
    what changed; one without an origin (note, summary) is built in this API's shape where it keeps
    the body valid (pairing, role order). Every other body key is kept as is;
  - ``problems(body) -> list[str]``: the structural rules of this API the body breaks (orphaned
    results, calls without results, ...), position-free wording; the pipeline's final guard and the
    property tests compare the output's problems with the input's;
  - ``error_body(error) -> dict``: one of our errors (``ErrorInfo``) in this API's error shape;
  - ``overflow(status, body) -> ContextOverflow | None``: is this upstream answer a context-length
    error (this API's wordings first, then the shared classifier)?
  - ``input_tokens_used(answer) -> int | None``: the upstream's own count of the prompt, from a
    JSON answer or from one parsed SSE event (``usage.prompt_tokens``, ``response.usage.
    input_tokens``, Anthropic's input + cache read + cache creation), for calibration;
  - ``count_answer(input_tokens) -> dict``: the answer of this API's token-counting endpoint
    (Responses ``/responses/input_tokens``, Anthropic ``/messages/count_tokens``) with our count;
  - ``stream_error(error) -> bytes``: the SSE bytes that end a stream that failed midway, in this
    API's shape (chat: ``data: {"error": ...}``; Responses: an ``error`` event; Anthropic:
    ``event: error``);
  - ``summary_request(prompt, *, model, max_tokens) -> SummaryCall``: how this API asks its
    upstream for a summary (``app.compaction``): ``prompt`` is the summarizer's chat-shaped
    messages (a ``system`` message, then ``user`` ones), the call says the path, the non-streaming
    body and the client's headers to carry (credentials, API version);
  - ``summary_text(answer) -> str | None``: the summary text of this API's answer to that call
    (None when it holds none).

* ``ErrorInfo`` (frozen): ``status``, ``code`` (``context_length_exceeded``,
  ``invalid_request_error``, ``upstream_timeout``, ...), ``message``, ``param``, and for a
  cannot-fit error the numbers (``tokens``, ``limit_tokens``, ``window_tokens``,
  ``reserve_tokens``) so a dialect can word it as its own upstream would.
* ``SummaryCall`` (frozen): ``path`` (under the upstream base URL), ``body``, ``carry`` (names of
  the client's request headers the call repeats, lower-case) and ``defaults`` (headers sent when
  the client did not send them, e.g. Anthropic's ``anthropic-version``).
* ``error_info(error) -> ErrorInfo``: the core errors mapped once (``InvalidRequest`` -> 400,
  ``CannotFit`` -> 400 ``context_length_exceeded``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .conversation import Conversation
from .errors import CannotFit, CoreError, InvalidRequest
from .messages import Message
from .overflow import ContextOverflow
from .parse_memo import ParseMemo
from .tokens import MessageCounter


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """One of our own errors, before a dialect puts it in its API's shape."""

    status: int
    code: str
    message: str
    param: str | None = None
    tokens: int | None = None
    limit_tokens: int | None = None
    window_tokens: int | None = None
    reserve_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class SummaryCall:
    """One summary request in a dialect's own API (see the module docstring)."""

    path: str
    body: dict[str, Any]
    carry: tuple[str, ...] = ()
    defaults: tuple[tuple[str, str], ...] = ()


class Dialect(Protocol):
    """One wire API (see the module docstring for the contract of each member)."""

    @property
    def name(self) -> str: ...

    @property
    def upstream_path(self) -> str: ...

    @property
    def items_key(self) -> str: ...

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation: ...

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int: ...

    def render(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        /,
        *,
        source: Sequence[Message] | None = None,
    ) -> dict[str, Any]: ...

    def problems(self, body: Mapping[str, Any], /) -> list[str]: ...

    def error_body(self, error: ErrorInfo, /) -> dict[str, Any]: ...

    def overflow(
        self, status: int, body: bytes | str | Mapping[str, object] | None, /
    ) -> ContextOverflow | None: ...

    def input_tokens_used(self, answer: Mapping[str, Any], /) -> int | None: ...

    def count_answer(self, input_tokens: int, /) -> dict[str, Any]: ...

    def stream_error(self, error: ErrorInfo, /) -> bytes: ...

    def summary_request(
        self, prompt: Sequence[Mapping[str, Any]], /, *, model: str, max_tokens: int
    ) -> SummaryCall: ...

    def summary_text(self, answer: Mapping[str, Any], /) -> str | None: ...


def error_info(error: CoreError) -> ErrorInfo:
    """A core error as an ``ErrorInfo`` (400 for both kinds a request can cause)."""
    if isinstance(error, CannotFit):
        return ErrorInfo(
            status=400,
            code="context_length_exceeded",
            message=error.message,
            param="messages",
            tokens=error.tokens,
            limit_tokens=error.budget_tokens,
            window_tokens=error.window_tokens,
            reserve_tokens=error.reserve_tokens,
        )
    if isinstance(error, InvalidRequest):
        return ErrorInfo(status=400, code="invalid_request_error", message=error.message, param=error.param)
    return ErrorInfo(status=400, code="invalid_request_error", message=str(error))
