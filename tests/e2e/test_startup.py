"""What ``ctxproxy serve`` says when it starts, as a real process: the start-up lines (upstreams,
policy, model table), the warning for a mistyped variable, and under ``CTXPROXY_LOG_JSON=true``
every line as a JSON object, uvicorn's own too, in the supervisor and in each worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.fault_upstream import closed_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def serve_and_stop(env: dict[str, str], *, workers: int) -> str:
    """Start ``ctxproxy serve``, wait until every worker has started (uvicorn's "Application
    startup complete" once per worker) and it answers, stop it with SIGTERM: its stderr."""
    port = closed_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    started = threading.Semaphore(0)

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Application startup complete" in line:
                started.release()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        for _ in range(workers):  # a SIGTERM before a worker is up would leave its lines out
            assert started.acquire(timeout=max(0.0, deadline - time.monotonic())), (
                "ctxproxy serve did not start: " + "".join(lines)
            )
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
    err = "".join(lines)
    assert proc.returncode == 0, err
    return err


def environment(**variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTXPROXY_", "PROMETHEUS_"))}
    return env | {"CTXPROXY_DISCOVERY": "false", **variables}


def test_every_line_is_json_under_log_json_with_two_workers(tmp_path: Path) -> None:
    err = serve_and_stop(
        environment(CTXPROXY_LOG_JSON="true", TMPDIR=str(tmp_path), CTXPROXY_UPSTREAM_BASEURL="x"),
        workers=2,
    )
    lines = [json.loads(line) for line in err.splitlines() if line.strip()]  # raises on a text line
    loggers = {line["logger"] for line in lines}
    assert {"uvicorn.error", "ctxproxy.startup"} <= loggers
    messages = [line["message"] for line in lines]
    assert any(m.startswith("Started parent process") for m in messages)  # the supervisor's
    assert sum(m.startswith("Started server process") for m in messages) == 2  # each worker's
    assert sum(m.startswith("policy auto:") for m in messages) == 2
    warnings = [line for line in lines if line["level"] == "WARNING"]
    assert warnings and all("did you mean CTXPROXY_UPSTREAM_BASE_URL?" in w["message"] for w in warnings)


def test_the_start_up_lines_name_the_upstream_and_never_a_key() -> None:
    err = serve_and_stop(
        environment(
            CTXPROXY_UPSTREAM_BASE_URL="http://operator:pw-in-url@127.0.0.1:9/v1",
            CTXPROXY_UPSTREAM_API_KEY="sk-operator-secret",
            CTXPROXY_API_KEYS="client-secret-1,client-secret-2",
        ),
        workers=1,
    )
    assert "INFO ctxproxy.startup upstream http://127.0.0.1:9/v1; clients must send a proxy key" in err
    assert "INFO ctxproxy.startup model table: built-in" in err
    for secret in ("pw-in-url", "sk-operator-secret", "client-secret"):
        assert secret not in err


def test_serve_on_a_port_in_use_exits_2_with_one_line_before_starting_anything() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "app", "serve", "--port", str(port)],
            cwd=REPO,
            env=environment(CTXPROXY_UPSTREAM_BASE_URL="http://127.0.0.1:9/v1"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ctxproxy: error: cannot listen on 127.0.0.1:{port}")
    assert "Started server process" not in done.stderr and "Traceback" not in done.stderr
