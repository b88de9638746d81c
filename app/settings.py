"""Configuration: the only module that reads the environment (``CTXPROXY_*`` variables).

``Settings()`` reads the environment when it is *constructed* (never at import time);
``create_app`` builds it once and passes it down. The budget engine never sees it:
:meth:`Settings.fit_policy` turns it into an ``app.core.budget.Policy`` value.

Loud, not quiet: a bad value, or two settings that contradict each other (a minimum above its
maximum, a stream idle timeout the read timeout would always cut first, a concurrency cap above the
connection pool), is refused with one line per problem (:func:`describe_settings_error`); a
``CTXPROXY_*`` variable that is no setting is a warning naming the nearest one
(:func:`unknown_variables`); :meth:`Settings.summary_lines` says at start-up what the proxy will do
(upstreams, policy, model table), never a key.
"""

from __future__ import annotations

import difflib
import os
import re
import types
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, get_args, get_origin
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from .core.budget import DEFAULT_CUT_TARGET, Policy, PolicyMode
from .core.errors import CtxproxyError

MIB = 1024 * 1024


class Settings(BaseSettings):
    """Every setting, with its default. Environment: ``CTXPROXY_<NAME>`` (case-insensitive)."""

    model_config = SettingsConfigDict(
        env_prefix="CTXPROXY_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    upstream_base_url: str = "https://api.openai.com/v1"
    upstream_api_key: SecretStr | None = None
    upstream_routes: dict[str, str] = Field(
        default_factory=dict,
        description="JSON object: model name or prefix -> base URL (longest prefix wins).",
    )
    upstream_transport: Literal["aiohttp", "httpx-aiohttp", "httpx"] = "aiohttp"
    upstream_max_connections: int = Field(default=1000, gt=0)
    upstream_keepalive_s: float = Field(default=15.0, ge=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0)
    readiness_timeout_s: float = Field(default=2.0, gt=0)
    stream_idle_timeout_s: float = Field(default=300.0, gt=0)
    max_concurrent_upstream: int = Field(default=1000, ge=0)
    queue_timeout_s: float = Field(default=5.0, ge=0)
    api_keys: SecretStr | None = None

    models_file: Path | None = None
    discovery: bool = Field(
        default=True, description="Ask the upstream for its models' windows (GET /models, /props, /api/show)."
    )
    discovery_timeout_s: float = Field(default=1.5, gt=0)
    default_window_tokens: int | None = Field(default=None, gt=0)
    default_max_output_tokens: int | None = Field(default=None, gt=0)

    policy_mode: PolicyMode = "auto"
    keep_turns: int = Field(default=2, ge=0)
    pin_first_user: bool = True
    protect_max_share: float = Field(default=0.5, gt=0, le=1)
    reserve_tokens: int | None = Field(default=None, ge=0)
    reserve_ratio: float = Field(default=0.15, ge=0, le=1)
    reserve_min_tokens: int = Field(default=512, ge=0)
    reserve_max_tokens: int = Field(default=4096, ge=0)
    cut_target: float = Field(
        default=DEFAULT_CUT_TARGET,
        gt=0,
        le=1,
        description="Share of the input budget a cut brings an over-long request down to (headroom "
        "for the next turns, so upstream prompt caches keep hitting); 1.0 cuts as little as possible.",
    )

    summarize: bool = Field(
        default=True,
        description="Under policy auto, what a cut forgets (dropped turns, pruned tool results) is "
        "summarized by the upstream in the request's own API (fail open: the note stands in).",
    )
    cache_url: str | None = None
    cache_ttl_s: float = Field(default=86400.0, gt=0)
    cache_max_entries: int = Field(default=4096, ge=1)
    summary_model: str | None = None
    summary_base_url: str | None = None
    summary_timeout_s: float = Field(default=4.0, gt=0)
    summary_ahead_ratio: float = Field(default=0.85, ge=0, le=1)
    summary_concurrency: int = Field(default=2, ge=1)

    max_body_bytes: int = Field(default=32 * MIB, gt=0)
    count_threads: int = Field(
        default=0,
        ge=0,
        description="Threads that count a large cold request's texts in parallel (tiktoken encodes "
        "outside the GIL); 0: as many as the CPUs the process may use (its affinity mask, capped by "
        "the cgroup's CPU quota); 1: no parallel counting.",
    )
    compress_aside_tokens: int | None = Field(
        default=None,
        ge=0,
        description="POST /v1/compress: tokens left for what the gateway keeps aside (system prompt, "
        "tools) when the request does not say (X-Context-Aside-Tokens); unset: 10% of the window.",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_json: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    shutdown_grace_s: float = Field(default=30.0, gt=0)
    worker_dir: Path | None = Field(
        default=None,
        description="Set by `ctxproxy serve --workers N` (leave unset): the directory its workers share.",
    )

    boundary_exact: bool = Field(
        default=True,
        description="Near the budget, find the upstream's own count before cutting (its usage of the "
        "conversation's previous request, its counting endpoint) and shrink the margin as its counts "
        "confirm ours; off: the fixed margins alone.",
    )
    upstream_count: bool = Field(
        default=True,
        description="Near the budget, ask the API's own token-counting endpoint (where its dialect has "
        "one) when the conversation's previous request does not settle the count.",
    )
    upstream_count_timeout_s: float = Field(default=1.0, gt=0)
    lower_output: bool = Field(
        default=True,
        description="When the client's output cap (max_tokens, ...) leaves no room for what must be "
        "kept, forward a lower one instead of refusing (never below OUTPUT_FLOOR_TOKENS).",
    )
    output_floor_tokens: int = Field(default=1024, ge=1)
    # Summaries (memory of what a cut forgot): the API they are asked in, and their back-off.
    summary_api: str | None = Field(
        default=None,
        description="Wire API of summary requests (a dialect's name); unset: the request's own.",
    )
    recall: bool = Field(
        default=True,
        description="What a cut removes is named by a recall id where it was and kept for a while; the "
        "model may fetch it back with the ctx_recall tool, which the proxy adds and answers itself.",
    )
    recall_ttl_s: float = Field(default=86400.0, gt=0, description="Seconds what a cut removed is kept.")
    recall_max_mb: int = Field(
        default=64,
        ge=1,
        description="Megabytes of memory the removed text kept in process may take (Redis: its own limits).",
    )
    summary_retry_after_s: float = Field(
        default=60.0,
        gt=0,
        description="A span whose summary failed is not asked for again for this long (doubling, up to "
        "an hour); an endpoint or key that cannot work turns summaries off for as long.",
    )
    summary_background_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="The shortest time limit of a summary call made in the background; the limit "
        "follows the summarizer's observed latency (four times its slowest recent answer, doubled by "
        "each timeout) up to CTXPROXY_SUMMARY_BACKGROUND_MAX_S.",
    )
    summary_background_max_s: float = Field(
        default=900.0, gt=0, description="The longest time limit of a summary call made in the background."
    )
    summary_yield: Literal["auto", "always", "never"] = Field(
        default="auto",
        description="Summary calls give way to client requests on the same upstream (they wait while "
        "one is in flight and for a second's pause, one at a time, the next client request cancels "
        "them, three cancellations give one up; a request there never waits in line for its own "
        "summary): auto on an upstream on this machine or the local network (a local server with few "
        "slots), always, never.",
    )
    memory_index: bool = Field(
        default=True,
        description="Every memory of a cut (policy auto or truncate) carries the index of the exact "
        "strings it forgot (identifiers, paths, commands, URLs, errors, versions): beside the summary, "
        "or alone when summaries are off or none came.",
    )

    @field_validator("upstream_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("summary_base_url")
    @classmethod
    def _optional_http_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return cls._http_url(value)

    @field_validator("summary_model", "cache_url", "summary_api")
    @classmethod
    def _blank_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("summary_api")
    @classmethod
    def _api_name(cls, value: str | None) -> str | None:
        return value.lower() if value is not None else None

    def require_apis(self, names: Collection[str]) -> None:
        """Refuse (``InvalidSettings``, one line) a setting that names a wire API not among
        ``names``: the registry's, which the composition root passes (the settings know no API)."""
        if self.summary_api is not None and self.summary_api not in names:
            known = ", ".join(names)
            raise InvalidSettings(
                [f"CTXPROXY_SUMMARY_API: unknown API {self.summary_api!r}; expected one of {known}"]
            )

    @field_validator("cache_url")
    @classmethod
    def _cache_scheme(cls, value: str | None) -> str | None:
        if value is None or value in {"memory", "memory://"}:
            return value
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in {"redis", "rediss", "unix"}:
            raise ValueError(f"unsupported scheme {scheme!r}")
        return value

    @field_validator("upstream_routes")
    @classmethod
    def _http_urls(cls, value: dict[str, str]) -> dict[str, str]:
        for model, url in value.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"route {model!r}: base URL must start with http:// or https://")
        return {model: url.rstrip("/") for model, url in value.items()}

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent_bounds(self) -> Settings:
        """Pairs of settings that bound one another, each problem on its own line."""
        problems = []
        if self.reserve_min_tokens > self.reserve_max_tokens:
            problems.append(
                f"CTXPROXY_RESERVE_MIN_TOKENS ({self.reserve_min_tokens}) is above "
                f"CTXPROXY_RESERVE_MAX_TOKENS ({self.reserve_max_tokens}): the output reserve is clamped "
                "between them, so the minimum must not exceed the maximum"
            )
        # Each pair below is refused only when the operator set the larger one: a default above a
        # lowered bound changes nothing (the read timeout ends a silent stream first; the cap on
        # concurrency follows a smaller pool, app.main.build_limiter).
        explicit = self.model_fields_set
        if "stream_idle_timeout_s" in explicit and self.stream_idle_timeout_s > self.read_timeout_s:
            problems.append(
                f"CTXPROXY_STREAM_IDLE_TIMEOUT_S ({self.stream_idle_timeout_s:g}) is longer than "
                f"CTXPROXY_READ_TIMEOUT_S ({self.read_timeout_s:g}), which ends a silent stream first: "
                "lower the idle timeout or raise the read timeout"
            )
        if self.summary_background_timeout_s > self.summary_background_max_s:
            problems.append(
                f"CTXPROXY_SUMMARY_BACKGROUND_TIMEOUT_S ({self.summary_background_timeout_s:g}) is above "
                f"CTXPROXY_SUMMARY_BACKGROUND_MAX_S ({self.summary_background_max_s:g}): the time limit of "
                "a summary call moves between them, so the shortest must not exceed the longest"
            )
        over_pool = self.max_concurrent_upstream > self.upstream_max_connections
        if "max_concurrent_upstream" in explicit and over_pool:
            problems.append(
                f"CTXPROXY_MAX_CONCURRENT_UPSTREAM ({self.max_concurrent_upstream}) is above "
                f"CTXPROXY_UPSTREAM_MAX_CONNECTIONS ({self.upstream_max_connections}): requests over "
                "the pool would wait for a connection instead of the queue; keep the cap at most the "
                "connections"
            )
        if (
            self.default_window_tokens is not None
            and self.default_max_output_tokens is not None
            and self.default_max_output_tokens > self.default_window_tokens
        ):
            problems.append(
                f"CTXPROXY_DEFAULT_MAX_OUTPUT_TOKENS ({self.default_max_output_tokens}) is above "
                f"CTXPROXY_DEFAULT_WINDOW_TOKENS ({self.default_window_tokens}): a model cannot write "
                "more than its window holds"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @model_validator(mode="after")
    def _proxy_keys_need_an_upstream_key(self) -> Settings:
        if self.proxy_api_keys() and self.upstream_key() is None:
            raise ValueError(
                "CTXPROXY_API_KEYS is set but CTXPROXY_UPSTREAM_API_KEY is not: with proxy keys the "
                "clients' keys are not forwarded, so the proxy needs its own upstream key"
            )
        return self

    def proxy_api_keys(self) -> tuple[str, ...]:
        """The keys clients must present (``CTXPROXY_API_KEYS``, comma-separated); () means no auth."""
        if self.api_keys is None:
            return ()
        return tuple(key.strip() for key in self.api_keys.get_secret_value().split(",") if key.strip())

    def fit_policy(self) -> Policy:
        """The operator's default policy; per-request headers refine it in the service."""
        return Policy(
            mode=self.policy_mode,
            keep_turns=self.keep_turns,
            pin_first_user=self.pin_first_user,
            protect_max_share=self.protect_max_share,
            reserve_tokens=self.reserve_tokens,
            reserve_ratio=self.reserve_ratio,
            reserve_min_tokens=self.reserve_min_tokens,
            reserve_max_tokens=self.reserve_max_tokens,
            cut_target=self.cut_target,
            lower_output=self.lower_output,
            output_floor_tokens=self.output_floor_tokens,
            recall="tool" if self.recall else "off",
            index_memory=self.memory_index,
        )

    def upstream_key(self) -> str | None:
        """The upstream API key in clear, for the Authorization header only (never logged)."""
        return self.upstream_api_key.get_secret_value() if self.upstream_api_key is not None else None

    def summary_lines(self, *, table: str) -> list[str]:
        """What the proxy will do, for the start-up log: the upstreams (without credentials), who
        authenticates, the fit policy and where the model table came from (``table``, worded by the
        caller, which loaded it). Never a key, nor how many there are."""
        routes = ", ".join(f"{model} -> {display_url(url)}" for model, url in self.upstream_routes.items())
        if self.proxy_api_keys():
            auth = "clients must send a proxy key (CTXPROXY_API_KEYS); the operator's upstream key is sent"
        elif self.upstream_api_key is not None:
            auth = "the operator's upstream key (CTXPROXY_UPSTREAM_API_KEY) replaces the clients' keys"
        else:
            auth = "the clients' own keys are forwarded"
        if self.reserve_tokens is not None:
            reserve = f"{self.reserve_tokens} tokens"
        else:
            reserve = (
                f"{self.reserve_ratio:.0%} of the window, within "
                f"[{self.reserve_min_tokens}, {self.reserve_max_tokens}] tokens"
            )
        summaries = "off" if self.policy_mode == "auto" else f"off (policy {self.policy_mode})"
        if self.summarize and self.policy_mode == "auto":
            writer = self.summary_model or "each request's own"
            summaries = f"on (model: {writer})"
        return [
            f"upstream {display_url(self.upstream_base_url)}"
            + (f"; routes {routes}" if routes else "")
            + f"; {auth}",
            f"policy {self.policy_mode}: keep the newest {self.keep_turns} turns (at most "
            f"{self.protect_max_share:.0%} of the budget), cut to {self.cut_target:g} of the budget, "
            f"summaries {summaries}, output reserve {reserve} when a request sets none",
            f"model table: {table}; discovery {'on' if self.discovery else 'off'}",
        ]


def display_url(url: str) -> str:
    """``url`` without user info, query or fragment (operators paste keys into URLs)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "(invalid URL)"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if port is not None:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


ENV_PREFIX = "CTXPROXY_"
# Read by the test suite, not by the proxy: known, so never warned about.
TEST_VARIABLES = frozenset({"CTXPROXY_FUZZ_EXAMPLES", "CTXPROXY_CHROMIUM"})


def setting_variables() -> frozenset[str]:
    """The environment variable of every setting (``CTXPROXY_WORKER_DIR`` included)."""
    return frozenset(f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``CTXPROXY_*`` variable of ``environ`` (default: the process environment)
    that is no setting, so it is silently ignored otherwise: its name and the nearest setting's
    (``CTXPROXY_UPSTREAM_BASEURL`` -> did you mean ``CTXPROXY_UPSTREAM_BASE_URL``?). Never its
    value. Names compare case-insensitively, as the settings are read."""
    env = os.environ if environ is None else environ
    known = setting_variables()
    suffixes = sorted(name.removeprefix(ENV_PREFIX) for name in known)
    warnings = []
    for variable in sorted(env):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in TEST_VARIABLES:
            continue
        near = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), suffixes, n=1, cutoff=0.6)
        hint = (
            f"did you mean {ENV_PREFIX}{near[0]}?"
            if near
            else "every setting is listed in config/ctxproxy.env.example"
        )
        warnings.append(f"{variable} is not a ctxproxy setting and is ignored: {hint}")
    return warnings


