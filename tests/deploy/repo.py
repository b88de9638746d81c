"""What the deploy tests share: the repository's files, the linters of the venv, compose defaults."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]

_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}")


def tool(name: str) -> Path:
    """A linter installed by ``bash .ci/setup`` (the dev extra) beside this interpreter; a missing
    one fails the test (never a skip): CI must run every check."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed in the venv: run bash .ci/setup"
    return path


def run(*args: str | Path, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def with_compose_defaults(text: str) -> str:
    """``text`` as ``docker compose`` reads it with no variable set: ``${NAME:-default}`` becomes
    ``default`` and ``${NAME}`` the empty string."""
    return _VARIABLE.sub(lambda m: m["default"] or "", text)


def compose() -> dict[str, Any]:
    """docker-compose.yml with its variables at their defaults (YAML merge keys resolved)."""
    loaded: dict[str, Any] = yaml.safe_load(with_compose_defaults((REPO / "docker-compose.yml").read_text()))
    return loaded


def load_example_app() -> ModuleType:
    """deploy/compose/example_app.py (a script, not a package module), freshly loaded."""
    path = REPO / "deploy" / "compose" / "example_app.py"
    spec = importlib.util.spec_from_file_location("example_app", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
