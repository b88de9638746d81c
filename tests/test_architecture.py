"""The dependency rules of AGENTS.md, checked on the imports of every module under app/."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"


def modules() -> dict[str, Path]:
    found = {}
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def package_of(path: Path) -> tuple[str, ...]:
    """The package a module's relative imports resolve against (``app.core`` for app/core/fit.py)."""
    return path.relative_to(APP.parent).with_suffix("").parts[:-1]


def imports_of(path: Path) -> set[str]:
    """Absolute names of everything ``path`` imports; relative imports resolved against its package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    package = package_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join((*base, node.module) if node.module else base)
            elif node.module:
                module = node.module
            else:
                continue
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".")[0]


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_scan_sees_the_packages() -> None:
    names = modules()
    assert "app.core.fit" in names and "app.upstream.client" in names and "app.service.driver" in names


def test_app_imports_itself_relatively() -> None:
    # The wheel installs app/ as the package ``ctxproxy``: an absolute ``app.`` import would break it.
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            absolute = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                absolute.append(node.module)
            assert not [a for a in absolute if top(a) == "app"], f"{name} imports app absolutely"


def test_relative_imports_are_resolved() -> None:
    assert "app.core.budget" in imports_of(APP / "core" / "fit.py")
    assert "app.core.errors.InvalidRequest" in imports_of(APP / "api" / "routes.py")


def test_core_imports_only_the_standard_library_and_itself() -> None:
    for name, path in modules().items():
        if under(name, "app.core"):
            bad = {
                i
                for i in imports_of(path)
                if not under(i, "app.core") and top(i) not in sys.stdlib_module_names
            }
            assert not bad, f"{name} imports {sorted(bad)}"


def test_upstream_imports_no_web_framework_nor_the_layers_above() -> None:
    forbidden = ("fastapi", "starlette", "app.api", "app.service", "app.main", "app.settings")
    for name, path in modules().items():
        if under(name, "app.upstream"):
            bad = {i for i in imports_of(path) if any(under(i, f) for f in forbidden)}
            assert not bad, f"{name} imports {sorted(bad)}"


def test_core_and_service_do_not_import_the_api() -> None:
    for name, path in modules().items():
        if under(name, "app.core") or under(name, "app.service"):
            assert not {i for i in imports_of(path) if under(i, "app.api") or under(i, "app.main")}, name


def test_service_imports_no_web_framework() -> None:
    forbidden = ("fastapi", "starlette", "app.api", "app.main", "app.observability")
    seen = 0
    for name, path in modules().items():
        if under(name, "app.service"):
            seen += 1
            bad = {i for i in imports_of(path) if any(under(i, f) for f in forbidden)}
            assert not bad, f"{name} imports {sorted(bad)}"
    assert seen >= 5


def test_observability_does_not_import_the_api() -> None:
    # The API layer records into the scope under keys observability defines (app.observability.context);
    # observability reads them: one direction, no cycle.
    seen = 0
    for name, path in modules().items():
        if under(name, "app.observability"):
            seen += 1
            bad = {i for i in imports_of(path) if under(i, "app.api") or under(i, "app.main")}
            assert not bad, f"{name} imports {sorted(bad)}"
    assert seen >= 8


def test_core_imports_nothing_of_the_layers_above() -> None:
    above = ("app.api", "app.service", "app.upstream", "app.main", "app.settings", "app.compaction")
    for name, path in modules().items():
        if under(name, "app.core"):
            bad = {i for i in imports_of(path) if any(under(i, a) for a in above)}
            assert not bad, f"{name} imports {sorted(bad)}"


def test_the_top_level_of_app_holds_only_edges_and_entry_points() -> None:
    loose = {name for name, path in modules().items() if path.parent == APP and path.stem != "__init__"}
    assert loose <= {
        "app.__main__",
        "app.cli",
        "app.demo",
        "app.demo_upstream",
        "app.engine",
        "app.main",
        "app.model_table",
        "app.settings",
        "app.tokenizer",
        "app.wire",
    }, sorted(loose)


def test_only_settings_imports_pydantic_settings_and_only_tokenizer_imports_tiktoken() -> None:
    for name, path in modules().items():
        found = {top(i) for i in imports_of(path)}
        if name != "app.settings":
            assert "pydantic_settings" not in found, name
        if name != "app.tokenizer":
            assert "tiktoken" not in found, name


def test_no_module_but_settings_reads_the_environment() -> None:
    for name, path in modules().items():
        if name == "app.settings":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "environb"}:
                assert not (isinstance(node.value, ast.Name) and node.value.id == "os"), (
                    f"{name} reads os.{node.attr}"
                )
            if isinstance(node, ast.ImportFrom) and node.module == "os":
                names = {alias.name for alias in node.names}
                assert not names & {"environ", "getenv", "environb"}, f"{name} imports from os {names}"


def test_no_module_imports_a_private_name_of_another() -> None:
    # A name with a leading underscore is its module's own business: another module that needs it
    # gets a public name with a contract (or the code moves to where it is used).
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
                assert not private, f"{name} imports private {private} from {node.module or '.'}"
