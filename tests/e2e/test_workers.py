"""``ctxproxy serve --workers 2``: one picture of all workers (metrics, status page) and what one
worker learns reaches the other without Redis. A real server in subprocesses, a real fake upstream."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from app.observability.status import with_totals
from tests.fake_upstream import FakeModel, FakeUpstream
from tests.fault_upstream import closed_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MODEL = "acme/llm"


@contextmanager
def serve_workers(
    upstream_url: str, tmp_path: Path, *, workers: int = 2, environ: dict[str, str] | None = None
) -> Iterator[str]:
    port = closed_port()
    table = tmp_path / "models.toml"
    # The proxy believes a larger window than the upstream has: the upstream's error teaches it.
    table.write_text(f'[models."{MODEL}"]\nwindow = 16384\nencoding = "o200k_base"\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXPROXY_", "PROMETHEUS_"))}
    env |= {
        "CTXPROXY_UPSTREAM_BASE_URL": f"{upstream_url}/v1",
        "CTXPROXY_MODELS_FILE": str(table),
        "CTXPROXY_DISCOVERY": "false",
        "CTXPROXY_LOG_LEVEL": "WARNING",
        "TMPDIR": str(tmp_path),  # where serve makes the workers' shared directory
        **(environ or {}),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while len(boards(tmp_path)) < workers:  # every worker publishes its board when it starts
            assert proc.poll() is None, "ctxproxy serve exited during start-up"
            assert time.monotonic() < deadline, "ctxproxy serve did not start its workers"
            time.sleep(0.1)
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "ctxproxy serve did not get ready"
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert not list(tmp_path.glob("ctxproxy-workers-*")), "the shared directory outlived the server"


def boards(tmp_path: Path) -> list[dict[str, object]]:
    found = []
    for path in tmp_path.glob("ctxproxy-workers-*/status/*.json"):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return found


def chat(url: str, content: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
    # A new connection each time, so the kernel spreads the requests over the workers.
    with httpx.Client(timeout=30) as client:
        return client.post(f"{url}/v1/chat/completions", json=body)


def metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_metrics_and_status_count_every_worker(tmp_path: Path) -> None:
    upstream = FakeUpstream([FakeModel(MODEL, window_tokens=16384)])
    with upstream.serve() as upstream_url, serve_workers(upstream_url, tmp_path) as url:
        for i in range(6):
            assert chat(url, f"hello {i}").status_code == 200
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert metric_sum(metrics, "ctxproxy_requests_total", route="chat", api="chat") == 6
        assert metric_sum(metrics, "ctxproxy_input_before_tokens_count", api="chat") == 6
        assert "_created" not in metrics
        deadline = time.monotonic() + 5
        while True:  # another worker's board is written at most 0.2 s after its request
            status = httpx.get(f"{url}/status.json", timeout=10).json()
            if status["counters"]["requests"] == 6 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status["workers"] == 2
        assert status["counters"]["requests"] == 6
        assert status["counters"]["fitted_requests"] == 6
        assert status["counters"]["by_api"]["chat"]["fitted_requests"] == 6
        assert len(status["recent"]) == 6
        assert status["in_flight"] == 0


def test_what_one_worker_learns_reaches_the_other(tmp_path: Path) -> None:
    upstream = FakeUpstream([FakeModel(MODEL, window_tokens=4096, dialect="llamacpp")])
    long_text = " ".join(f"word{i}" for i in range(5000))  # ~10k tokens: over 4096, under 16384
    with upstream.serve() as upstream_url, serve_workers(upstream_url, tmp_path) as url:
        first = chat(url, "first " + long_text)
        assert first.status_code == 200  # the overflow taught the window; the retry fitted
        assert [r.status for r in upstream.client_requests()] == [400, 200]
        time.sleep(1.0)  # the worker publishes what it learned within 0.2 s
        for i in range(12):
            assert chat(url, f"again {i} " + long_text).status_code == 200
        served = [b for b in boards(tmp_path) if with_totals(b["counters"])["requests"]]  # type: ignore[arg-type]
        assert len(served) == 2, "the kernel gave every request to one worker; the test proved nothing"
        # Only the very first request ever overflowed: the other worker knew the window already.
        assert [r.status for r in upstream.client_requests()].count(400) == 1


def test_a_sign_out_ends_the_session_in_every_worker(tmp_path: Path) -> None:
    upstream = FakeUpstream([FakeModel(MODEL, window_tokens=16384)])
    key = "ops-key-workers-1"
    keys = {"CTXPROXY_API_KEYS": key, "CTXPROXY_UPSTREAM_API_KEY": "sk-upstream"}
    with upstream.serve() as upstream_url, serve_workers(upstream_url, tmp_path, environ=keys) as url:
        with httpx.Client(timeout=30) as browser:
            assert browser.post(f"{url}/login", data={"key": key}).status_code == 303
            copy = {"Cookie": f"ctxproxy_status={browser.cookies['ctxproxy_status']}"}

        def status_codes() -> list[int]:
            # A new connection each time, so the kernel spreads the requests over the workers (the
            # status page is not on the workers' boards: chat requests, also on new connections,
            # show that the spread reached both).
            codes = []
            for i in range(12):
                codes.append(httpx.get(f"{url}/status.json", headers=copy, timeout=30).status_code)
                body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}]}
                auth = {"Authorization": f"Bearer {key}"}
                answer = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=30)
                assert answer.is_success
            return codes

        assert status_codes() == [200] * 12  # the session is live in every worker
        assert httpx.get(f"{url}/logout", headers=copy, timeout=30).status_code == 303
        assert status_codes() == [401] * 12  # and over in every worker, at once
        served = [b for b in boards(tmp_path) if with_totals(b["counters"])["requests"]]  # type: ignore[arg-type]
        assert len(served) == 2, "the kernel gave every request to one worker; the test proved nothing"
