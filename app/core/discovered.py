"""Read context windows out of what upstream servers say about their models (pure parsing, no I/O).

INTERFACE CONTRACT (``app.service.discovery`` relies on these):

* ``root_url(base_url) -> str``: the server root (a trailing ``/v1`` stripped), where llama.cpp's
  ``/props`` and Ollama's ``/api/*`` live.
* ``figures_from_model_list(body, *, detail) -> dict[str, DiscoveredFigures]``: per model id, from an
  OpenAI-style list (``{"data": [...]}``, ``{"models": [...]}`` or a bare list): vLLM/SGLang
  ``max_model_len``, LM Studio ``loaded_context_length`` (effective) and ``max_context_length``,
  OpenRouter ``context_length`` and ``top_provider.{context_length,max_completion_tokens}``, Groq
  ``context_window``, llama.cpp ``meta.n_ctx_train``, Google's ``inputTokenLimit`` (the limit its
  servers enforce: effective) and ``outputTokenLimit``, and ``max_completion_tokens`` /
  ``max_output_tokens`` where present. A model's id is its ``id``, else its ``name`` or
  ``model``, without Google's ``models/`` prefix (``name: "models/gemini-2.5-flash"``: the id a
  request's path names). Models without any figure are left out.
* ``listed_ids(body) -> tuple[str, ...]``: every model id of such a list.
* ``figures_from_props(body) -> DiscoveredFigures | None``: llama.cpp ``/props``
  (``default_generation_settings.n_ctx``, the per-slot runtime window, or a top-level ``n_ctx``).
* ``figures_from_ollama_show(body) -> DiscoveredFigures | None``: Ollama ``/api/show``: the
  ``num_ctx`` parameter (effective) wins over ``model_info`` ``*.context_length`` (declared).
* ``combine(figures) -> DiscoveredFigures | None``: several answers about one model merged: effective
  windows beat declared ones, and within each kind the smallest wins (in the user's favour).

Nothing here raises, whatever the body: malformed or implausible figures are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .knowledge import DiscoveredFigures

MAX_PLAUSIBLE_TOKENS = 100_000_000
MAX_LISTED_MODELS = 10_000
GOOGLE_MODEL_PREFIX = "models/"  # Google lists ``name: "models/gemini-2.5-flash"``

# (path inside the entry, effective?) in order of preference; paths are dotted.
_WINDOW_FIELDS: tuple[tuple[str, bool], ...] = (
    ("loaded_context_length", True),
    ("inputTokenLimit", True),
    ("max_model_len", True),
    ("n_ctx", True),
    ("top_provider.context_length", False),
    ("context_length", False),
    ("context_window", False),
    ("max_context_length", False),
    ("max_model_length", False),
    ("meta.n_ctx_train", False),
)
_OUTPUT_FIELDS: tuple[str, ...] = (
    "outputTokenLimit",
    "top_provider.max_completion_tokens",
    "max_completion_tokens",
    "max_output_tokens",
)


def root_url(base_url: str) -> str:
    base = base_url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _tokens(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int) and 0 < value <= MAX_PLAUSIBLE_TOKENS:
        return value
    return None


def _get(entry: Mapping[str, Any], path: str) -> Any:
    value: Any = entry
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value


def _entry_figures(entry: Mapping[str, Any], *, detail: str) -> DiscoveredFigures | None:
    effective: list[tuple[int, str]] = []
    declared: list[tuple[int, str]] = []
    for path, is_effective in _WINDOW_FIELDS:
        tokens = _tokens(_get(entry, path))
        if tokens is not None:
            (effective if is_effective else declared).append((tokens, path))
    output: tuple[int, str] | None = None
    for path in _OUTPUT_FIELDS:
        tokens = _tokens(_get(entry, path))
        if tokens is not None:
            output = (tokens, path)
            break
    window = min(effective) if effective else min(declared) if declared else None
    if window is None and output is None:
        return None
    fields = [f for f in (window, output) if f is not None]
    return DiscoveredFigures(
        window_tokens=window[0] if window else None,
        max_output_tokens=output[0] if output else None,
        effective=bool(effective),
        detail=f"{detail} {','.join(path for _, path in fields)}",
    )


def _entries(body: Any) -> Sequence[Any]:
    if isinstance(body, Mapping):
        for key in ("data", "models"):
            value = body.get(key)
            if isinstance(value, list):
                return value[:MAX_LISTED_MODELS]
        return ()
    if isinstance(body, list):
        return body[:MAX_LISTED_MODELS]
    return ()


def _model_id(entry: Any) -> str | None:
    if not isinstance(entry, Mapping):
        return None
    model = next((entry[k] for k in ("id", "name", "model") if isinstance(entry.get(k), str)), None)
    if not model:
        return None
    return model.removeprefix(GOOGLE_MODEL_PREFIX) or None


def listed_ids(body: Any) -> tuple[str, ...]:
    """Every model id of an OpenAI-style model list, in order, without duplicates."""
    return tuple(dict.fromkeys(m for m in map(_model_id, _entries(body)) if m is not None))


def figures_from_model_list(body: Any, *, detail: str) -> dict[str, DiscoveredFigures]:
    found: dict[str, DiscoveredFigures] = {}
    for entry in _entries(body):
        model = _model_id(entry)
        if model is None:
            continue
        figures = _entry_figures(entry, detail=detail)
        if figures is not None:
            found[model] = figures
    return found


def figures_from_props(body: Any) -> DiscoveredFigures | None:
    if not isinstance(body, Mapping):
        return None
    for path in ("default_generation_settings.n_ctx", "n_ctx"):
        tokens = _tokens(_get(body, path))
        if tokens is not None:
            return DiscoveredFigures(window_tokens=tokens, effective=True, detail=f"GET /props {path}")
    return None


def _num_ctx(parameters: Any) -> int | None:
    if isinstance(parameters, Mapping):
        return _tokens(parameters.get("num_ctx"))
    if not isinstance(parameters, str):
        return None
    for line in parameters.splitlines():
        name, _, value = line.strip().partition(" ")
        if name == "num_ctx":
            return _tokens(value.strip())
    return None


def figures_from_ollama_show(body: Any) -> DiscoveredFigures | None:
    if not isinstance(body, Mapping):
        return None
    num_ctx = _num_ctx(body.get("parameters"))
    if num_ctx is not None:
        return DiscoveredFigures(window_tokens=num_ctx, effective=True, detail="POST /api/show num_ctx")
    info = body.get("model_info")
    if isinstance(info, Mapping):
        lengths = [
            t
            for key, value in info.items()
            if isinstance(key, str) and key.endswith(".context_length") and (t := _tokens(value)) is not None
        ]
        if lengths:
            return DiscoveredFigures(
                window_tokens=min(lengths), effective=False, detail="POST /api/show model_info.context_length"
            )
    return None


def combine(figures: Iterable[DiscoveredFigures | None]) -> DiscoveredFigures | None:
    present = [f for f in figures if f is not None]
    windows = [f for f in present if f.window_tokens is not None]
    effective = [f for f in windows if f.effective]
    pool = effective or windows
    best = min(pool, key=lambda f: f.window_tokens or 0) if pool else None
    outputs = [f for f in present if f.max_output_tokens is not None]
    output = min(outputs, key=lambda f: f.max_output_tokens or 0) if outputs else None
    if best is None and output is None:
        return None
    details = list(dict.fromkeys(f.detail for f in (best, output) if f is not None and f.detail))
    return DiscoveredFigures(
        window_tokens=best.window_tokens if best else None,
        max_output_tokens=output.max_output_tokens if output else None,
        effective=bool(best and best.effective),
        detail="; ".join(details),
    )
