"""A wire API the proxy has never heard of, registered with no other edit: the seam is closed.

``TOY`` is defined here only: its body is ``{"turns": [{"who": "user"|"bot", "text": ...}],
"limit": N}``, its model comes from the path (``/toy/models/{model}:chat``, streaming chosen by
the path), it is sent upstream at the client's own path (the operator's base URL ends in ``/v1``),
its key travels in ``x-toy-key``, its errors are ``{"toy_error": {"status", "why"}}`` and its
upstream refuses an input over the window with ``413 {"toy_error": {"why": "too long: N > W"}}``.
The proxy is ``create_app(..., dialects={**DIALECTS, "toy": TOY})`` served by uvicorn in front of
a real fake upstream server that checks the toy's structure and counts words (a tokenizer the
proxy cannot know), over real HTTP on 127.0.0.1.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as StarletteRoute

from app.core.conversation import ORIGIN_KEY, Conversation, neutral, origin_of, priced_view
from app.core.dialect import ErrorInfo, Headers
from app.core.dialects import DIALECTS
from app.core.errors import InvalidRequest
from app.core.messages import Message
from app.core.overflow import ContextOverflow
from app.core.parse_memo import ParseMemo
from app.core.registry import ModelSpec
from app.core.routes import KeySlot, Route
from app.core.tokens import MessageCounter
from app.demo import serve_in_thread
from app.main import create_app
from app.settings import Settings

pytestmark = pytest.mark.e2e

WINDOW_WORDS = 600  # the fake upstream's real window, in its own unit
PROXY_KEY = "proxy-key-toy"
OPERATOR_KEY = "operator-key-toy"
TOO_LONG = re.compile(r"too long: (\d+) > (\d+)")
ROLES = {"user": "user", "bot": "assistant"}
WHO = {"user": "user", "assistant": "bot"}


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(str(part.get("text", "")) for part in parts if isinstance(part, Mapping))


@dataclass(frozen=True, slots=True)
class ToyDialect:
    """The toy wire API (see the module docstring): every member of ``app.core.dialect.Dialect``."""

    name: str = "toy"
    routes: tuple[Route, ...] = (
        Route("/toy/models/{model}:chat", stream=False),
        Route("/toy/models/{model}:count", kind="count", upstream_first=True),
    )
    key_slots: tuple[KeySlot, ...] = (KeySlot("x-toy-key"), KeySlot("toykey", in_query=True))
    items_key: str = "turns"
    output_in_window: bool = True
    preamble_events: frozenset[str] = frozenset()
    usage_needles: tuple[bytes, ...] = (b'"spent"',)
    turn_keys: frozenset[str] = field(default=frozenset({"who", "text"}))

    def recognition(self, body: Mapping[str, Any], headers: Mapping[str, str], /) -> int:
        return 2 if "turns" in body else 0

    def model_of(self, body: Mapping[str, Any], params: Mapping[str, str], /) -> str:
        model = params.get("model")
        if not model:
            raise InvalidRequest("The path names no model.", param="model")
        return model

    def refine_spec(self, spec: ModelSpec, headers: Headers, /) -> ModelSpec:
        return spec

    def upstream_count(self, answer: Mapping[str, Any], /) -> int | None:
        tokens = answer.get("tokens")
        return tokens if type(tokens) is int and tokens > 0 else None

    def parse(self, body: Mapping[str, Any], /, *, memo: ParseMemo | None = None) -> Conversation:
        turns = body.get("turns")
        if not isinstance(turns, list) or not turns:
            raise InvalidRequest("'turns' must be a non-empty array.", param="turns")
        messages: list[Message] = []
        for i, turn in enumerate(turns):
            if (
                not isinstance(turn, dict)
                or turn.get("who") not in ROLES
                or not isinstance(turn.get("text"), str)
            ):
                raise InvalidRequest(
                    "Each turn needs 'who' (user or bot) and a string 'text'.", param=f"turns.{i}"
                )
            messages.append(neutral(ROLES[turn["who"]], turn["text"], origin=[(i,)]))
        limit = body.get("limit")
        return Conversation(
            model="",
            messages=tuple(messages),
            requested_output_tokens=limit if type(limit) is int and limit > 0 else None,
        )

    def tool_tokens(self, body: Mapping[str, Any], counter: MessageCounter, /) -> int:
        return 0

    def accounting_view(
        self, body: Mapping[str, Any], messages: Sequence[Message], tool_tokens: int, /
    ) -> Mapping[str, Any]:
        return priced_view(messages, tool_tokens)

    def render(
        self,
        body: Mapping[str, Any],
        messages: Sequence[Message],
        /,
        *,
        source: Sequence[Message] | None = None,
    ) -> dict[str, Any]:
        turns: list[dict[str, Any]] = []
        wire = body["turns"]
        originals = {id(m) for m in source or ()}
        made = False  # the last turn is the engine's (a note, a summary)
        for message in messages:
            origin = origin_of(message)
            if id(message) in originals and len(origin) == 1:
                kept = wire[origin[0][0]]  # the client's own turn, untouched...
                if made and turns[-1]["who"] == kept["who"]:
                    # ...unless a note of its side stands right before it: they join.
                    kept = {**kept, "text": turns.pop()["text"] + "\n" + kept["text"]}
                turns.append(kept)
                made = False
                continue
            turn = {"who": WHO.get(str(message.get("role")), "user"), "text": _text(message)}
            if turns and turns[-1]["who"] == turn["who"]:  # a note next to a turn of its side joins it
                turns[-1] = {**turns[-1], "text": turns[-1]["text"] + "\n" + turn["text"]}
            else:
                turns.append(turn)
                made = True
        return {**body, "turns": turns}

    def problems(self, body: Mapping[str, Any], /) -> list[str]:
        turns = body.get("turns") if isinstance(body.get("turns"), list) else []
        found = set()
        if turns and turns[0].get("who") != "user":
            found.add("the first turn is not the user's")
        if any(a.get("who") == b.get("who") for a, b in itertools.pairwise(turns)):
            found.add("two turns of one side in a row")
        if any(ORIGIN_KEY in turn for turn in turns):
            found.add("an engine key leaked into a turn")
        return sorted(found)

    def error_body(self, error: ErrorInfo, /) -> dict[str, Any]:
        why = error.message
        if error.tokens is not None and error.limit_tokens is not None:
            why = f"too long: {error.tokens} > {error.limit_tokens}"
        return {"toy_error": {"status": error.status, "why": why}}

    def overflow(
        self, status: int, body: bytes | str | Mapping[str, object] | None, /
    ) -> ContextOverflow | None:
        try:
            answer = json.loads(body) if isinstance(body, bytes | str) else body
        except ValueError:
            return None
        error = answer.get("toy_error") if isinstance(answer, Mapping) else None
        found = TOO_LONG.search(str(error.get("why", ""))) if isinstance(error, Mapping) else None
        if found is None:
            return None
        return ContextOverflow(
            "toy",
            limit_tokens=int(found[2]),
            prompt_tokens=int(found[1]),
            message=found[0],
            prompt_at_least=False,
        )

    def input_tokens_used(self, answer: Mapping[str, Any], /) -> int | None:
        spent = answer.get("spent")
        tokens = spent.get("in") if isinstance(spent, Mapping) else None
        return tokens if type(tokens) is int and tokens >= 0 else None

    def count_answer(self, input_tokens: int, /) -> dict[str, Any]:
        return {"tokens": input_tokens}

    def json_stream_error(self, error: ErrorInfo, /, *, started: bool) -> bytes | None:
        return None

    def stream_error(self, error: ErrorInfo, /) -> bytes:
        return b"event: toy_error\ndata: " + json.dumps(self.error_body(error)).encode() + b"\n\n"


TOY = ToyDialect()


class FakeToyUpstream:
    """The toy's upstream: strict about its structure and its key, counting words."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.queries: list[str] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                StarletteRoute("/toy/models/{rest:path}", self._route, methods=["POST", "GET"]),
                StarletteRoute("/toy/models", self._list, methods=["GET"]),
            ]
        )

    @staticmethod
    def count(body: Mapping[str, Any]) -> int:
        return sum(len(str(turn.get("text", "")).split()) + 1 for turn in body.get("turns", []))

    async def _list(self, request: Request) -> Response:
        self._record(request, b"")
        return JSONResponse({"models": ["toy-1"]})

    def _record(self, request: Request, raw: bytes) -> None:
        with self._lock:
            self.requests.append((request.method, request.url.path, dict(request.headers), raw))
            self.queries.append(request.url.query)

    async def _route(self, request: Request) -> Response:
        raw = await request.body()
        self._record(request, raw)
        if request.headers.get("x-toy-key") != OPERATOR_KEY:
            return JSONResponse({"toy_error": {"status": 401, "why": "bad key"}}, status_code=401)
        body = json.loads(raw)
        problems = TOY.problems(body)
        if problems:
            return JSONResponse({"toy_error": {"status": 400, "why": "; ".join(problems)}}, status_code=400)
        tokens = self.count(body)
        if request.url.path.endswith(":count"):
            return JSONResponse({"tokens": tokens})
        if tokens > WINDOW_WORDS:
            return JSONResponse(
                {"toy_error": {"status": 413, "why": f"too long: {tokens} > {WINDOW_WORDS}"}}, 413
            )
        return JSONResponse({"reply": f"read {len(body['turns'])} turns", "spent": {"in": tokens}})

    @property
    def fitted(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for method, path, _h, raw in self.requests if path.endswith(":chat")]


