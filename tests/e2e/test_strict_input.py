"""Issue 27's probe of strict input, end to end: every invalid body of ``tests/e2e/invalid_bodies.py``
on every route of its API (the fitted routes, the counting routes, Gemini's stream, the dry run,
the gateway engine's whole-body and messages routes) through a real ctxproxy server in front of a
real recording upstream: nothing is forwarded, and each answer is a 400 that the API's official SDK
reads as its own bad-request error (``openai.BadRequestError``, ``anthropic.BadRequestError``,
``google.genai.errors.ClientError`` with ``INVALID_ARGUMENT``), saying what is wrong.

The controls: the same long body without its ``1e400`` is forwarded cut (so the probe's long body
is one the proxy would have rewritten), as strict JSON; an escaped lone surrogate, which JSON
allows, is forwarded byte for byte.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from google.genai import errors as genai_errors
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.e2e.invalid_bodies import LONG_TURNS, MODELS, Api, Case, base, corpus
from tests.fake_upstream import serve_app, serve_proxy

GEMINI = f"/v1beta/models/{MODELS['gemini']}"
# A small window for unknown models (the probe's long body is over it); no discovery (its calls
# to the upstream are not the client's request) and no summaries (the control is cut without).
PROXY_SETTINGS: dict[str, Any] = {
    "default_window_tokens": 4096,
    "default_max_output_tokens": 1024,
    "discovery": False,
    "summarize": False,
}
ROUTES: dict[Api, tuple[tuple[str, bool], ...]] = {
    # (path, counting: a route whose body is a counting request)
    "chat": (("/v1/chat/completions", False),),
    "responses": (("/v1/responses", False), ("/v1/responses/input_tokens", True)),
    "messages": (("/v1/messages", False), ("/v1/messages/count_tokens", True)),
    "gemini": (
        (f"{GEMINI}:generateContent", False),
        (f"{GEMINI}:streamGenerateContent?alt=sse", False),
        (f"{GEMINI}:streamGenerateContent", False),
        (f"{GEMINI}:countTokens", True),
    ),
}


def routes_of(case: Case) -> list[str]:
    """Every route ``case`` goes to: its API's own (counting ones unless the case is for answering
    routes only), the dry run, the gateway engine's whole-body route, and its messages route."""
    own = [path for path, counting in ROUTES[case.api] if case.scope == "all" or not counting]
    fitted = ROUTES[case.api][0][0]
    engine = [f"/v1/context/plan?api={case.api}", f"/v1/context/compact{fitted}"]
    if case.name.startswith(("temperature", "1e400")):
        engine.append(f"/v1/compress?api={case.api}")  # not JSON: refused before anything is read
    return own + engine


