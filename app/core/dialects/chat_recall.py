"""The recall tool in Chat Completions' shape (``CHAT.recall``; the contract: ``app.core.recall_shape``).

* offered unless ``tool_choice`` is set to anything but ``auto`` (``none``, ``required``, a named
  function), the legacy ``functions``/``function_call`` are used, ``n`` asks for more than one
  choice, a function of the client is named ``ctx_recall`` or the last message is the
  assistant's (a prefilled answer);
* the tool: ``{"type": "function", "function": {name, description, parameters}}`` after the
  client's ``tools``;
* an answer's calls: ``choices[0].message.tool_calls`` (one choice); the continuation appends the
  assistant message (content, tool calls, ``reasoning_content`` when the upstream sent one) and
  one ``tool`` message per recall call; the client's answer joins the rounds' contents, keeps
  the last round's other calls and says ``finish_reason: "stop"`` when no call is left;
* the stream (``chat.completion.chunk`` events, ``data: [DONE]``): a recall call's deltas are held
  back, the other calls' ``index`` renumbered; the closing chunks (the finish reason, the usage
  chunk, ``[DONE]``) are held while a recall call was seen; a continuation's chunks carry the
  first round's ``id``, and its opening role chunk is not sent again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..recall import RECALL_TOOL, parse_arguments
from ..recall_shape import AnswerCalls, RecallCall, RecallStream, function_tool
from ..recall_stream import SseEditor, frame_event, frame_json, reframe

_KEPT_FIELDS = ("role", "content", "tool_calls", "reasoning_content", "refusal", "name")


def _message(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    return message if isinstance(message, Mapping) else None


def _ours(call: object) -> bool:
    function = call.get("function") if isinstance(call, Mapping) else None
    return isinstance(function, Mapping) and function.get("name") == RECALL_TOOL


def _functions(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [t["function"] for t in tools if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)]


@dataclass(frozen=True, slots=True)
class ChatRecall:
    """``ctx_recall`` as a Chat Completions function (see the module docstring)."""

    def offered(self, body: Mapping[str, Any], /) -> bool:
        choice = body.get("tool_choice", "auto")
        n = body.get("n", 1)
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        return (
            choice in ("auto", None)
            and "functions" not in body
            and "function_call" not in body
            and (n is None or n == 1)
            and not any(f.get("name") == RECALL_TOOL for f in _functions(body))
            and not (isinstance(last, Mapping) and last.get("role") == "assistant")
            and (body.get("tools") is None or isinstance(body.get("tools"), list))
        )

    def with_tool(self, body: Mapping[str, Any], /) -> dict[str, Any]:
        tools = body.get("tools")
        tools = list(tools) if isinstance(tools, list) else []
        if tools and _ours(tools[-1]):
            return dict(body)
        return {**body, "tools": [*tools, {"type": "function", "function": function_tool()}]}

    def calls(self, answer: Mapping[str, Any], /) -> AnswerCalls:
        message = _message(answer)
        calls = message.get("tool_calls") if message is not None else None
        if not isinstance(calls, list):
            return AnswerCalls()
        ours: list[RecallCall] = []
        for call in calls:
            if _ours(call):
                ref, page = parse_arguments(call["function"].get("arguments"))
                ours.append(RecallCall(str(call.get("id")), ref, page))
        return AnswerCalls(tuple(ours), len(calls) - len(ours))

    def continuation(
        self, body: Mapping[str, Any], answer: Mapping[str, Any], results: Sequence[tuple[str, str]], /
    ) -> dict[str, Any]:
        message = _message(answer) or {}
        said = {k: message[k] for k in _KEPT_FIELDS if message.get(k) is not None}
        said["role"] = "assistant"
        said.setdefault("content", None)
        answered = [{"role": "tool", "tool_call_id": call_id, "content": text} for call_id, text in results]
        return {**body, "messages": [*body.get("messages", []), said, *answered]}

    def client_answer(self, answers: Sequence[Mapping[str, Any]], /) -> dict[str, Any]:
        last = answers[-1]
        message = _message(last)
        if message is None:
            return dict(last)
        joined = {**message}
        for key in ("content", "reasoning_content"):
            texts = [m.get(key) for m in map(_message, answers) if m is not None]
            strings = [t for t in texts if isinstance(t, str)]
            if strings:
                joined[key] = "".join(strings)
        calls = message.get("tool_calls")
        kept = [c for c in calls if not _ours(c)] if isinstance(calls, list) else None
        choice = dict(last["choices"][0])
        if kept:
            joined["tool_calls"] = kept
        elif calls is not None:
            joined.pop("tool_calls", None)
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
        choice["message"] = joined
        return {**last, "choices": [choice]}

    def stream(self) -> RecallStream:
        return ChatRecallStream()


class ChatRecallStream(SseEditor):
    """A streamed chat completion's editor (see the module docstring)."""

    def __init__(self) -> None:
        self.first_id: str | None = None
        super().__init__()

    def edit(self, frame: bytes, /) -> bytes:
        if self.untouched(frame):
            if self.first_id is None:
                chunk = frame_json(frame)
                self.first_id = str(chunk.get("id")) if chunk is not None else None
            return frame
        _event, data = frame_event(frame)
        chunk = frame_json(frame)
        if chunk is None:
            if data is not None and data.strip() == "[DONE]" and self.seen:
                self.held.append(frame)
                return b""
            return frame
        changed = False
        if self.round > 0 and self.first_id is not None and chunk.get("id") != self.first_id:
            chunk["id"] = self.first_id
            changed = True
        choices = chunk.get("choices")
        choice = (
            choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        )
        if choice is None:  # the usage chunk
            if self.seen:
                self.held.append(reframe(frame, chunk) if changed else frame)
                return b""
            return reframe(frame, chunk) if changed else frame
        delta = choice.get("delta")
        if isinstance(delta, dict):
            changed |= self._edit_delta(delta)
            if not delta and choice.get("finish_reason") is None:
                return b""
        edited = reframe(frame, chunk) if changed else frame
        if choice.get("finish_reason") is not None and self.seen:
            self.held.append(edited)
            return b""
        return edited

    def _edit_delta(self, delta: dict[str, Any]) -> bool:
        changed = False
        if self.round > 0 and "role" in delta:
            del delta["role"]  # the answer's role was said by its first round
            changed = True
        calls = delta.get("tool_calls")
        if not isinstance(calls, list):
            return changed
        kept = []
        for call in calls:
            index = call.get("index") if isinstance(call, dict) else None
            if not isinstance(index, int):
                kept.append(call)
                continue
            if _ours(call):
                self.ours.add(index)
                self.seen = True
            if index in self.ours:
                changed = True
                continue
            shown = index - sum(1 for o in self.ours if o < index)  # the client's numbering
            if shown != index:
                call["index"] = shown
                changed = True
            kept.append(call)
        if changed:
            if kept:
                delta["tool_calls"] = kept
            else:
                del delta["tool_calls"]
        return changed

    def answer(self) -> dict[str, Any]:
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish: Any = None
        usage: Any = None
        head: dict[str, Any] = {}
        for frame in self.frames:
            chunk = frame_json(frame)
            if chunk is None:
                continue
            head = head or chunk
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                finish = choice.get("finish_reason") or finish
                delta = choice.get("delta") or {}
                if isinstance(delta.get("content"), str):
                    content.append(delta["content"])
                if isinstance(delta.get("reasoning_content"), str):
                    reasoning.append(delta["reasoning_content"])
                for call in delta.get("tool_calls") or []:
                    if not isinstance(call, dict) or not isinstance(call.get("index"), int):
                        continue
                    made = calls.setdefault(
                        call["index"],
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    if call.get("id"):
                        made["id"] = call["id"]
                    function = call.get("function") or {}
                    made["function"]["name"] += function.get("name") or ""
                    made["function"]["arguments"] += function.get("arguments") or ""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = [calls[k] for k in sorted(calls)]
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return {"id": head.get("id"), "object": "chat.completion", "choices": [choice], "usage": usage}

    def release(self) -> bytes:
        out = []
        theirs = CHAT_RECALL.calls(self.answer()).theirs if self.held else 0
        for frame in self.held:
            chunk = frame_json(frame)
            choices = chunk.get("choices") if chunk is not None else None
            if chunk is not None and isinstance(choices, list) and choices and theirs == 0:
                choice = choices[0]
                if isinstance(choice, dict) and choice.get("finish_reason") == "tool_calls":
                    choice["finish_reason"] = "stop"
                    frame = reframe(frame, chunk)
            out.append(frame)
        self.held = []
        return b"".join(out)


CHAT_RECALL = ChatRecall()
