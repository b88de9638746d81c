"""``ctxproxy`` commands: models, plan (offline), serve's wiring, and ``python -m app``."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.core.tokens import MessageCounter
from app.tokenizer import counter_for

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads CTXPROXY_* settings: the tests must not see the developer's."""
    for name in list(os.environ):
        if name.upper().startswith("CTXPROXY_"):
            monkeypatch.delenv(name)


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def chat(n_turns: int, *, words: int = 50) -> dict[str, object]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
    for i in range(n_turns):
        messages.append({"role": "user", "content": f"question {i} " + "lorem ipsum " * words})
        messages.append({"role": "assistant", "content": f"answer {i} " + "dolor sit " * words})
    messages.append({"role": "user", "content": "and finally?"})
    return {"model": "gpt-4o", "messages": messages}


def test_models_lists_the_builtin_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["model", "window", "max", "output", "encoding", "source", "correction"]
    row = next(line.split() for line in lines if line.split()[0] == "gpt-4o")
    assert row[1:] == ["128,000", "16,384", "o200k_base", "builtin", "-"]
    assert lines[-1].split()[0] == "(default)"


def test_models_merges_the_operator_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "models.toml"
    table.write_text('[models."my-llama"]\nwindow = 4096\nmax_output = 512\n', encoding="utf-8")
    assert cli.main(["models", "--models-file", str(table)]) == 0
    row = next(line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("my-llama"))
    assert row[1:] == ["4,096", "512", "estimate", "operator", "-"]


