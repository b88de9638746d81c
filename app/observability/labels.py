"""Bounded label values: every label a metric carries comes from a closed set or a capped one.

* ``route`` (:class:`RouteLabels`): the wire API's name for a fitted request (the dialect the route
  recorded in the scope, see :mod:`app.observability.context`), ``count`` for an API's
  token-counting endpoint, and the proxy's own endpoints: ``plan``, ``engine`` (the gateway
  engine's ``/v1/compress`` and ``/v1/context/compact/...``: the engine's label, whatever API the
  body is in; the ``api`` label names that), ``models`` (the model report, ``GET
  /v1/context/models``), ``health``, ``observability``; ``passthrough`` for anything else under an
  API version prefix (``/v1...``), else ``other``.
* ``api`` (:class:`ApiLabels`): the names of the registered wire APIs (given by the composition
  root), ``none`` when a request has none (health, pass-through, ...); a name from elsewhere is
  sanitized and capped (``MAX_TOKEN_VALUES``).
* ``model`` (:class:`ModelLabels`): the model-table key the request's model resolved to, an
  upstream route key, or a model name the upstream itself reported (discovery), else ``other``;
  ``none`` when a request names no model; at most ``MAX_MODEL_LABELS`` distinct values.
* ``upstream`` (:class:`UpstreamLabels`): the configured base URL an upstream call went to (shown
  without credentials or query), else ``other``.
* free-form hook arguments (discovery ``endpoint``/``result``, summary ``outcome``):
  :class:`TokenSet`, ``[a-z0-9_]``, at most ``MAX_TOKEN_VALUES`` distinct values each.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Container, Iterable
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..settings import display_url

MAX_MODEL_LABELS = 256
MAX_ROUTE_MEMO = 1024
MAX_TOKEN_VALUES = 16
MODEL_LABEL_MAX_CHARS = 80
OTHER = "other"
NONE = "none"
COUNT = "count"
PASSTHROUGH = "passthrough"
ENGINE = "engine"

# The proxy's own endpoints (no wire API's): their route labels.
OWN_ROUTES = {
    "/v1/context/plan": "plan",
    "/v1/context/models": "models",
    "/v1/compress": ENGINE,
    "/healthz": "health",
    "/readyz": "health",
    "/metrics": "observability",
    "/": "observability",
    "/status.json": "observability",
}
# The gateway engine's whole-body endpoints: this prefix, then an API's own route path.
ENGINE_PREFIX = "/v1/context/compact/"
# Every API version prefix (``/v1/``, ``/v1beta/``, ...) is proxied traffic.
API_PREFIX = "/v1"


def proxied(path: str) -> bool:
    """Whether ``path`` is proxied traffic (under an API version prefix, the dry run included),
    which the status board lists and the in-flight gauge counts."""
    return path.startswith(API_PREFIX)


def own_route(path: str) -> str | None:
    """The route label of one of the proxy's own endpoints (``OWN_ROUTES``, and ``engine`` under
    ``ENGINE_PREFIX``), else None."""
    own = OWN_ROUTES.get(path)
    if own is None and path.startswith(ENGINE_PREFIX):
        return ENGINE
    return own


class RouteLabels:
    """The ``route`` label of a request, from its path and what its route recorded.

    ``counting``: the paths of the APIs' token-counting endpoints (anything with ``in``: the
    composition root may give a matcher of path templates). A request whose route recorded a
    dialect is ``count`` on those paths, the proxy's own endpoint label on its own paths (the dry
    run records the dialect of the body it plans), else a fitted request of that API.
    """

    def __init__(self, *, counting: Container[str] = frozenset()) -> None:
        self._counting = counting
        # (path, api) -> label of requests with an API (the routes' paths: a few, or one per model
        # for templated ones), asked twice per request and more with retries; bounded.
        self._memo: dict[tuple[str, str], str] = {}

    def before(self, path: str) -> str:
        """The label known before the route ran (no API yet): own endpoints, else ``passthrough``
        or ``other``; a fitted request is relabelled by :meth:`after`."""
        own = own_route(path)
        if own is not None:
            return own
        return PASSTHROUGH if path.startswith(API_PREFIX) else OTHER

    def after(self, path: str, api: str | None) -> str:
        """The final label, given the API the route recorded (None: no dialect)."""
        if api is not None:
            label = self._memo.get((path, api))
            if label is None:
                label = own_route(path) or (COUNT if path in self._counting else api)
                if len(self._memo) >= MAX_ROUTE_MEMO:
                    self._memo.clear()
                self._memo[path, api] = label
            return label
        own = own_route(path)
        if own is not None:
            return own
        return PASSTHROUGH if path.startswith(API_PREFIX) else OTHER

    @staticmethod
    def fitted(route: str, api: str | None) -> bool:
        """A request the proxy planned and forwarded (its route label is its API's name)."""
        return api is not None and route == api

    @staticmethod
    def plans_a_model(route: str, api: str | None) -> bool:
        """A request whose plan may first ask the upstream about a new model (lazy discovery): a
        fitted one, or the gateway engine's (which plans the same way, forwarding nothing)."""
        return route == ENGINE or (api is not None and route == api)


class TokenSet:
    """A capped set of sanitized label values for free-form hook arguments."""

    def __init__(self, cap: int = MAX_TOKEN_VALUES) -> None:
        self._cap = cap
        self._seen: set[str] = set()  # at most cap values, then OTHER
        self._lock = threading.Lock()

    def __call__(self, value: object) -> str:
        token = re.sub(r"[^a-z0-9_]+", "_", str(value).lower()).strip("_")[:32] or OTHER
        if token == OTHER or token in self._seen:
            return token
        with self._lock:
            if token in self._seen:
                return token
            if len(self._seen) >= self._cap:
                return OTHER
            self._seen.add(token)
            return token


class ApiLabels:
    """``api`` label values: the registered API names pass as they are (the composition root
    gives them, in the registry's order: ``names``); empty is ``none``; any other name is
    sanitized and capped (a hook called with an unregistered name cannot grow the label set)."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: tuple[str, ...] = tuple(dict.fromkeys(n for n in names if n))
        self._known = frozenset(self.names)
        self._others = TokenSet()

    def __call__(self, name: str | None) -> str:
        if not name:
            return NONE
        if name in self._known:
            return name
        return self._others(name)


class SpecLike(Protocol):
    @property
    def matched(self) -> str | None: ...

    @property
    def guessed(self) -> bool: ...


class ModelLabels:
    """Maps a request's model name to a bounded label (see the module docstring).

    ``resolve`` is the model table's ``resolve`` (a spec with ``matched``/``guessed``); ``routes``
    the configured upstream route keys; ``discovered(model)`` is truthy when the upstream itself
    reported the model (``app.core.knowledge.Knowledge.discovered``): its name is then its own
    label (cut to ``MODEL_LABEL_MAX_CHARS``), within the same cap as every other label. Results
    are memoized in a bounded dict; ``other`` is not, while names may still be discovered. Labels
    are issued first come: one client's many model names may fill them (the others' are then
    ``other``), which changes the operator's metrics, never an answer to a client.
    """

    def __init__(
        self,
        resolve: Callable[[str], SpecLike] | None = None,
        *,
        routes: Iterable[str] = (),
        discovered: Callable[[str], Any] | None = None,
        max_labels: int = MAX_MODEL_LABELS,
    ) -> None:
        self._resolve = resolve
        self._routes = sorted((r for r in routes if r), key=len, reverse=True)
        self._discovered = discovered
        self._max = max_labels
        # Bounded: at most max_labels labels issued (then OTHER); 4 * max_labels names memoized,
        # past that a name is resolved each time.
        self._issued: set[str] = set()
        self._memo: dict[str, str] = {}
        self._lock = threading.Lock()

    def label(self, model: str | None) -> str:
        if not model:
            return NONE
        hit = self._memo.get(model)
        if hit is not None:
            return hit
        label = self._bounded(self._candidate(model))
        if label != OTHER or self._discovered is None or self._full():
            with self._lock:
                if len(self._memo) < 4 * self._max:
                    self._memo[model] = label
        return label

    def _full(self) -> bool:
        return len(self._issued) >= self._max

    def _candidate(self, model: str) -> str:
        if self._resolve is not None:
            try:
                spec = self._resolve(model)
            except Exception:  # a resolver problem must not fail the request's bookkeeping
                spec = None
            if spec is not None and not spec.guessed and spec.matched:
                return spec.matched
        for key in self._routes:
            if model == key or model.startswith(key):
                return key
        if self._discovered is not None:
            try:
                reported = self._discovered(model)
            except Exception:  # same: the label falls back, the request goes on
                reported = None
            if reported:
                return model[:MODEL_LABEL_MAX_CHARS]
        return OTHER

    def _bounded(self, label: str) -> str:
        if label in (OTHER, NONE):
            return label
        with self._lock:
            if label in self._issued:
                return label
            if len(self._issued) >= self._max:
                return OTHER
            self._issued.add(label)
            return label


MAX_UPSTREAM_MEMO = 1024


class UpstreamLabels:
    """The ``upstream`` label of an upstream call's URL: the configured base URL it is under (the
    longest that matches), else the first configured base URL on the same origin (an API whose
    clients send their own versioned path is forwarded to the base URL's origin), else ``other``.
    Labels are shown as :func:`display_url` shows URLs (no credentials)."""

    def __init__(self, base_urls: Iterable[str]) -> None:
        bases = [b.rstrip("/") for b in dict.fromkeys(base_urls) if b]
        self._prefixes = sorted(((b, display_url(b)) for b in bases), key=lambda p: len(p[0]), reverse=True)
        self._origins: dict[tuple[str, str], str] = {}
        for base in bases:
            self._origins.setdefault(_origin(base), display_url(base))
        self.labels: tuple[str, ...] = tuple(dict.fromkeys(display_url(b) for b in bases))
        # URL -> label; bounded: MAX_UPSTREAM_MEMO URLs, past that a URL is matched each time.
        self._memo: dict[str, str] = {}

    def __call__(self, url: str | None) -> str:
        if not url:
            return OTHER
        hit = self._memo.get(url)
        if hit is not None:
            return hit
        label = self._match(url)
        if len(self._memo) < MAX_UPSTREAM_MEMO:
            self._memo[url] = label
        return label

    def _match(self, url: str) -> str:
        for base, label in self._prefixes:
            if url == base or url.startswith(base + "/") or url.startswith(base + "?"):
                return label
        return self._origins.get(_origin(url), OTHER)


def _origin(url: str) -> tuple[str, str]:
    try:
        parts = urlsplit(url)
        return parts.scheme.lower(), (parts.hostname or "").lower() + f":{parts.port or ''}"
    except ValueError:
        return "", ""


def status_class(status: int | None) -> str:
    return "error" if status is None else f"{status // 100}xx"


def retry_outcomes(retries: int, final_status: int | None) -> list[str]:
    """One outcome per emergency retry: every retry but the last overflowed again; the last one
    succeeded when the final upstream status is below 400."""
    if retries <= 0:
        return []
    last = "succeeded" if final_status is not None and final_status < 400 else "failed"
    return ["overflowed_again"] * (retries - 1) + [last]
