"""The wire APIs the proxy fits, one dialect each (``app.core.dialect`` states the contract).

``DIALECTS`` maps a dialect's name to it; the routes, auth, the upstream's key rules, the dry run,
the CLI's choices and the metrics are derived from it, so adding a wire API is one module under
``dialects/`` and one line below (``tests/core/dialects/test_conformance.py`` is the contract it
must pass).

No dialect is a default: every caller names the dialect of its request. Where a request has no
API (an error on a route of no dialect), the composition root (``app.main``) chooses which dialect
speaks for it and injects it; a body the dry run cannot place goes to the registry's first
(``routes.detect``).
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

__all__ = ["CHAT", "DIALECTS", "GEMINI", "MESSAGES", "RESPONSES"]
