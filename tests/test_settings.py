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
    # recall on (CTXPROXY_RECALL), every memory carries the index
    assert settings.fit_policy() == Policy(recall="tool", index_memory=True)


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
    assert line.endswith("; expected an integer >= 1 and <= 65535")
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


def lines_of(monkeypatch: pytest.MonkeyPatch, **variables: str) -> list[str]:
    from app.settings import InvalidSettings, load_settings

    for name, value in variables.items():
        monkeypatch.setenv(f"CTXPROXY_{name.upper()}", value)
    with pytest.raises(InvalidSettings) as refused:
        load_settings()
    return refused.value.lines


def test_a_minimum_above_its_maximum_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    (line,) = lines_of(monkeypatch, reserve_min_tokens="5000", reserve_max_tokens="100")
    assert line.startswith("CTXPROXY_RESERVE_MIN_TOKENS (5000) is above CTXPROXY_RESERVE_MAX_TOKENS (100)")


def test_a_summary_time_limit_floor_above_its_ceiling_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    (line,) = lines_of(monkeypatch, summary_background_timeout_s="600", summary_background_max_s="120")
    assert line.startswith(
        "CTXPROXY_SUMMARY_BACKGROUND_TIMEOUT_S (600) is above CTXPROXY_SUMMARY_BACKGROUND_MAX_S (120)"
    )
    assert Settings(summary_background_timeout_s=30, summary_background_max_s=30).summary_yield == "auto"


def test_every_contradiction_is_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = lines_of(
        monkeypatch,
        reserve_min_tokens="5000",
        reserve_max_tokens="100",
        stream_idle_timeout_s="900",
        max_concurrent_upstream="500",
        upstream_max_connections="100",
        default_window_tokens="1000",
        default_max_output_tokens="2000",
    )
    assert [line.split(" ", 1)[0] for line in lines] == [
        "CTXPROXY_RESERVE_MIN_TOKENS",
        "CTXPROXY_STREAM_IDLE_TIMEOUT_S",
        "CTXPROXY_MAX_CONCURRENT_UPSTREAM",
        "CTXPROXY_DEFAULT_MAX_OUTPUT_TOKENS",
    ]
    assert "CTXPROXY_READ_TIMEOUT_S (600)" in lines[1]
    assert "CTXPROXY_UPSTREAM_MAX_CONNECTIONS (100)" in lines[2]
    assert all("\n" not in line for line in lines)


def test_consistent_bounds_and_a_lowered_pool_under_the_default_cap_are_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.main import build_limiter

    Settings(reserve_min_tokens=100, reserve_max_tokens=100, stream_idle_timeout_s=600.0)
    Settings(read_timeout_s=60.0)  # the default idle timeout (300) above it changes nothing
    Settings(max_concurrent_upstream=100, upstream_max_connections=100)
    lowered = Settings(upstream_max_connections=50)  # the cap (default 1000) follows the pool
    limiter = build_limiter(lowered)
    assert limiter is not None and limiter.max_concurrent == 50
    assert build_limiter(Settings(max_concurrent_upstream=0)) is None


@pytest.mark.parametrize("port", ["0", "65536", "99999", "-1"])
def test_a_port_out_of_range_is_refused(port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (line,) = lines_of(monkeypatch, port=port)
    assert line.startswith("CTXPROXY_PORT: ") and ">= 1 and <= 65535" in line


def test_an_unknown_variable_names_the_nearest_setting_and_never_its_value() -> None:
    from app.settings import unknown_variables

    warnings = unknown_variables(
        {
            "CTXPROXY_UPSTREAM_BASEURL": "http://secret-host.example/v1",
            "ctxproxy_reserv_max_tokens": "3",
            "CTXPROXY_BANANA": "sk-123",
            "CTXPROXY_PORT": "8080",
            "CTXPROXY_WORKER_DIR": "/tmp/x",  # set by ctxproxy serve --workers N
            "CTXPROXY_FUZZ_EXAMPLES": "10",  # the test suite's own
            "PATH": "/usr/bin",
        }
    )
    assert warnings == [
        "CTXPROXY_BANANA is not a ctxproxy setting and is ignored: every setting is listed in "
        "config/ctxproxy.env.example",
        "CTXPROXY_UPSTREAM_BASEURL is not a ctxproxy setting and is ignored: did you mean "
        "CTXPROXY_UPSTREAM_BASE_URL?",
        "ctxproxy_reserv_max_tokens is not a ctxproxy setting and is ignored: did you mean "
        "CTXPROXY_RESERVE_MAX_TOKENS?",
    ]
    assert not any("secret-host" in w or "sk-123" in w for w in warnings)


def test_the_start_up_summary_names_upstreams_policy_and_table_never_a_key() -> None:
    from pydantic import SecretStr

    settings = Settings(
        upstream_base_url="http://user:hunter2@vllm.local:8000/v1",
        upstream_routes={"llama-": "http://llama.local:8080/v1?api_key=sk-route"},
        upstream_api_key=SecretStr("sk-upstream-secret"),
        api_keys=SecretStr("client-key-1,client-key-2"),
        policy_mode="truncate",
        keep_turns=3,
        cut_target=0.7,
        reserve_tokens=2048,
    )
    lines = settings.summary_lines(table="built-in merged with the operator file /etc/models.toml")
    text = "\n".join(lines)
    assert lines[0].startswith(
        "upstream http://vllm.local:8000/v1; routes llama- -> http://llama.local:8080/v1"
    )
    assert "clients must send a proxy key" in lines[0]
    assert lines[1].startswith("policy truncate: keep the newest 3 turns") and "cut to 0.7" in lines[1]
    assert "summaries off" in lines[1] and "output reserve 2048 tokens" in lines[1]
    assert lines[2].startswith("model table: built-in merged with the operator file /etc/models.toml")
    for secret in ("hunter2", "sk-route", "sk-upstream-secret", "client-key", "user:"):
        assert secret not in text
    default = Settings().summary_lines(table="built-in")
    assert "the clients' own keys are forwarded" in default[0]
    assert "15% of the window, within [512, 4096] tokens" in default[1]
