"""The dialect seam: one adapter per wire API between its JSON and the neutral conversation.

INTERFACE CONTRACT (the service drives a request through it; ``app/core/dialects/`` implements it).
A dialect is the only home of its wire API's facts: nothing outside ``app/core/dialects/`` and the
composition root names an API or branches on which dialect it holds (``tests/test_architecture.py``).

* ``Dialect`` (a protocol; implementations are stateless, frozen, pure). Where it lives on HTTP:

  - ``name``: the registry key (metrics label, headers, plan report): ``"chat"``, ...;
  - ``routes``: its POST endpoints as ``app.core.endpoints.Route`` templates (kind ``"fit"`` or
    ``"count"``, streaming chosen by the body or by the path, where each goes upstream: under the
    base URL or the client's own path at its origin). The API layer serves exactly these;
  - ``key_slots``: where its clients put their key (``routes.KeySlot``: a header such as
    ``authorization``/``x-api-key``, or a query parameter), the first being where the operator's
    key goes on its requests. Auth accepts a proxy key in any registered dialect's slot, and with
    an operator key every registered slot is cleared on the way upstream;
  - ``recognition(body, headers) -> int``: how surely a body that came without a route (the dry
    run, ``ctxproxy plan``) is this API's: 0 not it, 1 its shape fits, 2 a mark only it has
    (``routes.detect`` picks the highest);

  What a request of it means:

  - ``model_of(body, params) -> str``: the model a request is for: the body's ``model`` or a
    path parameter (``params``, a matched route's); ``InvalidRequest`` (``param="model"``) when
    there is none;
  - ``refine_spec(spec, headers) -> ModelSpec``: the model spec as this request's headers change
    it (Anthropic's 1M-context beta), ``spec`` itself when they change nothing;
  - ``items_key``: the top-level key of the array a client's history grows at the end of
    (``"messages"``, ``"input"``): a resent body is parsed only from where it changed near that
    array's end (``body_memo.BodyMemo``);
  - ``output_in_window``: True when the upstream counts the requested output against the
    model's window (OpenAI, Anthropic: the budget keeps an output reserve); False when its limit
    is on the input alone (Gemini's ``inputTokenLimit``: no output reserve);
  - ``accounting_view(body, messages, tool_tokens) -> Mapping``: a forwarded ``body`` of this
    API (its neutral ``messages``, its tool definitions' ``tool_tokens`` by ``tool_tokens``) as
    the chat accounting counts it (``MessageCounter.request_parts``): what learning compares the
    upstream's usage with (``Forwarded.counted``). The body itself for an API whose bodies are
    that accounting's own shape (chat: its text and tools split as they are, so the estimate's
    correction learns from both); else ``conversation.priced_view(messages, tool_tokens)``;
  - ``parse(body, *, memo=None) -> Conversation``: validate what planning relies on (raise
    ``InvalidRequest`` with ``param`` naming the field) and build the neutral messages
    (``conversation.py``). Never mutates ``body``; unknown fields are the upstream's business.
    ``memo`` (a ``parse_memo.ParseMemo``, owned by the caller) lets a dialect reuse what it built
    for the strictly equal leading items of an earlier request; the result equals a fresh parse.
    The conversation's ``model`` and ``stream`` are the body's; the service sets them from
    ``model_of`` and a route that chooses streaming;
  - ``tool_tokens(body, counter) -> int``: tokens of what the body sends besides its messages
    (tool definitions, ...), by this API's rules;
  - ``render(body, messages) -> dict``: ``body`` with its conversation replaced by the fitted
    neutral ``messages``. A kept message whose dict is the one ``parse`` made (identity) is written
    back as its original wire JSON, untouched; a changed one (same ``ORIGIN_KEY``) replaces only
    what changed; one without an origin (note, summary) is built in this API's shape where it keeps
    the body valid (pairing, role order). Every other body key is kept as is;
  - ``problems(body) -> list[str]``: the structural rules of this API the body breaks (orphaned
    results, calls without results, ...), position-free wording. The fit pipeline's final guard
    (``fit.plan_request``) compares a changed plan's rendered body with its input;

  What its upstream answers:

  - ``overflow(status, body) -> ContextOverflow | None``: is this upstream answer a context-length
    error (this API's wordings first, then the shared classifier)?
  - ``preamble_events``: the event types a streamed answer may open with before the answer
    proper; when not empty, a streamed 200 is peeked at until another event arrives, for an
    overflow reported inside it (``preamble.py``; Responses' ``response.failed``);
  - ``input_tokens_used(answer) -> int | None``: the upstream's own count of the prompt, from a
    JSON answer or from one parsed SSE event (``usage.prompt_tokens``, ``response.usage.
    input_tokens``, Anthropic's input + cache read + cache creation), for calibration;
    ``usage_needles``: byte strings every SSE line that carries it contains (lines without them
    are not parsed);
  - ``upstream_count(answer) -> int | None``: the count in an answer of the upstream's own
    token-counting endpoint (a positive integer), else None;

  What the proxy answers in its name:

  - ``count_answer(input_tokens) -> dict``: the answer of this API's token-counting endpoint
    with our count;
  - ``error_body(error) -> dict``: one of our errors (``ErrorInfo``) in this API's error shape
    (every status: 400, 401, 404, 413, 500, 502, 503, 504, ...);
  - ``stream_error(error) -> bytes``: the SSE bytes that end a stream that failed midway, in this
    API's shape (chat: ``data: {"error": ...}``; Responses: an ``error`` event; Anthropic:
    ``event: error``; Gemini: ``data: {"error": ...}`` ended by CRLF CRLF);
  - ``json_stream_error(error, *, started) -> bytes | None``: the bytes that end a streamed
    answer that is not an event stream (Gemini's JSON array sent element by element) when it
    failed midway (``started``: some of its bytes went out already); None for an API without
    such a stream: the body is then cut short (the client sees a truncated body).
  - ``count_request(body, path) -> (UpstreamTarget, body) | None``: the request that asks the
    upstream's own token-counting endpoint for the input of ``body`` (where it goes, derived when
    need be from ``path``, the client's own raw path of the request; and the body it takes: the
    input fields only), None when this API has none (``app.service.boundary`` asks it near the
    boundary);
  - ``with_output_cap(body, tokens) -> dict | None``: ``body`` with its output cap set to
    ``tokens`` (every other key as it is; what the cap constrains, e.g. Anthropic's thinking
    budget, lowered with it), None when this API cannot take that cap for this body;
  - ``summary_request(prompt, *, model, max_tokens) -> SummaryCall``: how this API asks its
    upstream for a summary (``app.compaction``): ``prompt`` is the summarizer's chat-shaped
    messages (a ``system`` message, then ``user`` ones), the call says where it goes (``path``
    under the upstream base URL, or from its origin when ``at_origin``), the non-streaming body and
    the client's headers to carry (credentials, API version);
  - ``summary_text(answer) -> str | None``: the summary text of this API's answer to that call
    (None when it holds none).

* ``ErrorInfo`` (frozen): ``status``, ``code`` (``context_length_exceeded``,
  ``invalid_request_error``, ``upstream_timeout``, ...), ``message``, ``param``, and for a
  cannot-fit error the numbers (``tokens``, ``limit_tokens``, ``window_tokens``,
  ``reserve_tokens``) so a dialect can word it as its own upstream would.
* ``SummaryCall`` (frozen): ``path`` (under the upstream base URL), ``body``, ``carry`` (names of
  the client's request headers the call repeats, lower-case), ``carry_query`` (names of the
  client's query parameters it repeats: a key slot in the query, Gemini's ``key``) and ``defaults``
  (headers sent when the client did not send them, e.g. Anthropic's ``anthropic-version``).
* ``error_info(error, dialect) -> ErrorInfo``: the core errors mapped once (``InvalidRequest`` ->
  400 with its own ``param``, ``CannotFit`` -> 400 ``context_length_exceeded`` whose ``param`` is
  the dialect's ``items_key``: the conversation that does not fit).
* ``model_from_body(body) -> str``: the body's ``model`` (a non-empty string), else
  ``InvalidRequest``; the ``model_of`` of APIs that name the model in the body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .conversation import Conversation
from .endpoints import KeySlot, Route, UpstreamTarget
from .errors import CannotFit, CoreError, InvalidRequest
from .messages import Message
from .overflow import ContextOverflow
from .parse_memo import ParseMemo
from .registry import ModelSpec
from .tokens import MessageCounter

Headers = Sequence[tuple[str, str]]


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
    at_origin: bool = False
    carry_query: tuple[str, ...] = ()


class Dialect(Protocol):
    """One wire API (see the module docstring for the contract of each member)."""

    @property
    def name(self) -> str: ...

    @property
    def routes(self) -> tuple[Route, ...]: ...

    @property
    def key_slots(self) -> tuple[KeySlot, ...]: ...

    def recognition(self, body: Mapping[str, Any], headers: Mapping[str, str], /) -> int: ...

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str: ...

    def refine_spec(self, spec: ModelSpec, headers: Headers, /) -> ModelSpec: ...

    @property
    def items_key(self) -> str: ...

    @property
    def output_in_window(self) -> bool: ...

    @property
    def preamble_events(self) -> frozenset[str]: ...

    @property
    def usage_needles(self) -> tuple[bytes, ...]: ...

    def upstream_count(self, answer: Mapping[str, Any], /) -> int | None: ...

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation: ...

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int: ...

    def accounting_view(
        self, body: Mapping[str, Any], messages: Sequence[Message], tool_tokens: int, /
    ) -> Mapping[str, Any]: ...

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

    def json_stream_error(self, error: ErrorInfo, /, *, started: bool) -> bytes | None: ...

    def stream_error(self, error: ErrorInfo, /) -> bytes: ...

    def count_request(
        self, body: Mapping[str, Any], path: str, /
    ) -> tuple[UpstreamTarget, dict[str, Any]] | None: ...

    def with_output_cap(self, body: Mapping[str, Any], tokens: int, /) -> dict[str, Any] | None: ...

    def summary_request(
        self, prompt: Sequence[Mapping[str, Any]], /, *, model: str, max_tokens: int
    ) -> SummaryCall: ...

    def summary_text(self, answer: Mapping[str, Any], /) -> str | None: ...


def error_info(error: CoreError, dialect: Dialect) -> ErrorInfo:
    """A core error of a request of ``dialect`` as an ``ErrorInfo`` (400 for both kinds a request
    can cause; a cannot-fit error names the dialect's conversation, ``items_key``)."""
    if isinstance(error, CannotFit):
        return ErrorInfo(
            status=400,
            code="context_length_exceeded",
            message=error.message,
            param=dialect.items_key,
            tokens=error.tokens,
            limit_tokens=error.budget_tokens,
            window_tokens=error.window_tokens,
            reserve_tokens=error.reserve_tokens,
        )
    if isinstance(error, InvalidRequest):
        return ErrorInfo(status=400, code="invalid_request_error", message=error.message, param=error.param)
    return ErrorInfo(status=400, code="invalid_request_error", message=str(error))


def model_from_body(body: Mapping[str, Any]) -> str:
    """The body's ``model``; ``InvalidRequest`` unless it is a non-empty string."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string naming the model.", param="model")
    return model
