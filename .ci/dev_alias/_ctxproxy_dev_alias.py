"""Development installs only: ``import ctxproxy`` is ``import app``, the same module objects.

The wheel installs the source directory ``app/`` as the package ``ctxproxy`` (hatchling's
``sources`` rewrite). Editable installs cannot rename a directory (hatchling refuses a ``sources``
prefix change in dev mode), so ``hatch_build.py`` puts this module and a ``.pth`` line importing it
into editable installs only. It adds one meta-path finder that answers ``ctxproxy`` and
``ctxproxy.<sub>`` with the already imported (or freshly imported) ``app`` / ``app.<sub>`` module
itself: one copy of every module, so module state (settings caches, the Prometheus registry) is
never duplicated when tests import ``app`` and the public-API tests import ``ctxproxy`` in one process.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

_ALIAS = "ctxproxy"
_SOURCE = "app"


def _source_name(fullname: str) -> str:
    return _SOURCE + fullname[len(_ALIAS) :]


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _ALIAS and not fullname.startswith(_ALIAS + "."):
            return None
        real = importlib.util.find_spec(_source_name(fullname))
        if real is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, is_package=real.submodule_search_locations is not None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = importlib.import_module(_source_name(spec.name))
        # The import system overwrites __spec__ on whatever create_module returns; keep the real one.
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._real_spec

    def get_code(self, fullname: str) -> types.CodeType | None:
        """For ``python -m ctxproxy``: runpy asks the loader for the code of ``ctxproxy.__main__``."""
        real = importlib.util.find_spec(_source_name(fullname))
        assert real is not None and real.loader is not None
        return real.loader.get_code(real.name)  # type: ignore[attr-defined, no-any-return]


if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())
