"""Sample chat requests and media shared by the token-accounting tests.

The OpenAI cookbook's worked examples (with the prompt token counts the API reported), small
conversations, and image headers built byte by byte (PNG, JPEG, GIF, WebP) for data URLs.
"""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

from app.tokenizer import counter_for

O200K = counter_for("o200k_base")
CL100K = counter_for("cl100k_base")

# The OpenAI cookbook "How to count tokens with tiktoken", section 6: 124 prompt tokens on gpt-4o
# (o200k_base) and 129 on gpt-4 (cl100k_base), as reported by the API.
COOKBOOK_MESSAGES: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon "
        "into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for "
        "increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]
# Section 7: 101 prompt tokens on gpt-4o, 105 on gpt-4.
COOKBOOK_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def conversation(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for i in range(n):
        messages.append({"role": "user", "content": f"Question {i}: what is {i} squared? 中文 {i}"})
        messages.append({"role": "assistant", "content": f"{i * i}"})
    return messages


def call_message(arguments: Any) -> dict[str, Any]:
    function = {"name": "f", "arguments": arguments}
    call = {"id": "c1", "type": "function", "function": function}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def png(width: int, height: int, *, padding: int = 0) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", 13)
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + bytes(padding)
    )


def jpeg(width: int, height: int, *, exif_bytes: int = 0) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    app1 = b""
    while exif_bytes > 0:  # EXIF-like segments in front of the frame header
        size = min(exif_bytes, 65000)
        app1 += b"\xff\xe1" + struct.pack(">H", size + 2) + bytes(size)
        exif_bytes -= size
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + app1 + sof + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + bytes(10)


def webp_vp8x(width: int, height: int) -> bytes:
    body = (
        b"VP8X"
        + struct.pack("<I", 10)
        + bytes(4)
        + (width - 1).to_bytes(3, "little")
        + (height - 1).to_bytes(3, "little")
    )
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_vp8(width: int, height: int) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"VP8 " + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_vp8l(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    frame = b"\x2f" + struct.pack("<I", bits)
    body = b"VP8L" + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()
