"""The status page in a real headless browser (Debian's Chromium driven by Playwright).

The session's real servers (ctxproxy in front of the fake upstream, uvicorn on loopback) serve a
chat request made with the openai SDK; the page, loaded from the proxy, must show that request
(found by its X-Request-ID), draw the chart, and log no console error. Then a proxy in front of
every registered API's fake (``tests/e2e/all_apis.py``): the page has a column per API with the
figures of ``status.json``, and its API selector narrows the recent requests and the chart.
Chromium must be installed (``.ci/run`` installs Debian's ``chromium`` package): a missing browser
fails the test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, sync_playwright

from app.core.dialects import DIALECTS
from app.core.tokens import MessageCounter
from tests.e2e.all_apis import LONG_TURNS, AllApis, serve_all_apis
from tests.e2e.conftest import WINDOW_TOKENS, Stack, conversation

CHROMIUM = os.environ.get("CTXPROXY_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PLANTED = "PLANTED-PROMPT-e2e-5b1d"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), (
        f"{CHROMIUM} is missing: install Debian's chromium package (bash .ci/run does) "
        "or point CTXPROXY_CHROMIUM at a Chromium binary"
    )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def open_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(f"console {message.type}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}"))
    page.goto(url)
    return page, problems


def chat(stack: Stack, messages: list[dict[str, Any]], request_id: str) -> Any:
    with stack.client() as client:
        return client.chat.completions.with_raw_response.create(
            model="fake-openai", messages=messages, extra_headers={"X-Request-ID": request_id}
        )


def test_the_status_page_shows_a_request_just_made_with_no_console_error(
    e2e: Stack, browser: Browser, counter: MessageCounter, tmp_path: Path
) -> None:
    small_id = f"page-small-{uuid.uuid4().hex[:8]}"
    cut_id = f"page-cut-{uuid.uuid4().hex[:8]}"
    small = chat(e2e, [{"role": "user", "content": f"Say hi. {PLANTED}"}], small_id)
    assert small.headers["x-request-id"] == small_id
    long = conversation(counter, at_least_tokens=2 * WINDOW_TOKENS)
    long[1] = {**long[1], "content": f"{long[1]['content']} {PLANTED}"}
    cut = chat(e2e, long, cut_id)
    before, after = int(cut.headers["x-context-tokens-before"]), int(cut.headers["x-context-tokens-after"])
    assert before > after

    page, problems = open_page(browser, f"{e2e.proxy_url}/")
    try:
        page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
        row = page.locator("#recent tbody tr", has_text=cut_id)
        row.wait_for(timeout=15_000)
        cells = row.locator("td").all_inner_texts()
        assert "fake-openai" in cells and "chat" in cells and "200" in cells
        assert f"{before:,}" in cells and f"{after:,}" in cells
        assert cut.headers["x-context-actions"].replace(",", ", ") in cells
        assert page.locator("#recent tbody tr", has_text=small_id).count() == 1
        assert page.locator("#version").inner_text().startswith("version ")
        assert e2e.upstream_url in page.locator("#upstream").inner_text()
        assert "fake-openai" in (page.locator("#models tbody").text_content() or "")  # operator table
        # The chart has bars in both series' colours.
        colours = page.evaluate(
            """() => {
                const c = document.getElementById("chart");
                const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                let before = 0, after = 0;
                for (let i = 0; i < d.length; i += 4) {
                    if (d[i] === 0xf0 && d[i + 1] === 0xa3 && d[i + 2] === 0x5e) before++;
                    if (d[i] === 0x2f && d[i + 1] === 0x6f && d[i + 2] === 0xdb) after++;
                }
                return [before, after];
            }"""
        )
        assert colours[0] > colours[1] > 0  # the cut request's "before" bar is the taller one
        assert PLANTED not in page.content()
        page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
        page.wait_for_timeout(2_500)  # one more poll cycle: still no error
    finally:
        page.close()
    assert problems == []


def test_the_table_fits_at_1400_px_the_axis_is_logarithmic_and_a_rejection_has_no_after(
    e2e: Stack, browser: Browser, counter: MessageCounter
) -> None:
    rejected_id = f"page-rejected-{uuid.uuid4().hex[:8]}"
    long = conversation(counter, at_least_tokens=2 * WINDOW_TOKENS)
    with e2e.client() as client, pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="fake-openai",
            messages=long,
            extra_headers={"X-Request-ID": rejected_id, "X-Context-Policy": "reject"},
        )
    chat(e2e, [{"role": "user", "content": "tiny"}], f"page-tiny-{uuid.uuid4().hex[:8]}")
    # The widest row a client can make: a 128-character request ID, a long model name, many actions.
    with e2e.client() as client, pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="org-with-a-long-name/a-very-long-model-name-" + "x" * 60,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Request-ID": "w" * 128},
        )
    chat(e2e, conversation(counter, at_least_tokens=3 * WINDOW_TOKENS), f"page-cut-{uuid.uuid4().hex[:8]}")

    page, problems = open_page(browser, f"{e2e.proxy_url}/")
    try:
        page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
        row = page.locator("#recent tbody tr", has_text=rejected_id)
        row.wait_for(timeout=15_000)
        cells = row.locator("td").all_inner_texts()
        assert cells[5] == "rejected" and cells[6] != "–"
        assert cells[7] == "–"  # nothing was forwarded: no "tokens after"
        widths = page.evaluate(
            """() => {
                const box = document.querySelector("#recent").parentElement;
                return [box.scrollWidth, box.clientWidth];
            }"""
        )
        assert widths[0] <= widths[1], f"the table scrolls sideways at 1400 px: {widths}"
        chart = page.locator("#chart")
        assert chart.get_attribute("data-scale") == "log"
        ticks = (chart.get_attribute("data-ticks") or "").split()
        assert ticks[:4] == ["1", "10", "100", "1,000"]
    finally:
        page.close()
    assert problems == []


@pytest.fixture(scope="module")
def all_apis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AllApis]:
    with serve_all_apis(list(DIALECTS), tmp_path_factory.mktemp("page-all-apis")) as stack:
        for sample in stack.samples.values():
            sample.send(stack.url, turns=1)
            sample.send(stack.url, turns=LONG_TURNS)
        yield stack


def test_the_page_shows_every_api_with_the_figures_of_status_json(
    all_apis: AllApis, browser: Browser
) -> None:
    status = httpx.get(f"{all_apis.url}/status.json", timeout=10).json()
    apis = list(DIALECTS)
    assert status["apis"][: len(apis)] == apis
    page, problems = open_page(browser, f"{all_apis.url}/")
    try:
        page.wait_for_selector("body[data-loaded=true]", timeout=15_000)
        columns = page.locator("#apis thead th").all_inner_texts()
        assert columns[1:] == [*status["apis"], "all"]  # from the server, not a list in the page
        for api in apis:
            mine = status["counters"]["by_api"][api]
            assert mine["changed_requests"] == 1 and mine["tokens_saved"] > 0
            for figure in ("fitted_requests", "changed_requests", "tokens_before", "tokens_after"):
                cell = page.locator(f'#apis tr[data-figure="{figure}"] td[data-api="{api}"]')
                assert cell.inner_text() == f"{mine[figure]:,}", (api, figure)
            saved = page.locator(f'#apis tr[data-figure="tokens_saved"] td[data-api="{api}"]').inner_text()
            assert saved.startswith(f"{mine['tokens_saved']:,} (")
            # The one cut request of each API: a summary, the index or the note stood in for what
            # it forgot (summaries are on by default); the page says which, as status.json does.
            memory = mine["memory"]
            assert memory["note"] + memory["index"] + memory["summary"] == 1, (api, memory)
            for kind in ("note", "index", "summary"):
                cell = page.locator(f'#summaries tr[data-figure="memory_{kind}"] td[data-api="{api}"]')
                assert cell.inner_text() == f"{memory[kind]:,}", (api, kind)
        total = page.locator('#apis tr[data-figure="tokens_saved"] td[data-api="all"]').inner_text()
        assert total.startswith(f"{status['counters']['tokens_saved']:,} (")
        # One API at a time: the recent requests and the chart follow the selector.
        page.select_option("#api-filter", apis[-1])
        routes = page.locator("#recent tbody tr td:nth-child(3)").all_inner_texts()
        assert routes == [apis[-1], apis[-1]]
        assert page.locator("#chart-note").inner_text().startswith("2 fitted requests shown, 1 of them cut")
        page.select_option("#api-filter", "")
        assert page.locator("#recent tbody tr").count() == 2 * len(apis)
        page.wait_for_timeout(2_500)  # one more poll: the choice is kept, still no error
        assert page.locator("#chart-note").inner_text().startswith(f"{2 * len(apis)} fitted requests shown")
    finally:
        page.close()
    assert problems == []