def test_models_file_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "models.toml"
    table.write_text('[models."env-model"]\nwindow = 1000\n', encoding="utf-8")
    monkeypatch.setenv("CTXPROXY_MODELS_FILE", str(table))
    assert cli.main(["models"]) == 0
    assert "env-model" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "not found"), ("[models.bad]\nwindow = -1\n", "positive integer")],
)
def test_models_bad_operator_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    table = tmp_path / "models.toml"
    if content is not None:
        table.write_text(content, encoding="utf-8")
    assert cli.main(["models", "--models-file", str(table)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ctxproxy: error:")
    assert message in err


def test_plan_of_a_request_that_fits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = chat(2)
    assert cli.main(["plan", str(write_json(tmp_path / "req.json", body)), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = MessageCounter(counter_for("o200k_base")).count_request(body)
    assert report["model"] == "gpt-4o"
    assert report["spec"]["window_tokens"] == 128_000
    assert report["count"] == "exact"
    assert report["tokens_before"] == report["tokens_after"] == expected
    assert report["fits"] is True
    assert report["changed"] is False
    assert report["body"] == body  # forwarded as it came
    assert len(report["message_tokens"]) == len(body["messages"])


def test_plan_over_a_small_window_under_reject(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path / "req.json", chat(12, words=80))
    code = cli.main(
        ["plan", str(path), "--model-window", "1024", "--policy", "reject", "--no-body", "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["fits"] is False
    assert report["spec"]["window_tokens"] == 1024
    assert report["spec"]["source"] == "request"
    assert report["tokens_before"] > report["budget"]["input_budget_tokens"]
    assert "body" not in report and "messages" not in report


def test_plan_fits_a_long_conversation_by_truncating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = chat(12, words=80)
    path = write_json(tmp_path / "req.json", body)
    code = cli.main(
        ["plan", str(path), "--model-window", "2048", "--policy", "truncate", "--keep-turns", "1", "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["fits"] is True
    assert report["changed"] is True
    assert report["tokens_after"] <= report["budget"]["input_budget_tokens"] < report["tokens_before"]
    forwarded = report["body"]
    assert forwarded.keys() == body.keys() and forwarded["model"] == body["model"]
    assert forwarded["messages"][0] == body["messages"][0]
    assert forwarded["messages"][-1] == body["messages"][-1]
    assert len(forwarded["messages"]) == len(report["message_tokens"]) < len(body["messages"])
    assert report["actions_header"] != "none"


def test_plan_budget_and_reserve_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path / "req.json", chat(1))
    assert (
        cli.main(["plan", str(path), "--budget", "5000", "--reserve", "700", "--no-messages", "--json"]) == 0
    )
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert budget["cap_tokens"] == 5000
    assert budget["reserve_tokens"] == 700
    assert budget["input_budget_tokens"] <= 5000


def test_plan_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(chat(1))))
    assert cli.main(["plan", "-", "--no-messages", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"messages": []}), "'model'"),
        (json.dumps({"model": "gpt-4o", "messages": [{"content": "no role"}]}), "messages[0]"),
        (json.dumps({"model": "gpt-4o", "messages": "hello"}), "invalid request"),
    ],
)
def test_plan_bad_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "req.json"
    path.write_text(content, encoding="utf-8")
    assert cli.main(["plan", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("ctxproxy: error:")
    assert message in captured.err


def test_plan_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", str(tmp_path / "nope.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["plan"],
        ["plan", "x.json", "--model-window", "0"],
        ["plan", "x.json", "--policy", "maybe"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "usage: ctxproxy" in capsys.readouterr().err


def test_serve_runs_the_app_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    calls: list[tuple[tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setenv("CTXPROXY_PORT", "9123")
    assert cli.main(["serve", "--host", "0.0.0.0", "--workers", "2"]) == 0
    (args, kwargs) = calls[0]
    assert args == ("app.main:create_app",)
    assert kwargs["factory"] is True
    assert (kwargs["host"], kwargs["port"], kwargs["workers"]) == ("0.0.0.0", 9123, 2)
    assert kwargs["access_log"] is False  # our access line carries the request ID; uvicorn's would not


def test_serve_rejects_a_bad_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_UPSTREAM_BASE_URL", "ftp://nope")
    assert cli.main(["serve"]) == 2
    assert "CTXPROXY_" in capsys.readouterr().err


def test_python_dash_m_app_is_the_console_script() -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CTXPROXY_")}
    done = subprocess.run(
        [sys.executable, "-m", "app", "models"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "gpt-4o" in done.stdout


def _bad_value(name: str) -> str | None:
    """A value the setting ``name`` refuses, from its type; None for free text (any value is valid)."""
    import types
    from typing import Literal, get_args, get_origin

    from app.settings import Settings

    base = Settings.model_fields[name].annotation
    if isinstance(base, types.UnionType):  # X | None
        (base,) = [a for a in get_args(base) if a is not type(None)]
    if name.endswith("_url"):
        return "ftp://example.invalid"
    if get_origin(base) is Literal or base in (int, float):
        return "not-a-value"
    if base is bool:
        return "maybe"
    if get_origin(base) is dict:
        return "{not json"
    return None


def _checkable_settings() -> list[str]:
    from app.settings import Settings

    return sorted(name for name in Settings.model_fields if _bad_value(name) is not None)


@pytest.mark.parametrize("name", _checkable_settings())
def test_serve_refuses_every_bad_setting_in_one_line(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    started: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.append(a))
    monkeypatch.setenv(f"CTXPROXY_{name.upper()}", str(_bad_value(name)))
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"ctxproxy: error: CTXPROXY_{name.upper()}: "), err
    assert "; expected " in err
    assert "Traceback" not in err and "errors.pydantic.dev" not in err
    assert not started


def test_the_checked_settings_cover_every_kind() -> None:
    assert {"upstream_routes", "port", "log_level", "discovery", "cache_url", "keep_turns"} <= set(
        _checkable_settings()
    )


@pytest.mark.parametrize(
    ("value", "wrong"),
    [
        ("not json", "not valid JSON"),
        ('["a"]', "valid dictionary"),
        ('{"gpt-4o": "ftp://x"}', "must start with http:// or https://"),
    ],
)
def test_a_bad_upstream_routes_value_is_one_line(
    value: str, wrong: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_UPSTREAM_ROUTES", value)
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and wrong in err and '{"model name or prefix"' in err, err


def test_a_rule_across_settings_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_API_KEYS", "client-key")
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CTXPROXY_UPSTREAM_API_KEY" in err and "secret" not in err


def test_two_bad_settings_are_two_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_PORT", "eighty")
    monkeypatch.setenv("CTXPROXY_KEEP_TURNS", "-1")
    assert cli.main(["serve"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("ctxproxy: error: CTXPROXY_") for line in lines)


def test_a_secret_setting_is_never_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_UPSTREAM_ROUTES", '{"m": "sk-secret-value"}')
    assert cli.main(["serve"]) == 2
    assert "sk-secret-value" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("table", "wrong"),
    [
        ('[models."x"\nwindow = 3\n', "not valid TOML"),
        ('[models."x"]\nwindow = "big"\n', "window must be a positive integer"),
        ('[models."x"]\nwindow = 1000\nencoding = "klingon"\n', "encoding"),
    ],
)
def test_serve_refuses_a_bad_model_table_in_one_line(
    table: str,
    wrong: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import uvicorn

    started: list[object] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: started.append(a))
    path = tmp_path / "models.toml"
    path.write_text(table, encoding="utf-8")
    monkeypatch.setenv("CTXPROXY_MODELS_FILE", str(path))
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"ctxproxy: error: CTXPROXY_MODELS_FILE: {path}") and wrong in err, err
    assert not started


def test_serve_refuses_a_missing_model_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_MODELS_FILE", str(tmp_path / "absent.toml"))
    assert cli.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CTXPROXY_MODELS_FILE: model table not found" in err


def test_a_real_start_with_bad_routes_exits_2_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CTXPROXY_")}
    env["CTXPROXY_UPSTREAM_ROUTES"] = "gpt-4o=http://x"
    done = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", "65535"],  # never bound: refused before
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        "ctxproxy: error: CTXPROXY_UPSTREAM_ROUTES"
    )


def test_serve_with_workers_shares_a_fresh_directory_and_leaves_no_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    seen: dict[str, str | None] = {}

    def run(*args: object, **kwargs: object) -> None:
        seen["worker_dir"] = os.environ.get("CTXPROXY_WORKER_DIR")
        seen["prometheus"] = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        assert seen["prometheus"] is not None and Path(seen["prometheus"]).is_dir()

    monkeypatch.setattr(uvicorn, "run", run)
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    assert cli.main(["serve", "--workers", "2"]) == 0
    assert seen["worker_dir"] is not None and seen["prometheus"] == f"{seen['worker_dir']}/metrics"
    assert not Path(seen["worker_dir"]).exists()  # removed when the server stopped
    assert "CTXPROXY_WORKER_DIR" not in os.environ and "PROMETHEUS_MULTIPROC_DIR" not in os.environ


def test_serve_with_one_worker_shares_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    seen: list[str | None] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: seen.append(os.environ.get("CTXPROXY_WORKER_DIR")))
    assert cli.main(["serve"]) == 0
    assert seen == [None]


def test_plan_prints_a_summary_for_people(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_json(tmp_path / "req.json", chat(12, words=80))
    assert cli.main(["plan", str(path), "--model-window", "2048", "--policy", "truncate"]) == 0
    out = capsys.readouterr().out
    with pytest.raises(ValueError):
        json.loads(out)
    lines = out.splitlines()
    assert lines[0].startswith("model    gpt-4o -> gpt-4o (request): window 2,048, o200k_base (exact count)")
    assert re.match(r"tokens   [\d,]+ -> [\d,]+$", lines[2])
    assert lines[3].startswith("result   fits after fitting: ")
    actions = [line for line in lines if line.startswith("action   ")]
    assert actions and any("tokens freed" in line for line in actions)
    freed = [line.split(", ")[1] for line in actions if "tokens freed" in line]
    assert len(freed) == len(set(freed))  # one saving is reported once


def test_plan_summary_of_a_request_that_cannot_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_json(tmp_path / "req.json", chat(12, words=80))
    assert cli.main(["plan", str(path), "--model-window", "1024", "--policy", "reject"]) == 1
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "context_length_exceeded" in out


def messages_body(n_turns: int, *, words: int = 80) -> dict[str, object]:
    """An Anthropic Messages body: ``system`` at the top level, content blocks, a tool round."""
    messages: list[dict[str, object]] = []
    for i in range(n_turns):
        text = f"question {i} " + "lorem " * words
        messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
        messages.append({"role": "assistant", "content": f"answer {i} " + "dolor " * words})
    messages.append({"role": "user", "content": "and finally?"})
    return {"model": "claude-sonnet-4-5", "system": "You are terse.", "max_tokens": 256, "messages": messages}


def test_plan_json_of_a_cut_messages_body_is_the_messages_body_to_forward(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.core.dialects import DIALECTS

    body = messages_body(12)
    path = str(write_json(tmp_path / "req.json", body))
    assert cli.main(["plan", path, "--api", "messages", "--model-window", "2048", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    forwarded = report["body"]
    assert report["api"] == "messages" and report["changed"] is True
    # Anthropic's shape, not chat's: the system prompt stays at the top level, no system message.
    assert forwarded["system"] == body["system"] and forwarded["max_tokens"] == 256
    assert all(m["role"] in ("user", "assistant") for m in forwarded["messages"])
    assert forwarded["messages"][-1] == body["messages"][-1]
    assert len(forwarded["messages"]) < len(body["messages"])
    assert DIALECTS["messages"].problems(forwarded) == []
    assert "messages" not in report  # the engine's chat-form messages are not the answer


def test_plan_of_a_responses_body_with_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = {
        "model": "gpt-4o",
        "instructions": "be brief",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
    }
    path = str(write_json(tmp_path / "req.json", body))
    assert cli.main(["plan", path, "--api", "responses", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["api"] == "responses" and report["fits"] is True and report["count"] == "exact"
    assert report["tokens_before"] > 0 and report["body"] == body  # a Responses body, as forwarded
    # Without --api the body is detected as the dry run detects it; read as chat it has no
    # messages: a clear error, not a traceback.
    assert cli.main(["plan", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["api"] == "responses"
    assert cli.main(["plan", path, "--api", "chat"]) != 0


def test_plan_json_into_a_reader_that_stops_early_ends_quietly(tmp_path: Path) -> None:
    """``ctxproxy plan --json ... | head`` ended in a BrokenPipeError traceback."""
    body = write_json(tmp_path / "big.json", chat(200, words=200))
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("CTXPROXY_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "plan", "--json", str(body)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()  # like head -1: read a line, then close the pipe
    process.stdout.close()
    err = process.stderr.read().decode()
    code = process.wait(timeout=60)
    process.stderr.close()
    assert first.strip() == b"{"
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert code == cli.EXIT_BROKEN_PIPE


def test_help_names_every_wire_api_not_only_chat(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "every LLM request" in out and "Responses" in out and "Anthropic Messages" in out
    assert "every chat request" not in out


@pytest.mark.parametrize("port", ["0", "99999", "eighty"])
def test_serve_refuses_a_port_out_of_range(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--port 99999`` bound a random port."""
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--port", port])
    assert exc.value.code == 2
    assert "expected a port number from 1 to 65535" in capsys.readouterr().err


def test_an_unknown_variable_is_a_warning_naming_the_nearest_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTXPROXY_UPSTREAM_BASEURL", "http://127.0.0.1:9/v1")
    assert cli.main(["models"]) == 0
    err = capsys.readouterr().err
    assert err == (
        "ctxproxy: warning: CTXPROXY_UPSTREAM_BASEURL is not a ctxproxy setting and is ignored: "
        "did you mean CTXPROXY_UPSTREAM_BASE_URL?\n"
    )


def test_serve_leaves_the_unknown_variable_warning_to_the_app(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: calls.append(k))
    monkeypatch.setenv("CTXPROXY_UPSTREAM_BASEURL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("CTXPROXY_LOG_JSON", "true")
    assert cli.main(["serve"]) == 0
    assert "warning" not in capsys.readouterr().err  # logged by each app at start-up instead
    config = calls[0]["log_config"]
    assert isinstance(config, dict)
    assert {f["()"] for f in config["formatters"].values()} == {"app.main.json_log_formatter"}
