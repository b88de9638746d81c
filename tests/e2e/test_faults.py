"""Fault injection: a real ctxproxy (uvicorn on 127.0.0.1) in front of ``tests.fault_upstream``.

Every upstream and client fault of the hardening issue, each with the answer the client must get:
an OpenAI-shaped error with the right status, a pass-through of the upstream's own answer, or an
SSE error event that ends a broken stream; never a hang (every client call has a timeout, so a hang
fails the test) and never a 500.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import pytest

from app.main import create_app
from app.settings import Settings
from tests.fake_upstream import serve_app
from tests.fault_upstream import FaultUpstream, blackhole, closed_port

MODEL = "gpt-4o-mini"
BODY: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}]}
STREAM_BODY: dict[str, Any] = {**BODY, "stream": True}
TRANSPORTS = ["aiohttp", "httpx-aiohttp", "httpx"]


@contextmanager
def proxy(base_url: str, **overrides: Any) -> Iterator[str]:
    settings = Settings(
        upstream_base_url=base_url,
        upstream_api_key=None,
        log_level="WARNING",
        discovery=False,  # the fake upstream's request log holds only what the tests send
        **{"connect_timeout_s": 2.0, "read_timeout_s": 2.0, "stream_idle_timeout_s": 1.0, **overrides},
    )
    with serve_app(create_app(settings)) as url:
        yield url


@pytest.fixture(scope="module")
def fault() -> Iterator[FaultUpstream]:
    upstream = FaultUpstream()
    with upstream.serve():
        yield upstream


@pytest.fixture(scope="module")
def proxy_url(fault: FaultUpstream) -> Iterator[str]:
    with proxy(f"{fault.url}/v1") as url:
        yield url


@pytest.fixture
def upstream(fault: FaultUpstream) -> FaultUpstream:
    fault.clear()
    return fault


@pytest.fixture
def http(proxy_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy_url, timeout=15) as client:
        yield client


def chat(
    http: httpx.Client, fault: str, body: dict[str, Any] | None = None, **headers: str
) -> httpx.Response:
    fault_headers = {"X-Fault": fault, **{f"X-Fault-{k.replace('_', '-')}": v for k, v in headers.items()}}
    return http.post("/v1/chat/completions", json=body or BODY, headers=fault_headers)


def assert_openai_error(response: httpx.Response, status: int, code: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == code
    return error  # type: ignore[no-any-return]


def wait_for(predicate: Any, *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def sse_events(body: bytes) -> list[str]:
    return [e[len("data: ") :] for e in body.decode().split("\n\n") if e.startswith("data: ")]


# --- upstream faults -------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connection_refused_is_502(transport: str) -> None:
    with proxy(f"http://127.0.0.1:{closed_port()}/v1", upstream_transport=transport) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=15)
    assert_openai_error(response, 502, "upstream_unreachable")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_dns_failure_is_502(transport: str) -> None:
    # .invalid never resolves (RFC 6761): the resolver fails it locally.
    with proxy("http://ctxproxy-fault-test.invalid/v1", upstream_transport=transport) as url:
        response = httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=15)
    error = assert_openai_error(response, 502, "upstream_unreachable")
    assert "ctxproxy-fault-test.invalid" in error["message"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connect_timeout_is_504_and_separate_from_the_read_timeout(transport: str) -> None:
    with (
        blackhole() as hole,
        proxy(f"{hole}/v1", upstream_transport=transport, connect_timeout_s=0.5, read_timeout_s=60.0) as url,
    ):
        response = httpx.post(f"{url}/v1/chat/completions", json=BODY, timeout=15)
    assert_openai_error(response, 504, "upstream_timeout")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_read_timeout_is_504_and_the_upstream_request_is_closed(
    upstream: FaultUpstream, transport: str
) -> None:
    with proxy(
        f"{upstream.url}/v1",
        upstream_transport=transport,
        connect_timeout_s=60.0,
        read_timeout_s=0.5,
        stream_idle_timeout_s=0.5,  # never above the read timeout (the settings refuse that)
    ) as url:
        response = httpx.post(
            f"{url}/v1/chat/completions", json=BODY, headers={"X-Fault": "stall_headers"}, timeout=15
        )
        assert_openai_error(response, 504, "upstream_timeout")
        (record,) = upstream.records
        wait_for(lambda: record.disconnected_at is not None)


def test_stream_idle_timeout_ends_the_stream_with_an_error_event(
    upstream: FaultUpstream, proxy_url: str
) -> None:
    # read_timeout_s is 2.0 here, the idle timeout 1.0: the idle timeout is what ends the stream.
    with proxy(f"{upstream.url}/v1", read_timeout_s=30.0, stream_idle_timeout_s=0.5) as url:
        with httpx.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=STREAM_BODY,
            headers={"X-Fault": "stall_stream"},
            timeout=15,
        ) as response:
            assert response.status_code == 200
            body = response.read()
        events = sse_events(body)
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == "Hello"
        error = json.loads(events[-1])["error"]
        assert error["code"] == "upstream_timeout" and error["type"] == "upstream_error"
        assert body.endswith(b"\n\n")
        (record,) = upstream.records
        wait_for(lambda: record.disconnected_at is not None)


def test_idle_stream_raises_in_the_openai_sdk(upstream: FaultUpstream, proxy_url: str) -> None:
    with openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="x", max_retries=0, timeout=15) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers={"X-Fault": "stall_stream"},
        )
        with pytest.raises(openai.APIError, match="sent nothing for 1 s"):
            list(stream)


@pytest.mark.parametrize(
    ("status", "kind", "retry_after"),
    [
        (500, "json", None),
        (502, "html", None),
        (503, "json", "7"),
        (429, "json", "3"),
        (500, "invalid_json", None),
    ],
)
def test_upstream_error_status_is_passed_through_with_body_and_retry_after(
    upstream: FaultUpstream, http: httpx.Client, status: int, kind: str, retry_after: str | None
) -> None:
    extra = {"Retry_After": retry_after} if retry_after else {}
    response = chat(http, "status", Status=str(status), Body=kind, **extra)
    assert response.status_code == status
    expected = {"json": b"The server had an error", "html": b"<html>", "invalid_json": b'{"error": {"mess'}[
        kind
    ]
    assert expected in response.content
    assert response.headers.get("retry-after") == retry_after
    assert len(upstream.records) == 1  # no retry on 5xx / 429


def test_invalid_json_400_is_passed_through_not_a_crash(upstream: FaultUpstream, http: httpx.Client) -> None:
    # A 400 is read and classified (maybe a context overflow): garbage must not break that.
    response = chat(http, "status", Status="400", Body="invalid_json")
    assert response.status_code == 400
    assert response.content.startswith(b'{"error": {"message": "upstream broke"')
    html = chat(http, "status", Status="400", Body="html")
    assert html.status_code == 400 and html.content.startswith(b"<html>")
    assert html.headers["content-type"].startswith("text/html")


def test_upstream_closing_mid_stream_ends_the_client_stream_with_an_error_event(
    upstream: FaultUpstream, proxy_url: str
) -> None:
    with httpx.stream(
        "POST",
        f"{proxy_url}/v1/chat/completions",
        json=STREAM_BODY,
        headers={"X-Fault": "drop_stream"},
        timeout=15,
    ) as response:
        assert response.status_code == 200
        body = response.read()  # returns: the stream was closed, not left hanging
    events = sse_events(body)
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:2]] == ["Hello", "there"]
    assert json.loads(events[-1])["error"]["code"] == "upstream_protocol_error"
    assert len(upstream.records) == 1  # never a retry after the first streamed byte


def test_upstream_closing_mid_stream_raises_in_the_openai_sdk(proxy_url: str) -> None:
    with openai.OpenAI(base_url=f"{proxy_url}/v1", api_key="x", max_retries=0, timeout=15) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            extra_headers={"X-Fault": "drop_stream"},
        )
        with pytest.raises(openai.APIError):
            list(stream)


@pytest.mark.parametrize("kind", ["drop_before_headers", "garbage"])
def test_upstream_that_breaks_before_answering_is_502(
    upstream: FaultUpstream, http: httpx.Client, kind: str
) -> None:
    response = chat(http, kind)
    assert response.status_code == 502
    # aiohttp reports a connection closed before the status line as a disconnect, httpx as a
    # protocol error: both are 502.
    assert_openai_error(response, 502, response.json()["error"]["code"])
    assert response.json()["error"]["code"] in {"upstream_protocol_error", "upstream_unreachable"}
    assert len(upstream.records) == 1


def test_slow_upstream_is_waited_for(upstream: FaultUpstream, http: httpx.Client) -> None:
    response = chat(http, "slow", Delay="0.5")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "fault upstream says hi"


def test_no_retry_on_timeouts(upstream: FaultUpstream, http: httpx.Client) -> None:
    response = chat(http, "stall_headers")
    assert_openai_error(response, 504, "upstream_timeout")
    assert len(upstream.records) == 1


# --- client faults ---------------------------------------------------------------------------------


def test_client_disconnect_mid_stream_cancels_the_upstream_within_a_second(
    upstream: FaultUpstream, proxy_url: str
) -> None:
    with (
        httpx.Client(timeout=15) as client,
        client.stream(
            "POST",
            f"{proxy_url}/v1/chat/completions",
            json=STREAM_BODY,
            headers={"X-Fault": "ok", "X-Fault-Chunks": "200", "X-Fault-Delay": "0.05"},
        ) as response,
    ):
        chunks = response.iter_raw()
        assert b"word0" in next(chunks)
        (record,) = upstream.records
        assert record.disconnected_at is None
        # Leaving the block closes the connection mid-stream.
        closed_at = time.monotonic()
    wait_for(lambda: record.disconnected_at is not None, timeout_s=5)
    assert record.disconnected_at is not None
    assert record.disconnected_at - closed_at < 1.0
    assert record.finished_at is None  # the upstream never got to finish the 200 chunks


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_before_the_answer_cancels_the_upstream_within_a_second(
    upstream: FaultUpstream, stream: bool
) -> None:
    body = json.dumps({**BODY, "stream": stream}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Fault: stall_headers\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    with proxy(f"{upstream.url}/v1", read_timeout_s=60.0) as url:
        sock = raw_request(url, head)
        wait_for(lambda: len(upstream.records) == 1)
        (record,) = upstream.records
        time.sleep(0.2)
        sock.close()  # gone while the upstream is still thinking
        closed_at = time.monotonic()
        wait_for(lambda: record.disconnected_at is not None, timeout_s=5)
    assert record.disconnected_at is not None
    assert record.disconnected_at - closed_at < 1.0


def raw_request(url: str, head: bytes, *, rcvbuf: int | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(15)
    sock.connect((host, int(port)))
    sock.sendall(head)
    return sock


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(rest) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        rest += piece
    return int(head.split(b" ")[1]), rest


def test_slow_client_does_not_make_the_proxy_buffer(upstream: FaultUpstream, proxy_url: str) -> None:
    body = json.dumps(STREAM_BODY).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"X-Fault: firehose\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    sock = raw_request(proxy_url, head, rcvbuf=16384)
    try:
        assert sock.recv(16).startswith(b"HTTP/1.1 200")
        # The client now reads nothing: the upstream's writes must stop once the buffers
        # between (kernel socket buffers, the transport's reader, uvicorn's write buffer) are full.
        wait_for(lambda: len(upstream.records) == 1)
        (record,) = upstream.records
        time.sleep(1.5)
        stalled_at = record.bytes_sent
        time.sleep(1.0)
        assert record.bytes_sent - stalled_at < 1024 * 1024, (
            "upstream still being read while the client stalls"
        )
        assert record.bytes_sent < 64 * 1024 * 1024
        # Reading again resumes the flow.
        for _ in range(200):
            sock.recv(65536)
        wait_for(lambda: record.bytes_sent > stalled_at)
    finally:
        sock.close()


@pytest.fixture(scope="module")
def small_proxy(fault: FaultUpstream) -> Iterator[str]:
    with proxy(f"{fault.url}/v1", max_body_bytes=64 * 1024) as url:
        yield url


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/context/plan"])
def test_declared_content_length_over_the_limit_is_413_before_reading(
    upstream: FaultUpstream, small_proxy: str, path: str
) -> None:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {10 * 1024 * 1024}\r\n\r\n"
    ).encode() + b'{"model": "gpt-4o-mini", '
    sock = raw_request(small_proxy, head)
    try:
        status, body = read_response(sock)  # answered although 10 MiB were never sent
    finally:
        sock.close()
    assert status == 413
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert upstream.records == []


def test_chunked_body_over_the_limit_is_413_before_the_end(upstream: FaultUpstream, small_proxy: str) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    sock = raw_request(small_proxy, head)
    try:
        piece = b"x" * 16384
        for _ in range(6):  # 96 KiB, over the 64 KiB limit; the terminating chunk is never sent
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        status, body = read_response(sock)
    finally:
        sock.close()
    assert status == 413
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert upstream.records == []


def test_passthrough_body_over_the_limit_is_413(upstream: FaultUpstream, small_proxy: str) -> None:
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {10 * 1024 * 1024}\r\n\r\n"
    ).encode() + b'{"input": "'
    sock = raw_request(small_proxy, head)
    try:
        status, body = read_response(sock)
    finally:
        sock.close()
    assert status == 413
    assert json.loads(body)["error"]["code"] == "request_too_large"
    assert upstream.records == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chunked_passthrough_body_over_the_limit_is_413(upstream: FaultUpstream, transport: str) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(8):
            yield b"x" * 16384  # 128 KiB in all, over the 64 KiB limit

    with proxy(f"{upstream.url}/v1", max_body_bytes=64 * 1024, upstream_transport=transport) as url:
        response = httpx.post(f"{url}/v1/files", content=chunks(), timeout=15)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert all(len(r.body) <= 64 * 1024 for r in upstream.records)


def nested(depth: int) -> bytes:
    opened, closed = b"[" * depth, b"]" * depth
    return (
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x", "x": '
        + opened
        + closed
        + b"}]}"
    )


JSON = "application/json"
MALFORMED: list[tuple[str, bytes, str]] = [
    ("deep-json-2000", nested(2000), JSON),
    ("deep-json-body", b"[" * 100000 + b"]" * 100000, JSON),
    (
        "invalid-utf8",
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        JSON,
    ),
    ("not-json", b"hello there", "text/plain"),
    ("form", b"model=gpt-4o-mini&messages=hi", "application/x-www-form-urlencoded"),
    (
        "multipart",
        b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nx\r\n--b--",
        "multipart/form-data; boundary=b",
    ),
    ("empty", b"", JSON),
    ("null", b"null", JSON),
    ("array", b"[1, 2]", JSON),
    ("truncated", b'{"model": "gpt-4o-mini", "messages": [{"role": "us', JSON),
    ("messages-object", b'{"model": "gpt-4o-mini", "messages": {"role": "user"}}', JSON),
    ("model-number", b'{"model": 5, "messages": []}', JSON),
    ("role-unknown", b'{"model": "gpt-4o-mini", "messages": [{"role": 7, "content": "x"}]}', JSON),
    ("content-number", b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": 5}]}', JSON),
    (
        "over-limit",
        b'{"model": "gpt-4o-mini", "messages": [' + b'{"role": "user", "content": "x"},' * 4000 + b"]}",
        JSON,
    ),
]
# Unusual but well-formed: forwarded (the upstream judges them), or refused; never a 5xx.
ODD: list[tuple[str, bytes, str]] = [
    ("deep-json-900", nested(900), JSON),
    (
        "lone-surrogate-escape",
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "\\udc00"}]}',
        JSON,
    ),
    (
        "nan",
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}',
        JSON,
    ),
    ("huge-int", b'{"model": "gpt-4o-mini", "messages": [], "max_tokens": 1' + b"0" * 5000 + b"}", JSON),
    (
        "huge-model",
        b'{"model": "' + b"m" * 60000 + b'", "messages": [{"role": "user", "content": "x"}]}',
        JSON,
    ),
    (
        "text-plain-json",
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}',
        "text/plain",
    ),
    ("no-content-type", b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}]}', ""),
]


@pytest.mark.parametrize(("name", "body", "content_type"), MALFORMED, ids=[b[0] for b in MALFORMED])
def test_malformed_bodies_are_4xx(
    upstream: FaultUpstream, small_proxy: str, name: str, body: bytes, content_type: str
) -> None:
    response = httpx.post(
        f"{small_proxy}/v1/chat/completions", content=body, headers={"Content-Type": content_type}, timeout=15
    )
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert upstream.records == []


@pytest.mark.parametrize(("name", "body", "content_type"), ODD, ids=[b[0] for b in ODD])
def test_odd_but_well_formed_bodies_are_never_5xx(
    small_proxy: str, name: str, body: bytes, content_type: str
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(f"{small_proxy}/v1/chat/completions", content=body, headers=headers, timeout=15)
    assert response.status_code < 500, (response.status_code, response.text[:300])


ABSURD_HEADERS: list[tuple[str, bytes]] = [
    ("X-Context-Budget", b"9" * 400),
    ("X-Context-Budget", b"-5"),
    ("X-Context-Budget", b"0"),
    ("X-Context-Budget", b"ten"),
    ("X-Context-Budget", "１２３".encode()),
    ("X-Context-Budget", b"1e9"),
    ("X-Context-Budget", b"0x10"),
    ("X-Context-Budget", b"\xff\xfe"),
    ("X-Context-Window", b"99999999999999999999999"),
    ("X-Context-Window", b""),
    ("X-Context-Reserve", b"-1"),
    ("X-Context-Keep-Turns", "ä".encode()),
    ("X-Context-Policy", b"yolo"),
    ("X-Context-Policy", "Ünïcödé".encode()),
]


def raw_post(
    url: str, headers: list[tuple[bytes, bytes]], body: bytes, *, path: bytes = b"/v1/chat/completions"
) -> int:
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: x"] + [k + b": " + v for k, v in headers]
    if not any(k.lower() == b"content-length" for k, _ in headers):
        lines.append(b"Content-Length: " + str(len(body)).encode())
    sock = raw_request(url, b"\r\n".join(lines) + b"\r\n\r\n" + body)
    try:
        status, _ = read_response(sock)
    except (ConnectionError, IndexError):
        status = 400  # the HTTP server refused the request line or headers and closed
    finally:
        sock.close()
    return status


@pytest.mark.parametrize(("name", "value"), ABSURD_HEADERS)
def test_absurd_context_headers_are_400(
    upstream: FaultUpstream, http: httpx.Client, name: str, value: bytes
) -> None:
    response = http.post("/v1/chat/completions", json=BODY, headers={name: value})
    error = assert_openai_error(response, 400, None)
    assert error["param"] == name
    assert upstream.records == []


@pytest.mark.parametrize(
    ("headers", "statuses"),
    [
        ([(b"Content-Type", b"x" * 30000)], {200, 400, 413, 431}),
        ([(b"X-Big", b"y" * 60000)], {200, 400, 413, 431}),
        ([(b"X-Many-%d" % i, b"v") for i in range(500)], {200, 400, 431}),
        ([(b"Content-Length", b"-1")], {400}),
        ([(b"Content-Length", b"abc")], {400}),
        ([(b"Authorization", b"Bearer \xff\xfe")], {200}),
        ([(b"X-Unicode", "ünï ☃".encode())], {200}),
        ([(b"Content-Type", b"application/json; charset=ebcdic")], {200}),
    ],
)
def test_absurd_transport_headers_are_never_500(
    upstream: FaultUpstream, proxy_url: str, headers: list[tuple[bytes, bytes]], statuses: set[int]
) -> None:
    assert raw_post(proxy_url, headers, json.dumps(BODY).encode()) in statuses


# --- what the client cannot choose -------------------------------------------------------------------


@pytest.fixture
def evil() -> Iterator[FaultUpstream]:
    other = FaultUpstream()
    with other.serve():
        yield other


def test_client_cannot_choose_the_upstream_host(
    upstream: FaultUpstream, evil: FaultUpstream, proxy_url: str, http: httpx.Client
) -> None:
    evil_url: str = evil.url
    evil_host = evil_url.removeprefix("http://")
    assert http.post("/v1/chat/completions", json=BODY, headers={"Host": evil_host}).status_code == 200
    assert (
        http.post("/v1/chat/completions", json=BODY, headers={"X-Forwarded-Host": evil_host}).status_code
        == 200
    )
    for field in ("base_url", "api_base", "baseURL", "url", "host"):
        body = {**BODY, field: f"{evil_url}/v1"}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert (
        http.get("/v1/models", headers={"Host": evil_host, "X-Forwarded-Host": evil_host}).status_code == 200
    )
    payload = json.dumps(BODY).encode()
    for target in (f"{evil_url}/v1/chat/completions", f"http://{evil_host}/v1/models"):
        method = b"POST" if "chat" in target else b"GET"
        head = (
            method
            + b" "
            + target.encode()
            + b" HTTP/1.1\r\nHost: "
            + evil_host.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload) if method == b"POST" else 0).encode()
            + b"\r\n\r\n"
        )
        sock = raw_request(proxy_url, head + (payload if method == b"POST" else b""))
        try:
            status, _ = read_response(sock)
        finally:
            sock.close()
        assert status in {200, 400, 404}
    assert evil.records == []
    assert len(upstream.records) >= 8
    assert all(r.headers["host"] == upstream.url.removeprefix("http://") for r in upstream.records)


def test_hop_by_hop_and_context_headers_are_not_forwarded(
    upstream: FaultUpstream, http: httpx.Client
) -> None:
    response = http.post(
        "/v1/chat/completions",
        json=BODY,
        headers={
            "X-Context-Policy": "auto",
            "X-Context-Whatever": "1",
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "Proxy-Authorization": "Basic abc",
            "TE": "trailers",
            "X-Kept": "yes",
        },
    )
    assert response.status_code == 200
    (record,) = upstream.records
    names = set(record.headers)
    assert "x-kept" in names
    assert not {n for n in names if n.startswith("x-context-")}
    assert not names & {"x-secret-hop", "proxy-authorization", "te"}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_expect_100_continue_is_answered_here_not_forwarded(
    upstream: FaultUpstream, transport: str, path: str
) -> None:
    # curl sends "Expect: 100-continue" for large bodies; the fault upstream, like many servers,
    # never answers 100, so a forwarded Expect would leave the body held back until a timeout.
    with proxy(f"{upstream.url}/v1", upstream_transport=transport) as url:
        started = time.monotonic()
        response = httpx.post(f"{url}{path}", json=BODY, headers={"Expect": "100-continue"}, timeout=10)
        took_s = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert took_s < 1.5  # not a timeout's worth of waiting
    (record,) = upstream.records
    assert "expect" not in record.headers and record.json() == BODY


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_passthrough_paths_go_upstream_as_sent_and_never_climb_out_of_the_base_url(
    upstream: FaultUpstream, transport: str
) -> None:
    with proxy(f"{upstream.url}/v1", upstream_transport=transport) as url:
        statuses = {}
        for path in ("/v1/files/a%2Fb/caf%C3%A9/%7Euser", "/v1/../admin", "/v1/%2e%2E/admin", "/v1/x/./y"):
            sock = raw_request(url, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: proxy\r\n\r\n")
            try:
                statuses[path], _ = read_response(sock)
            finally:
                sock.close()
    assert statuses == {
        "/v1/files/a%2Fb/caf%C3%A9/%7Euser": 200,
        "/v1/../admin": 400,
        "/v1/%2e%2E/admin": 400,
        "/v1/x/./y": 400,
    }
    sent = "/v1/files/a%2Fb/caf%C3%A9/%7Euser"
    if transport == "httpx-aiohttp":  # aiohttp re-quotes httpx's URL: an unreserved "~" is unescaped
        sent = sent.replace("%7E", "~")
    assert [r.path for r in upstream.records] == [sent]  # byte for byte otherwise


# --- concurrency cap ---------------------------------------------------------------------------------


def test_over_the_concurrency_cap_queues_briefly_then_503_with_retry_after(upstream: FaultUpstream) -> None:
    slow = {"X-Fault": "ok", "X-Fault-Chunks": "40", "X-Fault-Delay": "0.05"}
    with (
        proxy(
            f"{upstream.url}/v1",
            max_concurrent_upstream=2,
            queue_timeout_s=0.3,
        ) as url,
        httpx.Client(base_url=url, timeout=15) as client,
    ):
        with (
            client.stream("POST", "/v1/chat/completions", json=STREAM_BODY, headers=slow) as first,
            client.stream("POST", "/v1/chat/completions", json=STREAM_BODY, headers=slow) as second,
        ):
            assert first.status_code == second.status_code == 200
            refused = client.post("/v1/chat/completions", json=BODY)
            error = assert_openai_error(refused, 503, "upstream_busy")
            assert refused.headers["retry-after"] == "1"
            assert error["type"] == "server_error"
            assert len(upstream.records) == 2
            first.read()
            second.read()
        # Slots are given back when the streams end.
        assert client.post("/v1/chat/completions", json=BODY).status_code == 200


def test_a_queued_request_goes_through_when_a_slot_frees(upstream: FaultUpstream) -> None:
    slow = {"X-Fault": "ok", "X-Fault-Chunks": "5", "X-Fault-Delay": "0.1"}
    with (
        proxy(f"{upstream.url}/v1", max_concurrent_upstream=1, queue_timeout_s=10.0) as url,
        httpx.Client(base_url=url, timeout=15) as client,
        httpx.Client(base_url=url, timeout=15) as other,
        client.stream("POST", "/v1/chat/completions", json=STREAM_BODY, headers=slow) as first,
    ):
        assert first.status_code == 200
        # Waits in the queue: the first stream flows into socket buffers and ends by itself in
        # about 0.5 s, which frees its slot.
        queued = other.post("/v1/chat/completions", json=BODY)
        assert queued.status_code == 200
        first.read()
    first_record, second_record = upstream.records
    assert second_record.started_at >= (first_record.finished_at or 0)
