"""The shipped configuration stays in step with the code: settings example, README (the compose file,
the Dockerfile and the Kubernetes manifests: tests/deploy/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def env_example() -> dict[str, str]:
    text = (REPO / "config" / "ctxproxy.env.example").read_text(encoding="utf-8")
    return dict(re.findall(r"^# (CTXPROXY_[A-Z_]+)=(.*)$", text, flags=re.MULTILINE))


@pytest.mark.parametrize("name", sorted(Settings.model_fields))
def test_every_setting_is_documented(name: str) -> None:
    variable = f"CTXPROXY_{name.upper()}"
    example = env_example()
    assert variable in example, f"{variable} missing from config/ctxproxy.env.example"
    assert f"`{variable}`" in (REPO / "README.md").read_text(encoding="utf-8"), f"{variable} not in README"
    default = Settings.model_fields[name].get_default(call_default_factory=True)
    documented = example[variable]
    if default is None:
        assert documented == ""
    elif isinstance(default, bool):
        assert documented == str(default).lower()
    elif isinstance(default, dict):
        assert documented == "{}" and not default
    else:
        assert documented == str(default)


def test_nothing_documented_that_does_not_exist() -> None:
    known = {f"CTXPROXY_{name.upper()}" for name in Settings.model_fields}
    assert set(env_example()) <= known


def test_readme_quick_start_and_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bash .ci/setup && .venv/bin/ctxproxy demo", "bash .ci/run"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert ".venv/bin/python -m pytest -q" in ci
    assert ".venv/bin/python -m pytest -q" in readme
    assert "## Benchmarks" in readme
