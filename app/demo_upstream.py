"""A tiny local OpenAI-compatible upstream with a small context window, for ``ctxproxy demo``.

It stands in for a self-hosted model server (vLLM, llama.cpp) so the demo runs with no API key and no
internet: ``POST /v1/chat/completions`` counts the prompt exactly (tiktoken ``o200k_base`` with the
OpenAI chat accounting) and answers 400 ``context_length_exceeded`` in OpenAI's words when the prompt
is over the window, else a short canned reply with ``usage``. ``GET /v1/models`` lists the model.
The full-featured fake used by the end-to-end tests lives in ``tests/fake_upstream.py``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .core.tokens import MessageCounter


def create_demo_upstream(*, model: str, window_tokens: int, counter: MessageCounter) -> Starlette:
    """The demo upstream's ASGI app: one ``model`` with a ``window_tokens`` window."""

    async def chat(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            messages = body["messages"]
        except (ValueError, KeyError, TypeError):
            return _error(400, "We could not parse the JSON body of your request.", code=None)
        prompt_tokens = counter.count_request(body)
        if prompt_tokens > window_tokens:
            return _error(
                400,
                f"This model's maximum context length is {window_tokens} tokens. However, your messages "
                f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages.",
                code="context_length_exceeded",
            )
        text = f"Done: read {len(messages)} messages ({prompt_tokens} tokens)."
        completion_tokens = counter.counter.count_text(text)
        return JSONResponse(
            {
                "id": "chatcmpl-demo",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )

    async def models(request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "demo"}]}
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )


def _error(status: int, message: str, *, code: str | None) -> Response:
    body: dict[str, Any] = {
        "error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": code}
    }
    return JSONResponse(body, status_code=status)
