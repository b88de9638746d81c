"""A strict fake OpenAI Responses API upstream (``POST /v1/responses``), for e2e and integration tests.

One engine, two ways in: a real HTTP server (Starlette on uvicorn, 127.0.0.1, :meth:`serve`) for
e2e tests, and an httpx handler (:meth:`handler`, for ``httpx.MockTransport`` or a respx route) for
integration tests. It is strict where the real API is strict, with the real API's wordings:

* **pairing**: every ``function_call``/``custom_tool_call`` needs its output in ``input`` and
  every output its call (by ``call_id``); a 400 otherwise;
* **reasoning and compaction are sealed**: the fake issues ``encrypted_content`` as an HMAC of the
  item's id and summary under its own key; an edited, moved or forged one is a 400, and so is a
  reasoning item that is not followed by another item;
* **the window**: the prompt is counted with the proxy's own Responses accounting
  (``app.core.dialects.responses`` over tiktoken) times the model's ``counter_ratio``; a prompt
  over the window, or prompt plus ``max_output_tokens`` over it, gets OpenAI's
  ``context_length_exceeded`` 400 (or, with :attr:`overflow_in_stream`, a ``response.failed``
  event inside a 200 stream, as streamed responses can end);
* ``previous_response_id``: responses are stored (unless ``store: false``) and a request that names
  one is checked and counted with the stored history in front of its own input;
* a summary request (its ``instructions`` are the project's summary prompt) is answered by the
  extractive, capped summarizer of ``tests.fake_summarizer`` (no kinder than a real model), as
  one ``message`` item, counted in :attr:`summary_calls` (:attr:`summary_prompt_tokens`);
  :attr:`summary_mode` ``"missing"`` answers them 404, as a gateway without the route would;
* answers: a scripted :attr:`responder` (``body -> list of output specs``) or the default reply;
  specs are ``{"text": ...}``, ``{"call": name, "arguments": ...}``, ``{"reasoning": summary}``;
  a request whose last item is Codex's ``compaction_trigger`` is answered with one sealed
  ``compaction`` item (remote compaction v2), counted in :attr:`compactions`;
  ``stream: true`` gets the real event sequence (``response.created`` ... ``response.completed``).
* drip mode (served over HTTP, :attr:`drip_acks` set): event ``N + 1`` of a stream is sent only
  after the test sets ``drip_acks[N]`` on receiving event ``N`` (a buffering proxy would stall it;
  every wait that runs out is logged in :attr:`drip_timeouts`);
* ``POST /v1/responses/input_tokens`` answers the fake's count; ``GET /v1/models`` lists models.

Every request is recorded in :attr:`requests` (path, lower-case headers, raw body, status, count).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.core.dialects.responses import RESPONSES
from app.core.errors import InvalidRequest
from app.core.tokens import REPLY_PRIMING_TOKENS, MessageCounter
from app.tokenizer import counter_for
from tests.fake_summarizer import is_summary_prompt, prompt_text, summary_answer
from tests.fake_upstream import FakeModel, serve_app

DRIP_WAIT_S = 10.0
Responder = Callable[[Mapping[str, Any]], list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request the fake received."""

    path: str
    headers: Mapping[str, str]
    body: bytes
    status: int
    prompt_tokens: int | None = None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class Answer:
    """What the fake answers: status, content type and body bytes."""

    status: int
    body: bytes
    content_type: str = "application/json"
    frames: tuple[bytes, ...] = ()  # an event stream's frames, for the drip mode


