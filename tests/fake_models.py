"""Fake upstream servers that imitate how vLLM, llama.cpp, Ollama and OpenRouter describe their models,
count prompts with tokenizers that are not tiktoken, and refuse (or silently cut) what does not fit.

Real HTTP servers (Starlette on uvicorn, 127.0.0.1, free port: :func:`FakeModelServer.serve`):

* ``vllm``: ``GET /v1/models`` with ``max_model_len``; a prompt plus requested output over the window
  is a 400 in vLLM's wording.
* ``llamacpp``: ``GET /props`` (``default_generation_settings.n_ctx``), ``GET /v1/models`` with
  ``meta.n_ctx_train`` (the training window, larger); a prompt that leaves no room is llama.cpp's
  ``exceed_context_size_error`` (with ``n_prompt_tokens`` and ``n_ctx``).
* ``ollama``: ``POST /api/show`` (``model_info`` ``llama.context_length``, and ``num_ctx`` in
  ``parameters`` only when the model sets it) and a plain ``GET /v1/models``; a prompt over the
  runtime ``num_ctx`` is *cut silently* to its last ``num_ctx`` tokens and the usage reports the cut
  count, as Ollama does.
* ``openrouter``: ``GET /api/v1/models`` with ``context_length`` and ``top_provider``
  (``context_length``, ``max_completion_tokens``); chat at ``/api/v1/chat/completions``; overflow
  in OpenRouter's wording.

Every flavour answers ``POST .../chat/completions`` with ``usage.prompt_tokens`` = its own count (JSON,
or SSE with a final usage chunk when ``stream_options.include_usage``). ``discovery_gate`` (a
``threading.Event``) holds every discovery endpoint until it is set; ``discovery_status`` makes them
fail with that status instead.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fake_upstream import is_summary_request, serve_app

Flavour = Literal["vllm", "llamacpp", "ollama", "openrouter"]
FLAVOURS: tuple[Flavour, ...] = ("vllm", "llamacpp", "ollama", "openrouter")
BASE_PATHS: dict[Flavour, str] = {"vllm": "/v1", "llamacpp": "/v1", "ollama": "/v1", "openrouter": "/api/v1"}

Tokenizer = Callable[[str], int]

_PIECES = re.compile(r"[A-Za-z]+|\d|[^\sA-Za-z\d]")


def word_piece_tokens(text: str) -> int:
    """A word-piece-like tokenizer: letters in pieces of four, one token per digit and symbol."""
    total = 0
    for piece in _PIECES.findall(text):
        total += math.ceil(len(piece) / 4) if piece[0].isalpha() else 1
    return total


def scaled_tiktoken(ratio: float, encoding: str = "o200k_base") -> Tokenizer:
    """tiktoken's count times ``ratio`` (a vocabulary that cuts text finer or coarser)."""
    from app.tokenizer import counter_for

    counter = counter_for(encoding)

    def count(text: str) -> int:
        return math.ceil(counter.count_text(text) * ratio)

    return count


def chars_tokens(chars_per_token: float) -> Tokenizer:
    def count(text: str) -> int:
        return math.ceil(len(text) / chars_per_token)

    return count


@dataclass(frozen=True, slots=True)
class ServedModel:
    """One model: ``window_tokens`` is what the server really enforces; ``declared_window_tokens``
    what its metadata claims when different (Ollama's ``model_info``, llama.cpp's ``n_ctx_train``)."""

    name: str
    window_tokens: int
    declared_window_tokens: int | None = None
    max_output_tokens: int | None = None
    num_ctx_parameter: bool = False
    listed_window: bool = True


