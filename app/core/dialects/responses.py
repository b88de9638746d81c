"""The OpenAI Responses API (``POST /v1/responses``) as a dialect of the neutral conversation.

INTERFACE CONTRACT: ``RESPONSES`` implements :class:`app.core.dialect.Dialect` (see there for
each member). Routes: ``POST /v1/responses`` (to ``responses`` under the base URL) and its
counting endpoint ``POST /v1/responses/input_tokens`` (ours when the count is exact, else the
upstream's); the key is ``Authorization: Bearer``; a streamed answer is peeked at until an event
after ``response.created``/``in_progress``/``queued`` (the overflow may come as
``response.failed``); a body with ``input`` and no ``messages`` is recognised as one. Origins
(``ORIGIN_KEY`` paths) are ``[i]`` = item ``i`` of ``input`` (``[0]`` is a string ``input``
itself) and ``[-1]`` = the top-level ``instructions``.

Neutral mapping (``parse``), in wire order:

* ``instructions`` -> a pinned ``system`` message; a string ``input`` -> one ``user`` message;
* a ``message`` item (also an item with a ``role`` and no ``type``) -> a message of its role;
  ``input_text``/``output_text`` parts -> ``text`` parts, ``input_image`` -> an ``image_url`` part
  (OpenAI's tile rule), ``input_file`` -> a ``file`` part (the flat rule), other parts kept (their
  string values count as text);
* a run of consecutive **call items** (``function_call``, ``custom_tool_call``, and the built-in
  calls that take an output item: ``computer_call``, ``local_shell_call``, ``shell_call``,
  ``apply_patch_call``, ``mcp_approval_request``, ``program``) -> ONE assistant message with
  ``tool_calls`` (ids = ``call_id``), and the output items right after it that answer those calls
  -> ``tool`` messages: one unit, kept or dropped together. Outputs of function and custom calls
  may be pruned (only their ``output`` is replaced); built-in outputs are opaque;
* a ``reasoning`` item is glued to the item after it: both (and the rest of that item's neutral
  message, e.g. the whole call run) become one **opaque** neutral message whose origin lists every
  item. Priced: its summary and reasoning texts as text, its ``encrypted_content`` at
  ``ENCRYPTED_CHARS_PER_TOKEN`` characters a token (base64 ciphertext is longer than the tokens
  it holds, so this over-counts rather than under-counts);
* a ``compaction`` item -> an opaque, pinned ``developer`` message (it holds the conversation
  before it; dropping it would lose everything it summarises); priced like encrypted reasoning;
* every other item (built-in calls without an output item, ``item_reference``, Codex's
  ``compaction_trigger``, unknown types) -> an opaque ``assistant`` message of its own (pinned
  ``system``/``developer`` when the item has that role, e.g. ``additional_tools``), its string
  values counted as text;
* a call run whose outputs do not all follow it directly (another item sits between a call and its
  output): the whole span up to its last output is one opaque message, so nothing can split it.

``render`` writes the fitted messages back: an unchanged message as its original items (same
objects, same order); a changed one (a pruned output, a cut text) as its original item with only
``output``/``content``/``instructions`` replaced; a message the engine made (note, summary) as a
``message`` item. Notes sit at unit boundaries, so never between a call and its output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..conversation import Conversation, priced_view
from ..dialect import ErrorInfo, Headers, SummaryCall, model_from_body
from ..endpoints import AUTHORIZATION, KeySlot, Route, UpstreamTarget
from ..errors import InvalidRequest
from ..messages import Message
from ..overflow import ContextOverflow, classify_overflow
from ..parse_memo import ParseMemo
from ..registry import ModelSpec
from ..tokens import MessageCounter
from .chat import OPENAI_SUMMARY_HEADERS, positive_count
from .responses_items import (
    ENCRYPTED_CHARS_PER_TOKEN,
    INSTRUCTIONS_PATH,
    input_problems,
    parse_input,
    reject_orphan_outputs,
    render_input,
    unfittable_reason,
)

# The body fields ``POST /v1/responses/input_tokens`` takes (OpenAI's reference: conversation,
# input, instructions, model, parallel_tool_calls, previous_response_id, reasoning, text,
# tool_choice, tools, truncation).
COUNT_FIELDS: frozenset[str] = frozenset(
    {
        "conversation",
        "input",
        "instructions",
        "model",
        "parallel_tool_calls",
        "previous_response_id",
        "reasoning",
        "text",
        "tool_choice",
        "tools",
        "truncation",
    }
)

# -- the dialect ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResponsesDialect:
    """``POST /v1/responses`` (see the module docstring)."""

    name: str = "responses"
    routes: tuple[Route, ...] = (
        Route("/v1/responses", upstream="responses"),
        Route("/v1/responses/input_tokens", kind="count", upstream="responses/input_tokens"),
    )
    key_slots: tuple[KeySlot, ...] = (AUTHORIZATION,)
    items_key: str = "input"
    output_in_window: bool = True
    preamble_events: frozenset[str] = frozenset(
        {"response.created", "response.in_progress", "response.queued"}
    )
    usage_needles: tuple[bytes, ...] = (b'"usage"',)

    def recognition(self, body: Mapping[str, Any], headers: Mapping[str, str], /) -> int:
        """2 for a body with ``input`` and no ``messages`` (no other API has it) whose items are not
        all plain role messages (those, a bare item list of any API could be: 1)."""
        if "input" not in body or "messages" in body:
            return 0
        items = body.get("input")
        if isinstance(items, list) and not any(
            isinstance(item, Mapping) and ("type" in item or "role" not in item) for item in items
        ):
            return 1  # plain role messages: a shape other APIs' message lists share
        return 2

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str:
        return model_from_body(body)

    def refine_spec(self, spec: ModelSpec, headers: Headers, /) -> ModelSpec:
        return spec

    def upstream_count(self, answer: Mapping[str, Any], /) -> int | None:
        """``{"object": "response.input_tokens", "input_tokens": N}``."""
        return positive_count(answer, "input_tokens")

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation:
        parsed = parse_input(body, memo=memo)
        reason = unfittable_reason(body)
        if not reason:
            reject_orphan_outputs(parsed)
        cap = body.get("max_output_tokens")
        if cap is not None and (type(cap) is not int or cap < 0):
            raise InvalidRequest(
                "'max_output_tokens' must be a non-negative integer.", param="max_output_tokens"
            )
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise InvalidRequest("'tools' must be an array of tools.", param="tools")
        return Conversation(
            model=str(body.get("model", "")),
            messages=parsed.messages,
            requested_output_tokens=cap,
            stream=body.get("stream") is True,
            fittable=not reason,
            unfittable_reason=reason,
        )

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int:
        """Function tools by the chat tool rule (their flat shape nested as chat's); built-in and
        custom tools and a ``text.format`` JSON schema by their string values."""
        tools = body.get("tools")
        chat_tools: list[Any] = []
        if isinstance(tools, list):
            for tool in tools:
                if isinstance(tool, Mapping) and tool.get("type") == "function" and "function" not in tool:
                    spec = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
                    chat_tools.append({"type": "function", "function": spec})
                else:
                    chat_tools.append(tool)
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, Mapping) else None
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            chat_tools.append({"type": "json_schema", "json_schema": dict(fmt)})
        return counter.count_tools({"tools": chat_tools}) if chat_tools else 0


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
        return render_input(body, messages, source=source)

    def problems(self, body: Mapping[str, Any], /) -> list[str]:
        return input_problems(body)

    def error_body(self, error: ErrorInfo, /) -> dict[str, Any]:
        return {
            "error": {
                "message": error.message,
                "type": _error_type(error),
                "param": error.param,
                "code": _code(error),
            }
        }

    def overflow(
        self, status: int, body: bytes | str | Mapping[str, object] | None, /
    ) -> ContextOverflow | None:
        """OpenAI's wordings (the shared classifier) on a JSON body, an ``error`` event or a
        ``response.failed`` event (as JSON, or as SSE frames ``event: ...`` / ``data: ...``)."""
        for event in _events(body):
            kind = event.get("type")
            if kind == "error":
                node: object = event.get("error") if isinstance(event.get("error"), Mapping) else event
                return classify_overflow(status, {"error": node}) if isinstance(node, Mapping) else None
            if kind == "response.failed":
                response = event.get("response")
                error = response.get("error") if isinstance(response, Mapping) else None
                return classify_overflow(status, {"error": error}) if isinstance(error, Mapping) else None
        return classify_overflow(status, body)

    def input_tokens_used(self, answer: Mapping[str, Any], /) -> int | None:
        response = answer.get("response") if isinstance(answer.get("response"), Mapping) else answer
        usage = response.get("usage") if isinstance(response, Mapping) else None
        value = usage.get("input_tokens") if isinstance(usage, Mapping) else None
        return value if type(value) is int and value >= 0 else None

    def count_answer(self, input_tokens: int, /) -> dict[str, Any]:
        return {"object": "response.input_tokens", "input_tokens": input_tokens}

    def json_stream_error(self, error: ErrorInfo, /, *, started: bool) -> bytes | None:
        return None  # every answer of this API streams as server-sent events

    def stream_error(self, error: ErrorInfo, /) -> bytes:
        event = {
            "type": "error",
            "code": _code(error),
            "message": error.message,
            "param": self.error_body(error)["error"]["param"],
            "sequence_number": 0,
        }
        data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        return f"event: error\ndata: {data}\n\n".encode()

    def count_request(
        self, body: Mapping[str, Any], path: str, /
    ) -> tuple[UpstreamTarget, dict[str, Any]] | None:
        """``POST responses/input_tokens`` with the fields it takes (``COUNT_FIELDS``): the same
        input, tools and settings that shape the prompt; the output settings stay out."""
        fields = {k: v for k, v in body.items() if k in COUNT_FIELDS}
        return UpstreamTarget("responses/input_tokens"), fields

    def with_output_cap(self, body: Mapping[str, Any], tokens: int, /) -> dict[str, Any] | None:
        """``max_output_tokens`` lowered to ``tokens`` (reasoning tokens count against it too)."""
        cap = body.get("max_output_tokens")
        if type(cap) is int and cap > tokens:
            return {**body, "max_output_tokens": tokens}
        return dict(body)

    def summary_request(
        self, prompt: Sequence[Mapping[str, Any]], /, *, model: str, max_tokens: int
    ) -> SummaryCall:
        """The system message as ``instructions``, the rest as ``input`` messages; not stored
        (``store: false``), not streamed."""
        system = [str(m.get("content", "")) for m in prompt if m.get("role") in ("system", "developer")]
        rest = [
            {"role": str(m.get("role")), "content": m.get("content")}
            for m in prompt
            if m.get("role") not in ("system", "developer")
        ]
        body: dict[str, Any] = {
            "model": model,
            "input": rest,
            "max_output_tokens": max_tokens,
            "store": False,
            "stream": False,
        }
        if system:
            body["instructions"] = "\n\n".join(system)
        return SummaryCall(self.routes[0].upstream, body, carry=OPENAI_SUMMARY_HEADERS)

    def summary_text(self, answer: Mapping[str, Any], /) -> str | None:
        """The ``output_text`` parts of the answer's ``message`` items, joined."""
        output = answer.get("output")
        texts: list[str] = []
        for item in output if isinstance(output, list) else []:
            content = (
                item.get("content") if isinstance(item, Mapping) and item.get("type") == "message" else None
            )
            for part in content if isinstance(content, list) else []:
                if isinstance(part, Mapping) and part.get("type") == "output_text":
                    text = part.get("text")
                    if isinstance(text, str):
                        texts.append(text)
        return "".join(texts) if texts else None


def _error_type(error: ErrorInfo) -> str:
    if error.code == "upstream_busy" or (error.status >= 500 and not error.code.startswith("upstream_")):
        return "server_error"
    if error.code.startswith("upstream_"):
        return "upstream_error"
    return "invalid_request_error"


def _code(error: ErrorInfo) -> str | None:
    return None if error.code == "invalid_request_error" else error.code


def _events(body: bytes | str | Mapping[str, object] | None) -> list[Mapping[str, Any]]:
    """The JSON events in ``body``: the mapping itself, or the ``data:`` lines of SSE text."""
    if isinstance(body, Mapping):
        return [body] if isinstance(body.get("type"), str) else []
    if isinstance(body, bytes | bytearray | memoryview):
        text = bytes(body[:1_000_000]).decode("utf-8", errors="replace")
    elif isinstance(body, str):
        text = body[:1_000_000]
    else:
        return []
    events: list[Mapping[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue
        try:
            value = json.loads(line[5:].strip())
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("type"), str):
            events.append(value)
    return events


RESPONSES = ResponsesDialect()

__all__ = ["ENCRYPTED_CHARS_PER_TOKEN", "INSTRUCTIONS_PATH", "RESPONSES", "ResponsesDialect"]