_ROUTES_EXPECTED = 'a JSON object {"model name or prefix": "http(s)://base-url", ...}'


def _expected(name: str) -> str:
    """What a setting accepts, in words, from its annotation and constraints."""
    field = Settings.model_fields.get(name)
    if field is None:
        return "a valid value"
    if name == "upstream_routes":
        return _ROUTES_EXPECTED
    base = field.annotation
    if isinstance(base, types.UnionType):  # X | None
        (base,) = [a for a in get_args(base) if a is not type(None)]
    if get_origin(base) is Literal:
        return "one of " + ", ".join(str(c) for c in get_args(base))
    expected: dict[object, str] = {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        Path: "a file path",
        SecretStr: "text",
        str: "text",
    }
    words = expected.get(base, "a valid value")
    if name == "cache_url":
        words = "a redis://, rediss:// or unix:// URL (or empty: in memory)"
    elif name.endswith("_url"):
        words = "an http:// or https:// URL"
    bounds = []
    for item in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    return words + (f" {' and '.join(bounds)}" if bounds else "")


class InvalidSettings(CtxproxyError):
    """The environment holds bad ``CTXPROXY_*`` values: ``lines``, one per problem (see
    :func:`describe_settings_error`)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def load_settings() -> Settings:
    """``Settings()`` from the environment; bad values raise :class:`InvalidSettings`."""
    try:
        return Settings()
    except (ValidationError, SettingsError) as exc:
        raise InvalidSettings(describe_settings_error(exc)) from None


def describe_settings_error(exc: Exception) -> list[str]:
    """One line per bad setting: the variable, what was wrong, what is expected. For
    ``pydantic.ValidationError`` and ``pydantic_settings.SettingsError`` (a complex value, such as
    ``CTXPROXY_UPSTREAM_ROUTES``, that is not JSON). Never echoes the value (it may be a key)."""
    if isinstance(exc, SettingsError):
        match = re.search(r'field "([a-z_]+)"', str(exc))
        if match is None:
            return [f"invalid CTXPROXY_* setting: {exc}"]
        name = match.group(1)
        return [f"CTXPROXY_{name.upper()}: not valid JSON; expected {_expected(name)}"]
    if not isinstance(exc, ValidationError):
        return [str(exc)]
    lines = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = [str(part) for part in error.get("loc", ())]
        message = str(error.get("msg", "invalid value"))
        message = message.removeprefix("Value error, ")
        if not loc:  # rules across settings: their messages name them, one line each
            lines.extend(message.splitlines())
            continue
        name = loc[0]
        where = f" (at {'.'.join(loc[1:])})" if len(loc) > 1 else ""
        first = message[:1].lower() + message[1:]
        lines.append(f"CTXPROXY_{name.upper()}{where}: {first}; expected {_expected(name)}")
    return lines


@contextmanager
def worker_environment(worker_dir: Path | None) -> Iterator[None]:
    """Inside the block, worker processes started by this one find ``worker_dir`` (the directory
    ``ctxproxy serve --workers N`` made for them) in their environment: ``CTXPROXY_WORKER_DIR``
    and ``PROMETHEUS_MULTIPROC_DIR`` (its ``metrics/``, created here), which prometheus-client reads
    when first imported in each worker. The previous values are restored on the way out, so that
    nothing started later inherits a directory that is gone. ``None``: nothing changes."""
    if worker_dir is None:
        yield
        return
    (worker_dir / "metrics").mkdir(parents=True, exist_ok=True)
    values = {"CTXPROXY_WORKER_DIR": str(worker_dir), "PROMETHEUS_MULTIPROC_DIR": str(worker_dir / "metrics")}
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
