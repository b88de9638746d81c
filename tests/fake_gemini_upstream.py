"""A strict fake Gemini API upstream (``generativelanguage.googleapis.com``): a real HTTP server
for e2e tests, an httpx handler for the rest.

Routes (under ``/v1beta`` and ``/v1``, the key in ``x-goog-api-key`` or ``?key=``):
``POST models/{model}:generateContent``, ``:streamGenerateContent`` (``?alt=sse``: ``data: {...}``
frames ended by CRLF CRLF, no ``[DONE]``; without it: one JSON array streamed element by
element), ``:countTokens`` (``{"totalTokens": N}``), ``GET models`` and ``GET models/{model}``
(``inputTokenLimit``, ``outputTokenLimit``). Errors have Google's shape ``{"error": {"code",
"message", "status"}}`` (a JSON array of it on the array stream), with the real API's wordings.

It refuses (400 ``INVALID_ARGUMENT``) what the real API refuses, and the stricter reading the proxy
promises to keep. Its checks are its own code, not the dialect's:

* ``contents`` present, every content with parts and a role of ``user``/``model`` (or none);
  the first content is a user content and roles alternate;
* every function call of a model content is answered by the next content's function responses,
  as many as there are calls, by ``id`` when both carry one, else by name in order; a function
  response needs the call right before it;
* unless ``FakeGeminiModel.parts_after_responses``: no other part (text, media) after the function
  responses of a user content: "Requests ending with a model turn are not supported." (Gemini 3 on
  Vertex and Gemini 3 Flash refuse it: google/oss-rebuild PR #1559, MoonshotAI/kimi-code #3274,
  router-for-me/CLIProxyAPI #5607; a text *before* them is accepted by every model);
* **signatures**: every part it emits that the model "thought" about is signed with an HMAC under a
  secret only it knows, over the model's name and the part's own content (a call's name and
  args, a text and its thought flag); every ``thoughtSignature`` it receives must verify (an
  edited part, a forged or moved signature, one from another model: "Corrupted thought
  signature."), except Google's documented placeholders (``skip_thought_signature_validator``),
  which gemini-cli itself sends; with ``FakeGeminiModel.requires_signatures`` (Gemini 3's rule)
  the first function call of every model content of the current turn must be signed;
* the window: its own count (below) over ``input_token_limit`` is refused with Gemini's wording
  ``The input token count (N) exceeds the maximum number of tokens allowed (M).``; the output
  cap is not counted against it; ``maxOutputTokens`` over ``output_token_limit`` is refused.

Its tokenizer is one the proxy cannot know: a quarter of the characters of every string the
model reads (texts, call names and args, function responses as JSON, the system instruction, the
tool declarations as JSON), 4 per content, ``IMAGE_TOKENS`` per image, signatures at a quarter of
their length, all times ``FakeGeminiModel.ratio``. ``FakeGeminiModel.text_tokens`` replaces the
quarter of the characters of those strings (a benchmark's model whose tokenizer is the proxy's
own, for rows counted exactly); signatures keep their price.

Answers: a summary request (its ``systemInstruction`` is the project's summary prompt,
``app.compaction.prompts.SYSTEM_MARKER``) is answered by the extractive, capped summarizer of
``tests.fake_summarizer`` (no kinder than a real model: it knows nothing of what a test plants),
capped by its ``generationConfig.maxOutputTokens`` counted with the fake's own tokenizer, in
Gemini's answer shape, after the same checks as any request (a key, the structure, the window);
it is counted in :attr:`FakeGemini.summary_calls` (its prompt in
:attr:`FakeGemini.summary_prompt_tokens`), and :attr:`FakeGemini.summary_mode` ``"missing"``
answers it 404 as a gateway without the route would. Any other request: :attr:`FakeGemini.script`
(``body -> parts`` or None) when set, else a text answer naming every ``FACT-...`` token of its
input (the system instruction and the contents: tool results and the proxy's summaries included,
nothing it was not sent). :class:`Reader` is a scripted model that reads files one per step with
gemini-cli's ``read_file`` tool and then answers with the facts it can still see in its input: it
never restates what it read in its own messages. Every answer carries ``usageMetadata`` with
``promptTokenCount`` = its count (on every stream chunk). Every request is recorded in
:attr:`FakeGemini.requests`; :meth:`FakeGemini.client_requests` are the generate requests that are
not summary requests (what the client's calls were forwarded as), :meth:`summary_requests` the rest.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import itertools
import json
import math
import re
import secrets
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from app.demo import serve_in_thread
from tests.fake_summarizer import is_summary_prompt, prompt_text, summary_answer

FACT_RE = re.compile(r"FACT-[\w-]+")
IMAGE_TOKENS = 1120
CHARS_PER_TOKEN = 4
CONTENT_TOKENS = 4
PLACEHOLDER_SIGNATURES = frozenset(
    {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}
)
CORRUPTED = "Corrupted thought signature."
ALTERNATE = "Please ensure that multiturn requests alternate between user and model."
CALL_AFTER = (
    "Please ensure that function call turn comes immediately after a user turn or after a function "
    "response turn."
)
RESPONSE_AFTER = "Please ensure that function response turn comes immediately after a function call turn."
MODEL_TURN = "Requests ending with a model turn are not supported."
SAME_COUNT = (
    "Please ensure that the number of function response parts is equal to the number of function call "
    "parts of the function call turn."
)
Script = Callable[[Mapping[str, Any]], list[dict[str, Any]] | None]


@dataclass(frozen=True, slots=True)
class FakeGeminiModel:
    """One model the fake serves."""

    name: str
    input_token_limit: int = 1_048_576
    output_token_limit: int = 65_536
    ratio: float = 1.0
    requires_signatures: bool = True
    thinking: bool = True  # signs what it emits (Gemini 2.5/3 with thinking)
    parts_after_responses: bool = False  # True: a part after a content's function responses passes
    text_tokens: Callable[[str], float] | None = None  # a string's tokens (None: a quarter of its length)

    def tokens_of(self, text: str) -> float:
        return self.text_tokens(text) if self.text_tokens is not None else len(text) / CHARS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes
    status: int
    prompt_tokens: int | None = None

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def api_key(self) -> str | None:
        keys = parse_qs(self.query).get("key")
        return self.headers.get("x-goog-api-key") or (keys[0] if keys else None)


class Refused(Exception):
    """A request the fake refuses, with Google's status code and message."""

    def __init__(self, message: str, *, status: int = 400, reason: str = "INVALID_ARGUMENT") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


