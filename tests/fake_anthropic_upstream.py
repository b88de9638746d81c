"""A strict fake Anthropic Messages upstream: a real HTTP server for e2e, a respx handler for the rest.

It enforces what the real API enforces, and the stricter reading of it the proxy promises to keep
(each rule answers 400 ``invalid_request_error`` with Anthropic's own wording where it has one):

* the body's shape (``model``, ``max_tokens``, ``messages``), roles that alternate (a
  ``role: "system"`` message only right after a user message), the first message a user message;
* every ``tool_use`` answered by a ``tool_result`` in the very next message, results first in that
  message, no ``tool_result`` without its ``tool_use`` in the message just before;
* at most 4 ``cache_control`` breakpoints;
* **signed thinking**: every ``thinking`` block it emits is signed with an HMAC under a secret only
  it knows, over the thinking text *and* the tool results of the current tool loop that preceded
  it (their digests travel in the signature, so checking needs no state). A request is refused
  when a thinking block was edited (bad signature), or when, in the current tool loop, a tool result
  that a kept thinking block was bound to was changed (results that are gone with their call are
  fine: whole units may be dropped from the loop's oldest end). ``redacted_thinking`` data is
  signed the same way. With ``thinking`` enabled, the loop's last assistant message must start
  with a thinking block;
* the window: its own count (cl100k tokens of every text, ``FakeClaude.ratio`` times, 3 per
  message, ``IMAGE_TOKENS`` per image) against ``window_tokens``, refused with Anthropic's two
  wordings (``prompt is too long: N tokens > W maximum``; ``input length and `max_tokens` exceed
  context limit: N + K > W, ...``).

A summary request (its ``system`` is the project's summary prompt) is answered by the extractive,
capped summarizer of ``tests.fake_summarizer`` (no kinder than a real model), counted in
:attr:`FakeAnthropic.summary_calls`; it must carry ``anthropic-version`` (400 otherwise) and a key
(``x-api-key`` or ``Authorization``; 401 otherwise), as the real API requires.

Answers (``respond``): :attr:`FakeAnthropic.script` when set (a scripted model: its blocks), else
scripted tool loops (while the request has ``tools`` and the current loop has fewer than
``FakeClaude.loop_calls`` tool results, it calls the first tool of the client (never the proxy's
``ctx_recall``) with ``{"step": n}``; then a final
text repeating every ``FACT-...`` token it was sent, in order), optional thinking first (when the
body enables it), ``usage`` with ``input_tokens`` = its count, as JSON or real SSE
(``message_start``, ``ping``, ``content_block_start/delta/stop``, ``message_delta``,
``message_stop``). ``POST /v1/messages/count_tokens`` answers its count; ``HEAD /`` answers 200.
Every request is recorded in :attr:`FakeAnthropic.requests`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.demo import serve_in_thread
from app.tokenizer import counter_for
from tests.fake_summarizer import is_summary_prompt, prompt_text, summary_answer

IMAGE_TOKENS = 1600
MAX_BREAKPOINTS = 4
FACT_RE = re.compile(r"FACT-[\w-]+")


@dataclass(frozen=True, slots=True)
class FakeClaude:
    """One model the fake serves: its window, its tokenizer ratio, how many tool calls it makes."""

    name: str
    window_tokens: int = 200_000
    ratio: float = 1.0
    loop_calls: int = 0


@dataclass(frozen=True, slots=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int = 0

    def json(self) -> Any:
        return json.loads(self.body)


class Refused(Exception):
    """A request the fake refuses: ``status`` and Anthropic's error message."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def _digest(block: Mapping[str, Any]) -> str:
    """A tool result's digest: its id, content and error flag (not its cache marker)."""
    seen = {"id": block.get("tool_use_id"), "content": block.get("content"), "err": block.get("is_error")}
    return hashlib.sha256(_canonical(seen)).hexdigest()[:16]


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def loop_start(messages: Sequence[Mapping[str, Any]]) -> int:
    """The index after the newest user message with content other than tool results."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if message.get("role") == "user" and any(b.get("type") != "tool_result" for b in _blocks(message)):
            return i + 1
    return 0


def loop_results(messages: Sequence[Mapping[str, Any]], stop: int) -> dict[str, str]:
    """Digests of the tool results of the current tool loop in ``messages[:stop]``."""
    out: dict[str, str] = {}
    for message in messages[loop_start(messages[:stop]) : stop]:
        if message.get("role") == "user":
            for block in _blocks(message):
                if block.get("type") == "tool_result":
                    out[str(block.get("tool_use_id"))] = _digest(block)
    return out


class Signer:
    """Signs and checks thinking blocks with a secret only it knows."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _mac(self, text: str, payload: str) -> str:
        return hmac.new(self._secret, text.encode() + b"\x00" + payload.encode(), hashlib.sha256).hexdigest()

    def sign(self, thinking: str, bound: Mapping[str, str]) -> str:
        payload = base64.urlsafe_b64encode(_canonical(dict(bound))).decode()
        return f"{payload}.{self._mac(thinking, payload)}"

    def redacted(self, hidden: str) -> str:
        payload = base64.urlsafe_b64encode(hidden.encode()).decode()
        return f"{payload}.{self._mac('redacted', payload)}"

    def bound(self, block: Mapping[str, Any]) -> dict[str, str] | None:
        """The tool-result digests a thinking block is bound to, or None when it is not genuine."""
        if block.get("type") == "redacted_thinking":
            payload, _, mac = str(block.get("data", "")).partition(".")
            return {} if hmac.compare_digest(mac, self._mac("redacted", payload)) else None
        payload, _, mac = str(block.get("signature", "")).partition(".")
        if not hmac.compare_digest(mac, self._mac(str(block.get("thinking", "")), payload)):
            return None
        try:
            value = json.loads(base64.urlsafe_b64decode(payload.encode()))
        except ValueError:
            return None
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


