"""JSON to bytes for everything the proxy writes itself (rewritten bodies, its own answers).

orjson is fast but refuses strings holding a lone UTF-16 surrogate (``"\\ud800"``), which is valid
JSON that a client may send; the standard library escapes those, so it is the fallback and nothing
the client sent can turn our own serialization into a 500.

Nothing written here is anything but JSON as RFC 8259 defines it: never ``NaN`` or ``Infinity``.
The standard library's fallback refuses a non-finite float (``ValueError``); orjson would write one
as ``null``, a silent change of value, so ``dump_json`` is only given what is finite by
construction: a request body parsed by ``app.service.request.load_json`` holds no non-finite
number (it refuses them), and the engine adds strings and integers only. The proxy's own documents
(the status board, a plan report, the model report, the gateway engine's answer) go through
``dump_document``, which checks them first: a non-finite figure there is a bug, refused with
``ValueError`` rather than written as ``null`` or ``NaN``.
"""

from __future__ import annotations

import json
import math

import orjson


def dump_json(data: object) -> bytes:
    """``data`` as compact JSON bytes; lone surrogates are kept as ``\\uXXXX`` escapes; a
    non-finite float is refused by the fallback (see the module docstring)."""
    try:
        return orjson.dumps(data)
    except TypeError:
        return json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def finite(data: object) -> bool:
    """True when no float anywhere in ``data`` (dicts, lists, tuples) is NaN or infinite."""
    pending: list[object] = [data]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list | tuple):
            pending.extend(value)
        elif isinstance(value, float) and not math.isfinite(value):
            return False
    return True


def dump_document(data: object) -> bytes:
    """One of the proxy's own documents as ``dump_json`` writes it, after checking that every
    figure in it is finite (``ValueError`` otherwise: see the module docstring)."""
    if not finite(data):
        raise ValueError("a document of the proxy holds a non-finite number: not JSON")
    return dump_json(data)