def error_body(refused: Refused) -> dict[str, Any]:
    return {"error": {"code": refused.status, "message": refused.message, "status": refused.reason}}


def _get(mapping: Mapping[str, Any], camel: str) -> Any:
    if camel in mapping:
        return mapping[camel]
    return mapping.get(re.sub(r"([A-Z])", r"_\1", camel).lower())


def _parts(content: Any) -> list[Any]:
    parts = content.get("parts") if isinstance(content, Mapping) else None
    return parts if isinstance(parts, list) else []


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


class Signer:
    """Signs and checks thought signatures with a secret only it knows."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    @staticmethod
    def payload(part: Mapping[str, Any]) -> Any:
        """What a signature covers: the model's own content of the part (not ids clients add)."""
        call = _get(part, "functionCall")
        if isinstance(call, Mapping):
            return {"call": call.get("name"), "args": call.get("args") or {}}
        if isinstance(part.get("text"), str):
            return {"text": part["text"], "thought": part.get("thought") is True}
        return {k: v for k, v in part.items() if k not in ("thoughtSignature", "thought_signature")}

    def _mac(self, model: str, part: Mapping[str, Any]) -> bytes:
        payload = model.encode() + b"\x00" + _canonical(self.payload(part))
        return hmac.new(self._secret, payload, hashlib.sha256).digest()

    def sign(self, model: str, part: Mapping[str, Any]) -> str:
        """A signature as Gemini sends one: base64 bytes (the SDKs decode and re-encode them)."""
        return base64.b64encode(self._mac(model, part)).decode()

    def verify(self, model: str, part: Mapping[str, Any], signature: object) -> bool:
        if signature in PLACEHOLDER_SIGNATURES:
            return True
        if not isinstance(signature, str):
            return False
        text = signature.replace("-", "+").replace("_", "/").rstrip("=")
        try:  # either base64 alphabet, any padding: the bytes are what is signed
            raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(raw, self._mac(model, part))


def _calls(parts: Sequence[Any]) -> list[tuple[int, str, str | None]]:
    out = []
    for k, part in enumerate(parts):
        call = _get(part, "functionCall") if isinstance(part, Mapping) else None
        if isinstance(call, Mapping):
            out.append((k, str(call.get("name")), call.get("id") or None))
    return out


