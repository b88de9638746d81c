"""The one decision behind every door (``app.service.decision``).

The corpus: per wire API, four cases (it fits, it is cut, its output cap is lowered, it cannot
fit), each sent through every door: the live route (the app in front of a recording upstream,
through the transport seam; the shipped tokenizer), the dry run's ``body`` (``POST
/v1/context/plan``), ``ctxproxy plan --json``, ``ctxproxy.fit(...).body``, ``/v1/compress`` (its
message list against the live route's) and the llm-d endpoint. Every door forwards the same
bytes as the live route, and refuses what it refuses with the same numbers. Then what a dry run
cannot know, named; and the fast path, which sends before it plans, only where the decision
keeps the request as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from fastapi import FastAPI

from app import cli
from app.api.compress import ASIDE, COMPACT_PREFIX, COMPRESS_PATH
from app.core.ceiling import fitting_ceiling
from app.core.dialects import DIALECTS
from app.core.routes import RouteMatch
from app.engine import count, fit
from app.main import create_app
from app.service.request import RequestOptions
from app.settings import Settings
from app.wire import dump_json
from tests.api import UPSTREAM, OneModelRegistry, WordVocabularies, make_settings, words

MODEL = "door-model"
WINDOW_TOKENS = 4096
TABLE = f'[models]\n"{MODEL}" = {{ window = 4_096, max_output = 4_096, encoding = "o200k_base" }}\n'
CASES = ("fits", "cut", "lowered", "cannot_fit")
TOOL_WORDS = 6000  # a tool definition larger than the window: nothing can make the request fit


def text(n: int, tag: str) -> str:
    """``n`` words of varied text (a tokenizer does not merge it into a few tokens)."""
    return " ".join(f"{tag}{k % 97}x{k % 13}" for k in range(n))


def turns(n: int, size: int) -> list[tuple[str, str]]:
    return [(f"question {k}: {text(size, f'q{k}')}", f"answer {k}: {text(size, f'a{k}')}") for k in range(n)]


ASK = "Say hello to the world, please."


def chat_like(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Role messages with string content (chat's, and what Responses and Messages also take)."""
    said = [({"role": "user", "content": q}, {"role": "assistant", "content": a}) for q, a in pairs]
    return [*(m for both in said for m in both), {"role": "user", "content": ASK}]


def request_body(api: str, case: str) -> dict[str, Any]:
    """One request of ``api`` for ``case`` (see the module docstring), in the API's own shape."""
    pairs, cap = {"fits": (turns(2, 20), 100), "cut": (turns(30, 200), 500), "lowered": ([], 5000)}.get(
        case, ([], None)
    )
    tool = text(TOOL_WORDS, "tool") if case == "cannot_fit" else None
    body: dict[str, Any] = {"model": MODEL}
    if api == "chat":
        body["messages"] = chat_like(pairs)
        if cap is not None:
            body["max_tokens"] = cap
        if tool is not None:
            body["tools"] = [{"type": "function", "function": {"name": "f", "description": tool}}]
    elif api == "responses":
        body["input"] = chat_like(pairs)
        if cap is not None:
            body["max_output_tokens"] = cap
        if tool is not None:
            body["tools"] = [{"type": "function", "name": "f", "description": tool, "parameters": {}}]
    elif api == "messages":
        body.update(max_tokens=cap or 100, messages=chat_like(pairs))
        if tool is not None:
            body["tools"] = [{"name": "f", "description": tool, "input_schema": {"type": "object"}}]
    elif api == "gemini":
        roles = {"user": "user", "assistant": "model"}
        said = chat_like(pairs)
        body["contents"] = [{"role": roles[m["role"]], "parts": [{"text": m["content"]}]} for m in said]
        if cap is not None:
            body["generationConfig"] = {"maxOutputTokens": cap}
        if tool is not None:
            declaration = {"name": "f", "description": tool, "parameters": {"type": "object"}}
            body["tools"] = [{"functionDeclarations": [declaration]}]
    else:
        raise AssertionError(f"add the corpus of the new API {api!r}")
    return body


