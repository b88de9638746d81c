"""Where a wire API lives on HTTP: its routes, where its requests go upstream, where keys travel.

Pure values (``app.core.endpoints``, re-exported here) and matching, standard library only; every
fact in them is a dialect's (``app.core.dialects``): the API layer matches requests against the
registry's routes, the upstream package builds URLs and key headers from what a matched route says,
and neither names an API.

INTERFACE CONTRACT:

* ``Route(template, *, stream=None, kind="fit", upstream="", upstream_first=False,
  event_query="")``: one POST endpoint of an API.

  - ``template``: the proxy's path, literal (``"/v1/chat/completions"``) or with ``{name}``
    parameters, each matching one non-empty run of characters without ``/``
    (``"/v1beta/models/{model}:generateContent"``). The first segment is always literal: the
    pass-through serves everything else under it (``passthrough_prefixes``);
  - ``stream``: None when the body says whether the answer streams, True/False when the path does;
  - ``kind``: ``"fit"`` (planned, fitted and forwarded) or ``"count"`` (the API's token-counting
    endpoint, answered with our count or the upstream's);
  - ``upstream``: where the request goes, a path *relative to the upstream base URL* with the
    same ``{name}`` parameters (``"chat/completions"``, ``"models/{model}:countTokens"``); the
    empty string: the client's own path (percent-encoding kept) *at the base URL's origin*, for
    APIs whose clients send their own versioned path (``/v1beta/...`` while the operator's base
    URL ends in ``/v1``);
  - ``upstream_first`` (count routes): ask the upstream's counting endpoint even when our count is
    exact; ours answers only when the upstream has no such endpoint (404/405). False: ours when
    exact, else the upstream's;
  - ``event_query`` (a route that streams by its path): the query parameter, ``name=value``,
    that makes its stream an event stream (Gemini's ``alt=sse``); without it the answer is one
    JSON array sent element by element, and so are our errors before it
    (``Dialect.json_stream_error(error, started=False)``). "": the route streams events only.

* ``RouteMatch`` (frozen): what the API layer hands to the service for one request: ``dialect``,
  ``route``, ``params`` (the template's parameters, percent-decoded; ``raw_params`` as sent),
  ``path`` (the client's raw path, percent-encoding kept) and ``query`` (the client's raw query
  string, kept on the upstream request). ``target`` is its ``UpstreamTarget``, ``key_slot``
  where the operator's key goes (the dialect's first slot), ``json_stream`` True when its answer
  is one JSON array streamed element by element (``Route.event_query`` not in the query).
  ``RouteMatch.first(dialect, kind)`` is the dialect's first literal route of that kind (tests,
  the dry run, the public engine).
* ``UpstreamTarget(path, at_origin)`` (frozen): ``path`` relative to the base URL, or from the
  base URL's origin when ``at_origin``.
* ``KeySlot(name, *, in_query=False, scheme="")`` (frozen): where a client's key travels: a
  request header (``authorization`` with ``scheme="Bearer"``, ``x-api-key``, ...) or a query
  parameter (``in_query``). ``AUTHORIZATION`` is HTTP's own (``Authorization: Bearer KEY``).
  ``key_slots(dialects)``: every dialect's slots, each once, in registry order (the first is
  where a key goes when nothing else says).
* ``RouteTable.of(dialects)``: every route of every dialect. ``match(path, query="", raw_path=None)
  -> RouteMatch | None``: a dict lookup for literal templates, then the precompiled templates in
  registry order (``literal(path, query)``: the dict lookup alone). ``owner(path) -> Dialect |
  None``: the dialect a path belongs to (its route, or under one of its literal routes, or under
  a first segment no other dialect uses), for the pass-through's key slot and the shape of
  auth's 401. ``passthrough_prefixes()``: the first
  segments of every template, each with whether the pass-through under it sends the client's
  path at the origin (every route under it does) or under the base URL (the rest after the
  prefix). Building a table with a duplicate literal path or a parameter in the first segment
  raises ``ValueError`` (a registry bug).
* ``detect(dialects, body, headers) -> Dialect``: the dialect of a body that came without a route
  (the dry run, ``ctxproxy plan``): the highest ``Dialect.recognition`` (ties: registry order),
  else the first dialect of the registry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

from .dialect import Dialect
from .endpoints import AUTHORIZATION, KeySlot, Route, RouteKind, UpstreamTarget
from .errors import InvalidRequest

__all__ = [
    "AUTHORIZATION",
    "KeySlot",
    "Route",
    "RouteKind",
    "RouteMatch",
    "RouteTable",
    "UpstreamTarget",
    "detect",
    "key_slots",
]

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Templated paths ``RouteTable.match`` remembers (each a few hundred bytes).
MATCHED_MAX = 256


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """One request's route: its dialect, the route, the path parameters, its raw path and query."""

    dialect: Dialect
    route: Route
    params: Mapping[str, str] = field(default_factory=dict)
    path: str = ""
    query: str = ""
    raw_params: Mapping[str, str] = field(default_factory=dict)

    @property
    def target(self) -> UpstreamTarget:
        """Where this request goes upstream (see ``Route.upstream``); parameters are written into
        an upstream template as the client sent them (percent-encoding kept)."""
        upstream = self.route.upstream
        if not upstream:
            return UpstreamTarget(self.path or self.route.template, at_origin=True)
        if "{" in upstream:
            upstream = upstream.format_map({**self.params, **self.raw_params})
        return UpstreamTarget(upstream)

    @property
    def json_stream(self) -> bool:
        """True when the answer is one JSON array streamed element by element (a route that
        streams by its path, asked without its ``event_query``)."""
        wanted = self.route.event_query
        if self.route.stream is not True or not wanted:
            return False
        name, _, value = wanted.partition("=")
        return (name, value) not in parse_qsl(self.query, keep_blank_values=True)

    @property
    def key_slot(self) -> KeySlot | None:
        """Where the operator's key goes on this request: its dialect's first key slot."""
        slots = self.dialect.key_slots
        return slots[0] if slots else None

    @classmethod
    def first(cls, dialect: Dialect, kind: RouteKind = "fit") -> RouteMatch:
        """The dialect's first route of ``kind`` as a match without parameters or query (a literal
        one when it has one). ``LookupError`` when it has no route of that kind."""
        routes = [route for route in dialect.routes if route.kind == kind]
        if not routes:
            raise LookupError(f"the {dialect.name!r} API has no {kind} route")
        route = next((r for r in routes if r.literal), routes[0])
        return cls(dialect, route, {}, route.template, "")


