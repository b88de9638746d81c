"""The sessions of ``bench.memory`` in each wire API's own shape: a chat-shaped history (system,
user, assistant with ``tool_calls``, tool messages) as an OpenAI Responses body, an Anthropic
Messages body or a Gemini ``generateContent`` body.

Gemini's is written as a Gemini 2.5/3 client replays what the model sent: the first function call
of every model content signed (``thoughtSignature``), a text answer's last part signed, call ids
and names on the function responses; a user text that follows function responses joins their
content before them (Gemini 3 refuses a part after them; ``docs/gemini.md``). The signatures are
made with the fake's own ``Signer``, so the fake verifies every one it receives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tests.fake_gemini_upstream import Signer


def as_responses(history: Sequence[dict[str, Any]], *, model: str, max_tokens: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    instructions = ""
    for message in history:
        role = message["role"]
        if role == "system":
            instructions = message["content"]
        elif role == "user":
            items.append({"role": "user", "content": message["content"]})
        elif role == "assistant":
            if message.get("content"):
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": message["content"]}],
                    }
                )
            for call in message.get("tool_calls") or []:
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": call["function"]["name"],
                        "arguments": call["function"]["arguments"],
                    }
                )
        else:
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": message["content"],
                }
            )
    return {"model": model, "instructions": instructions, "input": items, "max_output_tokens": max_tokens}


def as_messages(history: Sequence[dict[str, Any]], *, model: str, max_tokens: int) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    system = ""
    for message in history:
        role = message["role"]
        if role == "system":
            system = message["content"]
            continue
        if role == "assistant":
            blocks: list[dict[str, Any]] = []
            if message.get("content"):
                blocks.append({"type": "text", "text": message["content"]})
            for call in message.get("tool_calls") or []:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"]),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
            continue
        block = (
            {"type": "tool_result", "tool_use_id": message["tool_call_id"], "content": message["content"]}
            if role == "tool"
            else {"type": "text", "text": message["content"]}
        )
        if out and out[-1]["role"] == "user":
            out[-1]["content"].append(block)  # results first, then the text, in one user message
        else:
            out.append({"role": "user", "content": [block]})
    return {"model": model, "system": system, "messages": out, "max_tokens": max_tokens}


def as_gemini(
    history: Sequence[dict[str, Any]], *, model: str, max_tokens: int, signer: Signer
) -> dict[str, Any]:
    contents: list[dict[str, Any]] = []
    system = ""
    names: dict[str, str] = {}

    def add(role: str, parts: list[dict[str, Any]], *, first: bool = False) -> None:
        if contents and contents[-1]["role"] == role:
            if first:
                contents[-1]["parts"][:0] = parts  # a text before the function responses
            else:
                contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})

    for message in history:
        role = message["role"]
        if role == "system":
            system = message["content"]
        elif role == "assistant":
            parts: list[dict[str, Any]] = [{"text": message["content"]}] if message.get("content") else []
            calls = []
            for call in message.get("tool_calls") or []:
                names[call["id"]] = call["function"]["name"]
                function = {
                    "id": call["id"],
                    "name": call["function"]["name"],
                    "args": json.loads(call["function"]["arguments"]),
                }
                calls.append({"functionCall": function})
            if calls:  # Gemini signs the first call of a step, else a text answer's last part
                calls[0] = {**calls[0], "thoughtSignature": signer.sign(model, calls[0])}
            elif parts:
                parts[-1] = {**parts[-1], "thoughtSignature": signer.sign(model, parts[-1])}
            add("model", parts + calls)
        elif role == "tool":
            call_id = message["tool_call_id"]
            response = {"id": call_id, "name": names[call_id], "response": {"output": message["content"]}}
            add("user", [{"functionResponse": response}])
        else:
            add("user", [{"text": message["content"]}], first=True)
    return {
        "systemInstruction": {"parts": [{"text": system}]},
        "contents": contents,
        "generationConfig": {"maxOutputTokens": max_tokens},
    }