def _responses(parts: Sequence[Any]) -> list[tuple[int, str, str | None]]:
    out = []
    for k, part in enumerate(parts):
        response = _get(part, "functionResponse") if isinstance(part, Mapping) else None
        if isinstance(response, Mapping):
            out.append((k, str(response.get("name")), response.get("id") or None))
    return out


def _answers(calls: list[tuple[int, str, str | None]], responses: list[tuple[int, str, str | None]]) -> bool:
    """Every call answered by exactly one response: by id when both have one, else name in order."""
    if len(calls) != len(responses):
        return False
    open_calls = list(calls)
    for _, name, rid in responses:
        match = next((c for c in open_calls if rid is not None and c[2] == rid), None)
        if match is None:
            match = next((c for c in open_calls if c[1] == name and (c[2] is None or rid is None)), None)
        if match is None:
            return False
        open_calls.remove(match)
    return True


def turn_start(contents: Sequence[Any]) -> int:
    """The newest user content with text and no function response (where the current turn starts)."""
    for i in range(len(contents) - 1, -1, -1):
        content = contents[i]
        parts = _parts(content)
        role = content.get("role") if isinstance(content, Mapping) else None
        has_text = any(isinstance(p, Mapping) and isinstance(p.get("text"), str) for p in parts)
        if role != "model" and has_text and not _responses(parts):
            return i
    return 0


