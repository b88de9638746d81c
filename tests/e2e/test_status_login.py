"""The status page with proxy keys on, in a real headless browser (Debian's Chromium driven by
Playwright, as in ``test_status_page.py``): the login form, a wrong key, the right key, the page
loaded with no console error, an API call from the page refused (the session is not a key), the
page's "Sign out" clicked. Chromium must be installed: a missing browser fails the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from tests.compaction.conftest import free_port, start_redis
from tests.e2e.test_status_page import CHROMIUM, CHROMIUM_ARGS
from tests.fake_upstream import serve_proxy
from tests.fault_upstream import FaultUpstream

PROXY_KEYS = ("ops-key-4a7c91", "ops-key-b2d5e8")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: install Debian's chromium package"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def proxy_url() -> Iterator[str]:
    upstream = FaultUpstream()
    with (
        upstream.serve(),
        serve_proxy(upstream.url, api_keys=",".join(PROXY_KEYS), upstream_api_key="sk-upstream-e2e") as url,
    ):
        yield url


def watched(page: Page) -> list[str]:
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        # The login form's own 401 is the expected answer to an anonymous visit, not a problem.
        if message.type in ("error", "warning") and "401" not in message.text:
            problems.append(f"console {message.type}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    return problems


def test_a_person_signs_in_sees_the_status_page_and_signs_out(browser: Browser, proxy_url: str) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    problems = watched(page)
    try:
        first = page.goto(f"{proxy_url}/")
        assert first is not None and first.status == 401
        page.fill("#key", "not-a-proxy-key")
        page.click("button[type=submit]")
        page.wait_for_selector("[role=alert]")
        assert "not one of this proxy's keys" in page.inner_text("[role=alert]")
        assert context.cookies() == []

        page.fill("#key", PROXY_KEYS[1])
        page.click("button[type=submit]")
        page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
        assert page.url == f"{proxy_url}/"
        (cookie,) = context.cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert all(key not in cookie["value"] for key in PROXY_KEYS)
        assert page.evaluate("() => document.cookie") == ""  # HttpOnly: no script reads it

        # The session opens the read-only pages, not the API, even from the page itself.
        statuses = page.evaluate(
            """async () => Promise.all([
                fetch("status.json").then(r => r.status),
                fetch("v1/models").then(r => r.status),
                fetch("v1/chat/completions", {method: "POST", headers: {"Content-Type": "application/json"},
                    body: JSON.stringify({model: "m", messages: [{role: "user", content: "hi"}]})})
                    .then(r => r.status),
            ])"""
        )
        assert statuses == [200, 401, 401]
        page.wait_for_timeout(2_500)  # one more poll of status.json: still no error

        # The page offers to sign out; clicking it ends the session, back to the form.
        copy = {"Cookie": f"{cookie['name']}={cookie['value']}"}
        assert httpx.get(f"{proxy_url}/status.json", headers=copy).status_code == 200
        sign_out = page.locator("#sign-out")
        assert sign_out.is_visible() and sign_out.inner_text() == "Sign out"
        sign_out.click()
        page.wait_for_selector("#key")
        assert context.cookies() == []
        assert page.url == f"{proxy_url}/"
        again = page.goto(f"{proxy_url}/")  # the session is over: the form again
        assert again is not None and again.status == 401 and page.locator("#sign-out").count() == 0
        # Over on the server: a copy of the cookie taken before the sign-out opens nothing.
        assert httpx.get(f"{proxy_url}/status.json", headers=copy).status_code == 401
    finally:
        context.close()
    assert problems == []


def test_a_sign_out_on_one_replica_ends_the_session_on_another_sharing_redis(tmp_path: Path) -> None:
    redis = start_redis(free_port(), tmp_path)
    upstream = FaultUpstream()
    shared = {"api_keys": PROXY_KEYS[0], "upstream_api_key": "sk-upstream-e2e", "cache_url": redis.url}
    try:
        with (
            upstream.serve(),
            serve_proxy(upstream.url, **shared) as one,
            serve_proxy(upstream.url, **shared) as two,
        ):
            with httpx.Client(timeout=30) as browser:
                assert browser.post(f"{one}/login", data={"key": PROXY_KEYS[0]}).status_code == 303
                copy = {"Cookie": f"ctxproxy_status={browser.cookies['ctxproxy_status']}"}
            assert httpx.get(f"{two}/status.json", headers=copy).status_code == 200  # live on both
            assert httpx.get(f"{one}/status.json", headers=copy).status_code == 200
            assert httpx.get(f"{two}/logout", headers=copy).status_code == 303  # signed out on two
            assert httpx.get(f"{one}/status.json", headers=copy).status_code == 401  # over on one, at once
            assert httpx.get(f"{two}/status.json", headers=copy).status_code == 401
    finally:
        redis.kill()
