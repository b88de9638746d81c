"""The wire APIs the proxy fits, one dialect each (``app.core.dialect`` states the contract).

``DIALECTS`` maps a dialect's name to it; the routes, the dry run and the metrics look dialects up
here, so adding a wire API is one module under ``dialects/`` and one line below.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..dialect import Dialect
from .chat import CHAT
from .messages import MESSAGES
from .responses import RESPONSES

DIALECTS: Mapping[str, Dialect] = {
    "chat": CHAT,
    "responses": RESPONSES,
    "messages": MESSAGES,
}

__all__ = ["CHAT", "DIALECTS", "MESSAGES", "RESPONSES"]
