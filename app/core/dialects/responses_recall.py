"""The recall tool in the Responses API's shape (``RESPONSES.recall``; contract: ``app.core.recall_shape``).

* offered unless ``tool_choice`` is set to anything but ``auto``, the answer runs in the
  background (``background: true``), a tool of the client is a function named ``ctx_recall``, or
  the answer is streamed and stored (``store`` not false): a stream's events all carry the first
  round's response id (the SDKs refuse an id that changes), which the upstream stored with the
  recall call unanswered, so ``previous_response_id`` could not continue from it. A whole answer
  carries the last round's id, whose stored history is whole;
* the tool: ``{"type": "function", "name", "description", "parameters", "strict": false}`` after
  the client's ``tools``;
* an answer's calls: its ``function_call`` output items (the client's calls: every other call item
  the client must answer: ``function_call``, ``custom_tool_call``, ``computer_call``, shell and
  patch calls, MCP approval requests); only a ``completed`` answer is continued;
* the continuation: the body's ``input`` (a string input becomes one user message) followed by
  the answer's output items exactly as they came (reasoning with its ``encrypted_content``, the
  messages, the calls) and one ``function_call_output`` per recall call; a reasoning item that
  cannot be sent back (no ``encrypted_content`` while ``store`` is false) is left out;
* the client's answer: the last round's response with the output items of every round in order,
  without the recall calls and without a reasoning item whose following item was one (OpenAI
  refuses a reasoning item sent back without the item that followed it);
* the stream: ``response.created``/``in_progress``/``queued`` of a continuation are not sent
  again; a recall call's events are held back, and so are a reasoning item's until the item
  after it starts (it goes with the call when that is a recall call); ``output_index`` is
  renumbered after a removed item and across rounds, ``sequence_number`` continues across
  rounds; the closing event (``response.completed``/``incomplete``/``failed``) is held while a
  recall call was seen and, after a continuation, carries every round's output items and the
  first round's response id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..recall import RECALL_TOOL, parse_arguments
from ..recall_shape import AnswerCalls, RecallCall, RecallStream, function_tool
from ..recall_stream import SseEditor, frame_json, reframe

# Output items the client must answer (with an output item of its own).
CLIENT_CALLS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_approval_request",
    }
)
_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})
_CLOSING = frozenset({"response.completed", "response.incomplete", "response.failed"})


def _ours(item: object) -> bool:
    return (
        isinstance(item, Mapping) and item.get("type") == "function_call" and item.get("name") == RECALL_TOOL
    )


def client_items(items: Sequence[Any]) -> list[Any]:
    """``items`` without the recall calls and the reasoning items each of them followed."""
    kept: list[Any] = []
    for k, item in enumerate(items):
        if _ours(item):
            continue
        following = items[k + 1] if k + 1 < len(items) else None
        if isinstance(item, Mapping) and item.get("type") == "reasoning" and _ours(following):
            continue
        kept.append(item)
    return kept


@dataclass(frozen=True, slots=True)
class ResponsesRecall:
    """``ctx_recall`` as a Responses function tool (see the module docstring)."""

    def offered(self, body: Mapping[str, Any], /) -> bool:
        tools = body.get("tools")
        return (
            body.get("tool_choice", "auto") in ("auto", None)
            and body.get("background") is not True
            and (body.get("stream") is not True or body.get("store") is False)
            and (tools is None or isinstance(tools, list))
            and not any(
                _ours(tool) or (isinstance(tool, Mapping) and tool.get("name") == RECALL_TOOL)
                for tool in tools or []
            )
        )

    def with_tool(self, body: Mapping[str, Any], /) -> dict[str, Any]:
        tools = body.get("tools")
        tools = list(tools) if isinstance(tools, list) else []
        if tools and isinstance(tools[-1], Mapping) and tools[-1].get("name") == RECALL_TOOL:
            return dict(body)
        tool = {"type": "function", **function_tool(), "strict": False}
        return {**body, "tools": [*tools, tool]}

    def calls(self, answer: Mapping[str, Any], /) -> AnswerCalls:
        output = answer.get("output")
        if not isinstance(output, list) or answer.get("status", "completed") != "completed":
            return AnswerCalls()
        ours = []
        theirs = 0
        for item in output:
            if _ours(item):
                ref, page = parse_arguments(item.get("arguments"))
                ours.append(RecallCall(str(item.get("call_id")), ref, page))
            elif isinstance(item, Mapping) and item.get("type") in CLIENT_CALLS:
                theirs += 1
        return AnswerCalls(tuple(ours), theirs)

    def continuation(
        self, body: Mapping[str, Any], answer: Mapping[str, Any], results: Sequence[tuple[str, str]], /
    ) -> dict[str, Any]:
        items = body.get("input")
        history = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
        output = answer.get("output")
        sealed_only = body.get("store") is False
        said = [
            item
            for item in (output if isinstance(output, list) else [])
            if not (
                sealed_only
                and isinstance(item, Mapping)
                and item.get("type") == "reasoning"
                and not item.get("encrypted_content")
            )
        ]
        answered = [
            {"type": "function_call_output", "call_id": call_id, "output": text} for call_id, text in results
        ]
        return {**body, "input": [*history, *said, *answered]}

    def client_answer(self, answers: Sequence[Mapping[str, Any]], /) -> dict[str, Any]:
        items: list[Any] = []
        for answer in answers:
            output = answer.get("output")
            items += client_items(output) if isinstance(output, list) else []
        return {**answers[-1], "output": items}

    def stream(self) -> RecallStream:
        return ResponsesRecallStream()


class ResponsesRecallStream(SseEditor):
    """A streamed response's editor (see the module docstring)."""

    def __init__(self) -> None:
        self.first_id: Any = None  # the first round's response id, which every event carries
        self.offset = 0  # output items the client got from earlier rounds
        self.sequence = 0  # the next sequence number after a continuation
        self.items: list[Any] = []  # those items, for the closing event after a continuation
        super().__init__()

    def _next_round(self) -> None:
        super()._next_round()
        self.removed: set[int] = set()  # output indices of this round the client does not get
        self.reasoning: tuple[int, list[bytes]] | None = None  # a reasoning item held back

    def edit(self, frame: bytes, /) -> bytes:
        plain = self.untouched(frame) and self.reasoning is None
        if plain and (b"output_item.added" not in frame or b"reasoning" not in frame):
            return frame
        event = frame_json(frame)
        if event is None:
            return frame
        kind = event.get("type")
        if kind in _OPENING and self.round > 0:
            return b""
        if kind in _CLOSING:
            return self._closing(frame, event)
        index = event.get("output_index")
        if not isinstance(index, int):
            return self._renumbered(frame, event)
        out = b""
        if kind == "response.output_item.added":
            item = event.get("item")
            ours = _ours(item)
            if self.reasoning is not None:
                held_index, frames = self.reasoning
                self.reasoning = None
                if ours:
                    self.removed.add(held_index)
                else:
                    out = b"".join(frames)
            if ours:
                self.seen = True
                self.removed.add(index)
            elif isinstance(item, Mapping) and item.get("type") == "reasoning":
                self.reasoning = (index, [self._renumbered(frame, event)])
                return out
        if index in self.removed:
            return out
        if self.reasoning is not None and self.reasoning[0] == index:
            self.reasoning[1].append(self._renumbered(frame, event))
            return out
        return out + self._renumbered(frame, event)

    def _renumbered(self, frame: bytes, event: dict[str, Any]) -> bytes:
        """``event`` with the client's output index and, after a continuation, sequence number."""
        changed = False
        index = event.get("output_index")
        if isinstance(index, int):
            shown = self.offset + index - sum(1 for r in self.removed if r < index)
            if shown != index:
                event["output_index"] = shown
                changed = True
        number = event.get("sequence_number")
        if self.round > 0 and isinstance(number, int):
            event["sequence_number"] = self.sequence + number
            changed = True
        return reframe(frame, event) if changed else frame

    def _closing(self, frame: bytes, event: dict[str, Any]) -> bytes:
        flushed = b""
        if self.reasoning is not None:  # a reasoning item the answer ended with
            flushed = b"".join(self.reasoning[1])
            self.reasoning = None
        if self.seen:
            self.held.append(frame)
            return flushed
        if self.round == 0:
            return flushed + self._renumbered(frame, event)
        return flushed + self._final(frame, event)

    def _final(self, frame: bytes, event: dict[str, Any]) -> bytes:
        """The closing event with every round's output items and the first round's id."""
        response = event.get("response")
        if isinstance(response, dict):
            output = response.get("output")
            response["output"] = [*self.items, *client_items(output if isinstance(output, list) else [])]
            if self.first_id is not None:
                response["id"] = self.first_id
        number = event.get("sequence_number")
        if self.round > 0 and isinstance(number, int):
            event["sequence_number"] = self.sequence + number
        return reframe(frame, event)

    def answer(self) -> dict[str, Any]:
        for frame in reversed(self.frames):
            event = frame_json(frame)
            if (
                event is not None
                and event.get("type") in _CLOSING
                and isinstance(event.get("response"), dict)
            ):
                response: dict[str, Any] = event["response"]
                return response
        return {"status": "incomplete", "output": []}

    def next_round(self) -> None:
        answer = self.answer()
        if self.round == 0:
            self.first_id = answer.get("id")
        output = answer.get("output")
        kept = client_items(output if isinstance(output, list) else [])
        self.items += kept
        self.offset += len(kept)
        # The next round's numbers follow the last one the client got of this round.
        last = 0
        for frame in reversed(self.frames):
            event = frame_json(frame)
            number = event.get("sequence_number") if event is not None else None
            if event is not None and event.get("type") not in _CLOSING and isinstance(number, int):
                last = number
                break
        self.sequence = (self.sequence if self.round > 0 else 0) + last + 1
        super().next_round()

    def release(self) -> bytes:
        out = []
        for frame in self.held:
            event = frame_json(frame)
            out.append(self._final(frame, event) if event is not None else frame)
        self.held = []
        return b"".join(out)


RESPONSES_RECALL = ResponsesRecall()
