"""bench.soak end to end on a tiny run: real processes, the whole mix, nothing unexpected, table written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import routes, soak


def test_tiny_soak_run_answers_every_request_as_expected(tmp_path: Path) -> None:
    args = argparse.Namespace(
        requests=120,
        concurrency=8,
        warmup=0,
        distinct=2,
        max_duration_s=120.0,
        routes=["chat", "responses", "messages", "gemini"],
    )
    result = soak.run(args)
    tally = result["tally"]
    assert sum(tally.sent.values()) == 120
    assert set(tally.sent) == {"fit", "stream", "long", "bad"}
    gemini_streams = sum(1 for n in range(120) if n % 4 == 3 and soak.KINDS[n % len(soak.KINDS)] == "stream")
    assert dict(tally.routes) == {
        "/v1/chat/completions": 30,
        "/v1/responses": 30,
        "/v1/messages": 30,
        f"/v1beta/models/{soak.MODEL}:generateContent": 30 - gemini_streams,
        f"/v1beta/models/{soak.MODEL}:streamGenerateContent?alt=sse": gemini_streams,
    }
    assert gemini_streams > 0
    assert sum(tally.unexpected.values()) == 0, tally.examples
    assert sum(result["warm"].unexpected.values()) == 0, result["warm"].examples
    assert tally.ok == tally.sent
    assert result["rss_after_kib"] > 0 and result["fd_after"] > 0
    table = soak.render(result)
    assert "| unexpected errors | 0 |" in table
    assert "| requests sent / answered as expected | 120 / 120 |" in table


def test_the_mix_is_forty_thirty_fifteen_fifteen() -> None:
    counts = {kind: soak.KINDS.count(kind) for kind in set(soak.KINDS)}
    assert counts == {"fit": 8, "stream": 6, "long": 3, "bad": 3}
    pool = soak.build_pool(4)
    assert [e.status for e in pool["bad"]] == [400, 400, 400, 413]
    assert all(len(e.body) > soak.MAX_BODY_BYTES for e in pool["bad"] if e.status == 413)


def test_every_kind_goes_to_every_route_in_its_shape() -> None:
    pool = soak.build_route_pool(4, ["chat", "responses", "messages", "gemini"])
    assert {kind: len(per_route) for kind, per_route in pool.items()} == dict.fromkeys(pool, 4)
    chat, responses, messages = pool["long"][0][0], pool["long"][1][0], pool["long"][2][0]
    assert (chat.path, responses.path, messages.path) == (
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
    )
    assert b'"input"' in responses.body and b'"instructions"' in responses.body
    assert b'"system"' in messages.body and messages.headers["anthropic-version"] == "2023-06-01"
    assert all(e.fitted for per_route in pool["long"] for e in per_route)
    assert [e.stream_end for e in (p[0] for p in pool["stream"])] == list(soak.STREAM_ENDS.values())
    assert [e.status for e in pool["bad"][1]] == [400, 400, 400, 413]
    role = pool["bad"][1][2]  # the unknown-role variant, as a Responses body
    assert b'"input"' in role.body and b'"role": "r2"' in role.body and role.path == "/v1/responses"
    # Gemini: the model and the stream are in the path; the unknown role in its contents.
    gemini_long, gemini_stream = pool["long"][3][0], pool["stream"][3][0]
    assert gemini_long.path == f"/v1beta/models/{soak.MODEL}:generateContent"
    assert b'"contents"' in gemini_long.body and b'"systemInstruction"' in gemini_long.body
    assert gemini_stream.path == f"/v1beta/models/{soak.MODEL}:streamGenerateContent?alt=sse"
    gemini_role = pool["bad"][3][2]
    assert b'"contents"' in gemini_role.body and b'"role": "r2"' in gemini_role.body
    # The first request numbers of the warm-up reach each route in turn.
    assert [pool[soak.KINDS[n % len(soak.KINDS)]][n % 4][0].path for n in range(4)] == [
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",
        f"/v1beta/models/{soak.MODEL}:generateContent",
    ]


def test_a_churned_request_is_another_clients_for_another_model_and_cap() -> None:
    pool = soak.build_pool(2)
    gemini, messages = routes.BY_NAME["gemini"], routes.BY_NAME["messages"]
    long_one = soak.churned(pool["long"][0], messages, 7)
    other = soak.churned(pool["long"][0], messages, 8)
    body = json.loads(long_one.body)
    assert body["model"] == f"{soak.MODEL}-c7" and body["max_tokens"] == 32 + 49
    assert long_one.headers["x-api-key"] == "sk-soak-churn-7" != other.headers["x-api-key"]
    assert long_one.headers["Authorization"] == "Bearer sk-soak-churn-7" and long_one.fitted
    assert (
        soak.churned(pool["stream"][0], gemini, 9).path
        == f"/v1beta/models/{soak.MODEL}-c9:streamGenerateContent?alt=sse"
    )
    bad = soak.churned(pool["bad"][0], messages, 10)
    assert (
        bad.body == pool["bad"][0].body
        and bad.status == 400
        and bad.headers["x-api-key"] == "sk-soak-churn-10"
    )


def test_a_tiny_churn_run_answers_every_new_client_as_expected() -> None:
    args = argparse.Namespace(
        requests=80,
        concurrency=8,
        warmup=20,
        distinct=1,
        max_duration_s=120.0,
        routes=["chat", "gemini"],
        churn=True,
    )
    result = soak.run(args)
    tally = result["tally"]
    assert sum(tally.sent.values()) == 80 and sum(tally.unexpected.values()) == 0, tally.examples
    assert sum(result["warm"].unexpected.values()) == 0, result["warm"].examples
    assert tally.ok == tally.sent and result["churn"] and result["tolerance"] == soak.CHURN_RSS_TOLERANCE
    assert any("-c<n>:" in path for path in tally.routes)
