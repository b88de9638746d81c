"""The recall tool in Anthropic Messages' shape (``MESSAGES.recall``; contract: ``app.core.recall_shape``).

* offered unless ``tool_choice`` is anything but ``{"type": "auto"}`` (``any``, ``tool``,
  ``none``), a tool of the client is named ``ctx_recall`` or the last message is the assistant's
  (a prefilled answer);
* the tool: ``{"name", "description", "input_schema"}`` after the client's ``tools``;
* an answer's calls: its ``tool_use`` blocks, continued only when it stopped for them
  (``stop_reason: "tool_use"``); the continuation appends the answer's content as the assistant
  message, exactly as it came (thinking blocks and their signatures, text, the calls), and a
  user message of one ``tool_result`` per recall call;
* the client's answer: the last round's message with the content blocks of every round in order,
  the recall calls removed, ``stop_reason: "end_turn"`` when no ``tool_use`` is left;
* the stream: a continuation's ``message_start`` is not sent again; a recall call's
  ``content_block_*`` events are held back, the other blocks' ``index`` renumbered (after a
  removed block, and continuing across rounds); ``message_delta`` and ``message_stop`` are held
  while a recall call was seen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..recall import RECALL_TOOL, TOOL_DESCRIPTION, TOOL_PARAMETERS, parse_arguments
from ..recall_shape import AnswerCalls, RecallCall, RecallStream
from ..recall_stream import SseEditor, frame_event, frame_json, reframe


def _ours(block: object) -> bool:
    return isinstance(block, Mapping) and block.get("type") == "tool_use" and block.get("name") == RECALL_TOOL


def _content(answer: Mapping[str, Any]) -> list[Any]:
    content = answer.get("content")
    return list(content) if isinstance(content, list) else []


@dataclass(frozen=True, slots=True)
class MessagesRecall:
    """``ctx_recall`` as an Anthropic tool (see the module docstring)."""

    def offered(self, body: Mapping[str, Any], /) -> bool:
        choice = body.get("tool_choice")
        tools = body.get("tools")
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        return (
            (choice is None or (isinstance(choice, Mapping) and choice.get("type") == "auto"))
            and (tools is None or isinstance(tools, list))
            and not any(isinstance(t, Mapping) and t.get("name") == RECALL_TOOL for t in tools or [])
            and not (isinstance(last, Mapping) and last.get("role") == "assistant")
        )

    def with_tool(self, body: Mapping[str, Any], /) -> dict[str, Any]:
        tools = body.get("tools")
        tools = list(tools) if isinstance(tools, list) else []
        if tools and isinstance(tools[-1], Mapping) and tools[-1].get("name") == RECALL_TOOL:
            return dict(body)
        tool = {"name": RECALL_TOOL, "description": TOOL_DESCRIPTION, "input_schema": TOOL_PARAMETERS}
        return {**body, "tools": [*tools, tool]}

    def calls(self, answer: Mapping[str, Any], /) -> AnswerCalls:
        if answer.get("stop_reason") != "tool_use":
            return AnswerCalls()
        ours = []
        theirs = 0
        for block in _content(answer):
            if _ours(block):
                ref, page = parse_arguments(block.get("input"))
                ours.append(RecallCall(str(block.get("id")), ref, page))
            elif isinstance(block, Mapping) and block.get("type") == "tool_use":
                theirs += 1
        return AnswerCalls(tuple(ours), theirs)

    def continuation(
        self, body: Mapping[str, Any], answer: Mapping[str, Any], results: Sequence[tuple[str, str]], /
    ) -> dict[str, Any]:
        said = {"role": "assistant", "content": _content(answer)}
        answered = {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": text} for call_id, text in results
            ],
        }
        return {**body, "messages": [*body.get("messages", []), said, answered]}

    def client_answer(self, answers: Sequence[Mapping[str, Any]], /) -> dict[str, Any]:
        blocks = [block for answer in answers for block in _content(answer) if not _ours(block)]
        last = {**answers[-1], "content": blocks}
        if last.get("stop_reason") == "tool_use" and not any(
            isinstance(b, Mapping) and b.get("type") == "tool_use" for b in blocks
        ):
            last["stop_reason"] = "end_turn"
        return last

    def stream(self) -> RecallStream:
        return MessagesRecallStream()


class MessagesRecallStream(SseEditor):
    """A streamed message's editor (see the module docstring)."""

    def __init__(self) -> None:
        self.offset = 0  # content blocks the client got from earlier rounds
        super().__init__()

    def edit(self, frame: bytes, /) -> bytes:
        if self.untouched(frame):
            return frame
        event = frame_json(frame)
        if event is None:
            return frame
        kind = event.get("type") or frame_event(frame)[0]
        if kind == "message_start":
            return frame if self.round == 0 else b""
        if kind in ("message_delta", "message_stop"):
            if self.seen:
                self.held.append(frame)
                return b""
            return frame
        index = event.get("index")
        if not isinstance(index, int):
            return frame
        if kind == "content_block_start" and _ours(event.get("content_block")):
            self.ours.add(index)
            self.seen = True
        if index in self.ours:
            return b""
        shown = self.offset + index - sum(1 for o in self.ours if o < index)
        if shown == index:
            return frame
        event["index"] = shown
        return reframe(frame, event)

    def answer(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "message", "role": "assistant", "content": []}
        blocks: dict[int, dict[str, Any]] = {}
        partial: dict[int, list[str]] = {}
        for frame in self.frames:
            event = frame_json(frame)
            kind = event.get("type") if event is not None else None
            if event is None:
                continue
            if kind == "message_start" and isinstance(event.get("message"), dict):
                message = {**event["message"], "content": []}
            elif kind == "content_block_start" and isinstance(event.get("index"), int):
                block = dict(event.get("content_block") or {})
                blocks[event["index"]] = block
            elif kind == "content_block_delta" and event.get("index") in blocks:
                _apply_delta(
                    blocks[event["index"]], event.get("delta") or {}, partial.setdefault(event["index"], [])
                )
            elif kind == "message_delta":
                delta = event.get("delta") or {}
                message.update({k: v for k, v in delta.items() if k in ("stop_reason", "stop_sequence")})
                usage = event.get("usage")
                if isinstance(usage, dict):
                    message["usage"] = {**(message.get("usage") or {}), **usage}
        for index, pieces in partial.items():
            if pieces and index in blocks:
                try:
                    blocks[index]["input"] = json.loads("".join(pieces))
                except ValueError:
                    blocks[index]["input"] = {}
        message["content"] = [blocks[k] for k in sorted(blocks)]
        return message

    def next_round(self) -> None:
        self.offset += len([b for b in self.answer()["content"] if not _ours(b)])
        super().next_round()

    def release(self) -> bytes:
        out = []
        theirs = any(b.get("type") == "tool_use" for b in self.answer()["content"] if not _ours(b))
        for frame in self.held:
            event = frame_json(frame)
            delta = event.get("delta") if event is not None else None
            if isinstance(delta, dict) and delta.get("stop_reason") == "tool_use" and not theirs:
                delta["stop_reason"] = "end_turn"
                frame = reframe(frame, event)
            out.append(frame)
        self.held = []
        return b"".join(out)


def _apply_delta(block: dict[str, Any], delta: Mapping[str, Any], partial: list[str]) -> None:
    kind = delta.get("type")
    if kind == "text_delta":
        block["text"] = block.get("text", "") + str(delta.get("text", ""))
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
    elif kind == "signature_delta":
        block["signature"] = str(delta.get("signature", ""))
    elif kind == "input_json_delta":
        partial.append(str(delta.get("partial_json", "")))
    elif kind == "citations_delta" and isinstance(delta.get("citation"), Mapping):
        block["citations"] = [*(block.get("citations") or []), dict(delta["citation"])]


MESSAGES_RECALL = MessagesRecall()
