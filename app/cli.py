"""The ``ctxproxy`` command (also ``python -m ctxproxy``; ``python -m app`` in a checkout).

::

    ctxproxy serve  [--host H] [--port P] [--workers N]   run the proxy (uvicorn ctxproxy.main:create_app)
    ctxproxy demo   [--turns N] [--window N]              local demo: no API key, no internet
    ctxproxy plan   FILE.json [--api NAME] [--model-window N] [--policy auto|truncate|reject|off] [...]
                                                          print the plan of a request body, offline
    ctxproxy models [--models-file PATH] [--upstream URL | --proxy URL [--key KEY]]
                                                          print the model table; --upstream: the models
                                                          that upstream serves, as discovered; --proxy:
                                                          what a running ctxproxy knows (calibration too:
                                                          what the requests with --key taught it)

Settings come from the environment (``CTXPROXY_*``, see ``app.settings``); the flags override the few
they name. ``plan`` never touches the network, nor does ``models`` without ``--upstream`` or
``--proxy``. Exit codes: 0 ok, 1 the command ran but failed (``plan`` of a request that cannot fit,
a demo turn that failed, ``models --upstream/--proxy`` that found no model), 2 bad usage or bad input
(``serve`` on a port in use included: checked before anything starts).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .core.budget import POLICY_MODES
from .core.errors import CtxproxyError

if TYPE_CHECKING:
    from .core.registry import ModelSpec


class CliError(CtxproxyError):
    """Bad input the user can fix: printed as ``ctxproxy: error: ...`` with exit code 2."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ctxproxy",
        description="HTTP reverse proxy that keeps every LLM request (OpenAI Chat Completions and "
        "Responses, Anthropic Messages, Google Gemini's generateContent) inside the model's context window.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the proxy server")
    serve.add_argument("--host", help="bind address (default: CTXPROXY_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="port, 1-65535 (default: CTXPROXY_PORT or 8080)")
    serve.add_argument("--workers", type=_positive_int, default=1, help="worker processes (default 1)")

    demo = commands.add_parser("demo", help="run the local demo (no API key, no internet)")
    demo.add_argument("--turns", type=_positive_int, default=8, help="conversation turns (default 8)")
    demo.add_argument("--window", type=_positive_int, default=4096, help="the demo upstream's window")

    plan = commands.add_parser("plan", help="print the plan of a request (offline)")
    plan.add_argument("file", type=Path, help="a request body (JSON) of the --api; '-' for stdin")
    from .core.dialects import DIALECTS

    plan.add_argument(
        "--api",
        choices=tuple(DIALECTS),
        help="the wire API of the body (default: detected from the body, as the dry run does)",
    )
    plan.add_argument("--model-window", type=_positive_int, help="the model's context window in tokens")
    plan.add_argument("--policy", choices=POLICY_MODES, help="fit policy (default: CTXPROXY_POLICY_MODE)")
    plan.add_argument("--keep-turns", type=_non_negative_int, help="newest turns protected from dropping")
    plan.add_argument("--budget", type=_positive_int, help="cap on input tokens (like X-Context-Budget)")
    plan.add_argument("--reserve", type=_non_negative_int, help="output reserve when the body sets none")
    plan.add_argument("--models-file", type=Path, help="operator model table (TOML)")
    plan.add_argument(
        "--no-body",
        "--no-messages",  # its name before the plan showed the whole body
        dest="no_body",
        action="store_true",
        help="with --json: leave out the body that would be forwarded",
    )
    plan.add_argument(
        "--json",
        action="store_true",
        help="print the whole plan as JSON, with the body that would be forwarded (POST /v1/context/plan)",
    )

    models = commands.add_parser("models", help="print the model table")
    models.add_argument(
        "--models-file", type=Path, help="operator model table (TOML) merged over the built-in"
    )
    models.add_argument(
        "--upstream",
        metavar="URL",
        help="ask this upstream base URL (e.g. http://localhost:11434/v1) for its models and windows",
    )
    models.add_argument(
        "--proxy",
        metavar="URL",
        help="ask a running ctxproxy (e.g. http://127.0.0.1:8080) what it knows: GET /v1/context/models",
    )
    models.add_argument(
        "--key",
        metavar="KEY",
        help="with --proxy: the key your client sends (as Authorization: Bearer): what the proxy learned "
        "is per client key, and a proxy with keys on asks for one",
    )
    models.add_argument(
        "--timeout", type=float, default=5.0, help="seconds per request with --upstream/--proxy (default 5)"
    )
    return parser


def _settings(*, warn: bool = True) -> Any:
    """The settings; bad ones are a ``CliError``. ``warn``: print a warning for every ``CTXPROXY_*``
    variable that is no setting (``serve`` leaves that to the app, which logs it)."""
    from .settings import InvalidSettings, load_settings, unknown_variables

    try:
        settings = load_settings()
    except InvalidSettings as exc:
        raise CliError("\nctxproxy: error: ".join(exc.lines)) from None
    if warn:
        for warning in unknown_variables():
            print(f"ctxproxy: warning: {warning}", file=sys.stderr)
    return settings


def _registry(models_file: Path | None, *, warn: bool = True) -> Any:
    from .core.errors import InvalidModelTable
    from .model_table import load_registry

    settings = _settings(warn=warn)
    operator_file = models_file if models_file is not None else settings.models_file
    if operator_file is not None and not Path(operator_file).is_file():
        where = "--models-file" if models_file is not None else "CTXPROXY_MODELS_FILE"
        raise CliError(f"{where}: model table not found: {operator_file}; expected a TOML file")
    try:
        return load_registry(
            operator_file=operator_file,
            default_window_tokens=settings.default_window_tokens,
            default_max_output_tokens=settings.default_max_output_tokens,
        )
    except InvalidModelTable as exc:
        where = "--models-file" if models_file is not None else "CTXPROXY_MODELS_FILE"
        raise CliError(f"{where}: {exc}" if operator_file is not None else str(exc)) from None


def _stopped(signum: int, frame: object) -> None:
    raise SystemExit(0)


def port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (in use, no such address), or None when it can.
    Bound the way uvicorn binds (``SO_REUSEADDR``: a port in ``TIME_WAIT`` is free), then let go."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    import uvicorn

    from .core.dialects import DIALECTS
    from .settings import InvalidSettings, worker_environment

    settings = _settings(warn=False)  # the app logs them, with its start-up lines
    # Everything create_app would stop on, checked here where it can be one clean line and exit
    # code 2 (uvicorn would print a traceback and exit 3): the model table, and the port (uvicorn
    # would start the whole app, then exit 3 on "address already in use").
    _registry(None, warn=False)
    try:
        settings.require_apis(tuple(DIALECTS))
    except InvalidSettings as exc:
        raise CliError("\nctxproxy: error: ".join(exc.lines)) from None
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    taken = port_taken(host, port)
    if taken is not None:
        hint = "another server there? choose one with --port or CTXPROXY_PORT"
        raise CliError(f"cannot listen on {host}:{port}: {taken} ({hint})")
    # On SIGTERM uvicorn stops accepting, drains in-flight requests for up to the grace period,
    # then re-raises the signal to whatever handler was there before it: with this one, a stop
    # that was asked for ends with exit code 0 instead of death by signal.
    signal.signal(signal.SIGTERM, _stopped)
    # Several workers share a fresh directory (metrics, status board, learned knowledge), fresh
    # because multiprocess metric files of an earlier run would be counted again.
    worker_dir = Path(tempfile.mkdtemp(prefix="ctxproxy-workers-")) if args.workers > 1 else None
    logs: dict[str, Any] = {}
    if settings.log_json:  # uvicorn's own lines as JSON too, in every process
        from .main import uvicorn_log_config

        logs["log_config"] = uvicorn_log_config()
    try:
        with worker_environment(worker_dir):
            uvicorn.run(
                f"{__package__}.main:create_app",
                factory=True,
                host=host,
                port=port,
                workers=args.workers,
                log_level=settings.log_level.lower(),
                access_log=False,  # ctxproxy.access logs every request, with its request ID
                timeout_graceful_shutdown=settings.shutdown_grace_s,
                **logs,
            )
    finally:
        if worker_dir is not None:
            shutil.rmtree(worker_dir, ignore_errors=True)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    return _print_demo(turns=args.turns, window_tokens=args.window)


def _print_demo(*, turns: int, window_tokens: int) -> int:
    """Run the demo (``app.demo``) and print its table; 0 when every turn succeeded through ctxproxy."""
    from . import demo

    print(
        f"ctxproxy demo: a local upstream with a {window_tokens:,}-token window "
        f"({demo.demo_model(window_tokens)}), "
        "and ctxproxy in front of it, both on 127.0.0.1. No API key, no internet.\n"
        "The demo model cannot summarize, so what a cut forgets is remembered by its index of exact "
        "strings (indexed).\n"
    )
    print(demo.header_line())
    started = time.monotonic()
    rows = demo.run_demo(
        turns=turns, window_tokens=window_tokens, on_row=lambda row: print(demo.format_row(row), flush=True)
    )
    failed_direct = sum(r.direct != "ok" for r in rows)
    proxied_ok = sum(r.proxied == "ok" for r in rows)
    print(
        f"\nDirect: {len(rows) - failed_direct} of {len(rows)} turns ok, "
        f"{failed_direct} refused by the upstream. "
        f"Through ctxproxy: {proxied_ok} of {len(rows)} ok ({time.monotonic() - started:.1f} s)."
    )
    print("Point any OpenAI client at ctxproxy instead of the upstream: base_url=http://HOST:PORT/v1")
    return 0 if proxied_ok == len(rows) else 1


def _read_body(path: Path) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    from .service.request import load_json

    try:
        body = load_json(text.encode("utf-8", "surrogatepass"))  # RFC 8259, as the proxy reads bodies
    except (ValueError, RecursionError) as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise CliError(f"{path} must hold a JSON object (a request body of one of the wire APIs)")
    return body


def cmd_plan(args: argparse.Namespace) -> int:
    from . import tokenizer
    from .core.dialects import DIALECTS
    from .core.errors import InvalidRequest
    from .core.routes import RouteMatch, detect
    from .service.planner import offline_planner
    from .service.report import plan_report
    from .service.request import RequestOptions

    body = _read_body(args.file)
    dialect = DIALECTS[args.api] if args.api is not None else detect(DIALECTS, body, {})
    registry = _registry(args.models_file)
    settings = _settings(warn=False)  # warned by _registry already
    # The proxy's own decision with these settings, as a planner outside its process (no
    # upstream, nothing learned: what that changes is named in the report's estimates).
    planner = offline_planner(
        policy=settings.fit_policy(),
        registry=registry,
        vocabularies=tokenizer,
        summarize=settings.summarize,
        boundary_exact=settings.boundary_exact,
        lower_output=settings.lower_output,
        upstream_count=settings.upstream_count,
    )
    # The flags are the X-Context-* headers of the same meaning.
    options = RequestOptions(
        budget_tokens=args.budget,
        reserve_tokens=args.reserve,
        window_tokens=args.model_window,
        mode=args.policy,
        keep_turns=args.keep_turns,
    )
    try:
        decision = planner.dry_run(planner.request(body, options, route=RouteMatch.first(dialect)))
    except InvalidRequest as exc:
        where = f" ({exc.param})" if exc.param else ""
        raise CliError(f"invalid request{where}: {exc.message}") from exc
    plan = decision.plan
    report = plan_report(plan, body, estimates=decision.explained)
    if not args.json:
        print(format_plan(report, detected=args.api is None))
        return 0 if plan.fits else 1
    if args.no_body:
        del report["body"]
    print(json.dumps(report, indent=2, ensure_ascii=False))
    return 0 if plan.fits else 1


def counted_as(report: dict[str, Any]) -> str:
    """How the plan's tokens were counted, in words: exact (with which vocabulary) or estimated."""
    count = report["count"]
    if count == "exact":
        return f"exact count ({report['spec']['encoding']})"
    if count == "calibrated":
        return "estimated count, calibrated by the upstream's usage"
    return "estimated count (no public tokenizer)"


def format_plan(report: dict[str, Any], *, detected: bool = True) -> str:
    """A plan (``plan_report``) for people: the API (``detected`` from the body, else named), the
    model, the budget, before -> after, what was done, and which figures a running proxy could
    decide otherwise (its estimates)."""
    spec, budget = report["spec"], report["budget"]
    before, after = report["tokens_before"], report["tokens_after"]
    if not report["fits"]:
        verdict = "does NOT fit: the proxy would answer 400 context_length_exceeded"
    elif report["changed"]:
        done = []
        if after < before:
            done.append(f"{before - after:,} tokens cut ({(before - after) / max(before, 1):.0%})")
        if report["output_lowered"] is not None:
            done.append(f"output cap lowered to {report['output_lowered']:,} (X-Context-Output-Lowered)")
        verdict = "fits after fitting: " + ", ".join(done)
    else:
        verdict = "fits as it is: forwarded byte for byte"
    chosen = "detected from the body; --api to name another" if detected else "--api"
    lines = [
        f"api      {report['api']} ({chosen})",
        f"model    {report['model']} -> {spec['name']} ({spec['source']}): window {spec['window_tokens']:,}, "
        f"{counted_as(report)}",
        f"budget   {budget['input_budget_tokens']:,} input tokens (reserve {budget['reserve_tokens']:,} for "
        f"the answer, margin {budget['margin_tokens']:,}"
        + (f", cap {budget['cap_tokens']:,}" if budget["cap_tokens"] else "")
        + ")",
        f"tokens   {before:,} -> {after if report['fits'] else before:,}",
        f"result   {verdict}",
    ]
    for action in report["actions"]:
        freed = f", {action['tokens_freed']:,} tokens freed" if action["tokens_freed"] else ""
        detail = f" ({action['detail']})" if action["detail"] else ""
        lines.append(f"action   {action['kind']} x{action['count']}{freed}{detail}")
    lines += [f"warning  {warning}" for warning in report["warnings"]]
    lines += [f"estimate {name}: {why}" for name, why in report["estimates"].items()]
    lines.append("(--json for the whole plan, with the body to forward)")
    return "\n".join(lines)


def figure_sources(spec: ModelSpec) -> str:
    """``builtin`` when every figure has the same source, else ``window=discovered,max_output=...``."""
    pairs = [(figure, spec.source_of(figure)) for figure in ("window", "max_output", "encoding")]
    if len({source for _, source in pairs}) == 1:
        return pairs[0][1]
    return ",".join(f"{figure}={source}" for figure, source in pairs)


def _correction(spec: Any) -> str:
    source = spec.source_of("correction") if spec.sources else "none"
    return "-" if source == "none" else f"{spec.correction:.3f}"


def format_models(specs: Sequence[Any], default: Any | None) -> str:
    """The model table as aligned text: name, window, max output, encoding, the source of each
    figure, and the correction factor applied to the estimate (``-``: none)."""
    header = ("model", "window", "max output", "encoding", "source", "correction")
    rows = [
        (
            s.name,
            f"{s.window_tokens:,}",
            f"{s.max_output_tokens:,}",
            s.encoding,
            figure_sources(s),
            _correction(s),
        )
        for s in specs
    ]
    if default is not None:
        rows.append(
            (
                "(default)",
                f"{default.window_tokens:,}",
                f"{default.max_output_tokens:,}",
                default.encoding,
                default.source,
                "-",
            )
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    right = {1, 2}

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def cmd_models(args: argparse.Namespace) -> int:
    if args.proxy is not None:
        return _proxy_models(args.proxy, key=args.key, timeout_s=args.timeout)
    registry = _registry(args.models_file)
    if args.upstream is None:
        print(format_models(registry.entries(), registry.default))
        return 0
    if not args.upstream.startswith(("http://", "https://")):
        raise CliError(f"--upstream must start with http:// or https://, got {args.upstream!r}")
    import asyncio

    specs = asyncio.run(_discovered_specs(registry, args.upstream.rstrip("/"), timeout_s=args.timeout))
    if not specs:
        print(f"{args.upstream} listed no models (or could not be reached)", file=sys.stderr)
        return 1
    print(format_models(specs, registry.default))
    return 0


def _proxy_models(url: str, *, key: str | None, timeout_s: float) -> int:
    """The table a running proxy reports (``GET /v1/context/models``) to a client with ``key``."""
    import httpx

    from .core.registry import ModelSpec

    if not url.startswith(("http://", "https://")):
        raise CliError(f"--proxy must start with http:// or https://, got {url!r}")
    where = f"{url.rstrip('/')}/v1/context/models"
    try:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = httpx.get(where, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        print(f"ctxproxy: could not reach {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    not_ours = f"ctxproxy: {url} does not look like ctxproxy: GET {where} answered"
    if response.status_code == 401:
        why = "a proxy with CTXPROXY_API_KEYS wants a key it knows (--key)"
        print(f"ctxproxy: GET {where} answered 401: {why}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        print(f"{not_ours} HTTP {response.status_code}, not ctxproxy's model report", file=sys.stderr)
        return 1
    try:
        specs = [
            ModelSpec(
                name=row["model"],
                window_tokens=row["window_tokens"],
                max_output_tokens=row["max_output_tokens"],
                encoding=row["encoding"],
                source=row["sources"].get("window", ""),
                sources=tuple(row["sources"].items()),
                correction=row["correction"] if row["correction"] is not None else 1.0,
            )
            for row in response.json()["data"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"{not_ours} something that is not ctxproxy's model report", file=sys.stderr)
        return 1
    if not specs:
        print(f"{url} knows no model yet (none discovered, none used)", file=sys.stderr)
        return 1
    print(format_models(specs, None))
    return 0


async def _discovered_specs(registry: Any, base_url: str, *, timeout_s: float) -> list[Any]:
    """The effective spec of every model ``base_url`` lists, after asking it (``app.service.discovery``)."""
    import httpx

    from .core.knowledge import Knowledge
    from .core.tenant import ANONYMOUS
    from .service.discovery import Discovery
    from .upstream.client import UpstreamClient

    settings = _settings(warn=False)  # warned by _registry already
    knowledge = Knowledge()
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        upstream = UpstreamClient(http, base_url=base_url, api_key=settings.upstream_key())
        discovery = Discovery(upstream, knowledge, timeout_s=timeout_s, retry_after_s=None)  # one shot
        try:
            ids = await discovery.discover_listed(base_url)
            await discovery.wait_idle()
        finally:
            await discovery.aclose()
    # What the upstream said (discovery) is everyone's: no tenant learned anything here.
    return [knowledge.effective(registry.resolve(model), tenant=ANONYMOUS) for model in ids]


COMMANDS = {"serve": cmd_serve, "demo": cmd_demo, "plan": cmd_plan, "models": cmd_models}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ctxproxy`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = COMMANDS[args.command](args)
        # Output that fit in the pipe's buffer meets a closed reader only here.
        sys.stdout.flush()
        return code
    except CliError as exc:
        print(f"ctxproxy: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`ctxproxy plan --json ... | head`): stop quietly, like cat.
        _discard_stdout()
        return EXIT_BROKEN_PIPE


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for cat cut short the same way


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what is left in its buffer
    does not raise a second BrokenPipeError at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (captured, closed): nothing will be flushed
        pass
