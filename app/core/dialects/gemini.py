"""Gemini's native API (``models/{model}:generateContent``, ``:streamGenerateContent``,
``:countTokens``) as a dialect of the neutral conversation.

INTERFACE CONTRACT (pure, standard library only; the wire facts are in ``docs/gemini.md``):

* ``GEMINI`` (``GeminiDialect``) implements ``app.core.dialect.Dialect``:

  - routes, under ``/v1beta`` and ``/v1``: ``POST /{v}/models/{model}:generateContent``
    (streaming: no), ``:streamGenerateContent`` (streaming: yes; SSE with ``?alt=sse``, its
    ``event_query``; one JSON array streamed element by element without it) and ``:countTokens``
    (kind ``count``, the upstream's own count first: Gemini's tokenizer is not public; ours, a
    labelled estimate, only when the upstream has no such endpoint). Every one goes upstream at
    the client's own path (query kept) at the base URL's origin (``Route.upstream == ""``), so a
    base URL ending in ``/v1`` serves ``/v1beta`` requests too;
  - ``key_slots``: the ``x-goog-api-key`` header (where the operator's key goes), then the
    ``key`` query parameter;
  - ``model_of``: the path's ``{model}``; without a path (the dry run, the gateway engine) the
    body's ``model`` (or its ``generateContentRequest``'s), ``models/`` stripped;
  - ``recognition``: 2 for a ``contents`` array holding an object with ``parts`` or a
    ``generateContentRequest`` (no other API has them), else 0; ``refine_spec`` changes nothing;
  - ``preamble_events`` is empty: Gemini refuses an input over its window with a 400 before the
    stream opens (gemini-cli #5807: ``generateContentStream`` throws on the status), never inside
    a 200 stream; ``usage_needles``: ``"usageMetadata"`` (on every stream chunk);
    ``upstream_count``: ``totalTokens`` of a ``:countTokens`` answer; ``accounting_view``: the
    neutral messages with the tools priced (``conversation.priced_view``);
  - ``output_in_window = False``: Gemini's ``inputTokenLimit`` limits the input alone and
    ``maxOutputTokens`` is not counted against it ("The input token count (N) exceeds the maximum
    number of tokens allowed (M)" compares the input with ``inputTokenLimit``), so the budget
    keeps no output reserve (``fit``); ``requested_output_tokens`` still says what the body asked
    for (``outputTokenLimit`` caps it upstream).

* ``parse(body, *, memo=None)``: ``gemini_parse.parse_gemini`` (validation, the neutral
  conversation, the ``ParseMemo`` reuse of a resent history, ``counted_request`` for a
  ``:countTokens`` body; re-exported here with ``validate_body`` and ``UNFITTABLE_CACHED``) with the
  body's model (``models/`` stripped) or "": the service sets the path's. ``requested_output_tokens``
  is ``generationConfig.maxOutputTokens``; a body with ``cachedContent`` is not fittable.
* ``gemini_error(error)``: our errors in Google's shape ``{"error": {"code", "message",
  "status"}}`` (``status`` the canonical code: ``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``,
  ``UNAVAILABLE``, ...); a cannot-fit error speaks Gemini's own overflow wording with our numbers:
  ``The input token count (N) exceeds the maximum number of tokens allowed (M).`` (``M`` the
  window when the prompt alone is over it, else the input budget: what the proxy can send).
* ``stream_error(error)``: one SSE frame ``data: {"error": ...}`` ended by CRLF CRLF, as Google
  frames its events; ``array_stream_error(error, *, started=True)`` (``json_stream_error``): the
  same error as the element that closes a JSON-array stream (``streamGenerateContent`` without
  ``alt=sse``), or a whole one-element array when none of it went out yet: our errors before such
  a stream, as Google answers them there (``[{"error": ...}]``: googleapis/python-aiplatform
  #5010 and google-cloud-python #15021, api-core's REST transport failing on the list;
  python-genai's ``APIError`` unwraps a one-element list).
* ``overflow(status, body)``: Gemini's wording on a JSON object, a JSON array (the array stream's
  error form) or SSE ``data:`` frames (the shared classifier knows the wording).
* ``input_tokens_used(answer)``: ``usageMetadata.promptTokenCount`` of a JSON answer or of one
  stream chunk (Google puts the usage on every chunk).
* ``count_answer(n)``: ``{"totalTokens": n}``.
* ``tool_tokens``: ``tools[].functionDeclarations`` (``parameters`` or ``parametersJsonSchema``) by
  the chat tool rule, other tools (``googleSearch``, ``codeExecution``, ...) and a
  ``responseSchema``/``responseJsonSchema`` by their string values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from ..conversation import Conversation, priced_view
from ..dialect import ErrorInfo, Headers, SummaryCall
from ..endpoints import KeySlot, Route, UpstreamTarget
from ..errors import InvalidRequest
from ..messages import Message
from ..overflow import ContextOverflow, classify_overflow
from ..parse_memo import ParseMemo
from ..registry import ModelSpec
from ..tokens import MessageCounter
from .chat import positive_count
from .gemini_parse import (
    MODEL_PREFIX,
    UNFITTABLE_CACHED,
    body_model,
    counted_request,
    parse_gemini,
    validate_body,
)
from .gemini_wire import field, render_contents, wire_problems

GEMINI_NAME = "gemini"
MODELS_SEGMENT = "/models/"
SUMMARY_VERSION = "/v1beta"  # the API version of summary calls (the one gemini-cli and the SDKs speak)
# Google's canonical error codes by HTTP status (google.rpc.Code's HTTP mapping).
STATUS_NAMES: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "NOT_IMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
VERSIONS: tuple[str, ...] = ("/v1beta", "/v1")


def status_name(status: int) -> str:
    """The canonical code Google names an HTTP status by (4xx/5xx outside the table by class)."""
    if status in STATUS_NAMES:
        return STATUS_NAMES[status]
    return "INTERNAL" if status >= 500 else "INVALID_ARGUMENT" if status == 413 else "FAILED_PRECONDITION"


def _message(error: ErrorInfo) -> str:
    tokens, limit, window = error.tokens, error.limit_tokens, error.window_tokens
    if error.code != "context_length_exceeded" or tokens is None or limit is None:
        return error.message
    allowed = window if window is not None and tokens > window else limit
    return f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({allowed})."


def gemini_error(error: ErrorInfo) -> dict[str, Any]:
    """One of our errors in Google's error shape (see the module docstring)."""
    return {"error": {"code": error.status, "message": _message(error), "status": status_name(error.status)}}


