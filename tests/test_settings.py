from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.core.budget import Policy
from app.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.upper().startswith("CTXPROXY_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    settings = Settings()
    assert settings.upstream_base_url == "https://api.openai.com/v1"
    assert settings.upstream_api_key is None and settings.upstream_key() is None
    assert settings.upstream_routes == {}
    assert settings.upstream_transport == "aiohttp"
    assert settings.max_body_bytes == 32 * 1024 * 1024
    assert settings.fit_policy() == Policy()


def test_environment_is_read_with_the_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CTXPROXY_UPSTREAM_BASE_URL", "http://vllm:8000/v1/")
    monkeypatch.setenv("CTXPROXY_UPSTREAM_API_KEY", "sk-secret")
    monkeypatch.setenv("CTXPROXY_UPSTREAM_ROUTES", '{"gpt-": "https://api.openai.com/v1"}')
    monkeypatch.setenv("CTXPROXY_MODELS_FILE", str(tmp_path / "models.toml"))
    monkeypatch.setenv("CTXPROXY_POLICY_MODE", "truncate")
    monkeypatch.setenv("CTXPROXY_KEEP_TURNS", "4")
    monkeypatch.setenv("CTXPROXY_PROTECT_MAX_SHARE", "0.3")
    monkeypatch.setenv("CTXPROXY_RESERVE_TOKENS", "1000")
    monkeypatch.setenv("CTXPROXY_LOG_LEVEL", "debug")
    monkeypatch.setenv("CTXPROXY_LOG_JSON", "true")
    monkeypatch.setenv("CTXPROXY_UPSTREAM_TRANSPORT", "httpx")
    settings = Settings()
    assert settings.upstream_base_url == "http://vllm:8000/v1"
    assert settings.upstream_key() == "sk-secret"
    assert "sk-secret" not in repr(settings)
    assert settings.upstream_routes == {"gpt-": "https://api.openai.com/v1"}
    assert settings.models_file == tmp_path / "models.toml"
    assert settings.log_level == "DEBUG" and settings.log_json is True
    assert settings.upstream_transport == "httpx"
    policy = settings.fit_policy()
    assert (policy.mode, policy.keep_turns, policy.reserve_tokens) == ("truncate", 4, 1000)
    assert policy.protect_max_share == 0.3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("upstream_base_url", "ftp://x"),
        ("upstream_routes", {"m": "not-a-url"}),
        ("policy_mode", "shrink"),
        ("keep_turns", -1),
        ("protect_max_share", 0),
        ("protect_max_share", 1.5),
        ("max_body_bytes", 0),
        ("default_window_tokens", 0),
        ("upstream_transport", "curl"),
        ("read_timeout_s", 0),
    ],
)
def test_bad_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        Settings(**{field: value})  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.port = 1  # type: ignore[misc]


def test_a_bad_setting_is_described_in_one_line_without_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.settings import describe_settings_error

    monkeypatch.setenv("CTXPROXY_PORT", "secret-looking-8080")
    with pytest.raises(ValidationError) as caught:
        Settings()
    (line,) = describe_settings_error(caught.value)
    assert line.startswith("CTXPROXY_PORT: input should be a valid integer")
    assert line.endswith("; expected an integer >= 0 and <= 65535")
    assert "secret-looking" not in line


def test_routes_that_are_not_json_are_described(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_settings import SettingsError

    from app.settings import describe_settings_error

    monkeypatch.setenv("CTXPROXY_UPSTREAM_ROUTES", "gpt-4o=http://x")
    with pytest.raises(SettingsError) as caught:
        Settings()
    assert describe_settings_error(caught.value) == [
        'CTXPROXY_UPSTREAM_ROUTES: not valid JSON; expected a JSON object {"model name or prefix": '
        '"http(s)://base-url", ...}'
    ]


def test_a_cache_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(ValidationError, match="unsupported scheme 'http'"):
        Settings(cache_url="http://cache:6379")
    assert Settings(cache_url="redis://cache:6379/0").cache_url == "redis://cache:6379/0"
    assert Settings(cache_url=" ").cache_url is None