def error_body(message: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def overflow_body() -> dict[str, Any]:
    """OpenAI's Responses API answer to an input over the window (verbatim wording)."""
    return error_body(
        "Your input exceeds the context window of this model. Please adjust your input and try again.",
        code="context_length_exceeded",
        param="input",
    )


class FakeResponsesUpstream:
    """The fake's state; serve it with :meth:`serve` or route httpx to :meth:`handler`."""

    def __init__(self, models: Iterable[FakeModel], *, key: bytes = b"fake-upstream-secret") -> None:
        self.models = {m.name: m for m in models}
        self.requests: list[Recorded] = []
        self.responder: Responder | None = None
        self.overflow_in_stream = False
        self.compactions = 0
        self.summary_calls = 0
        self.summary_prompt_tokens = 0
        self.summary_mode = "ok"
        self.summary_style = "prose"  # tests.fake_summarizer.STYLES
        self.drip_acks: list[threading.Event] | None = None
        self.drip_timeouts: list[int] = []
        self._key = key
        self._stored: dict[str, list[Any]] = {}
        self._counters: dict[str, MessageCounter] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/responses", self._route, methods=["POST"]),
                Route("/v1/responses/input_tokens", self._route, methods=["POST"]),
                Route("/v1/models", self._route, methods=["GET"]),
            ]
        )

    # ---- for tests -------------------------------------------------------------------------------

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Run on a free 127.0.0.1 port; yields the base URL (``http://127.0.0.1:PORT``)."""
        with serve_app(self.app, lifespan="off") as url:
            yield url

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The same answers as an httpx handler (``httpx.MockTransport(fake.handler)``)."""
        headers = {k.lower(): v for k, v in request.headers.items()}
        answer = self.answer(request.method, request.url.path, headers, request.read())
        return httpx.Response(
            answer.status, content=answer.body, headers={"content-type": answer.content_type}
        )

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.compactions = 0
            self.summary_calls = 0
            self.summary_prompt_tokens = 0

    def client_responses(self) -> list[Recorded]:
        """The ``/v1/responses`` requests that are not summary requests (the client's, forwarded)."""
        return [r for r in self.responses() if not is_summary_prompt(r.json().get("instructions"))]

    def responses(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path == "/v1/responses"]

    def seal(self, item_id: str, summary: Any) -> str:
        """The ``encrypted_content`` this fake issues for a reasoning/compaction item."""
        payload = json.dumps([item_id, summary], sort_keys=True, separators=(",", ":")).encode()
        mac = hmac.new(self._key, payload, hashlib.sha256).hexdigest()
        return base64.b64encode(payload).decode() + "." + mac + "~" * 64

    def prompt_tokens(self, model: FakeModel, body: Mapping[str, Any]) -> int:
        """The fake's count: the Responses accounting over tiktoken, times the model's ratio."""
        counter = self._counter(model.encoding)
        messages = RESPONSES.parse(body).messages
        tokens = (
            sum(counter.count_messages(messages))
            + REPLY_PRIMING_TOKENS
            + RESPONSES.tool_tokens(body, counter)
        )
        return math.ceil(tokens * model.counter_ratio)

    # ---- the engine ------------------------------------------------------------------------------

    def answer(self, method: str, path: str, headers: Mapping[str, str], raw: bytes) -> Answer:
        """The fake's answer to one request (recorded in :attr:`requests`)."""
        answer, prompt = self._answer(path, raw)
        with self._lock:
            self.requests.append(Recorded(path, dict(headers), raw, answer.status, prompt))
        return answer

    def _answer(self, path: str, raw: bytes) -> tuple[Answer, int | None]:
        if path == "/v1/models":
            data = [{"id": n, "object": "model", "created": 0, "owned_by": "fake"} for n in self.models]
            return _json(200, {"object": "list", "data": data}), None
        try:
            body = json.loads(raw)
        except ValueError:
            return _json(400, error_body("We could not parse the JSON body of your request.")), None
        if not isinstance(body, dict):
            return _json(400, error_body("The request body must be a JSON object.")), None
        model = self.models.get(str(body.get("model")))
        if model is None:
            message = f"The model `{body.get('model')}` does not exist or you do not have access to it."
            return _json(404, error_body(message, code="model_not_found", param="model")), None
        full, problem = self._history(body)
        if problem is not None:
            return _json(400, problem), None
        problem = self._strict(full)
        if problem is not None:
            return _json(400, problem), None
        try:
            prompt = self.prompt_tokens(model, full)
        except InvalidRequest as exc:
            return _json(400, error_body(exc.message, param=exc.param)), None
        if path.endswith("/input_tokens"):
            return _json(200, {"object": "response.input_tokens", "input_tokens": prompt}), prompt
        wanted = body.get("max_output_tokens")
        output = wanted if isinstance(wanted, int) else 0
        stream = body.get("stream") is True
        if is_summary_prompt(body.get("instructions")):
            with self._lock:
                self.summary_calls += 1
                self.summary_prompt_tokens += prompt
            if self.summary_mode == "missing":
                return _json(404, error_body("Not Found")), prompt
        if prompt > model.window_tokens or prompt + output > model.window_tokens:
            if stream and self.overflow_in_stream:
                return _sse(self._failed_events(body, model)), prompt
            return _json(400, overflow_body()), prompt
        response = self._response(body, model, full, prompt)
        if stream:
            return _sse(self._events(response)), prompt
        return _json(200, response), prompt

    def _history(self, body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """``body`` with a stored ``previous_response_id``'s history in front of its input."""
        previous = body.get("previous_response_id")
        if previous is None:
            return dict(body), None
        with self._lock:
            stored = self._stored.get(str(previous))
        if stored is None:
            message = f"Previous response with id '{previous}' not found."
            return dict(body), error_body(message, param="previous_response_id")
        own = body.get("input")
        own_items = [{"role": "user", "content": own}] if isinstance(own, str) else list(own or [])
        full = {k: v for k, v in body.items() if k != "previous_response_id"}
        full["input"] = [*stored, *own_items]
        return full, None

    def _strict(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The real API's refusals of a structurally broken input (its wordings)."""
        items = body.get("input")
        if not isinstance(items, list):
            return None
        calls = {i.get("call_id") for i in items if isinstance(i, dict) and i.get("type") in _CALLS}
        outputs = {i.get("call_id") for i in items if isinstance(i, dict) and i.get("type") in _OUTPUTS}
        for k, item in enumerate(items):
            kind = item.get("type") if isinstance(item, dict) else None
            if kind in _OUTPUTS and item.get("call_id") not in calls:
                return error_body(
                    f"No tool call found for function call output with call_id {item.get('call_id')}.",
                    param="input",
                )
            if kind in _CALLS and item.get("call_id") not in outputs:
                return error_body(
                    f"No tool output found for function call {item.get('call_id')}.", param="input"
                )
            if kind in ("reasoning", "compaction"):
                sealed = item.get("encrypted_content")
                if sealed is not None and sealed != self.seal(str(item.get("id")), item.get("summary")):
                    return error_body(
                        f"The encrypted content for item {item.get('id')} could not be verified.",
                        code="invalid_encrypted_content",
                        param=f"input[{k}]",
                    )
            if kind == "reasoning" and k + 1 >= len(items):
                return error_body(
                    f"Item '{item.get('id')}' of type 'reasoning' was provided without its required "
                    "following item.",
                    param="input",
                )
        return None

    # ---- answers ---------------------------------------------------------------------------------

    def _response(
        self, body: Mapping[str, Any], model: FakeModel, full: Mapping[str, Any], prompt: int
    ) -> dict[str, Any]:
        items = full.get("input")
        if (
            isinstance(items, list)
            and items
            and isinstance(items[-1], dict)
            and items[-1].get("type") == "compaction_trigger"
        ):
            specs: list[dict[str, Any]] = [{"compaction": True}]  # Codex's remote compaction (v2)
            self.compactions += 1
        elif is_summary_prompt(full.get("instructions")):
            items = full.get("input")
            text = "\n\n".join(
                prompt_text(i.get("content"))
                for i in (items if isinstance(items, list) else [])
                if isinstance(i, dict)
            )
            count_text = self._counter(model.encoding).counter.count_text
            cap = full.get("max_output_tokens")
            specs = [
                {
                    "text": summary_answer(
                        full.get("instructions"),
                        text,
                        cap_tokens=cap,
                        count_text=count_text,
                        style=self.summary_style,
                    )
                }
            ]
        elif self.responder is not None:
            specs = self.responder(full)
        else:
            specs = [{"text": _default_text(full, prompt)}]
        n = next(self._ids)
        output: list[dict[str, Any]] = []
        for k, spec in enumerate(specs):
            output.append(self._item(spec, f"{n}_{k}"))
        text = "".join(c["text"] for o in output if o["type"] == "message" for c in o["content"])
        counter = self._counter(model.encoding).counter
        produced = sum(counter.count_text(json.dumps(o)) for o in output if o["type"] != "message")
        out_tokens = counter.count_text(text) + produced
        response_id = f"resp_fake{n}"
        if body.get("store") is not False:
            items = full.get("input")
            history = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
            with self._lock:
                self._stored[response_id] = [*history, *output]
        return {
            "id": response_id,
            "object": "response",
            "created_at": 0,
            "status": "completed",
            "model": model.name,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + out_tokens,
            },
        }

    def _item(self, spec: Mapping[str, Any], suffix: str) -> dict[str, Any]:
        if "call" in spec:
            return {
                "type": "function_call",
                "id": f"fc_{suffix}",
                "call_id": f"call_{suffix}",
                "name": spec["call"],
                "arguments": spec.get("arguments", "{}"),
                "status": "completed",
            }
        if "compaction" in spec:
            item_id = f"cmp_{suffix}"
            return {"type": "compaction", "id": item_id, "encrypted_content": self.seal(item_id, None)}
        if "reasoning" in spec:
            summary = [{"type": "summary_text", "text": spec["reasoning"]}]
            item_id = f"rs_{suffix}"
            return {
                "type": "reasoning",
                "id": item_id,
                "summary": summary,
                "encrypted_content": self.seal(item_id, summary),
            }
        return {
            "type": "message",
            "id": f"msg_{suffix}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": spec.get("text", ""), "annotations": []}],
        }

    def _events(self, response: dict[str, Any]) -> list[dict[str, Any]]:
        head = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": head},
            {"type": "response.in_progress", "response": head},
        ]
        for index, item in enumerate(response["output"]):
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": _started(item)}
            )
            if item["type"] == "message":
                text = item["content"][0]["text"]
                base = {"item_id": item["id"], "output_index": index, "content_index": 0}
                empty = {"type": "output_text", "text": "", "annotations": []}
                events.append({"type": "response.content_part.added", **base, "part": empty})
                for start in range(0, len(text), 16):
                    piece = text[start : start + 16]
                    events.append(
                        {"type": "response.output_text.delta", **base, "delta": piece, "logprobs": []}
                    )
                events.append({"type": "response.output_text.done", **base, "text": text, "logprobs": []})
                events.append({"type": "response.content_part.done", **base, "part": item["content"][0]})
            elif item["type"] == "function_call":
                base = {"item_id": item["id"], "output_index": index}
                events.append(
                    {"type": "response.function_call_arguments.delta", **base, "delta": item["arguments"]}
                )
                events.append(
                    {"type": "response.function_call_arguments.done", **base, "arguments": item["arguments"]}
                )
            events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        events.append({"type": "response.completed", "response": response})
        return events

    def _failed_events(self, body: Mapping[str, Any], model: FakeModel) -> list[dict[str, Any]]:
        n = next(self._ids)
        head = {
            "id": f"resp_fake{n}",
            "object": "response",
            "created_at": 0,
            "model": model.name,
            "output": [],
        }
        failed = {**head, "status": "failed", "error": overflow_body()["error"], "usage": None}
        return [
            {"type": "response.created", "response": {**head, "status": "in_progress"}},
            {"type": "response.failed", "response": failed},
        ]

    def _counter(self, encoding: str) -> MessageCounter:
        with self._lock:
            counter = self._counters.get(encoding)
            if counter is None:
                counter = self._counters[encoding] = MessageCounter(counter_for(encoding))
            return counter

    async def _route(self, request: Request) -> Response:
        raw = await request.body()
        headers = {k.lower(): v for k, v in request.headers.items()}
        # Counting a large prompt is CPU work; the fake serves one test at a time, so inline is fine.
        answer = self.answer(request.method, request.url.path, headers, raw)
        acks = self.drip_acks
        if acks is None or not answer.frames:
            return Response(answer.body, status_code=answer.status, media_type=answer.content_type)

        async def drip() -> AsyncIterator[bytes]:
            for number, frame in enumerate(answer.frames):
                yield frame
                if number < len(acks) and not await asyncio.to_thread(acks[number].wait, DRIP_WAIT_S):
                    self.drip_timeouts.append(number)

        return StreamingResponse(drip(), status_code=answer.status, media_type=answer.content_type)


_CALLS = frozenset({"function_call", "custom_tool_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


def _started(item: Mapping[str, Any]) -> dict[str, Any]:
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return dict(item)


def _default_text(body: Mapping[str, Any], prompt: int) -> str:
    items = body.get("input")
    count = 1 if isinstance(items, str) else len(items or [])
    return f"fake reply to {count} input items ({prompt} tokens)"


def _json(status: int, value: Any) -> Answer:
    return Answer(status, json.dumps(value).encode())


def _sse(events: list[dict[str, Any]]) -> Answer:
    frames = []
    for number, event in enumerate(events):
        data = json.dumps({**event, "sequence_number": number})
        frames.append(f"event: {event['type']}\ndata: {data}\n\n".encode())
    return Answer(200, b"".join(frames), "text/event-stream", tuple(frames))
