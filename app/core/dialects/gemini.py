"""Gemini's native API (``models/{model}:generateContent``, ``:streamGenerateContent``,
``:countTokens``) as a dialect of the neutral conversation.

INTERFACE CONTRACT (pure, standard library only; the wire facts are in ``docs/gemini.md``):

* ``parse_gemini(body, *, model, stream, memo=None) -> Conversation``: the model and the
  streaming flag come from the request's path (``/v1beta/models/{model}:streamGenerateContent``),
  not from the body. Validates what planning relies on (``InvalidRequest`` naming the field) and
  maps ``contents`` onto neutral messages by ``gemini_wire``'s rules (``systemInstruction`` is
  pinned; a model content's function calls and the next content's function responses are one
  unit; signed parts are opaque). ``requested_output_tokens`` is
  ``generationConfig.maxOutputTokens``. A body with ``cachedContent`` is not fittable (part of
  its prompt lives upstream): it is forwarded unchanged. ``memo`` is accepted for the protocol
  and not used yet.
* ``counted_request(body)``: the ``generateContentRequest`` of a ``:countTokens`` body when it
  has one, else the body itself (``{"contents": [...]}``): what to parse and count.
* ``GEMINI`` (``GeminiDialect``) implements ``app.core.dialect.Dialect`` as it stands today:
  ``parse(body, *, memo=None, model=None, stream=None)`` reads the model from the body's
  ``model`` (``models/`` stripped) when the path's is not given; ``upstream_path`` is the path
  template ``models/{model}:generateContent``; ``items_key`` is ``contents``.
  It is NOT in ``DIALECTS`` yet: the routes cannot take a model from the path until the seam can.
* ``output_in_window = False``: Gemini's ``inputTokenLimit`` limits the input alone and
  ``maxOutputTokens`` is not counted against it ("The input token count (N) exceeds the maximum
  number of tokens allowed (M)" compares the input with ``inputTokenLimit``). A budget for a
  Gemini request is ``window - margin - tools`` with no output reserve; ``requested_output_tokens``
  still says what the body asked for (and ``outputTokenLimit`` caps it upstream).
* ``gemini_error(error)``: our errors in Google's shape ``{"error": {"code", "message",
  "status"}}`` (``status`` the canonical code: ``INVALID_ARGUMENT``, ``RESOURCE_EXHAUSTED``,
  ``UNAVAILABLE``, ...); a cannot-fit error speaks Gemini's own overflow wording with our numbers:
  ``The input token count (N) exceeds the maximum number of tokens allowed (M).`` (``M`` the
  window when the prompt alone is over it, else the input budget: what the proxy can send).
* ``stream_error(error)``: one SSE frame ``data: {"error": ...}`` ended by CRLF CRLF, as Google
  frames its events; ``array_stream_error(error)``: the same error as the element that closes a
  JSON-array stream (``streamGenerateContent`` without ``alt=sse``).
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

from ..conversation import Conversation
from ..dialect import ErrorInfo
from ..errors import InvalidRequest
from ..messages import Message
from ..overflow import ContextOverflow, classify_overflow
from ..parse_memo import ParseMemo
from ..tokens import MessageCounter
from .gemini_wire import field, neutral_messages, render_contents, wire_problems

ROLES: frozenset[str] = frozenset({"user", "model"})
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
UNFITTABLE_CACHED = "cachedContent: part of the prompt is cached upstream"


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


def array_stream_error(error: ErrorInfo) -> bytes:
    """The error as the element that closes an open JSON-array stream (after at least one chunk)."""
    return b",\r\n" + _json_bytes(gemini_error(error)) + b"]"


# -- validation --------------------------------------------------------------------------------


def _invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param)


def _check_parts(parts: object, where: str) -> None:
    if parts is None:
        return
    if not isinstance(parts, list):
        raise _invalid("Input should be a list of parts", where)
    for k, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise _invalid("Input should be an object (a part)", f"{where}[{k}]")
        call = field(part, "functionCall")
        if call is not None:
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str) or not call["name"]:
                raise _invalid("a functionCall needs a non-empty string 'name'", f"{where}[{k}].functionCall")
            if call.get("args") is not None and not isinstance(call["args"], Mapping):
                raise _invalid("'args' should be an object", f"{where}[{k}].functionCall.args")
        response = field(part, "functionResponse")
        if response is not None and (
            not isinstance(response, Mapping) or not isinstance(response.get("name"), str)
        ):
            raise _invalid("a functionResponse needs a string 'name'", f"{where}[{k}].functionResponse")


def validate_body(body: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """What planning relies on (raise ``InvalidRequest`` naming the field): ``(contents, system)``."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("The request body must be a JSON object.", param=None)
    contents = field(body, "contents")
    if not isinstance(contents, list):
        raise _invalid("Field required (an array of Content objects)", "contents")
    for i, content in enumerate(contents):
        if not isinstance(content, Mapping):
            raise _invalid("Input should be a Content object", f"contents[{i}]")
        role = content.get("role")
        if not (role is None or role == "" or (isinstance(role, str) and role in ROLES)):
            raise _invalid("Please use a valid role: user, model.", f"contents[{i}].role")
        _check_parts(content.get("parts"), f"contents[{i}].parts")
    system = field(body, "systemInstruction")
    if system is not None:
        if not isinstance(system, Mapping):
            raise _invalid("Input should be a Content object", "systemInstruction")
        _check_parts(system.get("parts"), "systemInstruction.parts")
    config = field(body, "generationConfig")
    if config is not None:
        if not isinstance(config, Mapping):
            raise _invalid("Input should be an object", "generationConfig")
        cap = field(config, "maxOutputTokens")
        if cap is not None and (type(cap) is not int or cap < 1):
            raise _invalid("Input should be an integer of at least 1", "generationConfig.maxOutputTokens")
    tools = field(body, "tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, Mapping) for t in tools)):
        raise _invalid("Input should be a list of Tool objects", "tools")
    return contents, system


def counted_request(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """What a ``:countTokens`` body asks to count: its ``generateContentRequest`` when it has one."""
    inner = field(body, "generateContentRequest") if isinstance(body, Mapping) else None
    return inner if isinstance(inner, Mapping) else body


def parse_gemini(
    body: Mapping[str, Any], *, model: str, stream: bool, memo: ParseMemo | None = None
) -> Conversation:
    """The neutral conversation of a Gemini body; ``model`` and ``stream`` from the path."""
    contents, system = validate_body(body)
    config = field(body, "generationConfig")
    cap = field(config, "maxOutputTokens") if isinstance(config, Mapping) else None
    cached = field(body, "cachedContent")
    return Conversation(
        model=model,
        messages=tuple(neutral_messages(contents, system)),
        requested_output_tokens=cap,
        stream=stream,
        fittable=cached is None,
        unfittable_reason="" if cached is None else UNFITTABLE_CACHED,
    )


# -- upstream answers --------------------------------------------------------------------------


def _sse_payloads(text: str) -> list[str]:
    return [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]


def _usage_prompt(answer: Mapping[str, Any]) -> int | None:
    usage = field(answer, "usageMetadata")
    value = field(usage, "promptTokenCount") if isinstance(usage, Mapping) else None
    return value if type(value) is int and value >= 0 else None


@dataclass(frozen=True, slots=True)
class GeminiDialect:
    """Gemini's native API (see the module docstring)."""

    name: str = "gemini"
    upstream_path: str = "models/{model}:generateContent"
    items_key: str = "contents"
    output_in_window: bool = False

    def parse(
        self,
        body: Mapping[str, Any],
        /,
        *,
        memo: ParseMemo | None = None,
        model: str | None = None,
        stream: bool | None = None,
    ) -> Conversation:
        if model is None:
            named = body.get("model") if isinstance(body, Mapping) else None
            model = named.removeprefix("models/") if isinstance(named, str) else ""
        return parse_gemini(body, model=model, stream=bool(stream), memo=memo)

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int:
        tools = field(body, "tools")
        shaped: list[Any] = []
        for tool in tools if isinstance(tools, list) else []:
            if not isinstance(tool, Mapping):
                continue
            declarations = field(tool, "functionDeclarations")
            for declaration in declarations if isinstance(declarations, list) else []:
                if not isinstance(declaration, Mapping):
                    continue
                schema = field(declaration, "parametersJsonSchema") or declaration.get("parameters")
                spec: dict[str, Any] = {"name": declaration.get("name")}
                if isinstance(declaration.get("description"), str):
                    spec["description"] = declaration["description"]
                if isinstance(schema, Mapping):
                    spec["parameters"] = schema
                shaped.append({"type": "function", "function": spec})
            rest = {
                k: v for k, v in tool.items() if k not in ("functionDeclarations", "function_declarations")
            }
            if rest:
                shaped.append({"type": "custom", "custom": rest})
        config = field(body, "generationConfig")
        if isinstance(config, Mapping):
            schema = field(config, "responseJsonSchema") or field(config, "responseSchema")
            if isinstance(schema, Mapping):
                shaped.append({"type": "json_schema", "json_schema": {"schema": schema}})
        return counter.count_tools({"tools": shaped}) if shaped else 0

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

    def stream_error(self, error: ErrorInfo, /) -> bytes:
        return b"data: " + _json_bytes(gemini_error(error)) + b"\r\n\r\n"


GEMINI = GeminiDialect()

__all__ = [
    "GEMINI",
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
