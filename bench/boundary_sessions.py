"""The sessions of ``bench.boundary``: growing conversations written in each API's own shape.

A session is a list of neutral *events* (``system``, ``user``, ``assistant`` text, ``call`` with its
``result``, optional ``reasoning`` before a call) that grows one client request at a time; ``body``
renders the events sent so far as one request body of an API: Chat Completions (``messages``),
OpenAI Responses (``instructions`` and ``input`` items: ``function_call`` / ``function_call_output``,
``reasoning`` items with ``encrypted_content``) or Anthropic Messages (``system``, alternating
``user``/``assistant`` messages with ``tool_use`` / ``tool_result`` blocks, ``redacted_thinking`` or
signed ``thinking`` blocks before a call) or Gemini (``systemInstruction``, alternating
``user``/``model`` contents with ``functionCall`` / ``functionResponse`` parts, a call carrying the
reasoning's ``thoughtSignature`` after a thought part when the reasoning has text; a user text that
follows function responses joins their content before them, as Gemini 3 requires). Deterministic
for a seed.

Shapes:

* ``chat``: a system prompt, then user turns of prose, code or JSON (60-500 tokens, log-uniform)
  each answered by an assistant text (40-200 tokens);
* ``agent``: a system prompt, three tools, a task, then steps of one call and its result (150-2,500
  tokens of code, JSON or prose, log-uniform), a new user message every 8 steps; with
  ``reasoning`` each call is preceded by encrypted reasoning (~1,500-4,000 characters);
* ``claude_code``: Claude Code's shape: ~6K tokens of system prompt and ~12K of tool definitions,
  a first user message of ~4K (its system reminders), then steps of a signed thinking block, a
  call and a result (300-8,000 tokens), a new user message every 10 steps;
* ``history``: ``turns`` chat turns of ~560 tokens sent at once (a conversation resumed), then one
  short turn per request.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_WORDS = [
    "the",
    "proxy",
    "keeps",
    "every",
    "request",
    "inside",
    "the",
    "context",
    "window",
    "while",
    "the",
    "upstream",
    "counts",
    "tokens",
    "with",
    "its",
    "own",
    "vocabulary",
    "and",
    "reports",
    "usage",
    "after",
    "each",
    "answer",
    "so",
    "the",
    "next",
    "request",
    "of",
    "a",
    "growing",
    "conversation",
    "is",
    "counted",
    "from",
    "what",
    "the",
    "upstream",
    "said",
    "plus",
    "what",
    "was",
    "appended",
    "since",
    "then",
    "and",
    "nothing",
    "is",
    "cut",
    "that",
    "fits",
]


def text_of(kind: int, size: int, rng: random.Random) -> str:
    """About ``size`` tokens of prose (0), code (1) or JSON (2)."""
    if kind == 0:
        return " ".join(rng.choice(_WORDS) for _ in range(size)) + "."
    if kind == 1:
        lines = [
            f"def handler_{rng.randrange(10**6)}(request, limit={i * 10}):\n"
            f"    return request.items[{i}:limit]"
            for i in range(max(1, size // 22))
        ]
        return "```python\n" + "\n\n".join(lines) + "\n```"
    rows = [
        {"id": rng.randrange(10**6), "name": f"item-{i}", "tags": ["a", "b"], "price": i * 1.25}
        for i in range(max(1, size // 24))
    ]
    return json.dumps(rows)


@dataclass(frozen=True, slots=True)
class Event:
    """One step of a session: ``kind`` is system, user, assistant, call or reasoning."""

    kind: str
    text: str = ""
    call_id: str = ""
    result: str = ""
    secret: str = ""  # encrypted reasoning / redacted thinking data, or a thinking block's signature


TOOLS = [
    {
        "name": name,
        "description": f"{name.replace('_', ' ').capitalize()} in the workspace and return what it printed.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "A path under the workspace root."}},
            "required": ["path"],
        },
    }
    for name in ("read_file", "run_tests", "search_code")
]


def big_tools(tokens: int, rng: random.Random) -> list[dict[str, Any]]:
    """Tool definitions of about ``tokens`` tokens (Claude Code sends ~12K of them)."""
    tools = []
    for i in range(max(1, tokens // 600)):
        tools.append(
            {
                "name": f"tool_{i}",
                "description": text_of(0, 520, rng),
                "parameters": {
                    "type": "object",
                    "properties": {
                        f"arg_{k}": {"type": "string", "description": "An argument."} for k in range(6)
                    },
                },
            }
        )
    return tools


class Session:
    """A growing session of one shape (see the module docstring)."""

    def __init__(self, shape: str, *, seed: int, reasoning: bool = False, turns: int = 0) -> None:
        self.shape = shape
        self.rng = random.Random(seed)
        self.reasoning = reasoning
        self.step = 0
        self.events: list[Event] = []
        self.tools: list[dict[str, Any]] = []
        rng = self.rng
        if shape == "chat":
            self.events.append(Event("system", "You are a careful assistant. " + text_of(0, 80, rng)))
        elif shape == "agent":
            self.events.append(Event("system", "You are a coding agent. " + text_of(0, 360, rng)))
            self.tools = TOOLS
            self.events.append(Event("user", "Fix the failing tests. " + text_of(0, 60, rng)))
        elif shape == "claude_code":
            self.events.append(Event("system", "You are Claude Code. " + text_of(0, 5600, rng)))
            self.tools = TOOLS + big_tools(12_000, rng)
            # Claude Code's first user message carries its system reminders (CLAUDE.md, context).
            self.events.append(Event("user", "Implement the feature. " + text_of(0, 4000, rng)))
        elif shape == "history":
            self.events.append(Event("system", "You are a careful assistant. " + text_of(0, 60, rng)))
            for n in range(turns):
                self.events.append(Event("user", text_of(n % 3, 330, rng)))
                self.events.append(Event("assistant", text_of(0, 200, rng)))
        else:
            raise ValueError(shape)

    def grow(self) -> None:
        """What the client appends before its next request."""
        rng, shape = self.rng, self.shape
        self.step += 1
        if shape in ("chat", "history"):
            if self.events[-1].kind == "user":
                reply = int(40 * 5 ** rng.random()) if shape == "chat" else 60
                self.events.append(Event("assistant", text_of(0, reply, rng)))
            size = int(60 * (500 / 60) ** rng.random()) if shape == "chat" else 80
            self.events.append(Event("user", text_of(self.step % 3, size, rng)))
            return
        every, low, high = (8, 150, 2500) if shape == "agent" else (10, 300, 8000)
        if self.step % every == 0:
            self.events.append(Event("assistant", "Done with this part. " + text_of(0, 60, rng)))
            self.events.append(Event("user", "Next: " + text_of(0, 50, rng)))
            return
        if shape == "claude_code":
            self.events.append(Event("reasoning", text_of(0, 120, rng), secret=_secret(rng, 120)))
        elif self.reasoning:
            self.events.append(Event("reasoning", "", secret=_secret(rng, rng.randrange(1500, 4000))))
        call_id = f"call_{self.step}_{rng.randrange(10**6)}"
        result = text_of(self.step % 3, int(low * (high / low) ** rng.random()), rng)
        self.events.append(Event("call", json.dumps({"path": f"src/m{self.step}.py"}), call_id, result))

    def body(self, api: str, *, model: str, max_tokens: int | None) -> dict[str, Any]:
        if api == "chat":
            return chat_body(self.events, self.tools, model=model, max_tokens=max_tokens)
        if api == "responses":
            return responses_body(self.events, self.tools, model=model, max_tokens=max_tokens)
        if api == "gemini":
            return gemini_body(self.events, self.tools, max_tokens=max_tokens)
        return messages_body(self.events, self.tools, model=model, max_tokens=max_tokens or 1024)


def _secret(rng: random.Random, chars: int) -> str:
    return base64.b64encode(rng.randbytes(chars * 3 // 4)).decode()


def chat_body(
    events: Sequence[Event], tools: Sequence[dict[str, Any]], *, model: str, max_tokens: int | None
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for e in events:
        if e.kind in ("system", "user", "assistant"):
            messages.append({"role": e.kind, "content": e.text})
        elif e.kind == "call":
            name = TOOLS[len(messages) % len(TOOLS)]["name"]
            call = {"id": e.call_id, "type": "function", "function": {"name": name, "arguments": e.text}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": e.call_id, "content": e.result})
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = [{"type": "function", "function": t} for t in tools]
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def responses_body(
    events: Sequence[Event], tools: Sequence[dict[str, Any]], *, model: str, max_tokens: int | None
) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    instructions = ""
    for n, e in enumerate(events):
        if e.kind == "system":
            instructions = e.text
        elif e.kind == "user":
            items.append({"role": "user", "content": [{"type": "input_text", "text": e.text}]})
        elif e.kind == "assistant":
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": e.text}],
                }
            )
        elif e.kind == "reasoning":
            items.append({"type": "reasoning", "id": f"rs_{n}", "summary": [], "encrypted_content": e.secret})
        elif e.kind == "call":
            name = TOOLS[n % len(TOOLS)]["name"]
            items.append({"type": "function_call", "call_id": e.call_id, "name": name, "arguments": e.text})
            items.append({"type": "function_call_output", "call_id": e.call_id, "output": e.result})
    body: dict[str, Any] = {"model": model, "instructions": instructions, "input": items}
    if tools:
        body["tools"] = [{"type": "function", **t} for t in tools]
    if max_tokens is not None:
        body["max_output_tokens"] = max_tokens
    return body


def messages_body(
    events: Sequence[Event], tools: Sequence[dict[str, Any]], *, model: str, max_tokens: int
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = ""
    pending: list[dict[str, Any]] = []  # the assistant blocks of a call being built

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for n, e in enumerate(events):
        if e.kind == "system":
            system = e.text
        elif e.kind in ("user", "assistant"):
            add(e.kind, [{"type": "text", "text": e.text}])
        elif e.kind == "reasoning":
            if e.text:
                pending.append({"type": "thinking", "thinking": e.text, "signature": e.secret})
            else:
                pending.append({"type": "redacted_thinking", "data": e.secret})
        elif e.kind == "call":
            name = TOOLS[n % len(TOOLS)]["name"]
            pending.append({"type": "tool_use", "id": e.call_id, "name": name, "input": json.loads(e.text)})
            add("assistant", pending)
            pending = []
            add("user", [{"type": "tool_result", "tool_use_id": e.call_id, "content": e.result}])
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "system": system, "messages": messages}
    if tools:
        body["tools"] = [
            {"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in tools
        ]
    return body


def gemini_body(
    events: Sequence[Event], tools: Sequence[dict[str, Any]], *, max_tokens: int | None
) -> dict[str, Any]:
    """The events as a ``generateContent`` body (the model is in the path, not the body)."""
    contents: list[dict[str, Any]] = []
    system = ""
    pending: list[dict[str, Any]] = []  # a thought before the call being built
    signature = ""

    def add(role: str, parts: list[dict[str, Any]], *, first: bool = False) -> None:
        if contents and contents[-1]["role"] == role:
            if first:
                contents[-1]["parts"][:0] = parts  # a text before the function responses
            else:
                contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})

    for n, e in enumerate(events):
        if e.kind == "system":
            system = e.text
        elif e.kind == "user":
            add("user", [{"text": e.text}], first=True)
        elif e.kind == "assistant":
            add("model", [{"text": e.text}])
        elif e.kind == "reasoning":
            if e.text:
                pending.append({"text": e.text, "thought": True})
            signature = e.secret
        elif e.kind == "call":
            name = TOOLS[n % len(TOOLS)]["name"]
            call: dict[str, Any] = {
                "functionCall": {"id": e.call_id, "name": name, "args": json.loads(e.text)}
            }
            if signature:
                call["thoughtSignature"] = signature
            add("model", [*pending, call])
            pending, signature = [], ""
            response = {"id": e.call_id, "name": name, "response": {"output": e.result}}
            add("user", [{"functionResponse": response}])
    body: dict[str, Any] = {"systemInstruction": {"parts": [{"text": system}]}, "contents": contents}
    if tools:
        declarations = [
            {"name": t["name"], "description": t["description"], "parametersJsonSchema": t["parameters"]}
            for t in tools
        ]
        body["tools"] = [{"functionDeclarations": declarations}]
    if max_tokens is not None:
        body["generationConfig"] = {"maxOutputTokens": max_tokens}
    return body