def long_turns(count: int = 40, size: int = 30) -> list[dict[str, str]]:
    turns = []
    for k in range(count):
        turns.append({"who": "user", "text": f"question {k} " + " ".join(f"q{k}w{i}" for i in range(size))})
        turns.append({"who": "bot", "text": f"answer {k} " + " ".join(f"a{k}w{i}" for i in range(size))})
    return [*turns, {"who": "user", "text": "the last question"}]


@pytest.fixture
def served() -> Iterator[tuple[FakeToyUpstream, str]]:
    upstream = FakeToyUpstream()
    with serve_in_thread(upstream.app) as upstream_url:
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1",  # the toy goes at its own path, at the origin
            upstream_api_key=OPERATOR_KEY,
            api_keys=PROXY_KEY,
            log_level="INFO",  # the access lines too: no key may be in any of them
            discovery=False,
        )
        with serve_in_thread(create_app(settings, dialects={**DIALECTS, "toy": TOY})) as proxy_url:
            yield upstream, proxy_url


def test_a_toy_dialect_registered_with_no_other_edit_is_fitted_counted_and_keyed(
    served: tuple[FakeToyUpstream, str], caplog: pytest.LogCaptureFixture
) -> None:
    upstream, proxy_url = served
    body = {"turns": long_turns(), "limit": 20}
    assert FakeToyUpstream.count(body) > WINDOW_WORDS  # direct, the upstream would refuse it
    key = {"x-toy-key": PROXY_KEY}
    with httpx.Client(base_url=proxy_url, timeout=30) as client:
        fitted = client.post(
            "/toy/models/toy-1:chat?trace=1", json=body, headers={**key, "X-Context-Window": "500"}
        )
        small = client.post(
            "/toy/models/toy-1:chat", json={"turns": [{"who": "user", "text": "hi"}]}, headers=key
        )
        counted = client.post("/toy/models/toy-1:count", json=body, headers=key)
        bad = client.post("/toy/models/toy-1:chat", json={"turns": "nope"}, headers=key)
        anonymous = client.post("/toy/models/toy-1:chat", json=body)
        listed = client.get("/toy/models", headers=key)
        in_query = client.post(
            f"/toy/models/toy-1:chat?toykey={PROXY_KEY}&x=1", json={"turns": [{"who": "user", "text": "q"}]}
        )
        chat_401 = client.post("/v1/chat/completions", json={"model": "m", "messages": []})

    # Its fit route: planned, cut, forwarded at the client's own path with its query, answered.
    assert fitted.status_code == 200, fitted.text
    assert fitted.json()["spent"]["in"] <= WINDOW_WORDS
    assert int(fitted.headers["x-context-tokens-after"]) < int(fitted.headers["x-context-tokens-before"])
    first = upstream.fitted[0]
    assert TOY.problems(first) == [] and first["turns"][-1] == body["turns"][-1] and first["limit"] == 20
    assert len(first["turns"]) < len(body["turns"])
    _method, path, headers, _raw = next(r for r in upstream.requests if r[1].endswith(":chat"))
    assert path == "/toy/models/toy-1:chat" and upstream.queries[0] == "trace=1"
    # A body that fits is forwarded byte for byte.
    assert small.status_code == 200 and upstream.fitted[1] == {"turns": [{"who": "user", "text": "hi"}]}
    # Its key slot: the proxy key is accepted there, the operator's key replaces it upstream.
    assert headers["x-toy-key"] == OPERATOR_KEY and PROXY_KEY not in json.dumps(headers)
    assert "authorization" not in headers
    # Its counting route: the upstream's own count first, passed back.
    assert counted.status_code == 200 and counted.json() == {"tokens": FakeToyUpstream.count(body)}
    # Its error shape on a 4xx of ours, and on auth's 401 on its path (chat keeps OpenAI's).
    assert bad.status_code == 400 and bad.json()["toy_error"]["status"] == 400
    assert "turns" in bad.json()["toy_error"]["why"]
    assert anonymous.status_code == 401 and "x-toy-key" in anonymous.json()["toy_error"]["why"]
    assert chat_401.status_code == 401 and set(chat_401.json()) == {"error"}
    # The pass-through covers the prefix its routes live under, at the origin like its routes.
    assert listed.status_code == 200 and listed.json() == {"models": ["toy-1"]}
    assert ("GET", "/toy/models") in [(m, p) for m, p, _h, _r in upstream.requests]
    assert not [r for r in upstream.requests if r[1].startswith("/v1/")]
    # A key in its query slot: accepted, replaced upstream by the operator's in its first slot.
    assert in_query.status_code == 200 and upstream.queries[-1] == "x=1"
    assert upstream.requests[-1][2]["x-toy-key"] == OPERATOR_KEY
    # Neither key is ever logged (access lines included).
    access = [r for r in caplog.records if r.name == "ctxproxy.access"]
    assert len(access) >= 7 and all(PROXY_KEY not in str(r.__dict__) for r in access)
    assert PROXY_KEY not in caplog.text and OPERATOR_KEY not in caplog.text
