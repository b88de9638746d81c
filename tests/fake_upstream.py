"""A fake OpenAI-compatible upstream that enforces a context window, for end-to-end tests.

It is a real HTTP server (Starlette served by uvicorn on 127.0.0.1, see :func:`serve_app`), so the
proxy talks to it exactly as it talks to vLLM, llama.cpp or OpenAI:

* ``POST /v1/chat/completions`` counts the prompt with the project's tokenizer
  (``app.tokenizer.counter_for`` + ``app.core.tokens.MessageCounter``) times the model's
  ``counter_ratio`` (a ratio above 1 imitates a model whose tokenizer counts more than tiktoken,
  which is what forces the proxy's emergency retry), and when the prompt does not fit answers 400 in
  the model's error dialect (``openai``, ``vllm`` or ``llamacpp``, the bodies those servers send);
  otherwise it answers a deterministic reply with ``usage`` (``prompt_tokens`` = its own count), as
  JSON or as SSE chunks (``stream: true``; a final usage chunk when
  ``stream_options.include_usage``; then ``data: [DONE]``; a tool call's arguments come in
  pieces, as OpenAI sends them). When the request has ``tools`` and the last message is a user
  message naming a tool (or ``tool_choice`` forces one) it answers with a tool call instead. With
  :attr:`FakeUpstream.recaller` (``tests.fake_recaller``) it is a model that needs one fact and
  fetches it back with ``ctx_recall`` when it sees it only as a recall id.
* It refuses (400, OpenAI's wordings) a conversation whose tool calls and results do not pair:
  an assistant message with ``tool_calls`` not followed by a ``tool`` message for each, a ``tool``
  message that answers no call of the assistant message before it.
* It doubles as a summarizer: a chat request whose system prompt starts with the project's
  summary prompt (``app.compaction.prompts.SYSTEM_MARKER``) is answered with the extractive,
  capped summary of ``tests.fake_summarizer`` (no kinder than a real model: it knows nothing of
  what a test plants), counted in :attr:`FakeUpstream.summary_calls` and its prompt tokens in
  :attr:`FakeUpstream.summary_prompt_tokens`. :attr:`FakeUpstream.summary_mode` makes those
  requests fail (``"error"``: a 500; ``"missing"``: a 404, as an upstream without that route),
  answer nothing (``"empty"``) or wait :attr:`summary_delay_s` first (``"slow"``);
  :attr:`summary_padding` is appended to every summary (to make it long); :attr:`summary_style`
  is the summarizer's style (``tests.fake_summarizer.STYLES``: ``prose`` by default, or one of a
  small model's bad answers).
* A request whose ``Authorization: Bearer`` key is in :attr:`FakeUpstream.refused_keys` is answered
  401 (OpenAI's ``invalid_api_key``), whatever it asks, summaries included, as a real upstream
  refuses a wrong key.
* ``GET /v1/models`` lists its models.
* Every request is recorded (method, path, headers, raw body) in :attr:`FakeUpstream.requests`.

Window rules, as the real servers apply them: OpenAI rejects a prompt over the window, or prompt plus
the requested output over it; vLLM rejects prompt plus requested output over the window; llama.cpp
rejects a prompt that does not leave one token of room (``n_prompt_tokens >= n_ctx``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.core.tokens import MessageCounter, TokenCounter
from app.demo import serve_in_thread
from tests.fake_recaller import RECALL_TOOL, Recall, Recaller
from tests.fake_summarizer import is_summary_prompt, prompt_text, summary_answer

Dialect = Literal["openai", "vllm", "llamacpp"]
SummaryMode = Literal["ok", "error", "missing", "empty", "slow"]
FACT_RE = re.compile(r"FACT-\w+")
DIALECTS: tuple[Dialect, ...] = ("openai", "vllm", "llamacpp")


@dataclass(frozen=True, slots=True)
class FakeModel:
    """One model the fake serves: its window, error dialect and how much more than tiktoken it counts."""

    name: str
    window_tokens: int
    dialect: Dialect = "openai"
    counter_ratio: float = 1.0
    encoding: str = "o200k_base"
    max_output_tokens: int = 1024


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """What the fake received: header names are lower-case, ``body`` is the raw bytes."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    status: int = 0
    prompt_tokens: int | None = None

    def json(self) -> Any:
        return json.loads(self.body)


