"""deploy/compose/example_app.py (compose's example app) against a scripted stand-in for ctxproxy on
127.0.0.1: it waits for /readyz, retries failed calls, and exits 1 when it must give up (so the
compose restart policy starts it again). tests/e2e/test_compose_demo.py runs it against a real
ctxproxy."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.deploy.repo import load_example_app


@dataclass
class Script:
    """What the stand-in answers: these statuses first, then 200."""

    readyz: list[int] = field(default_factory=list)
    chat: list[int] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)


@contextmanager
def stand_in(script: Script) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

        def answer(self, status: int, body: dict[str, object], headers: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            script.seen.append(f"GET {self.path}")
            status = script.readyz.pop(0) if script.readyz else 200
            self.answer(status, {"status": "ready" if status == 200 else "not ready"}, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            script.seen.append(f"POST {self.path} {body['model']} {len(body['messages'])}")
            status = script.chat.pop(0) if script.chat else 200
            if status != 200:
                self.answer(status, {"error": {"message": f"scripted {status}"}}, {})
                return
            reply = {"choices": [{"message": {"role": "assistant", "content": "A deployment checklist."}}]}
            self.answer(200, reply, {"X-Context-Actions": "dropped_turns=9", "Server": "stand-in"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("EXAMPLE_MODEL", "demo-model")
    monkeypatch.setenv("EXAMPLE_PAUSE_S", "0.01")
    monkeypatch.setenv("EXAMPLE_ATTEMPTS", "3")
    monkeypatch.setenv("EXAMPLE_READY_TIMEOUT_S", "5")
    return monkeypatch


def test_it_waits_for_readiness_retries_and_prints_what_the_proxy_did(
    app_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    script = Script(readyz=[503, 503], chat=[502])
    with stand_in(script) as base_url:
        app_env.setenv("OPENAI_BASE_URL", base_url)
        assert load_example_app().main() == 0
    messages = len(load_example_app().long_conversation())
    assert script.seen == ["GET /readyz"] * 3 + [f"POST /v1/chat/completions demo-model {messages}"] * 2
    out = capsys.readouterr().out
    assert "x-context-actions: dropped_turns=9" in out.lower()
    assert "answer: A deployment checklist." in out


def test_it_exits_1_when_the_proxy_never_gets_ready(app_env: pytest.MonkeyPatch) -> None:
    app_env.setenv("EXAMPLE_READY_TIMEOUT_S", "0.05")
    script = Script(readyz=[503] * 1000)
    with stand_in(script) as base_url:
        app_env.setenv("OPENAI_BASE_URL", base_url)
        assert load_example_app().main() == 1
    assert not any(s.startswith("POST") for s in script.seen)


def test_it_exits_1_after_its_attempts_and_at_once_on_a_client_error(app_env: pytest.MonkeyPatch) -> None:
    script = Script(chat=[503, 503, 503, 200])
    with stand_in(script) as base_url:
        app_env.setenv("OPENAI_BASE_URL", base_url)
        assert load_example_app().main() == 1
    assert sum(s.startswith("POST") for s in script.seen) == 3
    script = Script(chat=[400])
    with stand_in(script) as base_url:
        app_env.setenv("OPENAI_BASE_URL", base_url)
        assert load_example_app().main() == 1
    assert sum(s.startswith("POST") for s in script.seen) == 1


def test_the_conversation_is_longer_than_the_demo_window() -> None:
    text = " ".join(m["content"] for m in load_example_app().long_conversation())
    assert len(text.split()) > 8192  # words: each is at least one token
