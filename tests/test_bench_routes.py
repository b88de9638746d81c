"""bench/routes.py: the same conversation in every wire API's shape, and scenario (r) end to end
against the fake upstream (which answers every route in its API's shape). No timing asserted."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest
import uvloop

from app.core.dialects import DIALECTS
from bench import load, report, routes, run, scenarios
from bench.servers import ServerPool

pytestmark = pytest.mark.timeout(90)


def chat_session() -> dict[str, Any]:
    return scenarios.chat_body(scenarios.agent_messages(approx_tokens=12_000, seed=4), model="bench-200k")


def test_every_shape_holds_the_same_calls_and_results() -> None:
    chat = chat_session()
    calls = [c["id"] for m in chat["messages"] for c in m.get("tool_calls", [])]
    assert len(calls) >= 3

    responses = routes.responses_body(chat)
    assert responses["instructions"] == chat["messages"][0]["content"]
    kinds = [item["type"] for item in responses["input"]]
    assert [i["call_id"] for i in responses["input"] if i["type"] == "function_call"] == calls
    for i, item in enumerate(responses["input"]):  # every output right after its call
        if item["type"] == "function_call_output":
            assert kinds[i - 1] == "function_call" and responses["input"][i - 1]["call_id"] == item["call_id"]
    assert responses["max_output_tokens"] == chat["max_tokens"]
    assert {t["name"] for t in responses["tools"]} == {"read_file", "run_query"}

    messages = routes.messages_body(chat)
    roles = [m["role"] for m in messages["messages"]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    uses = [b["id"] for m in messages["messages"] for b in m["content"] if b["type"] == "tool_use"]
    results = [
        b["tool_use_id"] for m in messages["messages"] for b in m["content"] if b["type"] == "tool_result"
    ]
    assert uses == calls == results
    assert messages["system"] == chat["messages"][0]["content"]
    assert all("input_schema" in t for t in messages["tools"])

    gemini = routes.gemini_body(chat)
    roles = [c["role"] for c in gemini["contents"]]
    assert roles[0] == "user" and all(a != b for a, b in itertools.pairwise(roles))
    parts = [p for c in gemini["contents"] for p in c["parts"]]
    assert [p["functionCall"]["id"] for p in parts if "functionCall" in p] == calls
    assert [p["functionResponse"]["id"] for p in parts if "functionResponse" in p] == calls
    assert gemini["systemInstruction"]["parts"][0]["text"] == chat["messages"][0]["content"]
    assert gemini["generationConfig"]["maxOutputTokens"] == chat["max_tokens"] and "model" not in gemini
    declared = gemini["tools"][0]["functionDeclarations"]
    assert {d["name"] for d in declared} == {"read_file", "run_query"}


def test_the_session_grows_by_one_exchange_in_every_shape() -> None:
    session = routes.RouteSession(12_000, seed=4)
    first, second = session.next_bodies(), session.next_bodies()
    assert set(first) == {r.name for r in routes.ROUTES}
    chat1, chat2 = orjson.loads(first["chat"]), orjson.loads(second["chat"])
    assert chat2["messages"][:-2] == chat1["messages"]
    assert [m["role"] for m in chat2["messages"][-2:]] == ["assistant", "user"]
    messages2 = orjson.loads(second["messages"])["messages"]
    assert [m["role"] for m in messages2[-2:]] == ["assistant", "user"]


@pytest.mark.parametrize("name", sorted(set(DIALECTS) & set(routes.SHAPES)))
def test_the_shapes_are_valid_for_the_proxys_dialects(name: str) -> None:
    body = orjson.loads(routes.in_shape(name, chat_session()))
    dialect = DIALECTS[name]
    conversation = dialect.parse(body)
    assert len(conversation.messages) >= len(chat_session()["messages"]) - 1
    assert dialect.problems(body) == []


def test_scenario_r_runs_against_the_fake_upstream_and_reports(tmp_path: Path) -> None:
    with ServerPool(tmp_path) as pool:
        upstream = run.start_fake_upstream(pool)
        pool.wait_ready(["upstream"], timeout_s=20)
        stream_bodies = {r.path: routes.small(r.name, stream=True) for r in routes.ROUTES}
        # Gemini streams by its path: its stream target asks :streamGenerateContent?alt=sse.
        gemini = routes.BY_NAME["gemini"]
        sse_path = gemini.path.replace(":generateContent", ":streamGenerateContent?alt=sse")
        stream_bodies[sse_path] = routes.small("gemini")
        gemini_sse = load.Target("direct gemini sse", upstream.base_url, "upstream", sse_path, gemini.headers)

        async def go() -> tuple[dict[str, Any], dict[str, load.Samples]]:
            notes: list[str] = []
            async with load.new_session() as session:
                # The fake upstream stands in for the proxy too: it never fits, so no route is "fitted".
                measured = await routes.measure(
                    session,
                    direct_url=upstream.base_url,
                    proxy_url=upstream.base_url,
                    small_iterations=3,
                    session_tokens=8_000,
                    session_iterations=2,
                    requests=12,
                    concurrency=4,
                    rounds=2,
                    time_limit_s=20,
                    cpu_of=lambda target: upstream.cpu_s(),
                    notes=notes,
                )
                streamed, _ = await load.run_interleaved(
                    session,
                    [*routes.targets(upstream.base_url, upstream.base_url)[::2], gemini_sse],
                    lambda i: stream_bodies,
                    iterations=1,
                    time_limit_s=20,
                    stream=True,
                    warmup=0,
                )
            measured["notes"] = notes
            return measured, streamed

        measured, streamed = uvloop.run(go())
    for key in ("small", "session"):
        assert {n: s.errors for n, s in measured[key].items()} == {n: 0 for n in measured[key]}
        assert all(len(s.latency_s) >= 2 for s in measured[key].values())
    assert sum(len(s.latency_s) for s in measured["throughput"].values()) == len(routes.ROUTES) * 12
    # CPU read around every request: each target (here all served by one process) gets its own.
    assert all((s.server_cpu_s or 0) > 0 for s in measured["small"].values())
    assert measured["fitted"] == {"chat": False, "responses": False, "messages": False, "gemini": False}
    assert any("passed through, not fitted" in n for n in measured["notes"])
    ends = {name: s.last_body.rstrip().rsplit(b"\n", 1)[-1] for name, s in streamed.items()}
    assert ends == {
        "direct chat": b"data: [DONE]",
        "direct responses": ends["direct responses"],
        "direct messages": b'data: {"type":"message_stop"}',
        "direct gemini": ends["direct gemini"],
        "direct gemini sse": ends["direct gemini sse"],
    }
    assert b'"type":"response.completed"' in ends["direct responses"]
    # Gemini streams by its path, not by the body: its (r) route answers whole; its SSE stream is
    # CRLF-framed chunks with usage on each, the last with the finish reason, and no [DONE].
    whole, sse = ends["direct gemini"], streamed["direct gemini sse"].last_body
    assert whole.startswith(b'{"candidates"') and b'"finishReason":"STOP"' in whole
    frames = sse.split(b"\r\n\r\n")
    assert frames[-1] == b"" and all(f.startswith(b"data: {") and b"usageMetadata" in f for f in frames[:-1])
    assert b'"finishReason":"STOP"' in frames[-2] and b"[DONE]" not in sse

    block = {
        "small": {"stats": {n: report.stats_ms(s.latency_s) for n, s in measured["small"].items()}},
        "session": {"stats": {n: report.stats_ms(s.latency_s) for n, s in measured["session"].items()}},
        "throughput": {
            "stats": {
                n: {**report.stats_ms(s.latency_s), "rps": 10.0, "rps_rounds": 12.0}
                for n, s in measured["throughput"].items()
            }
        },
        "fitted": measured["fitted"],
    }
    text = "\n".join(routes.markdown(block))
    assert "/v1/responses" in text and "/v1/messages" in text and "median of rounds" in text
    assert ":generateContent" in text
    assert all(len(s.round_rps) == 2 for s in measured["throughput"].values())  # a rate per round
    verdicts = routes.checks(block)
    assert len(verdicts) == 9 and all(ok is None for _, ok, _ in verdicts)  # nothing was fitted
    assert "12 vs 12 (1.00x; all rounds 1.00x)" in verdicts[-1][2]


def test_the_throughput_check_reads_the_median_of_rounds_and_shows_all_rounds() -> None:
    stats = {
        "proxy chat": {"rps": 1000.0, "rps_rounds": 1000.0},
        "proxy responses": {"rps": 800.0, "rps_rounds": 950.0},  # one slow round pulled the total
        "proxy messages": {"rps": 990.0, "rps_rounds": 850.0},
    }
    verdicts = routes.checks({"throughput": {"stats": stats}})
    assert [(ok, detail) for _, ok, detail in verdicts] == [
        (True, "950 vs 1000 (0.95x; all rounds 0.80x)"),
        (False, "850 vs 1000 (0.85x; all rounds 0.99x)"),
    ]
    assert routes.rps_of({"rps": 5.0}) == 5.0  # results from before the rounds were kept