def context_error(
    model: FakeModel, *, prompt_tokens: int, output_tokens: int | None
) -> dict[str, Any] | None:
    """The dialect's 400 body when ``prompt_tokens`` (+ requested output) does not fit, else None."""
    window = model.window_tokens
    output = output_tokens or 0
    if model.dialect == "openai":
        if prompt_tokens > window:
            message = (
                f"This model's maximum context length is {window} tokens. However, your messages resulted "
                f"in {prompt_tokens} tokens. Please reduce the length of the messages."
            )
        elif prompt_tokens + output > window:
            message = (
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{prompt_tokens + output} tokens ({prompt_tokens} in the messages, {output} in the "
                "completion). Please reduce the length of the messages or completion."
            )
        else:
            return None
        return {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    if model.dialect == "vllm":
        if prompt_tokens + output <= window:
            return None
        return {
            "object": "error",
            "message": (
                f"This model's maximum context length is {window} tokens. However, you requested "
                f"{prompt_tokens + output} tokens ({prompt_tokens} in the messages, {output} in the "
                "completion). Please reduce the length of the messages or completion."
            ),
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    if prompt_tokens < window:
        return None
    return {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt_tokens,
            "n_ctx": window,
        }
    }


def _openai_error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    error_type: str = "invalid_request_error",
) -> Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def _default_counter(encoding: str) -> TokenCounter:
    from app.tokenizer import counter_for

    return counter_for(encoding)


class FakeUpstream:
    """The fake server's state and its Starlette app (:attr:`app`); serve it with :meth:`serve`."""

    def __init__(
        self,
        models: Iterable[FakeModel],
        *,
        counter_factory: Callable[[str], TokenCounter] = _default_counter,
    ) -> None:
        self.models: dict[str, FakeModel] = {m.name: m for m in models}
        self.requests: list[RecordedRequest] = []
        self._counter_factory = counter_factory
        self._counters: dict[str, MessageCounter] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.summary_mode: SummaryMode = "ok"
        self.summary_delay_s = 0.0
        self.summary_padding = ""
        self.refused_keys: set[str] = set()
        self.summary_style = "prose"  # tests.fake_summarizer.STYLES
        self.summary_calls = 0
        self.summary_prompt_tokens = 0
        self.recaller: Recaller | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # ---- introspection for tests -------------------------------------------------------------

    def chat_requests(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def client_requests(self) -> list[RecordedRequest]:
        """Chat requests that are not summary requests (what a client's call was forwarded as)."""
        return [r for r in self.chat_requests() if not is_summary_request(r.json())]

    def summary_requests(self) -> list[RecordedRequest]:
        return [r for r in self.chat_requests() if is_summary_request(r.json())]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.summary_calls = 0
            self.summary_prompt_tokens = 0

    def prompt_tokens(self, model: FakeModel, body: Mapping[str, Any]) -> int:
        """The fake's own count of ``body``'s prompt: tiktoken chat accounting times the ratio."""
        counter = self._counter(model.encoding)
        return math.ceil(counter.count_request(body) * model.counter_ratio)

    def models_toml(self) -> str:
        """An operator model table (``CTXPROXY_MODELS_FILE``) declaring the fake models' windows."""
        lines: list[str] = []
        for m in self.models.values():
            lines += [
                f'[models."{m.name}"]',
                f"window = {m.window_tokens}",
                f"max_output = {m.max_output_tokens}",
                f'encoding = "{m.encoding}"',
                "",
            ]
        return "\n".join(lines)

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Run the fake on a free 127.0.0.1 port; yields its base URL (``http://127.0.0.1:PORT``)."""
        with serve_app(self.app, lifespan="off") as url:
            yield url

    # ---- handlers ------------------------------------------------------------------------------

    def _counter(self, encoding: str) -> MessageCounter:
        with self._lock:
            counter = self._counters.get(encoding)
            if counter is None:
                counter = self._counters[encoding] = MessageCounter(self._counter_factory(encoding))
            return counter

    def _record(self, request: Request, raw: bytes, *, status: int, prompt_tokens: int | None = None) -> None:
        recorded = RecordedRequest(
            method=request.method,
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=raw,
            status=status,
            prompt_tokens=prompt_tokens,
        )
        with self._lock:
            self.requests.append(recorded)

    async def _models(self, request: Request) -> Response:
        self._record(request, b"", status=200)
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "fake"} for name in self.models]
        return JSONResponse({"object": "list", "data": data})

    async def _chat(self, request: Request) -> Response:
        raw = await request.body()
        key = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if key and key in self.refused_keys:
            self._record(request, raw, status=401)
            return _openai_error(
                401, "Incorrect API key provided.", code="invalid_api_key", error_type="invalid_request_error"
            )
        try:
            body = json.loads(raw)
        except ValueError:
            self._record(request, raw, status=400)
            return _openai_error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._record(request, raw, status=400)
            return _openai_error(400, "'messages' is a required property", param="messages")
        model = self.models.get(str(body.get("model")))
        if model is None:
            self._record(request, raw, status=404)
            return _openai_error(
                404, f"The model `{body.get('model')}` does not exist.", code="model_not_found", param="model"
            )
        unpaired = pairing_error(body["messages"])
        if unpaired is not None:
            self._record(request, raw, status=400)
            return _openai_error(400, unpaired, param="messages")
        # Counting the real tokenizer on a big prompt is CPU work: keep the event loop free.
        prompt = await asyncio.to_thread(self.prompt_tokens, model, body)
        output = body.get("max_completion_tokens") or body.get("max_tokens")
        error = context_error(
            model, prompt_tokens=prompt, output_tokens=output if isinstance(output, int) else None
        )
        if error is not None:
            self._record(request, raw, status=400, prompt_tokens=prompt)
            return JSONResponse(error, status_code=400)
        if is_summary_request(body):
            return await self._summary(request, raw, body, model=model, prompt_tokens=prompt)
        self._record(request, raw, status=200, prompt_tokens=prompt)
        reply = self._reply(body, prompt_tokens=prompt)
        completion = self._counter(model.encoding).counter.count_text(
            (reply["content"] or "") + json.dumps(reply.get("tool_calls") or "")
        )
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        completion_id = f"chatcmpl-fake{next(self._ids)}"
        return self._completion(body, model, reply, usage, completion_id)

    def _completion(
        self,
        body: Mapping[str, Any],
        model: FakeModel,
        reply: dict[str, Any],
        usage: dict[str, int],
        completion_id: str,
    ) -> Response:
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = _sse_events(completion_id, model.name, reply, usage if include_usage else None)
            return StreamingResponse(events, media_type="text/event-stream")
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model.name,
                "choices": [{"index": 0, "message": reply, "logprobs": None, "finish_reason": finish}],
                "usage": usage,
            }
        )

    async def _summary(
        self, request: Request, raw: bytes, body: Mapping[str, Any], *, model: FakeModel, prompt_tokens: int
    ) -> Response:
        with self._lock:
            self.summary_calls += 1
            self.summary_prompt_tokens += prompt_tokens
        mode = self.summary_mode
        if mode == "slow":
            await asyncio.sleep(self.summary_delay_s)
        if mode == "error":
            self._record(request, raw, status=500, prompt_tokens=prompt_tokens)
            return _openai_error(500, "The server had an error while processing your request.")
        if mode == "missing":
            self._record(request, raw, status=404, prompt_tokens=prompt_tokens)
            return _openai_error(404, "Not Found")
        self._record(request, raw, status=200, prompt_tokens=prompt_tokens)
        count_text = self._counter(model.encoding).counter.count_text
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        messages = body["messages"]
        user_text = "\n\n".join(prompt_text(m.get("content")) for m in messages[1:] if isinstance(m, Mapping))
        system = messages[0].get("content")
        style = self.summary_style
        summary = summary_answer(system, user_text, cap_tokens=cap, count_text=count_text, style=style)
        text = "" if mode == "empty" else (summary or "") + self.summary_padding
        reply = {"role": "assistant", "content": text}
        completion = self._counter(model.encoding).counter.count_text(text)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        return self._completion(body, model, reply, usage, f"chatcmpl-fake{next(self._ids)}")

    def _reply(self, body: Mapping[str, Any], *, prompt_tokens: int) -> dict[str, Any]:
        """The recaller's turn when there is one, else a tool call when asked for one, else a short
        deterministic text."""
        messages = body["messages"]
        if self.recaller is not None:
            return self._recalling(self.recaller, body)
        tool = _requested_tool(body)
        if tool is not None:
            params = tool.get("parameters") or {}
            properties = params.get("properties") if isinstance(params, dict) else None
            arguments = {key: "fake" for key in (properties or {})}
            call = {
                "id": f"call_fake{next(self._ids)}",
                "type": "function",
                "function": {"name": tool.get("name", ""), "arguments": json.dumps(arguments)},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        text = f"Fake reply to {len(messages)} messages ({prompt_tokens} prompt tokens)."
        return {"role": "assistant", "content": text}


    def _recalling(self, recaller: Recaller, body: Mapping[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        offered = any(
            isinstance(t, dict) and (t.get("function") or {}).get("name") == RECALL_TOOL
            for t in body.get("tools") or []
        )
        fetched = []
        for message in messages:
            for call in message.get("tool_calls") or [] if isinstance(message, dict) else []:
                function = call.get("function") or {}
                if function.get("name") == RECALL_TOOL:
                    args = json.loads(function.get("arguments") or "{}")
                    fetched.append((str(args.get("id")), int(args.get("page", 1))))
        prompt = "\n".join(prompt_text(m.get("content")) for m in messages if isinstance(m, dict))
        decision = recaller.decide(prompt, offered=offered, fetched=fetched)
        if isinstance(decision, Recall):
            arguments = json.dumps({"id": decision.ref, "page": decision.page})
            call = {
                "id": f"call_fake{next(self._ids)}",
                "type": "function",
                "function": {"name": RECALL_TOOL, "arguments": arguments},
            }
            calls = [call]
            if recaller.also_call is not None:
                own = {"name": recaller.also_call, "arguments": json.dumps({"n": 99})}
                calls.append({"id": f"call_fake{next(self._ids)}", "type": "function", "function": own})
            return {"role": "assistant", "content": recaller.text_before_call or None, "tool_calls": calls}
        return {"role": "assistant", "content": decision.text}


def pairing_error(messages: Any) -> str | None:
    """OpenAI's refusal of tool calls and results that do not pair, else None."""
    if not isinstance(messages, list):
        return None
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant" and message.get("tool_calls"):
            ids = [str(c.get("id")) for c in message["tool_calls"] if isinstance(c, dict)]
            answered = set()
            for following in messages[i + 1 :]:
                if not isinstance(following, dict) or following.get("role") != "tool":
                    break
                answered.add(str(following.get("tool_call_id")))
            missing = [x for x in ids if x not in answered]
            if missing:
                return (
                    "An assistant message with 'tool_calls' must be followed by tool messages responding to "
                    f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                    f"{', '.join(missing)}"
                )
        if message.get("role") == "tool":
            k = i - 1
            while k >= 0 and isinstance(messages[k], dict) and messages[k].get("role") == "tool":
                k -= 1
            before = messages[k] if k >= 0 else None
            assistant = isinstance(before, dict) and before.get("role") == "assistant"
            calls = before.get("tool_calls") if assistant and isinstance(before, dict) else None
            if not calls or str(message.get("tool_call_id")) not in {str(c.get("id")) for c in calls}:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'."
                )
    return None


def is_summary_request(body: Any) -> bool:
    """True for a request the project's summarizer sends (its system prompt starts with the marker)."""
    if not isinstance(body, Mapping):
        return False
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], Mapping):
        return False
    first = messages[0]
    return first.get("role") == "system" and is_summary_prompt(first.get("content"))


