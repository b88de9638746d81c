"""The composition root: create_app, the lifespan, logging configuration."""

from __future__ import annotations

import gc
import importlib
import io
import json
import logging
import sys
from typing import Any

import httpx
import pytest
import respx

from app.main import (
    _Formatter,
    build_httpx_transport,
    build_sender,
    configure_logging,
    create_app,
)
from app.service.driver import Service
from app.settings import Settings
from tests.api import OneModelRegistry, WordVocabularies, make_settings


class RecordingTransport(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.closed = False
        self.inner = httpx.MockTransport(respx.Router(assert_all_called=False).handler)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        self.closed = True


async def test_lifespan_preloads_builds_the_service_and_closes_the_client() -> None:
    transport = RecordingTransport()
    vocab = WordVocabularies()
    app = create_app(
        make_settings(), upstream_transport=transport, registry=OneModelRegistry(), vocabularies=vocab
    )
    assert not hasattr(app.state, "service")
    async with app.router.lifespan_context(app):
        assert isinstance(app.state.service, Service)
        assert vocab.loaded_encodings() == ("o200k_base", "cl100k_base")
        assert not transport.closed
    assert transport.closed


async def test_the_start_up_heap_is_frozen_while_the_app_runs_and_thawed_after() -> None:
    gc.unfreeze()
    app = create_app(make_settings(), upstream_transport=RecordingTransport(), registry=OneModelRegistry())
    async with app.router.lifespan_context(app):
        # The vocabularies (the real ones: the bulk of the start-up heap) are out of the collector's
        # reach, so a full collection no longer walks them.
        assert gc.get_freeze_count() > 10_000
        gc.collect()  # a collection leaves them frozen (reference counting may still free a few)
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0


def test_two_apps_share_no_state() -> None:
    first = create_app(make_settings(), registry=OneModelRegistry(), vocabularies=WordVocabularies())
    second = create_app(make_settings(), registry=OneModelRegistry(), vocabularies=WordVocabularies())
    assert first is not second and first.state is not second.state


def test_create_app_reads_settings_from_the_environment_only_when_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTXPROXY_MAX_BODY_BYTES", "1234")
    monkeypatch.setenv("CTXPROXY_UPSTREAM_TRANSPORT", "httpx")
    app = create_app(registry=OneModelRegistry(), vocabularies=WordVocabularies())
    assert app.title == "ctxproxy"


async def test_default_wiring_uses_the_real_model_table_and_tokenizer() -> None:
    app = create_app(make_settings(), upstream_transport=RecordingTransport())
    async with app.router.lifespan_context(app):
        service: Service = app.state.service
        assert "o200k_base" in service.vocabularies.loaded_encodings()
        spec = service.registry.resolve("gpt-4o")
        assert spec.window_tokens > 0


async def test_build_sender_follows_the_setting() -> None:
    from httpx_aiohttp import AiohttpTransport

    from app.upstream.aiohttp_sender import AiohttpSender
    from app.upstream.senders import HttpxSender

    assert isinstance(build_sender(make_settings(upstream_transport="aiohttp")), AiohttpSender)
    for name, kind in (("httpx-aiohttp", AiohttpTransport), ("httpx", httpx.AsyncHTTPTransport)):
        sender = build_sender(make_settings(upstream_transport=name))
        assert isinstance(sender, HttpxSender) and isinstance(sender.http._transport, kind)
        await sender.aclose()
    seam = httpx.MockTransport(lambda r: httpx.Response(200))
    sender = build_sender(make_settings(upstream_transport="aiohttp"), transport=seam)
    assert isinstance(sender, HttpxSender) and sender.http._transport is seam  # the test seam wins
    await sender.aclose()
    assert sender.http.is_closed  # made for the sender: closed with it
    lent = httpx.AsyncClient(transport=seam)
    await HttpxSender(lent).aclose()
    assert not lent.is_closed  # a caller's client is the caller's to close
    await lent.aclose()


def record(**access: Any) -> logging.LogRecord:
    rec = logging.LogRecord("ctxproxy.access", logging.INFO, __file__, 1, "request", None, None)
    rec.access = access
    return rec


def test_json_and_text_formats() -> None:
    line = json.loads(_Formatter(as_json=True).format(record(model="m", retries=1)))
    assert line["logger"] == "ctxproxy.access" and line["model"] == "m" and line["retries"] == 1
    assert _Formatter(as_json=False).format(record(model="m")).endswith("request model=m")


def test_configure_logging_replaces_its_handler_instead_of_stacking() -> None:
    logger = logging.getLogger("ctxproxy")
    configure_logging(make_settings(log_json=True))
    configure_logging(make_settings(log_json=True, log_level="WARNING"))
    ours = [h for h in logger.handlers if getattr(h, "_ctxproxy_handler", False)]
    assert len(ours) == 1
    assert logger.level == logging.WARNING


def test_log_lines_follow_stderr_when_it_is_swapped(monkeypatch: pytest.MonkeyPatch) -> None:
    configure_logging(Settings(log_level="INFO"))
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logging.getLogger("ctxproxy.test").info("one")
    first.close()  # e.g. a test runner's capture, closed after its test
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("ctxproxy.test").info("two")
    assert "two" in second.getvalue()


async def test_senders_are_sized_for_concurrency() -> None:
    from httpx_aiohttp import AiohttpTransport

    from app.upstream.aiohttp_sender import AiohttpSender

    assert Settings().upstream_transport == "aiohttp"  # production default
    sender = build_sender(make_settings(upstream_transport="aiohttp", upstream_max_connections=321))
    assert isinstance(sender, AiohttpSender)
    try:
        connector = sender.session.connector
        assert connector is not None and connector.limit == 321 and connector.limit_per_host == 0
    finally:
        await sender.aclose()
    transport = build_httpx_transport(
        make_settings(upstream_transport="httpx-aiohttp", upstream_max_connections=321)
    )
    assert isinstance(transport, AiohttpTransport)
    session = transport.get_client()
    try:
        assert session.connector is not None and session.connector.limit == 321
    finally:
        await session.close()
    plain = build_httpx_transport(make_settings(upstream_transport="httpx", upstream_max_connections=321))
    assert isinstance(plain, httpx.AsyncHTTPTransport)
    pool = plain._pool
    assert (pool._max_connections, pool._max_keepalive_connections) == (321, 321)
    assert pool._keepalive_expiry == Settings().upstream_keepalive_s


async def test_the_aiohttp_senders_keep_no_upstream_cookies() -> None:
    import aiohttp

    from app.upstream.aiohttp_sender import AiohttpSender

    sender = build_sender(make_settings(upstream_transport="aiohttp"))
    assert isinstance(sender, AiohttpSender)
    try:
        assert isinstance(sender.session.cookie_jar, aiohttp.DummyCookieJar)
    finally:
        await sender.aclose()
    transport = build_httpx_transport(make_settings(upstream_transport="httpx-aiohttp"))
    session = transport.get_client()  # type: ignore[attr-defined]
    try:
        assert isinstance(session.cookie_jar, aiohttp.DummyCookieJar)
    finally:
        await session.close()


def test_create_app_names_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``uvicorn ctxproxy.main:create_app --factory`` ends its traceback with one readable line."""
    from app.settings import InvalidSettings

    monkeypatch.setenv("CTXPROXY_KEEP_TURNS", "-1")
    with pytest.raises(InvalidSettings) as caught:
        create_app()
    assert (
        str(caught.value)
        == "CTXPROXY_KEEP_TURNS: input should be greater than or equal to 0; expected an integer >= 0"
    )


def test_uvicorns_own_handlers_write_json_under_log_json_and_text_again_without() -> None:
    stream = io.StringIO()
    theirs = logging.StreamHandler(stream)
    plain = logging.Formatter("%(levelname)s:     %(message)s")
    theirs.setFormatter(plain)
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(theirs)
    try:
        configure_logging(make_settings(log_json=True))
        configure_logging(make_settings(log_json=True))  # twice: still one swap, the original kept
        logging.getLogger("uvicorn.error").warning("Started server process [%d]", 42)
        line = json.loads(stream.getvalue().splitlines()[-1])
        assert line["logger"] == "uvicorn.error" and line["message"] == "Started server process [42]"
        configure_logging(make_settings(log_json=False))
        assert theirs.formatter is plain
    finally:
        uvicorn_logger.removeHandler(theirs)
        configure_logging(make_settings())


def test_uvicorn_log_config_formats_every_uvicorn_line_as_json() -> None:
    from app.main import uvicorn_log_config

    config = uvicorn_log_config()
    assert set(config["loggers"]) == {"uvicorn", "uvicorn.error", "uvicorn.access"}
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Running on %s", ("x",), None)
    for formatter in config["formatters"].values():
        module, _, name = formatter["()"].rpartition(".")
        made = getattr(importlib.import_module(module), name)()
        assert json.loads(made.format(record))["message"] == "Running on x"


async def test_start_up_logs_the_configuration_and_warns_of_unknown_variables(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CTXPROXY_UPSTREAM_BASEURL", "http://typo.example/v1")
    caplog.set_level(logging.INFO, logger="ctxproxy.startup")
    app = create_app(
        make_settings(), upstream_transport=RecordingTransport(), vocabularies=WordVocabularies()
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "CTXPROXY_UPSTREAM_BASEURL is not a ctxproxy setting and is ignored: did you mean "
        "CTXPROXY_UPSTREAM_BASE_URL?"
    ]
    async with app.router.lifespan_context(app):
        pass
    startup = [r for r in caplog.records if r.name == "ctxproxy.startup" and r.levelno == logging.INFO]
    lines = [r.getMessage() for r in startup]
    assert len(lines) == 3
    assert lines[0].startswith("upstream http://upstream.test/v1")
    assert lines[1].startswith("policy auto:")
    assert lines[2].startswith("model table: built-in; unknown models: window ")