def output_cap(api: str, body: dict[str, Any]) -> int | None:
    """The output cap ``body`` asks for (the corpus's own keys)."""
    if api == "gemini":
        return body.get("generationConfig", {}).get("maxOutputTokens")
    cap = body.get("max_output_tokens", body.get("max_tokens"))
    return cap if isinstance(cap, int) else None


def route_path(api: str) -> str:
    """The API's first fitted route, its model in the path when the template has one."""
    return RouteMatch.first(DIALECTS[api]).route.template.replace("{model}", MODEL)


@dataclass
class Recording:
    """The upstream: records what it is sent, answers a bare 200."""

    sent: list[httpx.Request]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        return httpx.Response(200, json={})


@asynccontextmanager
async def live(table: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Recording]]:
    """The app with the corpus's model table and the shipped tokenizer, summaries off (a dry run
    names a summary as an estimate; that is tested below), discovery off."""
    recording = Recording([])
    router = respx.Router(assert_all_called=False)
    router.route().mock(side_effect=recording)
    settings = Settings(
        upstream_base_url=UPSTREAM,
        upstream_transport="httpx",
        upstream_api_key=None,
        models_file=table,
        summarize=False,
        discovery=False,
        log_level="WARNING",
    )
    app = create_app(settings, upstream_transport=httpx.MockTransport(router.handler))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            yield client, recording


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The model table every door reads; ``ctxproxy plan`` sees the app's settings (summaries off)."""
    for name in [n for n in os.environ if n.startswith("CTXPROXY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CTXPROXY_SUMMARIZE", "false")
    path = tmp_path / "models.toml"
    path.write_text(TABLE, encoding="utf-8")
    return path


def cli_plan(
    api: str, raw: bytes, table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any]]:
    path = tmp_path / f"{api}.json"
    path.write_bytes(raw)
    capsys.readouterr()
    code = cli.main(["plan", "--json", "--api", api, "--models-file", str(table), str(path)])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("api", list(DIALECTS))
