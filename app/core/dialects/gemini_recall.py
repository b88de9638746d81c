"""The recall tool in Gemini's shape (``GEMINI.recall``; contract: ``app.core.recall_shape``).

* offered unless ``toolConfig.functionCallingConfig`` forces or forbids calls (a mode other than
  ``AUTO``, or ``allowedFunctionNames``), more than one candidate is asked for, a JSON answer is
  asked for (``responseMimeType: application/json``: Gemini refuses function calling with it),
  a tool of the client is not a function declaration (Gemini refuses some built-in tools beside
  functions), one of its functions is named ``ctx_recall`` or the last content is the model's;
* the tool: one more ``tools`` entry, ``{"functionDeclarations": [{name, description,
  parameters}]}``, after the client's;
* an answer's calls: the ``functionCall`` parts of its one candidate; the continuation appends the
  candidate's content (a ``model`` content, its parts exactly as they came: thought signatures
  stay on the parts that carried them) and a ``user`` content of one ``functionResponse`` per
  recall call (``{"output": text}``, the call's ``id`` when it had one), in the calls' order;
* the client's answer: the last round's envelope with the parts of every round in order, the
  recall calls removed; a thought signature a removed call carried moves to the next function
  call kept (Gemini 3 wants the first call of a step signed);
* the stream (``alt=sse`` only: the JSON array stream is not offered the tool): a recall call's
  part is removed from its chunk (a chunk left empty is not sent); the chunk with the
  ``finishReason`` is split while a recall call was seen: its parts go now, the reason waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..recall import RECALL_TOOL, parse_arguments
from ..recall_shape import AnswerCalls, RecallCall, RecallStream, function_tool
from ..recall_stream import NEEDLE, SseEditor, frame_json, reframe
from .gemini_wire import field

_SIGNATURE_KEYS = ("thoughtSignature", "thought_signature")


def _call(part: object) -> Mapping[str, Any] | None:
    call = field(part, "functionCall") if isinstance(part, Mapping) else None
    return call if isinstance(call, Mapping) else None


def _ours(part: object) -> bool:
    call = _call(part)
    return call is not None and call.get("name") == RECALL_TOOL


def _candidate(answer: Mapping[str, Any]) -> Mapping[str, Any] | None:
    candidates = answer.get("candidates")
    if not isinstance(candidates, list) or len(candidates) != 1 or not isinstance(candidates[0], Mapping):
        return None
    return candidates[0]


def _parts(answer: Mapping[str, Any]) -> list[Any]:
    candidate = _candidate(answer)
    content = candidate.get("content") if candidate is not None else None
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return list(parts) if isinstance(parts, list) else []


def _signature(part: Mapping[str, Any]) -> tuple[str, Any] | None:
    for key in _SIGNATURE_KEYS:
        if part.get(key):
            return key, part[key]
    return None


class _Signatures:
    """Moves the thought signature of a removed call to the next call kept."""

    def __init__(self) -> None:
        self.pending: tuple[str, Any] | None = None

    def keep(self, parts: Sequence[Any]) -> list[Any]:
        kept: list[Any] = []
        for part in parts:
            if _ours(part):
                signature = _signature(part)
                if signature is not None and self.pending is None:
                    self.pending = signature
                continue
            if self.pending is not None and _call(part) is not None:
                if _signature(part) is None:
                    part = {**part, self.pending[0]: self.pending[1]}
                self.pending = None
            kept.append(part)
        return kept


@dataclass(frozen=True, slots=True)
class GeminiRecall:
    """``ctx_recall`` as a Gemini function declaration (see the module docstring)."""

    def offered(self, body: Mapping[str, Any], /) -> bool:
        tools = field(body, "tools")
        config = field(body, "toolConfig")
        calling = field(config, "functionCallingConfig") if isinstance(config, Mapping) else None
        mode = field(calling, "mode") if isinstance(calling, Mapping) else None
        allowed = field(calling, "allowedFunctionNames") if isinstance(calling, Mapping) else None
        generation = field(body, "generationConfig")
        generation = generation if isinstance(generation, Mapping) else {}
        candidates = field(generation, "candidateCount")
        contents = body.get("contents")
        last = contents[-1] if isinstance(contents, list) and contents else None
        return (
            (mode is None or str(mode).upper() in ("AUTO", "MODE_UNSPECIFIED"))
            and not allowed
            and (candidates is None or candidates == 1)
            and field(generation, "responseMimeType") != "application/json"
            and (tools is None or isinstance(tools, list))
            and all(_declarations(tool) is not None for tool in tools or [])
            and not any(
                isinstance(d, Mapping) and d.get("name") == RECALL_TOOL
                for tool in tools or []
                for d in _declarations(tool) or []
            )
            and not (isinstance(last, Mapping) and last.get("role") == "model")
        )

    def with_tool(self, body: Mapping[str, Any], /) -> dict[str, Any]:
        tools = field(body, "tools")
        tools = list(tools) if isinstance(tools, list) else []
        last = _declarations(tools[-1]) if tools else None
        if last and any(isinstance(d, Mapping) and d.get("name") == RECALL_TOOL for d in last):
            return dict(body)
        return {**body, "tools": [*tools, {"functionDeclarations": [function_tool()]}]}

    def calls(self, answer: Mapping[str, Any], /) -> AnswerCalls:
        candidate = _candidate(answer)
        if candidate is None or candidate.get("finishReason", "STOP") not in ("STOP", None):
            return AnswerCalls()
        ours = []
        theirs = 0
        for k, part in enumerate(_parts(answer)):
            call = _call(part)
            if call is None:
                continue
            if call.get("name") == RECALL_TOOL:
                ref, page = parse_arguments(call.get("args"))
                ours.append(RecallCall(str(call.get("id") or f"{RECALL_TOOL}:{k}"), ref, page))
            else:
                theirs += 1
        return AnswerCalls(tuple(ours), theirs)

    def continuation(
        self, body: Mapping[str, Any], answer: Mapping[str, Any], results: Sequence[tuple[str, str]], /
    ) -> dict[str, Any]:
        said = {"role": "model", "parts": _parts(answer)}
        responses = []
        for call_id, text in results:
            response: dict[str, Any] = {"name": RECALL_TOOL, "response": {"output": text}}
            if not call_id.startswith(f"{RECALL_TOOL}:"):
                response["id"] = call_id
            responses.append({"functionResponse": response})
        contents = body.get("contents")
        history = list(contents) if isinstance(contents, list) else []
        return {**body, "contents": [*history, said, {"role": "user", "parts": responses}]}

    def client_answer(self, answers: Sequence[Mapping[str, Any]], /) -> dict[str, Any]:
        signatures = _Signatures()
        parts = [part for answer in answers for part in signatures.keep(_parts(answer))]
        last = answers[-1]
        candidate = _candidate(last)
        if candidate is None:
            return dict(last)
        content = candidate.get("content")
        content = (
            {**content, "parts": parts} if isinstance(content, Mapping) else {"role": "model", "parts": parts}
        )
        return {**last, "candidates": [{**candidate, "content": content}]}

    def stream(self) -> RecallStream:
        return GeminiRecallStream()


def _declarations(tool: object) -> list[Any] | None:
    """A tool entry's function declarations, or None when it is another kind of tool."""
    if not isinstance(tool, Mapping):
        return None
    declarations = field(tool, "functionDeclarations")
    if isinstance(declarations, list) and len(tool) == 1:
        return declarations
    return None


