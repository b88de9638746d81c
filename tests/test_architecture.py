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


# -- the dialect seam: a wire API's facts live in its dialect -------------------------------------

# Where API names may appear: the dialects themselves and the composition root that registers them.
SEAM_HOMES = ("app/core/dialects/", "app/main.py")
# Each entry: a module that may still name an API, and why. Keep it short.
SEAM_ALLOWED: dict[str, str] = {
    # A user of the proxy, not a part of it: the local demo's client and fake upstream speak chat.
    "app/demo.py": "the demo's client speaks chat completions to the proxy",
    "app/demo_upstream.py": "the demo's fake upstream serves chat completions",
}


def registry_bindings() -> tuple[frozenset[str], frozenset[str]]:
    """``(constants, modules)`` of the registry, Gemini and any later API included: the names the
    registered dialects are bound to in ``app.core.dialects`` (``CHAT``, ``GEMINI``, ...) and the
    modules of that package that define them (``chat``, ``gemini``, ...)."""
    import app.core.dialects as package
    from app.core.dialects import DIALECTS

    dialects = list(DIALECTS.values())
    constants = {name for name, value in vars(package).items() if any(value is d for d in dialects)}
    modules = {type(d).__module__.rsplit(".", 1)[-1] for d in dialects}
    return frozenset(constants), frozenset(modules)


def test_the_registry_bindings_cover_every_api() -> None:
    from app.core.dialects import DIALECTS

    constants, modules = registry_bindings()
    assert len(constants) >= len(DIALECTS) and len(modules) == len(DIALECTS)
    assert {"CHAT", "GEMINI"} <= constants and {"chat", "gemini"} <= modules


def api_names() -> tuple[frozenset[str], frozenset[str]]:
    """``(exact, contained)``: strings that name a registered wire API: its name (``messages`` is
    also the neutral conversation's own key, so it is no API's name alone), its routes and the
    multi-segment paths they go to upstream, its header key slots but HTTP's own
    ``authorization``, the headers its summary calls carry (its version and organisation
    headers), and the header families of Anthropic and Google."""
    from app.core.dialects import DIALECTS
    from app.core.routes import AUTHORIZATION, key_slots

    exact = {d.name for d in DIALECTS.values()} - {"messages"}
    contained = {"anthropic-", "x-goog-"}
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for dialect in DIALECTS.values():
        for route in dialect.routes:
            contained.add(route.template)
            if "/" in route.upstream:
                contained.add(route.upstream)
            elif route.upstream not in ("", "messages"):
                exact.add(route.upstream)
        call = dialect.summary_request(prompt, model="m", max_tokens=1)
        contained |= {name for name in (*call.carry, *(h for h, _ in call.defaults)) if "-" in name}
    # A query parameter's name is a plain word (Gemini's ``key``, also a login form's field): not
    # an API's name. Code reaches every slot through ``Dialect.key_slots`` anyway.
    contained |= {
        slot.name for slot in key_slots(DIALECTS.values()) if slot != AUTHORIZATION and not slot.in_query
    }
    return frozenset(exact), frozenset(contained)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def seam_violations(path: Path, exact: frozenset[str], contained: frozenset[str]) -> list[str]:
    """API names in code (docstrings may describe the APIs), identity branches on a dialect
    (``is CHAT``, ``is GEMINI``, ``dialect is None``, ``dialect.name == "messages"``) and imports of a
    specific dialect (its constant, or any module of the dialects package but the registry), in
    one module; the constants and module names come from the registry (``registry_bindings``)."""
    from app.core.dialects import DIALECTS

    specific, _ = registry_bindings()
    names = frozenset(DIALECTS)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstring_nodes(tree)
    found: list[str] = []

    def named(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        return node.attr if isinstance(node, ast.Attribute) else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) and id(node) not in docs:
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
            lower = text.lower()
            if lower in exact or any(name in lower for name in contained):
                found.append(f"line {node.lineno}: names an API: {text[:60]!r}")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            sided = {named(side) for side in sides}
            if any(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
                none = any(isinstance(side, ast.Constant) and side.value is None for side in sides)
                if sided & specific or (none and sided & {"dialect"}):
                    found.append(f"line {node.lineno}: identity branch: {ast.unparse(node)}")
            elif any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
                texts = {side.value for side in sides if isinstance(side, ast.Constant)}
                if texts & names and sided & {"name", "api"}:
                    found.append(f"line {node.lineno}: identity branch by name: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if "dialects." in module:
                found.append(f"line {node.lineno}: imports a specific dialect's module {module}")
            taken = {alias.name for alias in node.names} & specific
            if taken:
                found.append(f"line {node.lineno}: imports a specific dialect {sorted(taken)}")
    return found


def test_the_seam_scan_finds_what_it_forbids(tmp_path: Path) -> None:
    exact, contained = api_names()
    assert {"chat", "responses", "gemini"} <= exact and "/v1/messages" in contained
    assert {"x-api-key", "x-goog-api-key", "anthropic-version"} <= contained
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Docstrings may say chat/completions."""\n'
        "from app.core.dialects import CHAT\n"
        "from app.core.dialects.gemini_wire import render_contents\n"
        "def f(dialect, body):\n"
        '    """x-api-key in a docstring is fine."""\n'
        "    if dialect is CHAT or dialect is None or dialect is not GEMINI:\n"
        '        return body["messages"]\n'
        '    if dialect.name == "messages" or body["api"] != "gemini":\n'
        "        return None\n"
        '    return dialect.name == "responses" or "x-api-key" in body\n',
        encoding="utf-8",
    )
    found = seam_violations(sample, exact, contained)
    # The two imports, three identity branches, two by name and three names; not ``"messages"``
    # alone (the neutral conversation's own key).
    assert len(found) == 2 + 3 + 2 + 3, found


def test_no_api_name_nor_identity_branch_outside_the_dialects_and_the_composition_root() -> None:
    exact, contained = api_names()
    bad: dict[str, list[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        rel = path.relative_to(APP.parent).as_posix()
        if rel.startswith(SEAM_HOMES) or rel in SEAM_ALLOWED:
            continue
        found = seam_violations(path, exact, contained)
        if found:
            bad[rel] = found
    assert not bad, bad


def test_no_import_cycle_between_modules() -> None:
    # Every import counts, lazy and type-only ones too: a cycle hidden by a lazy import is a cycle.
    names = modules()
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        deps: set[str] = set()
        for imported in imports_of(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in names:
                parts.pop()
            target = ".".join(parts)
            if target and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps

    def reaches(start: str, goal: str) -> bool:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(graph.get(node, ()))
        return False

    cycles = sorted(f"{a} <-> {b}" for a, deps in graph.items() for b in deps if a < b and reaches(b, a))
    assert not cycles, cycles