def key_slots(dialects: Iterable[Dialect]) -> tuple[KeySlot, ...]:
    """Every dialect's key slots, each once, in registry order."""
    return tuple(dict.fromkeys(slot for dialect in dialects for slot in dialect.key_slots))


def _compile(template: str) -> re.Pattern[str]:
    pattern = ""
    end = 0
    for param in _PARAM.finditer(template):
        pattern += re.escape(template[end : param.start()]) + f"(?P<{param.group(1)}>[^/]+)"
        end = param.end()
    return re.compile(pattern + re.escape(template[end:]))


class RouteTable:
    """Every route of a registry, matched by path (see the module docstring)."""

    __slots__ = ("_dialects", "_literal", "_matched", "_templates", "routes")

    def __init__(self, routes: Sequence[tuple[Dialect, Route]]) -> None:
        self.routes = tuple(routes)
        self._dialects = tuple(dict.fromkeys(dialect for dialect, _ in self.routes))
        self._literal: dict[str, tuple[Dialect, Route]] = {}
        self._templates: list[tuple[re.Pattern[str], Dialect, Route]] = []
        for dialect, route in self.routes:
            if not route.template.startswith("/") or "{" in route.prefix:
                raise ValueError(f"route {route.template!r}: its first segment must be literal")
            if route.literal:
                if route.template in self._literal:
                    raise ValueError(f"route {route.template!r} is registered twice")
                self._literal[route.template] = (dialect, route)
            else:
                self._templates.append((_compile(route.template), dialect, route))
        # Templated paths matched lately (a client sends the same few model paths again and
        # again): ``(path, raw path)`` -> what the templates gave, bounded, oldest dropped first.
        # A path with a dot segment is refused every time, never remembered.
        self._matched: dict[tuple[str, str], tuple[Dialect, Route, Mapping[str, str], Mapping[str, str]]] = {}

    @classmethod
    def of(cls, dialects: Mapping[str, Dialect]) -> RouteTable:
        return cls([(dialect, route) for dialect in dialects.values() for route in dialect.routes])

    def literal(self, path: str, query: str = "") -> RouteMatch | None:
        """The literal route of ``path``, else None (one dict lookup: the fast path)."""
        hit = self._literal.get(path)
        return RouteMatch(hit[0], hit[1], {}, path, query) if hit is not None else None

    def match(self, path: str, query: str = "", raw_path: str | None = None) -> RouteMatch | None:
        """The route of ``path`` (decoded), else None. A template is matched on ``raw_path`` (the
        client's, percent-encoding kept; default ``path``) and its parameters decoded;
        ``InvalidRequest`` when that path has a dot segment (``..``, ``%2e``): a path sent at the
        upstream's origin, or a parameter written into one, must not climb. ``query`` is the raw
        query string."""
        hit = self._literal.get(path)
        if hit is not None:
            return RouteMatch(hit[0], hit[1], {}, path, query)
        if not self._templates:
            return None
        raw = path if raw_path is None else raw_path
        seen = self._matched.get((path, raw))
        if seen is not None:  # the parameters are never mutated (RouteMatch is read only)
            return RouteMatch(seen[0], seen[1], seen[2], raw, query, seen[3])
        # A dot segment follows a slash, or is percent-encoded: most paths have neither.
        encoded = "%" in raw
        for pattern, dialect, route in self._templates:
            found = pattern.fullmatch(raw)
            if found is not None:
                if ("/." in raw or encoded) and any(
                    unquote(segment) in (".", "..") for segment in raw.split("/")
                ):
                    raise InvalidRequest("The path must not contain '.' or '..' segments.", param=None)
                raw_params = found.groupdict()
                params = {k: unquote(v) for k, v in raw_params.items()} if encoded else raw_params
                if len(self._matched) >= MATCHED_MAX:
                    self._matched.pop(next(iter(self._matched)), None)
                self._matched[(path, raw)] = (dialect, route, params, raw_params)
                return RouteMatch(dialect, route, params, raw, query, raw_params)
        return None

    def owner(self, path: str) -> Dialect | None:
        """The dialect ``path`` belongs to (see the module docstring), None when none or several."""
        matched = self.match(path)
        if matched is not None:
            return matched.dialect
        best: tuple[int, Dialect] | None = None
        for template, (dialect, _route) in self._literal.items():
            if path.startswith(template + "/") and (best is None or len(template) > best[0]):
                best = (len(template), dialect)
        if best is not None:
            return best[1]
        prefix = "/" + path.lstrip("/").split("/", 1)[0]
        under = {dialect for dialect, route in self.routes if route.prefix == prefix}
        return next(iter(under)) if len(under) == 1 else None

    def passthrough_prefixes(self) -> tuple[tuple[str, bool], ...]:
        """``(prefix, at_origin)`` for the first segment of every route, in registry order:
        ``at_origin`` when every route under it sends the client's own path at the origin."""
        prefixes: dict[str, bool] = {}
        for _dialect, route in self.routes:
            prefixes[route.prefix] = prefixes.get(route.prefix, True) and not route.upstream
        return tuple(prefixes.items())

    @property
    def dialects(self) -> tuple[Dialect, ...]:
        return self._dialects


def detect(dialects: Mapping[str, Dialect], body: Mapping[str, Any], headers: Mapping[str, str]) -> Dialect:
    """The dialect of a body without a route: the highest ``recognition`` (ties: registry order),
    else the registry's first dialect. ``headers`` are the request's, names in lower case."""
    best: Dialect | None = None
    best_score = 0
    for dialect in dialects.values():
        score = dialect.recognition(body, headers)
        if score > best_score:
            best, best_score = dialect, score
    if best is not None:
        return best
    return next(iter(dialects.values()))
