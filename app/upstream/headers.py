"""Which headers cross the proxy, in each direction. Pure functions over (name, value) pairs.

Hop-by-hop headers (RFC 9110 §7.6.1, plus ``host`` and ``content-length`` which the next hop
recomputes) never pass in either direction, nor does any header the ``Connection`` header names.
Our own ``X-Context-*`` request headers are for the proxy and are never forwarded upstream, nor
is ``Expect`` (answered here). The client's ``Authorization`` (OpenAI) or ``x-api-key``
(Anthropic) passes as is, unless the operator configured an upstream key: then both are dropped
and the key is sent in the header the request asks for (``key_header``), else in the one the
client used (``x-api-key`` when it sent only that, else ``Authorization: Bearer``), so a client
never needs the real key. ``anthropic-version``/``anthropic-beta`` pass untouched like any other.
"""

from __future__ import annotations

from collections.abc import Iterable

Header = tuple[str, str]

HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
CONTEXT_PREFIX = "x-context-"
REQUEST_ID_HEADER = "X-Request-ID"
# Request headers the proxy answers itself: the server in front of us sends the client its
# "100 Continue" when the body is read. Forwarded, ``Expect: 100-continue`` would make a client
# library hold the body back until the upstream says 100, which not every server does.
ANSWERED_HERE: frozenset[str] = frozenset({"expect"})


def _connection_tokens(headers: list[Header]) -> set[str]:
    """Header names listed in ``Connection``: hop-by-hop for this connection only."""
    names: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            names.update(token.strip().lower() for token in value.split(",") if token.strip())
    return names


def _end_to_end(headers: Iterable[Header]) -> list[Header]:
    pairs = list(headers)
    dropped = HOP_BY_HOP | _connection_tokens(pairs)
    return [(name, value) for name, value in pairs if name.lower() not in dropped]


AUTHORIZATION = "authorization"
X_API_KEY = "x-api-key"
KEY_HEADERS: frozenset[str] = frozenset({AUTHORIZATION, X_API_KEY})


def upstream_request_headers(
    headers: Iterable[Header],
    *,
    api_key: str | None = None,
    request_id: str | None = None,
    key_header: str | None = None,
) -> list[Header]:
    """The client's request headers as the upstream should see them (order and case kept).

    ``api_key`` replaces every client ``Authorization`` and ``x-api-key``, and is sent as
    ``key_header`` (``authorization`` or ``x-api-key``; None: as the client sent its own);
    ``request_id`` replaces every client ``X-Request-ID`` (the upstream sees the ID of our logs
    and of the client's response)."""
    replaced = set(KEY_HEADERS) if api_key is not None else set()
    if request_id is not None:
        replaced.add("x-request-id")
    kept: list[Header] = []
    client_keys: set[str] = set()
    for name, value in _end_to_end(headers):
        lower = name.lower()
        if lower in KEY_HEADERS:
            client_keys.add(lower)
        if not (lower.startswith(CONTEXT_PREFIX) or lower in ANSWERED_HERE or lower in replaced):
            kept.append((name, value))
    if api_key is not None:
        if key_header is None:
            key_header = X_API_KEY if client_keys == {X_API_KEY} else AUTHORIZATION
        if key_header == X_API_KEY:
            kept.append(("x-api-key", api_key))
        else:
            kept.append(("Authorization", f"Bearer {api_key}"))
    if request_id is not None:
        kept.append((REQUEST_ID_HEADER, request_id))
    return kept


def labelled_json(headers: Iterable[Header]) -> list[Header]:
    """The request headers of a body the proxy parsed as JSON, labelled as JSON for the upstream: a
    client that sent it as ``text/plain``, form-urlencoded or with no ``Content-Type`` gets it
    forwarded as ``application/json`` (what it is); a JSON label (``application/json;
    charset=utf-8``, ``...+json``) is kept as the client wrote it."""
    pairs = list(headers)
    labels = [value for name, value in pairs if name.lower() == "content-type"]
    if len(labels) == 1 and _is_json_type(labels[0]):
        return pairs
    return [(name, value) for name, value in pairs if name.lower() != "content-type"] + [
        ("Content-Type", "application/json")
    ]


def _is_json_type(value: str) -> bool:
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# Response headers the server in front of the client (uvicorn) sets itself on every response: the
# upstream's copies would reach the client twice (comma-joined by clients that merge headers), and
# the upstream's ``Server`` would name the software behind the proxy.
SET_BY_OUR_SERVER: frozenset[str] = frozenset({"date", "server"})


def client_response_headers(headers: Iterable[Header]) -> list[Header]:
    """The upstream's response headers as the client should see them (order and case kept)."""
    return [(name, value) for name, value in _end_to_end(headers) if name.lower() not in SET_BY_OUR_SERVER]
