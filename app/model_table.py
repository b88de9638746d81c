"""Load the model registry: the built-in table, the operator's file, the configured default.

This is the edge that does the file I/O for ``app.core.registry`` (which only parses text).

``builtin_table_text()`` reads ``app/data/models.toml`` from the installed package (the wheel
force-includes ``config/models.toml`` there) and falls back to the repository's
``config/models.toml`` when running from a checkout.

``load_registry(*, operator_file=None, default_window_tokens=None,
default_max_output_tokens=None)`` returns the built-in registry merged with the operator's
(entries and ``[default]`` from the operator win; its entries get ``source="operator"``), then
with the default's window / max output overridden when given (its ``source`` becomes
``"settings"``). Every problem with a table,
including an unreadable operator file, raises ``InvalidModelTable`` naming the file.
"""

from __future__ import annotations

import importlib.resources
import pathlib
from importlib.resources.abc import Traversable

from .core.errors import InvalidModelTable
from .core.registry import ModelRegistry

_REPO_TABLE = pathlib.Path(__file__).resolve().parent.parent / "config" / "models.toml"


def _package_table() -> Traversable:
    return importlib.resources.files(__package__ or "app").joinpath("data", "models.toml")


def builtin_table_text() -> str:
    """The shipped model table as text (package data first, then the repository copy)."""
    resource = _package_table()
    if resource.is_file():
        return resource.read_text(encoding="utf-8")
    if _REPO_TABLE.is_file():
        return _REPO_TABLE.read_text(encoding="utf-8")
    raise FileNotFoundError(
        "the built-in model table is missing: neither ctxproxy/data/models.toml (installed package) "
        f"nor {_REPO_TABLE} (source checkout) exists"
    )


def load_registry(
    *,
    operator_file: pathlib.Path | None = None,
    default_window_tokens: int | None = None,
    default_max_output_tokens: int | None = None,
) -> ModelRegistry:
    """The registry the proxy runs with; see the module docstring for the layering."""
    registry = ModelRegistry.from_toml(builtin_table_text(), source="builtin")
    if operator_file is not None:
        registry = registry.merged(_operator_registry(operator_file))
    if default_window_tokens is None and default_max_output_tokens is None:
        return registry
    current = registry.default
    window = current.window_tokens if default_window_tokens is None else default_window_tokens
    if default_max_output_tokens is None:
        # Only the window was configured: keep the default's output size, but never above it.
        max_output = min(current.max_output_tokens, window)
    else:
        max_output = default_max_output_tokens
    return registry.with_default(window_tokens=window, max_output_tokens=max_output, source="settings")


def _operator_registry(path: pathlib.Path) -> ModelRegistry:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidModelTable(
            f"cannot read the operator model table {path}: {exc}", source="operator"
        ) from exc
    try:
        return ModelRegistry.from_toml(text, source="operator")
    except InvalidModelTable as exc:
        raise InvalidModelTable(f"{path}: {exc.message}", key=exc.key, source=exc.source) from exc
