"""The status page's login with proxy keys on: a form for browsers, a session cookie that is not the
key and opens the read-only pages only, never an API call; every worker checks it alike; a
sign-out ends the session on the server side; failed logins are limited per address; the cookie is
Secure over https, direct or behind a proxy that says so."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from app.api.login import (
    COOKIE,
    FAILURE_WINDOW_S,
    MAX_FAILURES,
    SESSION_S,
    LoginLimiter,
    cookie_session,
    cookie_value,
    new_session_id,
    served_over_https,
    session_secret,
)
from app.service.sessions import Sessions
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
    assert cookie.startswith(f"{COOKIE}=v2.")
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


async def test_a_copy_of_the_cookie_stops_working_at_once_after_sign_out() -> None:
    async with proxy(router(), **settings()) as (client, _):
        await login(client, KEYS[0])
        copy = {"Cookie": f"{COOKIE}={client.cookies[COOKIE]}"}
        before = await client.get("/status.json", headers=copy)
        await client.post("/logout", headers=HTML)
        after = await client.get("/status.json", headers=copy)
        page = await client.get("/", headers={**HTML, **copy})
    assert before.status_code == 200
    assert after.status_code == 401 and after.json()["error"]["code"] == "invalid_api_key"
    assert page.status_code == 401 and 'name="key"' in page.text


async def test_a_session_is_live_in_every_worker_sharing_the_directory_until_one_ends_it(
    tmp_path: Path,
) -> None:
    shared = settings(worker_dir=tmp_path)
    async with proxy(router(), **shared) as (one, _), proxy(router(), **shared) as (two, _):
        await login(one, KEYS[0])
        copy = {"Cookie": f"{COOKIE}={one.cookies[COOKIE]}"}
        seen = await two.get("/status.json", headers=copy)  # another worker of the same server
        await two.get("/logout", headers=copy)  # signed out there
        gone_here = await one.get("/status.json", headers=copy)
        gone_there = await two.get("/status.json", headers=copy)
    assert seen.status_code == 200
    assert gone_here.status_code == 401 and gone_there.status_code == 401
    async with proxy(router(), **settings()) as (alone, _):  # a process that shares nothing
        unknown = await alone.get("/status.json", headers=copy)
    assert unknown.status_code == 401


async def test_other_keys_end_every_session(tmp_path: Path) -> None:
    async with proxy(router(), **settings(worker_dir=tmp_path)) as (one, _):
        await login(one, KEYS[0])
        value = one.cookies[COOKIE]
    async with proxy(router(), **settings(worker_dir=tmp_path, api_keys="rotated-key-333")) as (two, _):
        rotated = await two.get("/status.json", headers={"Cookie": f"{COOKIE}={value}"})
    assert rotated.status_code == 401


async def test_failed_logins_are_limited_per_address_then_429_with_retry_after() -> None:
    async with proxy(router(), **settings()) as (client, app):
        failures = [await login(client, f"guess-{i}") for i in range(MAX_FAILURES)]
        limited = await login(client, KEYS[0])  # the right key too, while limited
        elsewhere = httpx.ASGITransport(app=app, client=("192.0.2.7", 40000))
        async with httpx.AsyncClient(transport=elsewhere, base_url="http://proxy.test") as other:
            other_address = await login(other, KEYS[0])
    assert all(f.status_code == 401 for f in failures)
    assert limited.status_code == 429 and "set-cookie" not in limited.headers
    assert 1 <= int(limited.headers["retry-after"]) <= FAILURE_WINDOW_S
    assert "Too many failed sign-ins" in limited.text and 'name="key"' in limited.text
    assert limited.headers["content-type"].startswith("text/html")  # the login page's own shape
    assert other_address.status_code == 303  # another address is not limited


def test_the_limit_is_a_sliding_window_per_address_with_bounded_memory() -> None:
    now = [1000.0]
    limiter = LoginLimiter(max_failures=3, window_s=60.0, max_addresses=100, clock=lambda: now[0])
    for second in (0, 20, 40):
        now[0] = 1000.0 + second
        assert limiter.retry_after_s("10.0.0.1") is None
        limiter.failed("10.0.0.1")
    assert limiter.retry_after_s("10.0.0.1") == 20  # the first failure leaves the window at 1060
    assert limiter.retry_after_s("10.0.0.2") is None  # another address is not limited
    now[0] = 1060.0
    assert limiter.retry_after_s("10.0.0.1") is None  # one fell out: one more try
    limiter.failed("10.0.0.1")
    assert limiter.retry_after_s("10.0.0.1") == 20
    limiter.succeeded("10.0.0.1")
    assert limiter.retry_after_s("10.0.0.1") is None
    for i in range(1000):
        limiter.failed(f"192.0.2.{i}")
    assert len(limiter) == 100


async def test_local_sessions_are_bounded_and_expire() -> None:
    now = [1000.0]
    sessions = Sessions(max_local=3, clock=lambda: now[0])
    ids = [new_session_id() for _ in range(5)]
    for session_id in ids:
        await sessions.start(session_id, expires_s=1100)
    assert [await sessions.live(i) for i in ids] == [False, False, True, True, True]
    await sessions.end(ids[4], expires_s=1100)
    assert not await sessions.live(ids[4])
    now[0] = 1100.0
    assert not await sessions.live(ids[3])


@pytest.mark.parametrize(
    ("scope", "secure"),
    [
        ({"scheme": "https", "headers": []}, True),
        ({"scheme": "http", "headers": [(b"x-forwarded-proto", b"https")]}, True),
        ({"scheme": "http", "headers": [(b"x-forwarded-proto", b"https, http")]}, True),
        ({"scheme": "http", "headers": [(b"forwarded", b'for=192.0.2.1;proto="https";by=x')]}, True),
        ({"scheme": "http", "headers": [(b"forwarded", b"for=192.0.2.1;proto=http")]}, False),
        ({"scheme": "http", "headers": [(b"x-forwarded-proto", b"http")]}, False),
        ({"scheme": "http", "headers": []}, False),
    ],
)
def test_https_is_the_scopes_scheme_or_what_a_proxy_says(scope: dict[str, Any], secure: bool) -> None:
    assert served_over_https(scope) is secure


async def test_the_cookie_is_secure_behind_a_proxy_that_says_https() -> None:
    async with proxy(router(), **settings()) as (client, _):
        right = await client.post(
            "/login", data={"key": KEYS[0]}, headers={**HTML, "X-Forwarded-Proto": "https"}
        )
        out = await client.get("/logout", headers={**HTML, "Forwarded": "proto=https"})
    assert right.status_code == 303 and "; Secure" in right.headers["set-cookie"]
    assert "; Secure" in out.headers["set-cookie"]


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
    session_id = new_session_id()
    value = cookie_value(secret, now_s=1_000, session_id=session_id)
    assert cookie_session(secret, value, now_s=1_000 + SESSION_S - 1) == (session_id, 1_000 + SESSION_S)
    assert cookie_session(secret, value, now_s=1_000 + SESSION_S) is None
    version, expires, sid, mac = value.split(".")
    assert cookie_session(secret, f"{version}.{int(expires) + 3600}.{sid}.{mac}", now_s=1_000) is None
    assert cookie_session(secret, f"{version}.{expires}.{new_session_id()}.{mac}", now_s=1_000) is None
    flipped = mac[:-1] + ("1" if mac[-1] == "0" else "0")
    assert cookie_session(secret, f"{version}.{expires}.{sid}.{flipped}", now_s=1_000) is None
    assert cookie_session(session_secret(("other",)), value, now_s=1_000) is None
    for junk in ("", "v2", "v2...", "v2.99999999999..00", "v2.-5.x.ab", "v2.1e9.x.ab", "v1.9999999999.ab"):
        assert cookie_session(secret, junk, now_s=1_000) is None


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
