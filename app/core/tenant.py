"""Whom a request belongs to: its tenant, decided once, from the credential it carries.

Shared state that depends on what a client sent (summaries and their chains, back-offs of a
refused key, learned windows and calibration, anchors, prefix reuse, counted bodies) is keyed by
the tenant, so one client's traffic or credentials never change what another client gets, and a
cache hit never tells one client what another sent.

INTERFACE CONTRACT (``app.service`` computes ``ProxyRequest.tenant`` with it; anything that keeps
state per client, a recall store included, keys it by ``request.tenant``):

* ``tenant_of(headers, query, slots) -> str``: the tenant of a request whose headers are
  ``headers`` (``(name, value)`` pairs, any case) and whose raw query string is ``query``, for the
  key slots ``slots`` (its dialect's ``key_slots``, in order): ``key_hash`` of the first key found
  in them (``credential_in``), else ``ANONYMOUS``: every request without a credential shares one
  tenant (the operator chose not to tell its clients apart).
* ``credential_in(headers, query, slots) -> str | None``: that key, as its slot carries it without
  the scheme (``Bearer K`` and an ``x-api-key: K`` are the same key); a value its slot cannot read
  (another scheme) counts as it travels, whole. Headers before query parameters, slot by slot.
* ``key_hash(key) -> str``: ``"t"`` and 32 hex digits of a SHA-256 over a fixed domain prefix and
  the key: the same on every replica, never the key itself (state and logs never hold a key).
* ``ANONYMOUS``: the tenant of requests that carry no credential (never a ``key_hash``).

Pure, standard library only. The hash is not keyed by a secret: API keys are random enough that
their hash cannot be inverted, and replicas need no shared secret to agree on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from urllib.parse import unquote_plus

from .endpoints import KeySlot

ANONYMOUS = "anonymous"
_DOMAIN = b"ctxproxy-tenant\n"
_HEX_DIGITS = 32


def key_hash(key: str) -> str:
    """The tenant of a request that carries ``key`` (see the module contract)."""
    digest = hashlib.sha256(_DOMAIN + key.encode("utf-8", "surrogatepass")).hexdigest()
    return "t" + digest[:_HEX_DIGITS]


def credential_in(headers: Sequence[tuple[str, str]], query: str, slots: Sequence[KeySlot]) -> str | None:
    """The key the request carries in ``slots`` (the first slot that holds one), else None."""
    for slot in slots:
        if slot.in_query:
            values = _query_values(query, slot.name) if query else []
        else:
            # The length first: most headers are not this one, and it costs no lowercase copy.
            size = len(slot.name)
            values = [value for name, value in headers if len(name) == size and name.lower() == slot.name]
        for value in values:
            text = value.strip()
            if text:
                return slot.key_in(text) or text
    return None


def tenant_of(headers: Sequence[tuple[str, str]], query: str, slots: Sequence[KeySlot]) -> str:
    """The tenant of a request (see the module contract)."""
    key = credential_in(headers, query, slots)
    return ANONYMOUS if key is None else key_hash(key)


def _query_values(query: str, name: str) -> list[str]:
    values = []
    for pair in query.split("&"):
        raw_name, _, raw_value = pair.partition("=")
        if unquote_plus(raw_name).lower() == name:
            values.append(unquote_plus(raw_value))
    return values