def check_structure(body: Mapping[str, Any], model: FakeGeminiModel, signer: Signer) -> None:
    """Raise :class:`Refused` for the first rule ``body`` breaks (see the module docstring)."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise Refused("* GenerateContentRequest.contents: contents is not specified\n")
    roles: list[str] = []
    for i, content in enumerate(contents):
        if not isinstance(content, Mapping) or content.get("role") not in (None, "user", "model"):
            raise Refused("Please use a valid role: user, model.")
        if not _parts(content):
            raise Refused(
                f"* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty.\n"
            )
        roles.append("model" if content.get("role") == "model" else "user")
    for i, content in enumerate(contents):
        parts = _parts(content)
        calls = _calls(parts) if roles[i] == "model" else []
        if i == 0 and roles[0] == "model":
            raise Refused(CALL_AFTER if calls else ALTERNATE)
        if i and roles[i] == roles[i - 1]:
            raise Refused(ALTERNATE)
        if calls and i + 1 < len(contents):
            following = _responses(_parts(contents[i + 1]))
            if roles[i + 1] != "user" or not _answers(calls, following):
                raise Refused(SAME_COUNT)
        responses = _responses(parts) if roles[i] == "user" else []
        if responses and (i == 0 or roles[i - 1] != "model" or not _calls(_parts(contents[i - 1]))):
            raise Refused(RESPONSE_AFTER)
        after = parts[responses[0][0] :] if responses and not model.parts_after_responses else []
        if any(isinstance(p, Mapping) and _get(p, "functionResponse") is None for p in after):
            raise Refused(MODEL_TURN)
        for k, part in enumerate(parts):
            if not isinstance(part, Mapping):
                raise Refused(f"* GenerateContentRequest.contents[{i}].parts[{k}]: part is not an object\n")
            signature = _get(part, "thoughtSignature")
            if signature is not None and not signer.verify(model.name, part, signature):
                raise Refused(CORRUPTED)
    if model.requires_signatures:
        for i in range(turn_start(contents), len(contents)):
            calls = _calls(_parts(contents[i])) if roles[i] == "model" else []
            if calls and not _get(_parts(contents[i])[calls[0][0]], "thoughtSignature"):
                k, name, _ = calls[0]
                raise Refused(
                    "Function call is missing a thought_signature in functionCall parts. This is required "
                    "for tools to work correctly, and missing thought_signature may lead to degraded "
                    f"model performance. Additional data, function call `default_api:{name}`, position "
                    f"{k + 1}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures "
                    "for more details."
                )


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)


def _part_tokens(part: Any, text: Callable[[str], float]) -> float:
    if not isinstance(part, Mapping):
        return 0.0
    tokens = 0.0
    signature = _get(part, "thoughtSignature")
    if isinstance(signature, str):
        tokens += len(signature) / CHARS_PER_TOKEN
    if isinstance(part.get("text"), str):
        return tokens + text(part["text"])
    if _get(part, "inlineData") is not None or _get(part, "fileData") is not None:
        return tokens + IMAGE_TOKENS
    call = _get(part, "functionCall")
    if isinstance(call, Mapping):
        seen = str(call.get("name")) + json.dumps(call.get("args") or {})
        return tokens + 3 + text(seen)
    response = _get(part, "functionResponse")
    if isinstance(response, Mapping):
        seen = str(response.get("name")) + json.dumps(response.get("response"))
        nested = response.get("parts")
        extra = sum(_part_tokens(p, text) for p in nested) if isinstance(nested, list) else 0.0
        return tokens + 3 + text(seen) + extra
    return tokens + sum(text(s) for s in _strings(part))


class Reader:
    """A scripted model: reads ``paths`` in order with ``read_file`` (one call per step), then answers
    with the ``FACT-...`` tokens it can still see in its input. It never restates what it read."""

    def __init__(self, paths: Sequence[str], *, tool: str = "read_file", argument: str = "file_path") -> None:
        self.paths = [str(p) for p in paths]
        self.tool = tool
        self.argument = argument

    def __call__(self, body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        tools = {
            str(d.get("name"))
            for t in body.get("tools") or []
            if isinstance(t, Mapping)
            for d in _get(t, "functionDeclarations") or []
            if isinstance(d, Mapping)
        }
        if self.tool not in tools:
            return None  # a side request (a check): the default answer
        contents = body.get("contents") or []
        # The files it asked for: the newest call tells (a proxy may drop the oldest ones).
        asked = [
            self.paths.index(call["args"][self.argument])
            for content in contents[turn_start(contents) :]
            for part in _parts(content)
            if isinstance(part, Mapping)
            for call in [_get(part, "functionCall")]
            if isinstance(call, Mapping)
            and call.get("name") == self.tool
            and isinstance(call.get("args"), Mapping)
            and call["args"].get(self.argument) in self.paths
        ]
        reads = max(asked) + 1 if asked else 0
        if reads >= len(self.paths):
            return None  # done: the default answer names the facts it can still see
        return [{"functionCall": {"name": self.tool, "args": {self.argument: self.paths[reads]}}}]


@dataclass
class FakeGemini:
    """The fake's state and app; ``serve()`` runs it on 127.0.0.1, ``handler`` serves httpx."""

    models: Sequence[FakeGeminiModel]
    signer: Signer = field(default_factory=Signer)
    script: Script | None = None
    api_key: str | None = None  # when set, any other key is refused
    requests: list[Recorded] = field(default_factory=list)
    summary_calls: int = 0
    summary_prompt_tokens: int = 0
    summary_mode: str = "ok"  # "missing": summary requests answered 404
    summary_style: str = "prose"  # tests.fake_summarizer.STYLES

    def __post_init__(self) -> None:
        self._by_name = {m.name: m for m in self.models}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.app = Starlette(
            routes=[Route("/{version}/models{rest:path}", self._http, methods=["GET", "POST"])]
        )

    # ---- counting and answering (pure apart from the record) ---------------------------------

    def model(self, name: str) -> FakeGeminiModel:
        model = self._by_name.get(name.removeprefix("models/"))
        if model is None:
            raise Refused(
                f"models/{name} is not found for API version v1beta, or is not supported for "
                "generateContent. Call ListModels to see the list of available models and their "
                "supported methods.",
                status=404,
                reason="NOT_FOUND",
            )
        return model

    def count(self, body: Mapping[str, Any], model: FakeGeminiModel) -> int:
        """The fake's own count of ``body``'s prompt (see the module docstring)."""
        raw = 0.0
        text = model.tokens_of
        system = _get(body, "systemInstruction")
        for part in _parts(system):
            raw += _part_tokens(part, text)
        for content in body.get("contents") or []:
            raw += CONTENT_TOKENS + sum(_part_tokens(p, text) for p in _parts(content))
        tools = body.get("tools")
        if tools:
            raw += text(json.dumps(tools))
        return math.ceil(raw * model.ratio)

    def _model_json(self, model: FakeGeminiModel) -> dict[str, Any]:
        return {
            "name": f"models/{model.name}",
            "version": "001",
            "displayName": model.name,
            "inputTokenLimit": model.input_token_limit,
            "outputTokenLimit": model.output_token_limit,
            "supportedGenerationMethods": ["generateContent", "countTokens"],
            "thinking": model.thinking,
        }

    def respond(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """``(status, JSON)`` or ``(200, list of chunk dicts)`` for a stream; ``path`` is what
        follows ``/{version}/models``."""
        try:
            if method == "GET":
                if path in ("", "/"):
                    return 200, {"models": [self._model_json(m) for m in self.models]}
                return 200, self._model_json(self.model(path.lstrip("/")))
            name, _, verb = path.lstrip("/").rpartition(":")
            model = self.model(name)
            if not isinstance(body, Mapping):
                raise Refused("Invalid JSON payload received.")
            if verb == "countTokens":
                inner = _get(body, "generateContentRequest")
                counted = inner if isinstance(inner, Mapping) else body
                tokens = self.count(counted, model)
                return 200, {
                    "totalTokens": tokens,
                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}],
                }
            if verb not in ("generateContent", "streamGenerateContent"):
                raise Refused(f"Method not found: {verb}", status=404, reason="NOT_FOUND")
            check_structure(body, model, self.signer)
            config = _get(body, "generationConfig") or {}
            cap = _get(config, "maxOutputTokens") if isinstance(config, Mapping) else None
            if isinstance(cap, int) and cap > model.output_token_limit:
                raise Refused(
                    f"Unable to submit request because it has a maxOutputTokens value of {cap} but the "
                    f"supported range is from 1 (inclusive) to {model.output_token_limit + 1} (exclusive). "
                    "Update the value and try again."
                )
            tokens = self.count(body, model)
            if tokens > model.input_token_limit:
                raise Refused(
                    f"The input token count ({tokens}) exceeds the maximum number of tokens allowed "
                    f"({model.input_token_limit})."
                )
            summary = self._summary(model, body, tokens)
        except Refused as refused:
            return refused.status, error_body(refused)
        chunks = self._answer(model, body, tokens, summary)
        if verb == "streamGenerateContent":
            return 200, chunks
        merged = [p for chunk in chunks for p in chunk["candidates"][0]["content"]["parts"]]
        answer = chunks[-1]
        answer["candidates"][0]["content"]["parts"] = merged
        return 200, answer

    def _summary(
        self, model: FakeGeminiModel, body: Mapping[str, Any], tokens: int
    ) -> list[dict[str, Any]] | None:
        """The answer's parts for a summary request (see the module docstring), else None."""
        if not is_summary(body):
            return None
        with self._lock:
            self.summary_calls += 1
            self.summary_prompt_tokens += tokens
        if self.summary_mode == "missing":
            raise Refused("Not found", status=404, reason="NOT_FOUND")
        config = _get(body, "generationConfig") or {}
        cap = _get(config, "maxOutputTokens") if isinstance(config, Mapping) else None
        contents = [c for c in body.get("contents") or [] if isinstance(c, Mapping)]
        text = summary_answer(
            _parts(_get(body, "systemInstruction")),
            "\n\n".join(prompt_text(_parts(c)) for c in contents),
            cap_tokens=cap,
            count_text=lambda s: math.ceil(model.tokens_of(s) * model.ratio),
            style=self.summary_style,
        )
        return [{"text": text or ""}]

    def _answer(
        self,
        model: FakeGeminiModel,
        body: Mapping[str, Any],
        tokens: int,
        scripted: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """The answer as stream chunks (each with the usage; the last with the finish reason):
        ``scripted`` parts (a summary), else the script's, else the facts of its whole input."""
        if scripted is None and self.script is not None:
            scripted = self.script(body)
        if scripted is None:
            seen = json.dumps([_get(body, "systemInstruction"), body.get("contents") or []])
            facts = list(dict.fromkeys(FACT_RE.findall(seen)))
            scripted = [{"text": "Done. "}, {"text": " ".join(facts) or "No facts."}]
        parts: list[dict[str, Any]] = []
        config = _get(body, "generationConfig") or {}
        thinking_config = _get(config, "thinkingConfig") if isinstance(config, Mapping) else None
        if (
            model.thinking
            and isinstance(thinking_config, Mapping)
            and _get(thinking_config, "includeThoughts")
        ):
            thought = {"text": f"Thinking about request {next(self._ids)}.", "thought": True}
            parts.append({**thought, "thoughtSignature": self.signer.sign(model.name, thought)})
        signed_call = False
        for part in scripted:
            is_call = isinstance(_get(part, "functionCall"), Mapping)
            if model.thinking and is_call and not signed_call:
                part = {**part, "thoughtSignature": self.signer.sign(model.name, part)}
                signed_call = True
            parts.append(part)
        if model.thinking and not signed_call and parts and isinstance(parts[-1].get("text"), str):
            parts[-1] = {**parts[-1], "thoughtSignature": self.signer.sign(model.name, parts[-1])}
        usage = {"promptTokenCount": tokens, "candidatesTokenCount": 10, "totalTokenCount": tokens + 10}
        chunks = []
        for n, part in enumerate(parts):
            candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
            if n == len(parts) - 1:
                candidate["finishReason"] = "STOP"
            chunks.append(
                {"candidates": [candidate], "usageMetadata": dict(usage), "modelVersion": model.name}
            )
        return chunks

    # ---- transports -------------------------------------------------------------------------

    def _authorized(self, headers: Mapping[str, str], query: str) -> Refused | None:
        keys = parse_qs(query).get("key")
        key = headers.get("x-goog-api-key") or (keys[0] if keys else None)
        if not key:
            return Refused(
                "Method doesn't allow unregistered callers (callers without established identity). Please "
                "use API Key or other form of API consumer identity to call this API.",
                status=403,
                reason="PERMISSION_DENIED",
            )
        if self.api_key is not None and key != self.api_key:
            return Refused("API key not valid. Please pass a valid API key.")
        return None

    def _serve(
        self, method: str, path: str, query: str, headers: Mapping[str, str], raw: bytes
    ) -> tuple[int, Any]:
        prefix, _, rest = path.lstrip("/").partition("/models")
        refused = self._authorized(headers, query)
        if prefix not in ("v1", "v1beta"):
            refused = Refused("Not found", status=404, reason="NOT_FOUND")
        if refused is not None:
            status, answer = refused.status, error_body(refused)
        else:
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
            status, answer = self.respond(method, rest, body)
        prompt = answer[0]["usageMetadata"]["promptTokenCount"] if isinstance(answer, list) else None
        if isinstance(answer, Mapping) and "usageMetadata" in answer:
            prompt = answer["usageMetadata"]["promptTokenCount"]
        with self._lock:
            self.requests.append(Recorded(method, path, query, dict(headers), raw, status, prompt))
        return status, answer

    def generate_requests(self) -> list[Recorded]:
        """The ``generateContent``/``streamGenerateContent`` requests received, in order."""
        with self._lock:
            return [r for r in self.requests if r.path.endswith(("GenerateContent", ":generateContent"))]

    def client_requests(self) -> list[Recorded]:
        """The generate requests that are not summary requests (the client's, as forwarded)."""
        return [r for r in self.generate_requests() if not is_summary(_json_or_none(r.body))]

    def summary_requests(self) -> list[Recorded]:
        """The proxy's summary requests, in order."""
        return [r for r in self.generate_requests() if is_summary(_json_or_none(r.body))]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self.summary_calls = 0
            self.summary_prompt_tokens = 0

    async def _http(self, request: Request) -> Response:
        raw = await request.body()
        query = request.url.query
        status, answer = self._serve(request.method, request.url.path, query, request.headers, raw)
        sse = "alt=sse" in query
        if isinstance(answer, list):
            frames = sse_frames(answer) if sse else array_frames(answer)
            media = "text/event-stream" if sse else "application/json"
            return StreamingResponse(_aiter(frames), media_type=media)
        if status >= 400 and request.url.path.endswith(":streamGenerateContent") and not sse:
            return JSONResponse([answer], status_code=status)
        return JSONResponse(answer, status_code=status)

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The same answers for ``httpx.MockTransport`` / respx."""
        raw = request.read()
        query = request.url.query.decode()
        status, answer = self._serve(request.method, request.url.path, query, request.headers, raw)
        sse = "alt=sse" in query
        if isinstance(answer, list):
            frames = sse_frames(answer) if sse else array_frames(answer)
            media = "text/event-stream" if sse else "application/json"
            return httpx.Response(200, content=b"".join(frames), headers={"content-type": media})
        if status >= 400 and request.url.path.endswith(":streamGenerateContent") and not sse:
            return httpx.Response(status, json=[answer])
        return httpx.Response(status, json=answer)

    @contextmanager
    def serve(self) -> Iterator[str]:
        with serve_in_thread(self.app) as url:
            yield url


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def is_summary(body: Any) -> bool:
    """True for a summary request of the proxy (its system instruction is the summary prompt)."""
    return isinstance(body, Mapping) and is_summary_prompt(_parts(_get(body, "systemInstruction")))


async def _aiter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def sse_frames(chunks: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """``alt=sse``: one ``data:`` frame per chunk, ended by CRLF CRLF; no ``[DONE]``."""
    return [b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\r\n\r\n" for c in chunks]


def array_frames(chunks: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """Without ``alt=sse``: one JSON array, sent element by element."""
    out = []
    for n, chunk in enumerate(chunks):
        out.append((b"[" if n == 0 else b",\r\n") + json.dumps(chunk, indent=2).encode())
    out.append(b"]")
    return out
