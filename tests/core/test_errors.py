"""app.core.errors: one root, and the tree its docstring draws is the tree the code defines."""

from __future__ import annotations

import importlib
import pkgutil
import re

import app
from app.core import errors
from app.core.errors import CannotFit, CoreError, CtxproxyError, InvalidModelTable, InvalidRequest


def drawn_tree() -> dict[str, str | None]:
    """``{class name: parent name}`` from the module docstring's drawing (indentation = depth)."""
    doc = errors.__doc__ or ""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.search(r"[A-Za-z]+", line)
        if (
            match is None
            or set(line[: match.start()]) - set(" │├└─")
            or not re.fullmatch(r"(?:[A-Z][a-z]+){2,}", match.group())
        ):
            continue  # not a node: a description, or prose outside the drawing
        if not line[: match.start()].strip(" │") and stack:
            continue  # a description's continuation line, under a node
        depth = match.start()
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[match.group()] = stack[-1][1] if stack else None
        stack.append((depth, match.group()))
    return parents


def import_all_of_app() -> None:
    for module in pkgutil.walk_packages(app.__path__, "app."):
        if not module.name.endswith("__main__"):  # runs the command line when imported
            importlib.import_module(module.name)


def bug_signals() -> set[str]:
    """The exception classes the docstring names as outside the tree on purpose."""
    doc = (errors.__doc__ or "").split("Outside the tree on purpose", 1)[1]
    return set(re.findall(r"``([A-Z][A-Za-z]+(?:Error|Warning))``", doc))


def defined_tree() -> dict[str, str | None]:
    """``{class name: parent name}`` of every ``CtxproxyError`` subclass, with all of app imported."""
    import_all_of_app()
    found: dict[str, str | None] = {"CtxproxyError": None}
    pending = [CtxproxyError]
    while pending:
        parent = pending.pop()
        for child in parent.__subclasses__():
            if child.__module__.startswith("app."):
                found[child.__name__] = parent.__name__
                pending.append(child)
    return found


def test_the_drawing_is_the_code() -> None:
    drawn = drawn_tree()
    assert drawn["CtxproxyError"] is None and drawn["SummaryUpstreamError"] == "SummaryError"
    assert defined_tree() == drawn


def test_every_exception_class_of_app_is_under_the_root_or_a_named_bug_signal() -> None:
    import_all_of_app()
    outside: set[str] = set()
    pending: list[type[BaseException]] = [Exception]
    while pending:
        kind = pending.pop()
        for child in kind.__subclasses__():
            if child.__module__.startswith("app.") and not issubclass(child, CtxproxyError):
                outside.add(child.__name__)
            pending.append(child)
    assert outside <= bug_signals(), sorted(outside - bug_signals())


def test_the_core_errors_hang_under_the_root() -> None:
    for kind in (InvalidRequest, CannotFit, InvalidModelTable):
        assert issubclass(kind, CoreError) and issubclass(kind, CtxproxyError)
    error = CannotFit(tokens=12, budget_tokens=10, window_tokens=16, reserve_tokens=6, reason="no strategy")
    assert isinstance(error, CtxproxyError)
    assert "12 input tokens" in error.message and "budget is 10" in error.message
    assert InvalidRequest("bad", param="messages[0]").param == "messages[0]"