class GeminiRecallStream(SseEditor):
    """A streamed ``alt=sse`` answer's editor (see the module docstring)."""

    def __init__(self) -> None:
        self.signatures = _Signatures()
        super().__init__()

    def edit(self, frame: bytes, /) -> bytes:
        if not self.seen and self.signatures.pending is None and NEEDLE not in frame:
            return frame
        chunk = frame_json(frame)
        candidate = _candidate(chunk) if chunk is not None else None
        if chunk is None or candidate is None:
            return frame
        content = candidate.get("content")
        content = dict(content) if isinstance(content, Mapping) else {}
        parts = content.get("parts")
        changed = False
        if isinstance(parts, list):
            self.seen = self.seen or any(_ours(p) for p in parts)
            kept = self.signatures.keep(parts)
            if kept != parts:
                changed = True
                candidate = {**candidate, "content": {**content, "parts": kept}}
                parts = kept
        if candidate.get("finishReason") is not None and self.seen:
            closing = {**candidate, "content": {"role": "model", "parts": []}}
            self.held.append(reframe(frame, {**chunk, "candidates": [closing]}))
            if not parts:
                return b""
            now = {k: v for k, v in candidate.items() if k != "finishReason"}
            return reframe(frame, {**chunk, "candidates": [now]})
        if changed and not parts:
            return b""
        return reframe(frame, {**chunk, "candidates": [candidate]}) if changed else frame

    def answer(self) -> dict[str, Any]:
        parts: list[Any] = []
        last: dict[str, Any] = {}
        finish: Any = None
        for frame in self.frames:
            chunk = frame_json(frame)
            candidate = _candidate(chunk) if chunk is not None else None
            if chunk is None or candidate is None:
                continue
            last = chunk
            parts += _parts(chunk)
            finish = candidate.get("finishReason") or finish
        candidate = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        return {**last, "candidates": [candidate]}


GEMINI_RECALL = GeminiRecall()