@dataclass
class Recorded:
    method: str
    path: str
    body: bytes
    status: int
    prompt_tokens: int | None = None
    truncated: bool = False

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeModelServer:
    """One fake server of a given flavour (see the module docstring)."""

    flavour: Flavour
    models: Sequence[ServedModel]
    tokenizer: Tokenizer
    tokens_per_message: int = 4
    priming_tokens: int = 3
    discovery_gate: threading.Event | None = None
    discovery_status: int | None = None
    requests: list[Recorded] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_name = {m.name: m for m in self.models}
        self._lock = threading.Lock()
        base = BASE_PATHS[self.flavour]
        routes = [
            Route(f"{base}/chat/completions", self._chat, methods=["POST"]),
            Route(f"{base}/models", self._models, methods=["GET"]),
        ]
        if self.flavour == "llamacpp":
            routes.append(Route("/props", self._props, methods=["GET"]))
        if self.flavour == "ollama":
            routes.append(Route("/api/show", self._show, methods=["POST"]))
        self.app = Starlette(routes=routes)

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Yields the base URL a client configures (``http://127.0.0.1:PORT/v1``, OpenRouter's
        ``.../api/v1``)."""
        with serve_app(self.app, lifespan="off") as url:
            yield url + BASE_PATHS[self.flavour]

    # -- introspection ----------------------------------------------------------------------------

    def chats(self) -> list[Recorded]:
        """The chat requests a client's call was forwarded as (the proxy's summary requests aside)."""
        with self._lock:
            chats = [r for r in self.requests if r.path.endswith("/chat/completions")]
        return [r for r in chats if not is_summary_request(json.loads(r.body or b"null"))]

    def summaries(self) -> list[Recorded]:
        """The proxy's summary requests (this server answers them as any chat, with its reply)."""
        with self._lock:
            chats = [r for r in self.requests if r.path.endswith("/chat/completions")]
        return [r for r in chats if is_summary_request(json.loads(r.body or b"null"))]

    def discovery_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if not r.path.endswith("/chat/completions")]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def count_prompt(self, messages: Sequence[Mapping[str, Any]], tools: Any = None) -> int:
        """The server's own count: per message its overhead, role and text; then reply priming; and
        the tool definitions its chat template renders (their JSON), when there are any."""
        total = self.priming_tokens
        for message in messages:
            total += self.tokens_per_message + self.tokenizer(str(message.get("role", "")))
            total += self.tokenizer(_text(message.get("content")))
        if tools:
            total += self.tokenizer(json.dumps(tools))
        return total

    # -- discovery endpoints ------------------------------------------------------------------------

    async def _gate(self) -> Response | None:
        if self.discovery_gate is not None:
            while not self.discovery_gate.is_set():
                await asyncio.sleep(0.02)
        if self.discovery_status is not None:
            return JSONResponse({"error": "discovery is broken"}, status_code=self.discovery_status)
        return None

    def _record(self, request: Request, body: bytes, status: int, **extra: Any) -> None:
        with self._lock:
            self.requests.append(Recorded(request.method, request.url.path, body, status, **extra))

    async def _models(self, request: Request) -> Response:
        failed = await self._gate()
        self._record(request, b"", failed.status_code if failed else 200)
        if failed is not None:
            return failed
        data = [self._model_entry(m) for m in self.models]
        return JSONResponse({"object": "list", "data": data})

    def _model_entry(self, model: ServedModel) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": model.name, "object": "model", "created": 0, "owned_by": "fake"}
        if not model.listed_window:
            return entry
        if self.flavour == "vllm":
            entry["max_model_len"] = model.window_tokens
        elif self.flavour == "llamacpp":
            entry["meta"] = {"n_ctx_train": model.declared_window_tokens or model.window_tokens}
        elif self.flavour == "openrouter":
            entry["context_length"] = model.window_tokens
            entry["top_provider"] = {
                "context_length": model.window_tokens,
                "max_completion_tokens": model.max_output_tokens,
                "is_moderated": False,
            }
        return entry

    async def _props(self, request: Request) -> Response:
        failed = await self._gate()
        self._record(request, b"", failed.status_code if failed else 200)
        if failed is not None:
            return failed
        model = self.models[0]
        return JSONResponse(
            {
                "default_generation_settings": {"n_ctx": model.window_tokens, "params": {"n_predict": -1}},
                "total_slots": 1,
                "model_path": f"/models/{model.name}.gguf",
            }
        )

    async def _show(self, request: Request) -> Response:
        raw = await request.body()
        failed = await self._gate()
        if failed is not None:
            self._record(request, raw, failed.status_code)
            return failed
        name = str(json.loads(raw or b"{}").get("model", ""))
        model = self._by_name.get(name) or self._by_name.get(name.removesuffix(":latest"))
        if model is None:
            self._record(request, raw, 404)
            return JSONResponse({"error": f"model '{name}' not found"}, status_code=404)
        self._record(request, raw, 200)
        parameters = 'stop "<|eot_id|>"'
        if model.num_ctx_parameter:
            parameters = f"num_ctx {model.window_tokens}\n" + parameters
        declared = model.declared_window_tokens or model.window_tokens
        return JSONResponse(
            {
                "modelfile": "# fake",
                "parameters": parameters,
                "details": {"family": "llama", "parameter_size": "8.0B"},
                "model_info": {"general.architecture": "llama", "llama.context_length": declared},
            }
        )

    # -- chat ----------------------------------------------------------------------------------------

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw)
        model = self._by_name.get(str(body.get("model")))
        if model is None:
            self._record(request, raw, 404)
            return JSONResponse({"error": {"message": "no such model", "code": 404}}, status_code=404)
        prompt = await asyncio.to_thread(self.count_prompt, body["messages"], body.get("tools"))
        requested = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        error = self._overflow(model, prompt, requested)
        if error is not None:
            self._record(request, raw, 400, prompt_tokens=prompt)
            return JSONResponse(error, status_code=400)
        truncated = self.flavour == "ollama" and prompt > model.window_tokens
        if truncated:
            prompt = model.window_tokens  # Ollama keeps the last num_ctx tokens and says nothing
        self._record(request, raw, 200, prompt_tokens=prompt, truncated=truncated)
        text = f"Fake {self.flavour} reply ({prompt} prompt tokens)."
        usage = {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8}
        if body.get("stream") is True:
            options = body.get("stream_options")
            include = isinstance(options, dict) and options.get("include_usage") is True
            events = _events(model.name, text, usage if include else None)
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model.name,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                ],
                "usage": usage,
            }
        )

    def _overflow(self, model: ServedModel, prompt: int, requested: int) -> dict[str, Any] | None:
        window = model.window_tokens
        if self.flavour == "vllm" and prompt + requested > window:
            return {
                "object": "error",
                "message": (
                    f"This model's maximum context length is {window} tokens. However, you requested "
                    f"{prompt + requested} tokens ({prompt} in the messages, {requested} in the completion). "
                    "Please reduce the length of the messages or completion."
                ),
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        if self.flavour == "llamacpp" and prompt >= window:
            return {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": prompt,
                    "n_ctx": window,
                }
            }
        if self.flavour == "openrouter" and prompt + requested > window:
            return {
                "error": {
                    "message": (
                        f"This endpoint's maximum context length is {window} tokens. However, you requested "
                        f"about {prompt + requested} tokens ({prompt} of text input, {requested} in the "
                        'output). Please reduce the length of either one, or use the "middle-out" '
                        "transform to compress your prompt automatically."
                    ),
                    "code": 400,
                    "metadata": {"provider_name": None},
                }
            }
        return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


