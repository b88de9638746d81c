"""ctxproxy: an OpenAI-compatible proxy that keeps every LLM request inside the model's context window.

The installed import package is ``ctxproxy``. Its in-process API (see ``ctxproxy.engine``):
``fit(body, *, api=None, window_tokens=None, ...) -> FitResult``, ``count(body, *, api=None)``
(``api`` detected from the body when not given), ``FitResult``, ``InvalidRequest`` and ``APIS``
(the wire APIs it fits). Importing the package does
nothing but define ``__version__``: those names load the engine on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["APIS", "FitResult", "InvalidRequest", "__version__", "count", "fit"]

_ENGINE_NAMES = frozenset({"APIS", "FitResult", "InvalidRequest", "count", "fit"})

if TYPE_CHECKING:
    from .engine import APIS, FitResult, InvalidRequest, count, fit


def __getattr__(name: str) -> Any:
    if name in _ENGINE_NAMES:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_ENGINE_NAMES})