@dataclass
class Recorder:
    """The recording upstream: every request but the model discovery's GETs."""

    seen: list[tuple[str, str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        if request.method == "GET":
            return JSONResponse({"object": "list", "data": []})
        with self.lock:
            self.seen.append((request.method, request.url.path, body))
        return JSONResponse(
            {
                "id": "chatcmpl-probe",
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
            }
        )

    def count(self) -> int:
        with self.lock:
            return len(self.seen)


@dataclass
class Probe:
    url: str
    recorder: Recorder
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    http: httpx.Client


@contextmanager
def probe_stack() -> Iterator[tuple[str, Recorder, httpx.Client]]:
    """The recording upstream and the proxy in front of it, both real servers on loopback:
    ``(proxy URL, recorder, an HTTP client of the proxy)``."""
    recorder = Recorder()
    upstream = Starlette(routes=[Route("/{path:path}", recorder.handle, methods=["GET", "POST"])])
    with (
        serve_app(upstream, lifespan="off") as upstream_url,
        serve_proxy(upstream_url, **PROXY_SETTINGS) as url,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        yield url, recorder, http


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    with probe_stack() as (url, recorder, http):
        clients = (
            openai.OpenAI(api_key="sk-probe", base_url=url, max_retries=0),
            anthropic.Anthropic(api_key="sk-ant-probe", base_url=url, max_retries=0),
        )
        try:
            yield Probe(url, recorder, clients[0], clients[1], http)
        finally:
            for client in clients:
                client.close()


def refused_by_the_sdk(probe: Probe, api: Api, path: str, raw: bytes) -> tuple[str, str]:
    """Send ``raw`` to ``path`` with the API's official SDK (its raw-bytes request, the SDK's own
    error mapping); ``(error type, message)`` of the bad-request error it must raise."""
    headers = {"Content-Type": "application/json"}
    if api in ("chat", "responses"):
        with pytest.raises(openai.BadRequestError) as raised:
            probe.openai.post(path, content=raw, cast_to=object, options={"headers": headers})
        error = raised.value
        assert error.status_code == 400 and error.type == "invalid_request_error", error.body
        return str(error.type), error.message
    if api == "messages":
        with pytest.raises(anthropic.BadRequestError) as raised:
            probe.anthropic.post(path, content=raw, cast_to=object, options={"headers": headers})
        body = raised.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error", body
        return str(body["error"]["type"]), str(body["error"]["message"])
    response = probe.http.post(path, content=raw, headers={**headers, "x-goog-api-key": "probe"})
    with pytest.raises(genai_errors.ClientError) as raised:
        genai_errors.APIError.raise_for_response(response)
    error = raised.value
    assert error.code == 400 and error.status == "INVALID_ARGUMENT", error.details
    return str(error.status), str(error.message)


CASES = [(case, path) for case in corpus() for path in routes_of(case)]


@pytest.mark.parametrize(("case", "path"), CASES, ids=[f"{case.id}@{path}" for case, path in CASES])
def test_an_invalid_body_is_refused_in_the_apis_own_shape_and_never_forwarded(
    probe: Probe, case: Case, path: str
) -> None:
    before = probe.recorder.count()
    _kind, message = refused_by_the_sdk(probe, case.api, path, case.raw)
    assert case.says in message, message
    assert probe.recorder.count() == before, probe.recorder.seen[before:]


def test_the_probe_has_the_issues_cases_and_more() -> None:
    cases = corpus()
    assert len(cases) >= 32 and len(CASES) >= 3 * len(cases)
    assert {case.api for case in cases} == set(ROUTES)


def test_the_long_body_without_its_1e400_is_forwarded_cut_as_strict_json(probe: Probe) -> None:
    body = base("chat", turns=LONG_TURNS)
    raw = json.dumps({**body, "temperature": 0.5}).encode()
    before = probe.recorder.count()
    response = probe.http.post(
        "/v1/chat/completions", content=raw, headers={"Authorization": "Bearer sk-probe"}
    )
    assert response.status_code == 200, response.text
    assert response.headers["X-Context-Actions"] != "none"
    (forwarded,) = [
        body for _method, path, body in probe.recorder.seen[before:] if path.endswith("/completions")
    ]
    sent = orjson.loads(forwarded)  # strict: no NaN, no Infinity
    assert len(sent["messages"]) < len(body["messages"]) and sent["temperature"] == 0.5


def test_an_escaped_lone_surrogate_is_json_and_goes_byte_for_byte(probe: Probe) -> None:
    raw = (
        b'{"model": "probe-chat", "messages": [{"role": "user", "content": "a \\ud800 b"}], "max_tokens": 64}'
    )
    before = probe.recorder.count()
    response = probe.http.post(
        "/v1/chat/completions", content=raw, headers={"Authorization": "Bearer sk-probe"}
    )
    assert response.status_code == 200, response.text
    assert [body for *_rest, body in probe.recorder.seen[before:]] == [raw]


def report() -> list[dict[str, Any]]:
    """Every case's route and answer, for a person (``python -m tests.e2e.test_strict_input``)."""
    rows: list[dict[str, Any]] = []
    with probe_stack() as (_url, recorder, http):
        for case, path in CASES:
            headers = {"Content-Type": "application/json", "Authorization": "Bearer k", "x-api-key": "k"}
            answer = http.post(path, content=case.raw, headers=headers)
            data = json.loads(answer.text)
            error = (data[0] if isinstance(data, list) else data)["error"]
            kind = error.get("type") or error.get("status")
            rows.append({"case": case.id, "route": path, "status": answer.status_code, "type": kind,
                         "message": str(error.get("message"))[:90]})  # fmt: skip
        rows.append({"forwarded": recorder.count()})
    return rows


if __name__ == "__main__":
    for row in report():
        print(json.dumps(row))