async def _events(model: str, text: str, usage: Mapping[str, int] | None) -> AsyncIterator[bytes]:
    def chunk(payload: Mapping[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    yield chunk({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    for word in text.split(" "):
        yield chunk({**base, "choices": [{"index": 0, "delta": {"content": word + " "}}]})
        await asyncio.sleep(0)
    yield chunk({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if usage is not None:
        yield chunk({**base, "choices": [], "usage": dict(usage)})
    yield b"data: [DONE]\n\n"


_TEXT = (
    "the proxy keeps every request inside the window of the model while the upstream counts tokens "
    "with its own vocabulary and reports usage after each answer so calibration learns the ratio "
    "between both counts quickly conversations grow turn by turn with questions answers notes "
    "numbers like 2024 and 31 and code such as print(value) or items[3] = total / count"
)
_WORDS = tuple(_TEXT.split(" "))


def prose(words: int, *, seed: int) -> str:
    """Deterministic English-like text of ``words`` words (sentences, numbers, a little code)."""
    out: list[str] = []
    state = seed * 2654435761 % 2**32
    for i in range(words):
        state = (state * 1103515245 + 12345) % 2**31
        word = _WORDS[state % len(_WORDS)]
        out.append(word.capitalize() if i % 12 == 0 else word)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


def conversation(turns: int, *, words_per_message: int = 120, seed: int = 0) -> list[dict[str, Any]]:
    """A system prompt, ``turns`` user/assistant pairs of prose and a final question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(turns):
        for offset, role in enumerate(("user", "assistant")):
            text = prose(words_per_message, seed=seed * 1000 + 2 * turn + offset)
            messages.append({"role": role, "content": text})
    messages.append({"role": "user", "content": f"Question {seed}: what did we say about calibration?"})
    return messages


__all__ = [
    "BASE_PATHS",
    "FLAVOURS",
    "FakeModelServer",
    "Flavour",
    "Recorded",
    "ServedModel",
    "chars_tokens",
    "conversation",
    "prose",
    "scaled_tiktoken",
    "word_piece_tokens",
]