async def test_every_door_forwards_the_live_routes_bytes(
    api: str, case: str, table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dialect = DIALECTS[api]
    body = request_body(api, case)
    raw = dump_json(body)
    items = body[dialect.items_key]
    async with live(table) as (client, recording):
        answer = await client.post(route_path(api), content=raw, headers={"content-type": "application/json"})
        forwarded = recording.sent[-1].content if recording.sent else None
        calls = len(recording.sent)
        dry = await client.post(f"/v1/context/plan?api={api}", content=raw)
        compacted = await client.post(COMPACT_PREFIX + route_path(api), content=raw)
        # The messages contract: the gateway keeps aside what is not in the message list (here the
        # tool definitions) and forwards the output cap the live route did.
        lowered = answer.headers.get("x-context-output-lowered")
        reserve = int(lowered) if lowered is not None else output_cap(api, body)
        listed = {"model": MODEL, dialect.items_key: items}
        aside = count(body, api=api, models_file=table) - count(listed, api=api, models_file=table)
        headers = {"X-Context-Api": api, ASIDE: str(aside)}
        if reserve is not None:
            headers["X-Context-Reserve"] = str(reserve)
        listed_json = {"model": MODEL, "messages": items}
        compressed = await client.post(COMPRESS_PATH, json=listed_json, headers=headers)
    assert calls == (0 if case == "cannot_fit" else 1)  # one request sent; no counting endpoint asked
    report = dry.json()
    code, printed = cli_plan(api, raw, table, tmp_path, capsys)
    fitted = fit(body, api=api, models_file=table)
    assert report["estimates"] == {}  # in the proxy's process: nothing it could not know here
    assert set(printed["estimates"]) == {"window"} and fitted.estimates == ("window",)  # offline
    if case == "cannot_fit":
        assert answer.status_code == compacted.status_code == compressed.status_code == 400
        assert answer.content == compacted.content  # the same refusal, words and numbers
        assert answer.json() != {} and dialect.overflow(400, answer.content) is not None
        before = int(answer.headers["x-context-tokens-before"])
        for plan in (report, printed):
            assert plan["fits"] is False and plan["tokens_before"] == before
            assert str(plan["budget"]["request_budget_tokens"]) == answer.headers["x-context-budget"]
        assert code == 1 and not fitted.fits and fitted.tokens_before == before
        return
    assert answer.status_code == 200 and forwarded is not None
    assert dump_json(report["body"]) == forwarded
    assert code == 0 and dump_json(printed["body"]) == forwarded
    assert dump_json(fitted.body) == forwarded
    assert compacted.status_code == 200 and compacted.content == forwarded
    assert compressed.status_code == 200
    assert dump_json(compressed.json()["messages"]) == dump_json(json.loads(forwarded)[dialect.items_key])
    # What each case is, at every door.
    changed = {"fits": False, "cut": True, "lowered": dialect.output_in_window}[case]
    assert (forwarded != raw) is changed is report["changed"] is printed["changed"] is fitted.changed
    if case == "lowered" and dialect.output_in_window:
        cap = int(answer.headers["x-context-output-lowered"])
        assert report["output_lowered"] == printed["output_lowered"] == cap < 5000
        assert output_cap(api, json.loads(forwarded)) == cap
    if case == "cut":
        assert "dropped_turns=" in answer.headers["x-context-actions"]
        assert report["actions_header"] == printed["actions_header"] == answer.headers["x-context-actions"]


async def test_the_issues_example_every_door_says_what_the_live_route_does(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # ``max_tokens: 5000`` on a 4,096-token model: the live route answers 200 with the output cap
    # lowered; the dry run, ``ctxproxy plan`` and ``ctxproxy.fit`` say so and forward the same.
    body = {"model": MODEL, "max_tokens": 5000, "messages": [{"role": "user", "content": "hello"}]}
    raw = dump_json(body)
    async with live(table) as (client, recording):
        answer = await client.post("/v1/chat/completions", content=raw)
        report = (await client.post("/v1/context/plan", content=raw)).json()
    lowered = int(answer.headers["x-context-output-lowered"])
    assert answer.status_code == 200 and json.loads(recording.sent[-1].content)["max_tokens"] == lowered
    assert report["fits"] and report["output_lowered"] == lowered and report["body"]["max_tokens"] == lowered
    path = tmp_path / "issue.json"
    path.write_bytes(raw)
    capsys.readouterr()
    assert cli.main(["plan", "--models-file", str(table), str(path)]) == 0
    out = capsys.readouterr().out
    assert f"output cap lowered to {lowered:,} (X-Context-Output-Lowered)" in out
    assert "would answer 400" not in out and "estimate window:" in out
    result = fit(body, models_file=table)  # the API detected from the body
    assert result.fits and result.api == "chat" and result.body["max_tokens"] == lowered


# -- what a dry run cannot know, named -------------------------------------------------------------


def anthropic_near_the_budget(size: int) -> dict[str, Any]:
    return {
        "model": "acme/llm",
        "max_tokens": 100,
        "messages": [
            {"role": "user", "content": words(size, "u")},
            {"role": "assistant", "content": words(size, "a")},
            {"role": "user", "content": words(40, "q")},
        ],
    }


@asynccontextmanager
async def word_app(
    router: respx.Router, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    app = create_app(
        make_settings(log_level="WARNING", **settings),
        upstream_transport=httpx.MockTransport(router.handler),
        registry=OneModelRegistry(),
        vocabularies=WordVocabularies(),
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy.test") as client:
            yield client, app


async def test_a_dry_run_names_the_upstream_count_the_live_route_asks_for() -> None:
    # Near the budget (window 1,000, word counts), the live route asks Anthropic's counting
    # endpoint; the dry run asks nothing and says its decision used our count.
    router = respx.Router(assert_all_called=False)
    counted = router.post(f"{UPSTREAM}/messages/count_tokens").mock(
        return_value=httpx.Response(200, json={"input_tokens": 700})
    )
    router.post(f"{UPSTREAM}/messages").mock(return_value=httpx.Response(200, json={}))
    body = anthropic_near_the_budget(420)
    version = {"anthropic-version": "2023-06-01"}  # the dry run detects the API by it
    async with word_app(router, summarize=False, discovery=False) as (client, _):
        report = (await client.post("/v1/context/plan", json=body, headers=version)).json()
        assert counted.calls.call_count == 0
        answer = await client.post("/v1/messages", json=body, headers=version)
        off = await client.post(
            "/v1/context/plan", json=body, headers={**version, "X-Context-Upstream-Count": "off"}
        )
    assert counted.calls.call_count == 1 and answer.headers["x-context-upstream-tokens"] == "700"
    assert set(report["estimates"]) == {"upstream_count"}
    assert "counting endpoint" in report["estimates"]["upstream_count"]
    # By our count it is cut; by the upstream's it goes whole.
    assert report["changed"] and answer.headers["x-context-actions"] == "none"
    assert off.json()["estimates"] == {}  # the proxy would not ask either: nothing unknown


async def test_a_dry_run_names_the_memory_when_summaries_are_on() -> None:
    router = respx.Router(assert_all_called=False)
    body = {"model": "m", "messages": [{"role": "user", "content": words(300, f"u{k}")} for k in range(8)]}
    async with word_app(router, discovery=False) as (client, _):  # summaries on (the default)
        cut = (await client.post("/v1/context/plan", json=body)).json()
        one = {"model": "m", "messages": body["messages"][:1]}
        small = (await client.post("/v1/context/plan", json=one)).json()
        quiet = {"X-Context-Summarize": "off"}
        off = (await client.post("/v1/context/plan", json=body, headers=quiet)).json()
    assert cut["changed"] and set(cut["estimates"]) == {"memory"}
    assert small["estimates"] == {} and off["estimates"] == {}


async def test_a_dry_run_names_a_window_discovery_has_not_settled() -> None:
    router = respx.Router(assert_all_called=False)
    router.route().mock(return_value=httpx.Response(404))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with word_app(router, summarize=False) as (client, app):  # discovery on
        unsettled = (await client.post("/v1/context/plan", json=body)).json()
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 404  # discovers
        await app.state.service.learner.discovery.wait_idle()
        settled = (await client.post("/v1/context/plan", json=body)).json()
        window = {"X-Context-Window": "900"}
        given = (await client.post("/v1/context/plan", json=body, headers=window)).json()
    assert set(unsettled["estimates"]) == {"window"}
    assert settled["estimates"] == {} and given["estimates"] == {}


def test_ctxproxy_plan_prints_what_it_cannot_know(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "b.json"
    path.write_bytes(dump_json(request_body("chat", "fits")))
    capsys.readouterr()
    assert cli.main(["plan", "--models-file", str(table), str(path)]) == 0
    assert "estimate window: the model table's window" in capsys.readouterr().out
    assert cli.main(["plan", "--model-window", "4096", "--models-file", str(table), str(path)]) == 0
    assert "estimate" not in capsys.readouterr().out


# -- the fast path is the decision too ------------------------------------------------------------


async def test_the_fast_path_sends_first_only_what_the_boundary_keeps() -> None:
    # A request whose ceiling fits the budget but lies where the boundary would look for the
    # upstream's count is planned first (the decision may cut it), not sent before its plan.
    async with word_app(respx.Router(assert_all_called=False), summarize=False, discovery=False) as (_, app):
        service = app.state.service
        route = RouteMatch.first(DIALECTS["chat"])
        options = RequestOptions(reserve_tokens=100)

        def request(size: int) -> Any:
            body = {"model": "m", "messages": [{"role": "user", "content": "x" * size}]}
            return service.request(body, options, route=route)

        def ceiling(size: int) -> Any:
            r = request(size)
            return fitting_ceiling(r.body, r.conversation, dialect=r.dialect, spec=r.spec, policy=r.policy)

        near, far = request(870), request(300)
        assert ceiling(870) is not None and ceiling(300) is not None  # both fit the budget
        assert not service.boundary.keeps(near, ceiling(870).tokens, ceiling(870).budget)
        assert not service.surely_fits(near) and service.surely_fits(far)
