"""Which headers cross the proxy, in each direction. Pure functions over (name, value) pairs.

Hop-by-hop headers (RFC 9110 §7.6.1, plus ``host`` and ``content-length`` which the next hop
recomputes) never pass in either direction, nor does any header the ``Connection`` header names.
Our own ``X-Context-*`` request headers are for the proxy and are never forwarded upstream, nor
is ``Expect`` (answered here). Where keys travel is not this module's to know: the caller
passes the key slots (``app.core.endpoints.KeySlot``) of every API the proxy serves. The client's key
in any of them passes as is, unless the operator configured an upstream key: then every slot is
cleared (headers here, query parameters by ``upstream_query``) and the key is sent in the slot
the request asks for (``key_slot``, its API's), else in the one the client used when it used
exactly one, else in the first slot given, so a client never needs the real key. Every other
header passes untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from urllib.parse import quote, unquote_plus

from ..core.endpoints import AUTHORIZATION, KeySlot

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
_NOT_SENT = HOP_BY_HOP | ANSWERED_HERE


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


DEFAULT_KEY_SLOTS: tuple[KeySlot, ...] = (AUTHORIZATION,)


def _query_names(query: str) -> list[str]:
    return [unquote_plus(pair.split("=", 1)[0]).lower() for pair in query.split("&") if pair]


def _chosen_slot(
    headers: Sequence[Header], query: str, *, key_slot: KeySlot | None, key_slots: Sequence[KeySlot]
) -> KeySlot:
    """Where the operator's key goes: ``key_slot``, else the one slot the client used, else the
    first of ``key_slots``."""
    if key_slot is not None:
        return key_slot
    names = {name.lower() for name, _ in headers}
    params = set(_query_names(query)) if query else set()
    used = [slot for slot in key_slots if slot.name in (params if slot.in_query else names)]
    return used[0] if len(used) == 1 else (key_slots[0] if key_slots else AUTHORIZATION)


def upstream_request_headers(
    headers: Iterable[Header],
    *,
    api_key: str | None = None,
    request_id: str | None = None,
    key_slot: KeySlot | None = None,
    key_slots: Sequence[KeySlot] = DEFAULT_KEY_SLOTS,
    query: str = "",
) -> list[Header]:
    """The client's request headers as the upstream should see them (order and case kept).

    ``api_key`` replaces the client's key in every header slot of ``key_slots`` and is sent in the
    chosen slot (``key_slot``, else the one the client used, in its headers or its ``query``, else
    the first) when that is a header; ``request_id`` replaces every client ``X-Request-ID`` (the
    upstream sees the ID of our logs and of the client's response)."""
    pairs = list(headers)
    lowers = [name.lower() for name, _ in pairs]  # once: every rule below is on the lowercase name
    listed = _connection_tokens(pairs) if "connection" in lowers else set()
    not_sent = _NOT_SENT | listed if listed else _NOT_SENT
    replaced: set[str] = set()
    slot: KeySlot | None = None
    if api_key is not None:
        replaced = {s.name for s in key_slots if not s.in_query}
        slot = _chosen_slot(_end_to_end(pairs), query, key_slot=key_slot, key_slots=key_slots)
        if not slot.in_query:
            replaced.add(slot.name)
    if request_id is not None:
        replaced.add("x-request-id")
    kept = [
        pair
        for pair, lower in zip(pairs, lowers, strict=True)
        if not (lower in not_sent or lower in replaced or lower.startswith(CONTEXT_PREFIX))
    ]
    if api_key is not None and slot is not None and not slot.in_query:
        kept.append((_header_name(slot.name), slot.value(api_key)))
    if request_id is not None:
        kept.append((REQUEST_ID_HEADER, request_id))
    return kept


def _header_name(name: str) -> str:
    """The conventional spelling of a header name we write (``Authorization``; others as given)."""
    return "Authorization" if name == AUTHORIZATION.name else name


def upstream_query(
    query: str,
    headers: Sequence[Header] = (),
    *,
    api_key: str | None = None,
    key_slot: KeySlot | None = None,
    key_slots: Sequence[KeySlot] = DEFAULT_KEY_SLOTS,
) -> str:
    """The client's raw query string as the upstream should see it: as it came (order, encoding),
    unless ``api_key`` is set: then every query slot of ``key_slots`` is removed and the key is
    appended in the chosen slot (as ``upstream_request_headers`` chooses) when that is a query
    parameter."""
    if api_key is None:
        return query
    params = {slot.name for slot in key_slots if slot.in_query}
    slot = _chosen_slot(headers, query, key_slot=key_slot, key_slots=key_slots)
    if not params and not slot.in_query:
        return query
    pairs = [
        pair
        for pair in query.split("&")
        if pair and unquote_plus(pair.split("=", 1)[0]).lower() not in params
    ]
    if slot.in_query:
        pairs.append(f"{quote(slot.name, safe='')}={quote(slot.value(api_key), safe='')}")
    return "&".join(pairs)


def labelled_json(headers: Iterable[Header]) -> list[Header]:
    """The request headers of a body the proxy parsed as JSON, labelled as JSON for the upstream: a
    client that sent it as ``text/plain``, form-urlencoded or with no ``Content-Type`` gets it
    forwarded as ``application/json`` (what it is); a JSON label (``application/json;
    charset=utf-8``, ``...+json``) is kept as the client wrote it."""
    pairs = list(headers)
    labels = [value for name, value in pairs if name.lower() == "content-type"]
    if len(labels) == 1 and is_json_type(labels[0]):
        return pairs
    return [(name, value) for name, value in pairs if name.lower() != "content-type"] + [
        ("Content-Type", "application/json")
    ]


def is_json_type(value: str) -> bool:
    """``application/json`` or ``application/...+json`` (parameters such as a charset aside)."""
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# Response headers the server in front of the client (uvicorn) sets itself on every response: the
# upstream's copies would reach the client twice (comma-joined by clients that merge headers), and
# the upstream's ``Server`` would name the software behind the proxy.
SET_BY_OUR_SERVER: frozenset[str] = frozenset({"date", "server"})


def client_response_headers(headers: Iterable[Header]) -> list[Header]:
    """The upstream's response headers as the client should see them (order and case kept)."""
    return [(name, value) for name, value in _end_to_end(headers) if name.lower() not in SET_BY_OUR_SERVER]


_NOT_TO_CLIENT: frozenset[bytes] = frozenset(
    name.encode("latin-1") for name in HOP_BY_HOP | SET_BY_OUR_SERVER
)


def client_response_raw(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """:func:`client_response_headers` on the wire's bytes, names lowercased (as ASGI sends them):
    one pass, no text decoding (a response's path to the client)."""
    kept: list[tuple[bytes, bytes]] = []
    listed: set[bytes] | None = None
    for name, value in headers:
        lower = name.lower()
        if lower == b"connection":
            listed = listed or set()
            listed.update(token.strip().lower() for token in value.split(b",") if token.strip())
        if lower not in _NOT_TO_CLIENT:
            kept.append((lower, value))
    if listed:
        kept = [(name, value) for name, value in kept if name not in listed]
    return kept