def _json_bytes(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def array_stream_error(error: ErrorInfo, *, started: bool = True) -> bytes:
    """The error as the element that closes an open JSON-array stream (``started``: after its
    first bytes), else as a whole one-element array (what Google sends for an error there)."""
    element = _json_bytes(gemini_error(error))
    return b",\r\n" + element + b"]" if started else b"[" + element + b"]"


# -- upstream answers --------------------------------------------------------------------------


def _sse_payloads(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def _usage_prompt(answer: Mapping[str, Any]) -> int | None:
    usage = field(answer, "usageMetadata")
    value = field(usage, "promptTokenCount") if isinstance(usage, Mapping) else None
    return value if type(value) is int and value >= 0 else None


def _routes() -> tuple[Route, ...]:
    routes: list[Route] = []
    for version in VERSIONS:
        routes += [
            Route(f"{version}/models/{{model}}:generateContent", stream=False),
            Route(f"{version}/models/{{model}}:streamGenerateContent", stream=True, event_query="alt=sse"),
            Route(f"{version}/models/{{model}}:countTokens", kind="count", upstream_first=True),
        ]
    return tuple(routes)


@dataclass(frozen=True, slots=True)
class GeminiDialect:
    """Gemini's native API (see the module docstring)."""

    name: str = GEMINI_NAME
    routes: tuple[Route, ...] = _routes()
    key_slots: tuple[KeySlot, ...] = (KeySlot("x-goog-api-key"), KeySlot("key", in_query=True))
    items_key: str = "contents"
    output_in_window: bool = False
    preamble_events: frozenset[str] = frozenset()
    usage_needles: tuple[bytes, ...] = (b'"usageMetadata"',)

    def recognition(self, body: Mapping[str, Any], headers: Mapping[str, str], /) -> int:
        """2 for a ``contents`` array holding a Content (an object with ``parts``: no other API's
        item has them) or a ``generateContentRequest``; 1 for an empty ``contents``; else 0 (the
        gateway engine asks with any API's items under ``contents``)."""
        if isinstance(body.get("generateContentRequest"), Mapping):
            return 2
        contents = body.get("contents")
        if not isinstance(contents, list):
            return 0
        if any(isinstance(c, Mapping) and isinstance(c.get("parts"), list) for c in contents):
            return 2
        return 0 if contents else 1

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str:
        model = params.get("model") or body_model(body)
        if not model:
            raise InvalidRequest("The path names no model (models/{model}:generateContent).", param="model")
        return model.removeprefix(MODEL_PREFIX)

    def refine_spec(self, spec: ModelSpec, headers: Headers, /) -> ModelSpec:
        return spec

    def upstream_count(self, answer: Mapping[str, Any], /) -> int | None:
        """``{"totalTokens": N, ...}``."""
        return positive_count(answer, "totalTokens")

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation:
        """The model is the body's (``models/`` stripped) or ""; the service sets the path's."""
        if not isinstance(body, Mapping):
            return parse_gemini(body, model="", stream=False, memo=memo)
        request = counted_request(body)  # once: the model and the parse both read it
        model = body_model(body, counted=request)
        return parse_gemini(body, model=model or "", stream=False, memo=memo, counted=request)

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int:
        body = counted_request(body)
        tools = field(body, "tools")
        config = field(body, "generationConfig")
        schema = None
        if isinstance(config, Mapping):
            schema = field(config, "responseJsonSchema") or field(config, "responseSchema")
        if not tools and schema is None:
            return 0  # nothing but the conversation
        shaped: list[Any] = []
        for tool in tools if isinstance(tools, list) else []:
            if not isinstance(tool, Mapping):
                continue
            declarations = field(tool, "functionDeclarations")
            for declaration in declarations if isinstance(declarations, list) else []:
                if not isinstance(declaration, Mapping):
                    continue
                parameters = field(declaration, "parametersJsonSchema") or declaration.get("parameters")
                spec: dict[str, Any] = {"name": declaration.get("name")}
                if isinstance(declaration.get("description"), str):
                    spec["description"] = declaration["description"]
                if isinstance(parameters, Mapping):
                    spec["parameters"] = parameters
                shaped.append({"type": "function", "function": spec})
            rest = {
                k: v for k, v in tool.items() if k not in ("functionDeclarations", "function_declarations")
            }
            if rest:
                shaped.append({"type": "custom", "custom": rest})
        if isinstance(schema, Mapping):
            shaped.append({"type": "json_schema", "json_schema": {"schema": schema}})
        return counter.count_tools({"tools": shaped}) if shaped else 0


    def accounting_view(
        self, body: Mapping[str, Any], messages: Sequence[Message], tool_tokens: int, /
    ) -> Mapping[str, Any]:
        return priced_view(messages, tool_tokens)

    def render(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        /,
        *,
        source: Sequence[Message] | None = None,
    ) -> dict[str, Any]:
        return render_contents(body, messages, source=source)

    def problems(self, body: Mapping[str, Any], /) -> list[str]:
        return wire_problems(body)

    def error_body(self, error: ErrorInfo, /) -> dict[str, Any]:
        return gemini_error(error)

    def overflow(
        self, status: int, body: bytes | str | Mapping[str, object] | None, /
    ) -> ContextOverflow | None:
        if isinstance(body, bytes | str):
            text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
            if text.lstrip().startswith("data:"):
                for payload in _sse_payloads(text):
                    found = classify_overflow(status if status >= 400 else 400, payload)
                    if found is not None:
                        return found
                return None
        return classify_overflow(status, body)

    def input_tokens_used(self, answer: Mapping[str, Any], /) -> int | None:
        return _usage_prompt(answer) if isinstance(answer, Mapping) else None

    def count_answer(self, input_tokens: int, /) -> dict[str, Any]:
        return {"totalTokens": input_tokens}

    def json_stream_error(self, error: ErrorInfo, /, *, started: bool) -> bytes | None:
        return array_stream_error(error, started=started)

    def stream_error(self, error: ErrorInfo, /) -> bytes:
        return b"data: " + _json_bytes(gemini_error(error)) + b"\r\n\r\n"

    def count_request(
        self, body: Mapping[str, Any], path: str, /
    ) -> tuple[UpstreamTarget, dict[str, Any]] | None:
        """``POST {version}/models/{model}:countTokens`` at the upstream's origin: the client's own
        versioned path with its method replaced, asking to count the whole request
        (``generateContentRequest``: contents, system instruction, tools and their settings, with
        the model named as Google wants it); None for a path that names no model's method."""
        head, colon, _method = path.rpartition(":")
        model = unquote(head.rpartition(MODELS_SEGMENT)[2]) if MODELS_SEGMENT in head else ""
        if not colon or not model or "/" in model:
            return None
        request = {key: value for key, value in body.items() if key != "model"}
        request["model"] = MODEL_PREFIX + model.removeprefix(MODEL_PREFIX)
        return UpstreamTarget(f"{head}:countTokens", at_origin=True), {"generateContentRequest": request}

    def with_output_cap(self, body: Mapping[str, Any], tokens: int, /) -> dict[str, Any] | None:
        """``body`` as it is: Gemini does not count ``maxOutputTokens`` against its input window
        (``output_in_window``), so a lower cap never makes a request fit."""
        return dict(body)

    def summary_request(
        self, prompt: Sequence[Mapping[str, Any]], /, *, model: str, max_tokens: int
    ) -> SummaryCall:
        """``POST /v1beta/models/{model}:generateContent`` at the upstream's origin (the version
        every Gemini client speaks): the system message as ``systemInstruction``, the rest as
        ``user``/``model`` text contents; the client's key repeated where it put it (the
        ``x-goog-api-key`` header or the ``key`` query parameter)."""
        system = [str(m.get("content", "")) for m in prompt if m.get("role") == "system"]
        contents = [
            {
                "role": "model" if m.get("role") == "assistant" else "user",
                "parts": [{"text": str(m.get("content", ""))}],
            }
            for m in prompt
            if m.get("role") != "system"
        ]
        body: dict[str, Any] = {"contents": contents, "generationConfig": {"maxOutputTokens": max_tokens}}
        if system:
            body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
        name = model.removeprefix(MODEL_PREFIX)
        return SummaryCall(
            f"{SUMMARY_VERSION}{MODELS_SEGMENT}{name}:generateContent",
            body,
            carry=tuple(slot.name for slot in self.key_slots if not slot.in_query),
            at_origin=True,
            carry_query=tuple(slot.name for slot in self.key_slots if slot.in_query),
        )

    def summary_text(self, answer: Mapping[str, Any], /) -> str | None:
        """The text parts of the first candidate's content, thoughts left out."""
        candidates = answer.get("candidates")
        first = candidates[0] if isinstance(candidates, list) and candidates else None
        content = first.get("content") if isinstance(first, Mapping) else None
        parts = content.get("parts") if isinstance(content, Mapping) else None
        texts = [
            part["text"]
            for part in (parts if isinstance(parts, list) else [])
            if isinstance(part, Mapping)
            and isinstance(part.get("text"), str)
            and part.get("thought") is not True
        ]
        return "".join(texts) if texts else None


GEMINI = GeminiDialect()

__all__ = [
    "GEMINI",
    "GEMINI_NAME",
    "STATUS_NAMES",
    "UNFITTABLE_CACHED",
    "GeminiDialect",
    "array_stream_error",
    "counted_request",
    "gemini_error",
    "parse_gemini",
    "status_name",
    "validate_body",
]
