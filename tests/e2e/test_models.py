"""Know every model: a proxy configured with nothing but the upstream's base URL, in front of fake vLLM,
llama.cpp, Ollama and OpenRouter servers whose tokenizers are not tiktoken (tests/fake_models.py).

It fits requests to each model's real window (discovered), its estimate converges to the upstream's
count after a few requests (calibrated from usage), an overflow error teaches it the window for the
next request, Ollama's silent truncation is reported and teaches the window, and a slow or failing
discovery never holds a chat request longer than the discovery's own short timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from app import cli
from app.main import create_app
from app.settings import Settings
from tests.fake_models import (
    FakeModelServer,
    Flavour,
    ServedModel,
    Tokenizer,
    chars_tokens,
    conversation,
    scaled_tiktoken,
    word_piece_tokens,
)
from tests.fake_upstream import serve_app

WINDOW_TOKENS = 4096
DEFAULT_WINDOW_TOKENS = 8192  # the built-in table's default, for a model nobody describes
MODEL = "acme/chat-7b"


def tokenizer_for(flavour: Flavour) -> Tokenizer:
    return {
        "vllm": word_piece_tokens,
        "llamacpp": scaled_tiktoken(1.3),
        "ollama": chars_tokens(4.0),
        "openrouter": scaled_tiktoken(0.85, "cl100k_base"),
    }[flavour]


def served(flavour: Flavour) -> list[ServedModel]:
    if flavour == "ollama":
        # num_ctx set in the Modelfile: /api/show states the effective window.
        return [ServedModel(MODEL, WINDOW_TOKENS, declared_window_tokens=131072, num_ctx_parameter=True)]
    return [ServedModel(MODEL, WINDOW_TOKENS, declared_window_tokens=131072, max_output_tokens=2048)]


@dataclass
class Proxy:
    fake: FakeModelServer
    url: str

    def client(self, *, timeout_s: float = 30.0) -> openai.OpenAI:
        http = httpx.Client(timeout=timeout_s)
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="test", max_retries=0, http_client=http)


@contextmanager
def proxy_for(fake: FakeModelServer, **settings: Any) -> Iterator[Proxy]:
    with fake.serve() as base_url:
        config = Settings(upstream_base_url=base_url, log_level="WARNING", **settings)
        with serve_app(create_app(config)) as url:
            yield Proxy(fake=fake, url=url)


def chat(
    client: openai.OpenAI,
    messages: list[dict[str, Any]],
    *,
    stream: bool = False,
    headers: dict[str, str] | None = None,
) -> httpx.Headers:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": messages}
    if headers:
        kwargs["extra_headers"] = headers
    if stream:
        kwargs.update(stream=True, stream_options={"include_usage": True})
    raw = client.chat.completions.with_raw_response.create(**kwargs)
    result = raw.parse()
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in result if c.choices)
    else:
        text = result.choices[0].message.content or ""
    assert text.startswith("Fake")
    return raw.headers


FLAVOURS: tuple[Flavour, ...] = ("vllm", "llamacpp", "ollama", "openrouter")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_each_model_is_fitted_to_its_discovered_window_and_calibrated(
    flavour: Flavour, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeModelServer(flavour, served(flavour), tokenizer_for(flavour))
    with proxy_for(fake) as proxy, proxy.client() as client:
        headers = chat(client, conversation(40, seed=1))  # about three times the window
        assert headers["x-context-window"] == str(WINDOW_TOKENS)
        assert headers["x-context-actions"] != "none"
        final = fake.chats()[-1]
        assert final.status == 200 and not final.truncated
        assert final.prompt_tokens is not None and final.prompt_tokens <= WINDOW_TOKENS

        errors: list[float] = []
        for i in range(2, 8):
            headers = chat(client, conversation(6 + i, seed=i), stream=i % 2 == 0)
            sent = fake.chats()[-1]
            assert sent.status == 200 and not sent.truncated and sent.prompt_tokens is not None
            ours = int(headers["x-context-tokens-after"])
            errors.append(abs(ours - sent.prompt_tokens) / sent.prompt_tokens)
        assert headers["x-context-count"] == "calibrated"
        assert headers["x-context-retries"] == "0"
        assert max(errors[-3:]) < 0.03, errors
        # The same conversation sized over the window again: now it fits the first time.
        fake.clear()
        headers = chat(client, conversation(40, seed=9))
        assert headers["x-context-retries"] == "0"
        assert [r.status for r in fake.chats()] == [200]
        assert fake.chats()[0].prompt_tokens is not None and fake.chats()[0].prompt_tokens <= WINDOW_TOKENS

        # What the running proxy knows, with the source of each figure and the correction.
        # (what this client's requests taught: asked with its key)
        report = httpx.get(f"{proxy.url}/v1/context/models", headers={"Authorization": "Bearer test"})
        known = {row["model"]: row for row in report.json()["data"]}
        row = known[MODEL]
        # (vLLM's first, uncalibrated request overflowed: its error confirmed the same window)
        assert row["window_tokens"] == WINDOW_TOKENS
        assert row["sources"]["window"] in ("discovered", "learned:overflow")
        assert row["sources"]["correction"] == "calibrated:usage" and row["calibration_samples"] >= 3
        assert row["discovered"]["window_tokens"] == WINDOW_TOKENS
        # Another client sees what the upstream said, not what this one's requests taught.
        other = httpx.get(f"{proxy.url}/v1/context/models", headers={"Authorization": "Bearer other"})
        theirs = {r["model"]: r for r in other.json()["data"]}[MODEL]
        assert theirs["calibration_samples"] == 0 and theirs["sources"]["correction"] == "none"
        assert theirs["discovered"]["window_tokens"] == WINDOW_TOKENS
        capsys.readouterr()
        assert cli.main(["models", "--proxy", proxy.url, "--key", "test"]) == 0
        line = next(x.split() for x in capsys.readouterr().out.splitlines() if x.startswith(MODEL))
        assert line[1] == f"{WINDOW_TOKENS:,}" and f"window={row['sources']['window']}" in line[4]
        assert abs(float(line[5]) - row["correction"]) < 0.001


@pytest.mark.parametrize("flavour", ["vllm", "llamacpp", "openrouter"])
def test_an_overflow_error_teaches_the_window_for_the_next_request(flavour: Flavour) -> None:
    model = ServedModel(MODEL, WINDOW_TOKENS, listed_window=False)
    # llama.cpp's /props would tell the window: make its discovery answer 404 like a server without it.
    fake = FakeModelServer(
        flavour, [model], tokenizer_for(flavour), discovery_status=404 if flavour == "llamacpp" else None
    )
    with proxy_for(fake) as proxy, proxy.client() as client:
        messages = conversation(18, seed=3)  # over the real window, under the default one
        first = chat(client, messages)
        # Planned for the default window, refused, retried: the answer says the window its retry
        # was fitted to, the one the error stated.
        assert first["x-context-window"] == str(WINDOW_TOKENS)
        assert first["x-context-retries"] == "1"
        assert [r.status for r in fake.chats()] == [400, 200]

        fake.clear()
        second = chat(client, [*messages, {"role": "user", "content": "And one more question?"}])
        assert second["x-context-window"] == str(WINDOW_TOKENS)
        assert second["x-context-retries"] == "0"
        assert [r.status for r in fake.chats()] == [200]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_ollama_silent_truncation_is_reported_and_teaches_the_window(stream: bool) -> None:
    # model_info says 128k, the runtime num_ctx is 4096 and /api/show does not say so.
    model = ServedModel(MODEL, WINDOW_TOKENS, declared_window_tokens=131072)
    fake = FakeModelServer("ollama", [model], tokenizer_for("ollama"))
    with proxy_for(fake) as proxy, proxy.client() as client:
        for i in range(3):  # small requests calibrate the estimate
            headers = chat(client, conversation(3, seed=10 + i))
            assert headers["x-context-window"] == "131072"
            assert "x-context-warning" not in headers
        headers = chat(client, conversation(30, seed=20), stream=stream)  # ~2.5x the real window
        assert fake.chats()[-1].truncated
        if stream:
            assert "x-context-warning" not in headers  # the usage came after the headers
        else:
            assert headers["x-context-warning"] == "upstream-truncated"

        headers = chat(client, conversation(30, seed=21))
        assert headers["x-context-window"] == str(WINDOW_TOKENS)
        if stream:
            assert headers["x-context-warning"] == "upstream-truncated"
        else:
            assert "x-context-warning" not in headers
        last = fake.chats()[-1]
        assert not last.truncated and last.prompt_tokens is not None and last.prompt_tokens <= WINDOW_TOKENS


def test_an_ollama_tokenizer_far_above_the_estimate_is_cut_once_then_fits() -> None:
    # num_ctx is known (4096), but this model counts ~1.45x our estimate. Cutting as little as
    # possible (cut target 1.0), the first, uncalibrated request fits by our count and Ollama cuts it
    # at num_ctx. Its usage at the window reveals it; the next requests are calibrated and fit.
    model = ServedModel(MODEL, WINDOW_TOKENS, num_ctx_parameter=True)
    fake = FakeModelServer("ollama", [model], chars_tokens(3.2))
    # (Summaries off: a cut leaves room for a summary, which is headroom too.)
    tight = {"X-Context-Cut-Target": "1.0", "X-Context-Summarize": "off"}
    with proxy_for(fake) as proxy, proxy.client() as client:
        first = chat(client, conversation(40, seed=5), headers=tight)
        assert fake.chats()[-1].truncated and fake.chats()[-1].prompt_tokens == WINDOW_TOKENS
        assert first["x-context-warning"] == "upstream-truncated"
        for seed in (6, 7):
            headers = chat(client, conversation(40, seed=seed), headers=tight)
            assert "x-context-warning" not in headers
            assert headers["x-context-count"] == "calibrated"
            last = fake.chats()[-1]
            assert not last.truncated
            assert last.prompt_tokens is not None and last.prompt_tokens < WINDOW_TOKENS


def test_the_default_headroom_cut_absorbs_an_uncalibrated_ollama_tokenizer() -> None:
    # The same ~1.45x tokenizer with the default cut target (0.6 of the budget): the headroom left
    # for the next turns also absorbs the estimate's error, so not even the first request is cut
    # by Ollama, and the usage still calibrates the count.
    model = ServedModel(MODEL, WINDOW_TOKENS, num_ctx_parameter=True)
    fake = FakeModelServer("ollama", [model], chars_tokens(3.2))
    with proxy_for(fake) as proxy, proxy.client() as client:
        first = chat(client, conversation(40, seed=5))
        assert first["x-context-actions"] != "none"
        assert "x-context-warning" not in first
        forwarded = fake.chats()[-1]
        assert not forwarded.truncated
        assert forwarded.prompt_tokens is not None and forwarded.prompt_tokens < WINDOW_TOKENS
        headers = chat(client, conversation(40, seed=6))
        assert headers["x-context-count"] == "calibrated"
        assert not fake.chats()[-1].truncated


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_ctxproxy_models_upstream_shows_what_each_server_says(
    flavour: Flavour, capsys: pytest.CaptureFixture[str]
) -> None:
    models = [
        *served(flavour),
        ServedModel("acme/other-1b", 2048, declared_window_tokens=2048, max_output_tokens=512),
    ]
    if flavour == "llamacpp":
        models = models[:1]  # llama.cpp serves one model
    fake = FakeModelServer(flavour, models, word_piece_tokens)
    with fake.serve() as base_url:
        assert cli.main(["models", "--upstream", base_url]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[MODEL][1] == f"{WINDOW_TOKENS:,}" and "window=discovered" in rows[MODEL][4]
    if flavour != "llamacpp":
        assert rows["acme/other-1b"][1] == "2,048"
    if flavour == "openrouter":
        assert rows[MODEL][2] == "2,048" and "max_output=discovered" in rows[MODEL][4]


def test_a_slow_discovery_does_not_hold_a_chat_request_beyond_its_timeout() -> None:
    gate = threading.Event()  # the discovery endpoints answer only when the test ends
    fake = FakeModelServer("vllm", served("vllm"), word_piece_tokens, discovery_gate=gate)
    with proxy_for(fake, discovery_timeout_s=0.2) as proxy, proxy.client(timeout_s=10.0) as client:
        try:
            headers = chat(client, conversation(2, seed=4))
            # Discovery has not answered: the table's default applied, and the request went through.
            assert headers["x-context-window"] == str(DEFAULT_WINDOW_TOKENS)
            assert [r.status for r in fake.chats()] == [200]
            assert fake.discovery_requests() == []  # still held
        finally:
            gate.set()  # before the servers stop, so the fake's held handlers can finish


def test_a_failing_discovery_is_logged_once_and_the_table_applies(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeModelServer("vllm", served("vllm"), word_piece_tokens, discovery_status=500)
    with (
        caplog.at_level(logging.INFO, logger="ctxproxy.discovery"),
        proxy_for(fake) as proxy,
        proxy.client() as client,
    ):
        for seed in range(3):
            headers = chat(client, conversation(2, seed=seed))
            assert headers["x-context-window"] == str(DEFAULT_WINDOW_TOKENS)
    failures = [r for r in caplog.records if r.name == "ctxproxy.discovery" and r.levelno >= logging.WARNING]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert "HTTP 500" in failures[0].getMessage()
