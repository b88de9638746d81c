"""Hatchling build hook: editable installs also answer ``import ctxproxy`` (see .ci/dev_alias/)."""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version != "editable":
            return
        # Replaces the force-include map in editable builds: the model table is read from the
        # checkout's config/ there, and nothing named ctxproxy/ lands in site-packages.
        build_data["force_include_editable"] = {
            ".ci/dev_alias/_ctxproxy_dev_alias.py": "_ctxproxy_dev_alias.py",
            ".ci/dev_alias/_ctxproxy_dev_alias.pth": "_ctxproxy_dev_alias.pth",
        }
