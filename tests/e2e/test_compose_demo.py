"""The compose demo's chain without Docker: the example app (deploy/compose/example_app.py) against
a real ctxproxy configured as docker-compose.yml configures it (its model table, rendered with the
compose defaults), in front of a fake llama.cpp that enforces the served window. The app's
conversation is longer than the window; it must get an answer, and the upstream a prompt that fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.main import create_app
from app.settings import Settings
from tests.deploy.repo import compose, load_example_app
from tests.fake_upstream import FakeModel, FakeUpstream, serve_app


def test_the_example_app_gets_an_answer_through_a_real_ctxproxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = compose()
    llama = spec["services"]["llama"]["environment"]
    model, window = llama["LLAMA_ARG_ALIAS"], int(llama["LLAMA_ARG_CTX_SIZE"])
    models_file = tmp_path / "models.toml"
    models_file.write_text(spec["configs"]["ctxproxy-models"]["content"], encoding="utf-8")
    fake = FakeUpstream([FakeModel(model, window, "llamacpp")])
    with fake.serve() as upstream_url:
        settings = Settings(
            upstream_base_url=f"{upstream_url}/v1", models_file=models_file, log_level="WARNING"
        )
        with serve_app(create_app(settings)) as proxy_url:
            monkeypatch.setenv("OPENAI_BASE_URL", f"{proxy_url}/v1")
            monkeypatch.setenv("EXAMPLE_MODEL", spec["services"]["app"]["environment"]["EXAMPLE_MODEL"])
            monkeypatch.setenv("EXAMPLE_PAUSE_S", "0.05")
            monkeypatch.setenv("EXAMPLE_ATTEMPTS", "1")
            assert load_example_app().main() == 0
    (forwarded,) = fake.client_requests()
    assert forwarded.status == 200 and forwarded.prompt_tokens is not None
    assert forwarded.prompt_tokens < window
    assert len(forwarded.json()["messages"]) < len(load_example_app().long_conversation())
    out = capsys.readouterr().out.lower()
    assert "x-context-actions:" in out and "answer:" in out
