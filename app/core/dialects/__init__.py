"""The wire APIs the proxy fits, one dialect each (``app.core.dialect`` states the contract).

``DIALECTS`` maps a dialect's name to it; the routes, auth, the upstream's key rules, the dry run,
the CLI's choices and the metrics are derived from it, so adding a wire API is one module under
``dialects/`` and one line below (``tests/core/dialects/test_conformance.py`` is the contract it
must pass).

``DEFAULT_DIALECT`` (chat, OpenAI's shape, what most clients of a ``/v1`` base URL read) speaks for
requests that name no API: errors on routes of no dialect, a body the dry run cannot place,
``plan_request`` called without a dialect.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..dialect import Dialect
from .chat import CHAT
from .gemini import GEMINI
from .messages import MESSAGES
from .responses import RESPONSES

DIALECTS: Mapping[str, Dialect] = {
    "chat": CHAT,
    "responses": RESPONSES,
    "messages": MESSAGES,
    "gemini": GEMINI,
}
DEFAULT_DIALECT: Dialect = CHAT

__all__ = ["CHAT", "DEFAULT_DIALECT", "DIALECTS", "GEMINI", "MESSAGES", "RESPONSES"]
