"""An instant OpenAI-compatible upstream for the benchmarks (aiohttp.web on uvloop).

``POST /v1/chat/completions`` reads the whole body and answers at once with a fixed small
completion; it never parses the JSON (two byte searches decide what to do), so its cost does not
grow with the prompt beyond reading the bytes. With ``"stream": true`` it answers with
``bench_chunks`` SSE chunks (default 16) and ``data: [DONE]``, sleeping ``bench_drip_ms``
milliseconds between chunks when the body asks (default 0: instant). Those two keys are unknown
top-level keys that proxies keep.

``system_fingerprint`` carries ``bytes=N``, the size of the body it received, so the harness can
check what a proxy actually forwarded (scenario (c): the cut request is smaller).

``POST /v1/responses`` (OpenAI Responses API) and ``POST /v1/messages`` (Anthropic Messages API)
do the same in their own API's shape: a fixed ``message`` output item / ``text`` block with
``usage``, or, streaming, the API's event sequence (Responses: ``response.created``, one
``response.output_text.delta`` per chunk, ``response.completed`` with usage; Anthropic:
``message_start`` ... ``message_stop``). Their ``metadata.bench_bytes`` / ``id`` suffix carry the
body size like ``system_fingerprint`` does for chat.

``POST /{v1beta,v1}/models/{model}:generateContent`` (Gemini's native API) answers one
``GenerateContentResponse`` with ``usageMetadata`` (``responseId`` carries the body size);
``:streamGenerateContent`` answers its SSE chunks framed with CRLF, usage on each. The
benchmark's own models are plain routes (as cheap to route as the other APIs' paths); any other
model goes through the path template.

``GET /v1/models`` lists one model (readiness probes use it).

Run: ``python -m bench.fake_upstream --port 8001``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import time
from collections.abc import Callable

import uvloop
from aiohttp import web

from bench.scenarios import CL100K_MODEL, CUT_MODEL, SMALL_MODEL

_STREAM = re.compile(rb'"stream"\s*:\s*true')
_DRIP = re.compile(rb'"bench_drip_ms"\s*:\s*(\d+)')
_CHUNKS = re.compile(rb'"bench_chunks"\s*:\s*(\d+)')

_COMPLETION = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":%d,"model":"bench",'
    b'"system_fingerprint":"bytes=%d","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"OK, done."},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":%d,"completion_tokens":3,"total_tokens":%d}}'
)
_CHUNK = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":"tok%d "},"finish_reason":null}]}\n\n'
)
_LAST = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":0,"model":"bench",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)
_RESPONSE = (
    b'{"id":"resp_bench","object":"response","created_at":%d,"status":"completed","model":"bench",'
    b'"metadata":{"bench_bytes":"%d"},"output":[{"type":"message","id":"msg_bench","status":"completed",'
    b'"role":"assistant","content":[{"type":"output_text","text":"OK, done.","annotations":[]}]}],'
    b'"usage":{"input_tokens":%d,"output_tokens":3,"total_tokens":%d}}'
)
_RESPONSE_CREATED = (
    b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":'
    b'{"id":"resp_bench","object":"response","status":"in_progress","model":"bench","output":[]}}\n\n'
)
_RESPONSE_DELTA = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":%d,'
    b'"item_id":"msg_bench","output_index":0,"content_index":0,"delta":"tok%d "}\n\n'
)
_RESPONSE_COMPLETED = (
    b'event: response.completed\ndata: {"type":"response.completed","sequence_number":%d,"response":'
    b'{"id":"resp_bench","object":"response","status":"completed","model":"bench","output":[],'
    b'"usage":{"input_tokens":%d,"output_tokens":%d,"total_tokens":%d}}}\n\n'
)
_MESSAGE = (
    b'{"id":"msg_bench_%d","type":"message","role":"assistant","model":"bench",'
    b'"content":[{"type":"text","text":"OK, done."}],"stop_reason":"end_turn","stop_sequence":null,'
    b'"usage":{"input_tokens":%d,"output_tokens":3}}'
)
_MESSAGE_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_bench","type":"message",'
    b'"role":"assistant","model":"bench","content":[],"stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":%d,"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
_MESSAGE_DELTA = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"tok%d "}}\n\n'
)
_MESSAGE_STOP = (
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn",'
    b'"stop_sequence":null},"usage":{"output_tokens":%d}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
_GEMINI = (
    b'{"candidates":[{"content":{"role":"model","parts":[{"text":"OK, done."}]},"finishReason":"STOP",'
    b'"index":0}],"usageMetadata":{"promptTokenCount":%d,"candidatesTokenCount":3,"totalTokenCount":%d},'
    b'"modelVersion":"bench","responseId":"bench-%d"}'
)
_GEMINI_CHUNK = (
    b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"tok%d "}]},"index":0}],'
    b'"usageMetadata":{"promptTokenCount":%d,"totalTokenCount":%d},"modelVersion":"bench"}\r\n\r\n'
)
_GEMINI_LAST = (
    b'data: {"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP",'
    b'"index":0}],"usageMetadata":{"promptTokenCount":%d,"candidatesTokenCount":%d,"totalTokenCount":%d},'
    b'"modelVersion":"bench"}\r\n\r\n'
)
_MODELS = b'{"object":"list","data":[{"id":"bench","object":"model","created":0,"owned_by":"bench"}]}'


def _int_key(pattern: re.Pattern[bytes], body: bytes, default: int) -> int:
    match = pattern.search(body)
    return int(match.group(1)) if match else default


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if not _STREAM.search(body):
        # A rough prompt size (a token covers at least one byte); only a placeholder for usage.
        prompt = len(body) // 4
        payload = _COMPLETION % (int(time.time()), len(body), prompt, prompt + 3)
        return web.Response(body=payload, content_type="application/json")
    chunks = _int_key(_CHUNKS, body, 16)
    drip_s = _int_key(_DRIP, body, 0) / 1000
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for i in range(chunks):
        await resp.write(_CHUNK % i)
        if drip_s:
            await asyncio.sleep(drip_s)
    await resp.write(_LAST)
    await resp.write_eof()
    return resp


async def _stream(
    request: web.Request,
    body: bytes,
    first: bytes,
    chunk: Callable[[int], bytes],
    last: Callable[[int], bytes],
) -> web.StreamResponse:
    chunks = _int_key(_CHUNKS, body, 16)
    drip_s = _int_key(_DRIP, body, 0) / 1000
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    await resp.write(first)
    for i in range(chunks):
        await resp.write(chunk(i))
        if drip_s:
            await asyncio.sleep(drip_s)
    await resp.write(last(chunks))
    await resp.write_eof()
    return resp


async def responses(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    prompt = len(body) // 4
    if not _STREAM.search(body):
        payload = _RESPONSE % (int(time.time()), len(body), prompt, prompt + 3)
        return web.Response(body=payload, content_type="application/json")
    return await _stream(
        request,
        body,
        _RESPONSE_CREATED,
        lambda i: _RESPONSE_DELTA % (i + 1, i),
        lambda n: _RESPONSE_COMPLETED % (n + 1, prompt, n, prompt + n),
    )


async def messages(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    prompt = len(body) // 4
    if not _STREAM.search(body):
        return web.Response(body=_MESSAGE % (len(body), prompt), content_type="application/json")
    return await _stream(
        request, body, _MESSAGE_START % prompt, lambda i: _MESSAGE_DELTA % i, lambda n: _MESSAGE_STOP % n
    )


async def gemini(request: web.Request) -> web.StreamResponse:
    """``POST /{v1,v1beta}/models/{model}:generateContent`` (one answer) or
    ``:streamGenerateContent?alt=sse`` (CRLF-framed chunks, usage on each, no ``[DONE]``)."""
    if request.path.endswith(":streamGenerateContent"):
        return await gemini_stream(request)
    return await gemini_whole(request)


async def gemini_whole(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    prompt = len(body) // 4
    return web.Response(body=_GEMINI % (prompt, prompt + 3, len(body)), content_type="application/json")


async def gemini_stream(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    prompt = len(body) // 4
    return await _stream(
        request,
        body,
        b"",
        lambda i: _GEMINI_CHUNK % (i, prompt, prompt + i),
        lambda n: _GEMINI_LAST % (prompt, n, prompt + n),
    )


async def models(request: web.Request) -> web.Response:
    return web.Response(body=_MODELS, content_type="application/json")


def make_app() -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    for prefix in ("/v1", ""):
        app.router.add_post(f"{prefix}/chat/completions", chat)
        app.router.add_post(f"{prefix}/responses", responses)
        app.router.add_post(f"{prefix}/messages", messages)
        app.router.add_get(f"{prefix}/models", models)
    for version in ("/v1beta", "/v1"):
        # The benchmark's own models first, as plain paths: a path template costs the router a
        # regular expression and the handler a look at the path, so Gemini's requests would cost
        # this upstream more than the other APIs' (it shares the two cores with the proxy).
        for model in (SMALL_MODEL, CUT_MODEL, CL100K_MODEL):
            app.router.add_post(f"{version}/models/{model}:generateContent", gemini_whole)
            app.router.add_post(f"{version}/models/{model}:streamGenerateContent", gemini_stream)
        app.router.add_post(version + "/models/{tail}", gemini)
    return app


async def _serve(host: str, port: int) -> None:
    runner = web.AppRunner(make_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve(args.host, args.port))


if __name__ == "__main__":
    main()