def _requested_tool(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The function to call: forced by ``tool_choice``, or named in the last (user) message."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools:
        return None
    functions = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    choice = body.get("tool_choice")
    if choice == "none" or not functions:
        return None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        return next((f for f in functions if f.get("name") == wanted), None)
    if choice == "required":
        return functions[0]
    last = body["messages"][-1] if body["messages"] else {}
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return next((f for f in functions if str(f.get("name")) in text), None)


async def _sse_events(
    completion_id: str, model: str, reply: Mapping[str, Any], usage: Mapping[str, int] | None
) -> AsyncIterator[bytes]:
    created = int(time.time())

    def chunk(delta: Mapping[str, Any], finish: str | None, *, choices: bool = True, **extra: Any) -> bytes:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            if choices
            else [],
            **extra,
        }
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": ""}, None)
    calls = reply.get("tool_calls")
    if reply.get("content"):
        for word in str(reply["content"]).split(" "):
            yield chunk({"content": word + " "}, None)
            await asyncio.sleep(0)
    if calls:
        for index, call in enumerate(calls):
            function = call["function"]
            head = {**call, "function": {"name": function["name"], "arguments": ""}}
            yield chunk({"tool_calls": [{"index": index, **head}]}, None)
            arguments = function["arguments"]
            for start in range(0, len(arguments), 8):
                piece = {"index": index, "function": {"arguments": arguments[start : start + 8]}}
                yield chunk({"tool_calls": [piece]}, None)
        finish = "tool_calls"
    else:
        finish = "stop"
    yield chunk({}, finish)
    if usage is not None:
        yield chunk({}, None, choices=False, usage=dict(usage))
    yield b"data: [DONE]\n\n"


# One server-in-a-thread helper for the demo and the tests alike.
serve_app = serve_in_thread


@contextmanager
def serve_proxy(upstream_url: str, **settings: Any) -> Iterator[str]:
    """ctxproxy on 127.0.0.1 in front of ``{upstream_url}/v1`` (the client's own key forwarded,
    warnings-only logs, ``settings`` overriding any of it); yields its URL, stops it after."""
    from app.main import create_app
    from app.settings import Settings

    options: dict[str, Any] = {
        "upstream_base_url": f"{upstream_url}/v1",
        "upstream_api_key": None,
        "log_level": "WARNING",
    }
    options.update(settings)
    with serve_app(create_app(Settings(**options))) as proxy_url:
        yield proxy_url


__all__ = [
    "DIALECTS",
    "Dialect",
    "FakeModel",
    "FakeUpstream",
    "RecordedRequest",
    "context_error",
    "is_summary_request",
    "serve_app",
    "serve_proxy",
]
