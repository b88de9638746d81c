"""The status page's login with proxy keys on: a form for browsers, a session cookie that is not the
key and opens the read-only pages only, never an API call; every worker checks it alike."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
import respx

from app.api.login import (
    COOKIE,
    SESSION_S,
    cookie_valid,
    cookie_value,
    session_secret,
)
from tests.api import UPSTREAM, chat_ok, proxy

KEYS = ("team-a-key-111", "team-b-key-222")
HTML = {"Accept": "text/html,application/xhtml+xml"}


def settings(**overrides: Any) -> dict[str, Any]:
    return {"api_keys": ",".join(KEYS), "upstream_api_key": "sk-upstream", **overrides}


def router() -> respx.Router:
    r = respx.Router(assert_all_called=False)
    r.post(f"{UPSTREAM}/chat/completions").mock(return_value=httpx.Response(200, json=chat_ok()))
    r.get(f"{UPSTREAM}/models").mock(return_value=httpx.Response(200, json={"data": []}))
    return r


async def login(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post("/login", data={"key": key}, headers=HTML)


async def test_a_browser_without_a_key_gets_the_form_and_an_api_client_the_json_401() -> None:
    async with proxy(router(), **settings()) as (client, _):
        page = await client.get("/", headers=HTML)
        api = await client.get("/", headers={"Accept": "application/json"})
        status_json = await client.get("/status.json")
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    assert '<form method="post" action="login">' in page.text and 'name="key"' in page.text
    assert "form-action 'self'" in page.headers["content-security-policy"]
    assert api.status_code == 401 and api.json()["error"]["code"] == "invalid_api_key"
    assert status_json.status_code == 401 and status_json.json()["error"]["code"] == "invalid_api_key"


async def test_a_right_key_sets_a_strict_http_only_session_that_is_not_the_key() -> None:
    async with proxy(router(), **settings()) as (client, _):
        wrong = await login(client, "team-a-key-112")
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        assert "not one of this proxy's keys" in wrong.text
        right = await login(client, KEYS[1])
    assert right.status_code == 303 and right.headers["location"] == "./"
    cookie = right.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=v1.")
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={SESSION_S}"):
        assert attribute in cookie
    assert "Secure" not in cookie  # plain http here; https gets Secure
    for key in KEYS:
        assert key not in cookie and hashlib.sha256(key.encode()).hexdigest() not in cookie


async def test_the_session_opens_the_read_only_pages_and_no_api_call() -> None:
    upstream = router()
    async with proxy(upstream, **settings()) as (client, _):
        await login(client, KEYS[0])  # the client keeps the cookie
        assert client.cookies.get(COOKIE)
        page = await client.get("/", headers=HTML)
        status = await client.get("/status.json")
        metrics = await client.get("/metrics")
        chat = await client.post(
            "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        )
        models = await client.get("/v1/models")
        plan = await client.post("/v1/context/plan", json={"model": "m", "messages": []})
        posted = await client.post("/status.json")
    assert page.status_code == 200 and 'id="recent"' in page.text  # the status page itself
    assert status.status_code == 200 and "version" in status.json()
    assert metrics.status_code in (200, 503)  # 503 only without prometheus-client
    for refused in (chat, models, plan):
        assert refused.status_code == 401, refused.request.url
    assert posted.status_code in (401, 405)
    assert not any(call.request.url.path.endswith("/chat/completions") for call in upstream.calls)


async def test_logout_clears_the_session() -> None:
    async with proxy(router(), **settings()) as (client, _):
        await login(client, KEYS[0])
        out = await client.get("/logout", headers=HTML)
        assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
        assert not client.cookies.get(COOKIE)
        again = await client.get("/", headers=HTML)
    assert again.status_code == 401 and 'name="key"' in again.text


async def test_a_session_from_another_worker_with_the_same_keys_is_valid_and_other_keys_end_it() -> None:
    async with proxy(router(), **settings()) as (one, _):
        await login(one, KEYS[0])
        value = one.cookies[COOKIE]
    async with proxy(router(), **settings()) as (two, _):  # another worker (or replica)
        seen = await two.get("/status.json", headers={"Cookie": f"{COOKIE}={value}"})
    async with proxy(router(), **settings(api_keys="rotated-key-333")) as (three, _):
        rotated = await three.get("/status.json", headers={"Cookie": f"{COOKIE}={value}"})
    assert seen.status_code == 200
    assert rotated.status_code == 401


async def test_a_key_in_the_header_still_opens_the_page_and_nothing_changes_without_keys() -> None:
    async with proxy(router(), **settings()) as (client, _):
        with_key = await client.get("/", headers={**HTML, "Authorization": f"Bearer {KEYS[0]}"})
    assert with_key.status_code == 200 and 'id="recent"' in with_key.text
    async with proxy(router()) as (client, _):  # no proxy keys: no login at all
        page = await client.get("/", headers=HTML)
        login_path = await client.post("/login", data={"key": "x"})
    assert page.status_code == 200
    assert login_path.status_code in (404, 405)


def test_cookie_values_expire_and_a_tampered_one_is_refused() -> None:
    secret = session_secret(KEYS)
    assert session_secret(tuple(reversed(KEYS))) == secret  # the set of keys, not their order
    value = cookie_value(secret, now_s=1_000)
    assert cookie_valid(secret, value, now_s=1_000 + SESSION_S - 1)
    assert not cookie_valid(secret, value, now_s=1_000 + SESSION_S)
    version, expires, mac = value.split(".")
    assert not cookie_valid(secret, f"{version}.{int(expires) + 3600}.{mac}", now_s=1_000)
    flipped = mac[:-1] + ("1" if mac[-1] == "0" else "0")
    assert not cookie_valid(secret, f"{version}.{expires}.{flipped}", now_s=1_000)
    assert not cookie_valid(session_secret(("other",)), value, now_s=1_000)
    for junk in ("", "v1", "v1..", "v2.99999999999.00", "v1.-5.ab", "v1.1e9.ab", "v1.9999999999999.ab"):
        assert not cookie_valid(secret, junk, now_s=1_000)


@pytest.mark.parametrize("body", [b"key=" + b"x" * 5000, b"\xff\xfe=1", b""])
async def test_a_bad_login_form_is_the_form_again(body: bytes) -> None:
    async with proxy(router(), **settings()) as (client, _):
        response = await client.post(
            "/login", content=body, headers={**HTML, "Content-Type": "application/x-www-form-urlencoded"}
        )
    assert response.status_code == 401 and "set-cookie" not in response.headers


@pytest.mark.parametrize(
    "cookie", ['ctxproxy_status="unterminated', "a b=c; ctxproxy_status=v1.1.x", "\x7f=1"]
)
async def test_a_malformed_cookie_header_is_no_session(cookie: str) -> None:
    async with proxy(router(), **settings()) as (client, _):
        response = await client.get("/status.json", headers={"Cookie": cookie})
    assert response.status_code == 401


async def test_the_page_offers_to_sign_out_only_to_a_session() -> None:
    async with proxy(router(), **settings()) as (client, _):
        with_key = await client.get("/", headers={**HTML, "Authorization": f"Bearer {KEYS[0]}"})
        await login(client, KEYS[0])
        with_session = await client.get("/", headers=HTML)
        signed_out = await client.get("/logout", headers=HTML)
    link = '<a class="sign-out" id="sign-out" href="logout">Sign out</a>'
    assert with_key.status_code == 200 and 'id="sign-out"' not in with_key.text
    assert with_session.status_code == 200 and link in with_session.text
    assert signed_out.status_code == 303 and f"{COOKIE}=;" in signed_out.headers["set-cookie"]


async def test_without_proxy_keys_the_page_has_no_sign_out() -> None:
    async with proxy(router()) as (client, _):
        page = await client.get("/", headers=HTML)
        logout = await client.get("/logout")
    assert page.status_code == 200 and 'id="sign-out"' not in page.text
    assert logout.status_code == 404  # no login without keys