def check_structure(body: Mapping[str, Any], signer: Signer) -> None:
    """Raise :class:`Refused` for the first rule ``body`` breaks (see the module docstring)."""
    if not isinstance(body.get("model"), str):
        raise Refused("model: Field required")
    if type(body.get("max_tokens")) is not int or body["max_tokens"] < 1:
        raise Refused("max_tokens: Field required")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused("messages: Field required")
    previous: str | None = None
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        if role not in ("user", "assistant", "system"):
            raise Refused(f"messages.{i}.role: Input should be 'user', 'assistant' or 'system'")
        if role == "system":
            if previous != "user":
                raise Refused(f"messages.{i}: a system message must immediately follow a user message")
            continue
        if previous is None and role != "user":
            raise Refused('messages: first message must use the "user" role')
        if i and messages[i - 1].get("role") == role:
            raise Refused(
                f'messages: roles must alternate between "user" and "assistant", but found multiple "{role}" '
                "roles in a row"
            )
        previous = role
        blocks = _blocks(message)
        if role == "user":
            asked = set()
            if i and messages[i - 1].get("role") == "assistant":
                asked = {str(b.get("id")) for b in _blocks(messages[i - 1]) if b.get("type") == "tool_use"}
            other = False
            for k, block in enumerate(blocks):
                if block.get("type") != "tool_result":
                    other = True
                    continue
                if other:
                    raise Refused(
                        f"messages.{i}.content.{k}: tool_result blocks must come first in the message"
                    )
                if str(block.get("tool_use_id")) not in asked:
                    raise Refused(
                        f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{block.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )
        else:
            ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            following = messages[i + 1] if i + 1 < len(messages) else None
            answered = (
                {str(b.get("tool_use_id")) for b in _blocks(following) if b.get("type") == "tool_result"}
                if isinstance(following, Mapping) and following.get("role") == "user"
                else set()
            )
            missing = [x for x in ids if x not in answered]
            if missing and following is not None:
                raise Refused(
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately "
                    f"after: {', '.join(missing)}. Each `tool_use` block must have a corresponding "
                    "`tool_result` block in the next message."
                )
    _check_thinking(body, messages, signer)
    markers = _count_markers(body)
    if markers > MAX_BREAKPOINTS:
        raise Refused(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {markers}."
        )


def _check_thinking(body: Mapping[str, Any], messages: list[Any], signer: Signer) -> None:
    start = loop_start(messages)
    current = loop_results(messages, len(messages))
    for i, message in enumerate(messages):
        for k, block in enumerate(_blocks(message)):
            if block.get("type") not in ("thinking", "redacted_thinking"):
                continue
            bound = signer.bound(block)
            if bound is None:
                raise Refused(f"messages.{i}.content.{k}: Invalid `signature` in `thinking` block")
            if i < start:
                continue
            for call_id, digest in bound.items():
                if call_id in current and current[call_id] != digest:
                    raise Refused(
                        f"messages.{i}.content.{k}: the conversation before this thinking block was changed "
                        f"(tool result {call_id})"
                    )
    thinking = body.get("thinking")
    enabled = isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")
    assistants = [i for i in range(start, len(messages)) if messages[i].get("role") == "assistant"]
    if enabled and assistants:
        last = _blocks(messages[assistants[-1]])
        if last and last[0].get("type") not in ("thinking", "redacted_thinking"):
            raise Refused(
                f"messages.{assistants[-1]}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
                f"found `{last[0].get('type')}`. When `thinking` is enabled, a final `assistant` message "
                "must start with a thinking block."
            )


def _count_markers(body: Mapping[str, Any]) -> int:
    def count(value: Any) -> int:
        if isinstance(value, list):
            return sum(count(v) for v in value)
        if isinstance(value, Mapping):
            own = 1 if "cache_control" in value else 0
            return own + count(value.get("content")) if value.get("type") == "tool_result" else own
        return 0

    tools = body.get("tools") or []
    system = body.get("system")
    return (
        sum("cache_control" in t for t in tools if isinstance(t, Mapping))
        + (count(system) if isinstance(system, list) else 0)
        + sum(count(m.get("content")) for m in body.get("messages") or [] if isinstance(m, Mapping))
    )


def _texts(value: Any) -> Iterator[str]:
    """Every prompt string of a body part (not signatures, ids, base64 data or cache markers)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key in ("signature", "data", "cache_control", "type", "id", "tool_use_id", "media_type"):
                continue
            yield from _texts(item)


@dataclass
class FakeAnthropic:
    """The fake's state and app; ``serve()`` runs it on 127.0.0.1, ``handler`` serves respx."""

    models: Sequence[FakeClaude]
    signer: Signer = field(default_factory=Signer)
    requests: list[Recorded] = field(default_factory=list)
    # A scripted model: the reply's blocks (thinking is added in front when enabled), or None for
    # the default behaviour.
    script: Callable[[Mapping[str, Any]], list[dict[str, Any]] | None] | None = None
    summary_calls: int = 0
    summary_style: str = "prose"  # tests.fake_summarizer.STYLES
    summary_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self._by_name = {m.name: m for m in self.models}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._encoding = counter_for("cl100k_base")
        self.app = Starlette(
            routes=[
                Route("/v1/messages", self._http, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._http, methods=["POST"]),
                Route("/", self._head, methods=["HEAD", "GET"]),
            ]
        )

    # ---- counting and answering (pure apart from the record) ---------------------------------

    def model(self, name: object) -> FakeClaude:
        model = self._by_name.get(str(name))
        if model is None:
            raise Refused(f"model: {name}", status=404)
        return model

    def count(self, body: Mapping[str, Any]) -> int:
        """The fake's own count of ``body``'s prompt (see the module docstring)."""
        model = self.model(body.get("model"))
        messages = [m for m in body.get("messages") or [] if isinstance(m, Mapping)]
        text = "\n".join(_texts([body.get("system"), body.get("tools"), messages]))
        images = json.dumps(messages).count('"type": "image"') + json.dumps(body.get("system")).count(
            '"type": "image"'
        )
        raw = self._encoding.count_text(text) + 3 * len(messages) + IMAGE_TOKENS * images
        return int(raw * model.ratio + 0.999)

    def respond(self, path: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any] | list[bytes]]:
        """``(status, JSON)`` or ``(200, SSE chunks)`` for one request."""
        try:
            if not isinstance(body, Mapping):
                raise Refused("The request body is not valid JSON.")
            model = self.model(body.get("model"))
            if path.endswith("/count_tokens"):
                return 200, {"input_tokens": self.count({**body, "max_tokens": 1})}
            check_structure(body, self.signer)
            tokens = self.count(body)
            if tokens > model.window_tokens:
                raise Refused(f"prompt is too long: {tokens} tokens > {model.window_tokens} maximum")
            if tokens + body["max_tokens"] > model.window_tokens:
                raise Refused(
                    f"input length and `max_tokens` exceed context limit: {tokens} + {body['max_tokens']} > "
                    f"{model.window_tokens}, decrease input length or `max_tokens` and try again"
                )
        except Refused as refused:
            kind = "not_found_error" if refused.status == 404 else "invalid_request_error"
            return refused.status, error_body(refused.message, kind)
        message = self._message(model, body, tokens)
        if body.get("stream") is True:
            return 200, list(sse_events(message))
        return 200, message

    def _message(self, model: FakeClaude, body: Mapping[str, Any], tokens: int) -> dict[str, Any]:
        messages = body["messages"]
        start = loop_start(messages)
        # The calls it made in this loop: the highest step it asked for (a proxy may have dropped
        # the loop's oldest calls, never its newest).
        results = max(
            (
                int(b["input"]["step"])
                for m in messages[start:]
                if m.get("role") == "assistant"
                for b in _blocks(m)
                if b.get("type") == "tool_use"
                and isinstance(b.get("input"), Mapping)
                and type(b["input"].get("step")) is int
            ),
            default=0,
        )
        content: list[dict[str, Any]] = []
        summary = summary_answer(
            body.get("system"),
            "\n\n".join(prompt_text(m.get("content")) for m in messages if isinstance(m, Mapping)),
            cap_tokens=body.get("max_tokens"),
            count_text=self._encoding.count_text,
            style=self.summary_style,
        )
        if summary is not None:
            with self._lock:
                self.summary_calls += 1
                self.summary_prompt_tokens += tokens
            return self._answer(model, [{"type": "text", "text": summary}], "end_turn", tokens)
        thinking = body.get("thinking")
        if isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive"):
            text = f"Thinking about step {results} of this loop."
            signature = self.signer.sign(text, loop_results(messages, len(messages)))
            content.append({"type": "thinking", "thinking": text, "signature": signature})
        # The client's tools: a model with nothing to fetch back does not call the proxy's ctx_recall.
        tools = [
            t for t in body.get("tools") or [] if isinstance(t, Mapping) and t.get("name") != "ctx_recall"
        ]
        n = next(self._ids)
        scripted = self.script(body) if self.script is not None else None
        if scripted is not None:
            content += scripted
            stop = "tool_use" if any(b.get("type") == "tool_use" for b in scripted) else "end_turn"
        elif tools and results < model.loop_calls:
            content.append({"type": "text", "text": f"Calling step {results + 1}."})
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_{n:06d}",
                    "name": tools[0]["name"],
                    "input": {"step": results + 1},
                }
            )
            stop = "tool_use"
        else:
            facts = list(dict.fromkeys(FACT_RE.findall("\n".join(_texts([body.get("system"), messages])))))
            content.append({"type": "text", "text": "Done. " + " ".join(facts)})
            stop = "end_turn"
        return self._answer(model, content, stop, tokens, n=n)

    def _answer(
        self,
        model: FakeClaude,
        content: list[dict[str, Any]],
        stop: str,
        tokens: int,
        *,
        n: int | None = None,
    ) -> dict[str, Any]:
        n = next(self._ids) if n is None else n
        return {
            "id": f"msg_{n:06d}",
            "type": "message",
            "role": "assistant",
            "model": model.name,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 10,
            },
        }

    def client_requests(self) -> list[Recorded]:
        """The ``/v1/messages`` requests that are not summary requests (the client's, forwarded)."""
        return [r for r in self.message_requests() if not is_summary_prompt(r.json().get("system"))]

    # ---- transports -------------------------------------------------------------------------

    def _record(self, path: str, headers: Mapping[str, str], raw: bytes, status: int) -> None:
        with self._lock:
            self.requests.append(Recorded(path, dict(headers), raw, status))

    def message_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path == "/v1/messages"]

    def _decode(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError:
            return None

    def _answer_with_headers(
        self, path: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, dict[str, Any] | list[bytes]]:
        body = self._decode(raw)
        if isinstance(body, Mapping) and is_summary_prompt(body.get("system")):
            lower = {k.lower() for k in headers}
            if "anthropic-version" not in lower:
                return 400, error_body("anthropic-version: header is required")
            if not lower & {"x-api-key", "authorization"}:
                return 401, error_body("x-api-key header is required", "authentication_error")
        return self.respond(path, body)

    async def _http(self, request: Request) -> Response:
        raw = await request.body()
        status, answer = self._answer_with_headers(request.url.path, request.headers, raw)
        self._record(request.url.path, request.headers, raw, status)
        if isinstance(answer, list):
            return StreamingResponse(_aiter(answer), media_type="text/event-stream")
        return JSONResponse(answer, status_code=status)

    async def _head(self, request: Request) -> Response:
        return Response(status_code=200)

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The same answers for ``respx``/``httpx.MockTransport``."""
        raw = request.read()
        status, answer = self._answer_with_headers(request.url.path, request.headers, raw)
        self._record(request.url.path, request.headers, raw, status)
        if isinstance(answer, list):
            return httpx.Response(
                200, content=b"".join(answer), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(status, json=answer)

    @contextmanager
    def serve(self) -> Iterator[str]:
        with serve_in_thread(self.app) as url:
            yield url


async def _aiter(chunks: list[bytes]) -> Any:
    for chunk in chunks:
        yield chunk


def _event(name: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def sse_events(message: Mapping[str, Any]) -> Iterator[bytes]:
    """``message`` as Anthropic's stream of server-sent events."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event("ping", {"type": "ping"})
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "text":
            yield _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                },
            )
            delta = {"type": "text_delta", "text": block["text"]}
            yield _event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
        elif kind == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            yield _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
            )
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
            yield _event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
            delta = {"type": "signature_delta", "signature": block["signature"]}
            yield _event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
        else:  # tool_use
            empty = {**block, "input": {}}
            yield _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": empty}
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            yield _event(
                "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
            )
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    yield _event(
        "message_delta",
        {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage["output_tokens"]}},
    )
    yield _event("message_stop", {"type": "message_stop"})
