"""The public Python API: only ``ctxproxy`` is imported here, as a user of the installed package would."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import ctxproxy
import pytest


def conversation(turns: int, *, words: int = 300) -> dict[str, object]:
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "lorem ipsum " * words})
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "result " * words})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    messages.append({"role": "user", "content": "and finally?"})
    return {"model": "gpt-4o", "temperature": 0.2, "messages": messages}


def test_importing_the_package_loads_nothing_else(tmp_path: Path) -> None:
    probe = (
        "import sys, ctxproxy; "
        "heavy = {'ctxproxy.engine', 'app.engine', 'tiktoken', 'pydantic', 'fastapi', 'httpx'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_public_names() -> None:
    assert {"fit", "count", "FitResult", "InvalidRequest", "APIS"} <= set(dir(ctxproxy))
    assert "chat" in ctxproxy.APIS
    with pytest.raises(AttributeError):
        ctxproxy.no_such_name  # noqa: B018


def test_count_is_the_exact_openai_count() -> None:
    # OpenAI bills 8 prompt tokens for this request to gpt-4o (3 per message, 3 reply priming).
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hello"}]}
    assert ctxproxy.count(body) == 8


def test_a_request_that_fits_comes_back_as_it_is() -> None:
    body = conversation(2, words=10)
    result = ctxproxy.fit(body)
    assert result.fits and not result.changed
    assert result.body is body
    assert result.actions == ()
    assert result.tokens_before == result.tokens_after == ctxproxy.count(body)
    assert result.window_tokens == 128_000 and result.count_kind == "exact"


def test_an_over_long_conversation_is_fitted_without_breaking_it() -> None:
    body = conversation(12)
    original = copy.deepcopy(body)
    result = ctxproxy.fit(body, window_tokens=8192)
    assert body == original  # the input is never mutated
    assert result.fits and result.changed
    assert result.tokens_before > 8192 >= result.tokens_after
    assert result.tokens_after <= result.input_budget_tokens
    assert result.actions and all("=" in action for action in result.actions)
    fitted = result.body
    assert fitted is not body and fitted["temperature"] == 0.2
    messages = fitted["messages"]
    assert messages[0] == original["messages"][0] and messages[-1] == original["messages"][-1]
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or ()}
    results = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert calls == results  # no orphaned result, no call without its result
    assert ctxproxy.count(fitted) == result.tokens_after


def test_a_budget_caps_the_input() -> None:
    result = ctxproxy.fit(conversation(6), budget_tokens=2000)
    assert result.fits and result.tokens_after <= 2000


def test_reject_never_rewrites() -> None:
    body = conversation(12)
    result = ctxproxy.fit(body, window_tokens=4096, policy="reject")
    assert not result.fits and result.body is body
    assert result.tokens_after == result.tokens_before


def test_an_operator_table_gives_the_window(tmp_path: Path) -> None:
    table = tmp_path / "models.toml"
    table.write_text('[models."my-model"]\nwindow = 4096\nencoding = "estimate"\n', encoding="utf-8")
    body = {**conversation(8), "model": "my-model"}
    result = ctxproxy.fit(body, models_file=table)
    assert result.window_tokens == 4096 and result.count_kind == "estimate"
    assert result.fits and result.tokens_after < result.tokens_before


def test_bad_input_is_an_invalid_request() -> None:
    with pytest.raises(ctxproxy.InvalidRequest) as caught:
        ctxproxy.fit({"messages": []})
    assert caught.value.param == "model"
    with pytest.raises(ctxproxy.InvalidRequest):
        ctxproxy.fit({"model": "gpt-4o", "messages": "not a list"})


def test_an_unknown_api_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown api 'completions'"):
        ctxproxy.count({"model": "gpt-4o", "messages": []}, api="completions")


def test_the_result_is_a_frozen_value() -> None:
    result = ctxproxy.fit(conversation(1, words=5))
    assert isinstance(result, ctxproxy.FitResult)
    with pytest.raises(AttributeError):
        result.fits = False  # type: ignore[misc]


def long_request(api: str) -> dict[str, object]:
    """An over-long conversation in the shape of each wire API the engine fits."""
    turns = [("question " + "lorem ipsum " * 300, "answer " + "dolor sit " * 300) for _ in range(12)]
    if api == "chat":
        messages = [
            m for q, a in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
        ]
        return {"model": "gpt-4o", "messages": [*messages, {"role": "user", "content": "and now?"}]}
    if api == "responses":
        items = [
            m for q, a in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
        ]
        return {
            "model": "gpt-4o",
            "instructions": "be brief",
            "input": [*items, {"role": "user", "content": "now?"}],
        }
    if api == "messages":
        messages = [
            m for q, a in turns for m in ({"role": "user", "content": q}, {"role": "assistant", "content": a})
        ]
        return {
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "messages": [*messages, {"role": "user", "content": "?"}],
        }
    if api == "gemini":  # the model is in the path on the wire; a body may name it too
        contents = [
            c
            for q, a in turns
            for c in ({"role": "user", "parts": [{"text": q}]}, {"role": "model", "parts": [{"text": a}]})
        ]
        return {
            "model": "models/gemini-2.5-flash",
            "systemInstruction": {"parts": [{"text": "be brief"}]},
            "contents": [*contents, {"role": "user", "parts": [{"text": "and now?"}]}],
        }
    raise AssertionError(f"add a sample request for the new api {api!r}")


@pytest.mark.parametrize("api", ctxproxy.APIS)
def test_every_api_is_fitted_in_its_own_shape(api: str) -> None:
    body = long_request(api)
    original = copy.deepcopy(body)
    result = ctxproxy.fit(body, api=api, window_tokens=4096)
    assert body == original
    assert result.api == api and result.fits and result.changed
    assert result.tokens_after <= result.input_budget_tokens < result.tokens_before
    assert set(result.body) == set(body)  # same keys: only the conversation was replaced
    # Never more than planned (Messages merges same-role neighbours on render: a little less).
    assert ctxproxy.count(result.body, api=api) <= result.tokens_after


@pytest.mark.parametrize("api", ctxproxy.APIS)
def test_the_api_is_detected_from_the_body_when_not_named(api: str) -> None:
    body = long_request(api)
    if api == "messages":  # its top-level system prompt marks it (a bare messages array is chat's too)
        body = {**body, "system": "be brief"}
    detected = ctxproxy.fit(body, window_tokens=4096)
    named = ctxproxy.fit(body, api=api, window_tokens=4096)
    assert detected.api == api and detected.body == named.body
    assert ctxproxy.count(body) == ctxproxy.count(body, api=api)


def test_an_output_cap_that_leaves_no_room_is_lowered_as_the_proxy_lowers_it() -> None:
    # The proxy's own decision: ``max_tokens`` 5000 on a 4,096-token window is forwarded lowered
    # (the live route's X-Context-Output-Lowered), not refused.
    body = {"model": "gpt-4o", "max_tokens": 5000, "messages": [{"role": "user", "content": "hello"}]}
    result = ctxproxy.fit(body, window_tokens=4096)
    assert result.fits and result.changed and result.actions == ("output_lowered=1",)
    assert result.body["max_tokens"] == result.plan.output_cap_tokens < 4096
    assert result.body["messages"] == body["messages"] and body["max_tokens"] == 5000
    assert result.estimates == ()  # the caller gave the window: nothing a proxy could know better
    assert ctxproxy.fit(body).estimates == ("window",)
