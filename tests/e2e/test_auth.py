"""Proxy keys end to end: clients need one of ``CTXPROXY_API_KEYS``; the upstream sees only the
operator's ``CTXPROXY_UPSTREAM_API_KEY``; start-up refuses proxy keys without an upstream key."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from pydantic import ValidationError

from app.main import create_app
from app.settings import Settings
from tests.fake_upstream import serve_app
from tests.fault_upstream import FaultUpstream

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_KEY = "sk-upstream-0123456789-secret"
PROXY_KEYS = ("team-a-key-111", "team-b-key-222")
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FaultUpstream]:
    fault = FaultUpstream()
    with fault.serve():
        yield fault


@pytest.fixture(scope="module")
def proxy_url(upstream: FaultUpstream) -> Iterator[str]:
    settings = Settings(
        upstream_base_url=f"{upstream.url}/v1",
        upstream_api_key=UPSTREAM_KEY,
        api_keys=" , ".join(PROXY_KEYS),
        log_level="WARNING",
        discovery=False,  # the fake upstream's request log holds only what the tests send
    )
    with serve_app(create_app(settings)) as url:
        yield url


@pytest.fixture
def fake(upstream: FaultUpstream) -> FaultUpstream:
    upstream.clear()
    return upstream


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer  x y",
        "Bearer wrong",
        f"Basic {PROXY_KEYS[0]}",
        f"Bearer {PROXY_KEYS[0]}x",
        f"Bearer {PROXY_KEYS[0][:-1]}",
        f"Bearer {UPSTREAM_KEY}",
        "Bearer ünï",
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/context/plan", "/v1/models", "/v1/embeddings"])
def test_without_a_proxy_key_401(
    fake: FaultUpstream, proxy_url: str, authorization: str | None, path: str
) -> None:
    headers = {} if authorization is None else {"Authorization": authorization.encode()}
    response = httpx.post(f"{proxy_url}{path}", json=BODY, headers=headers, timeout=10)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert set(error) == {"message", "type", "param", "code"}
    assert response.headers["www-authenticate"] == "Bearer"
    assert PROXY_KEYS[0] not in response.text and UPSTREAM_KEY not in response.text
    assert fake.records == []


@pytest.mark.parametrize("key", PROXY_KEYS)
def test_a_proxy_key_passes_and_the_upstream_gets_the_operator_key(
    fake: FaultUpstream, proxy_url: str, key: str
) -> None:
    with openai.OpenAI(base_url=f"{proxy_url}/v1", api_key=key, max_retries=0, timeout=10) as client:
        reply = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        assert reply.choices[0].message.content == "fault upstream says hi"
        client.models.with_raw_response.list()
    assert len(fake.records) == 2
    for record in fake.records:
        assert record.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        assert all(key not in value for value in record.headers.values())


def test_probes_need_no_key(proxy_url: str) -> None:
    assert httpx.get(f"{proxy_url}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{proxy_url}/readyz", timeout=10).status_code in {200, 503}


def test_proxy_keys_without_an_upstream_key_are_refused() -> None:
    with pytest.raises(ValidationError, match="CTXPROXY_UPSTREAM_API_KEY") as info:
        Settings(api_keys="k1,k2", upstream_api_key=None)
    assert "k1" not in str(info.value)
    assert Settings(api_keys=" , ", upstream_api_key=None).proxy_api_keys() == ()


def test_serve_refuses_to_start_with_proxy_keys_and_no_upstream_key() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env["CTXPROXY_API_KEYS"] = "team-key-zzz"
    done = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", "65535"],  # refused before binding
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "CTXPROXY_API_KEYS is set but CTXPROXY_UPSTREAM_API_KEY is not" in done.stderr
    assert "team-key-zzz" not in done.stderr + done.stdout
