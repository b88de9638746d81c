"""The package build: the wheel installs ``app/`` as ``ctxproxy`` only; a dev install answers both names."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheel")
    # Offline: hatchling is a dev dependency, so no isolated build environment is fetched.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (path,) = out.glob("ctxproxy-*.whl")
    with zipfile.ZipFile(path) as archive:
        yield archive


def test_the_wheel_installs_ctxproxy_and_no_top_level_app(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"ctxproxy"}
    assert "ctxproxy/main.py" in names and "ctxproxy/core/fit.py" in names
    assert not [name for name in names if name.endswith(".pth")]


def test_the_wheel_ships_the_model_table_and_the_vocabularies(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "ctxproxy/data/models.toml" in names
    assert "ctxproxy/vocab/SHA256SUMS" in names
    assert any(name.startswith("ctxproxy/vocab/o200k_base") for name in names)


def test_the_console_script_points_into_ctxproxy(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [name for name in wheel.namelist() if name.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "ctxproxy = ctxproxy.cli:main" in text


def test_a_dev_install_answers_ctxproxy_with_the_app_modules_themselves() -> None:
    # One copy of every module: state such as the metrics registry must not exist twice.
    assert importlib.import_module("ctxproxy") is importlib.import_module("app")
    assert importlib.import_module("ctxproxy.core.fit") is importlib.import_module("app.core.fit")
    assert importlib.import_module("ctxproxy.core.fit").__spec__.name == "app.core.fit"


def test_python_dash_m_ctxproxy_runs_from_a_dev_install(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctxproxy", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: ctxproxy" in done.stdout


def test_the_installed_wheel_runs_as_ctxproxy_alone(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """The wheel unpacked on its own (no checkout, no dev alias: ``-S`` skips every ``.pth``):
    ``python -m ctxproxy`` runs, the engine counts with the shipped vocabulary and model table."""
    import site
    import sysconfig

    target = tmp_path / "site"
    wheel.extractall(target)
    dependencies = sysconfig.get_paths()["purelib"]
    env = {"PYTHONPATH": os.pathsep.join([str(target), dependencies, *site.getsitepackages()])}
    probe = "\n".join(
        [
            "import ctxproxy",
            "print(ctxproxy.__file__)",
            "try:",
            "    import app.main",
            "except ModuleNotFoundError:",
            "    print(None)",
            "else:",
            "    print(app.main.__file__)",
            "print(ctxproxy.count({'model': 'gpt-4o', 'messages': [{'role': 'user', 'content': 'hello'}]}))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    where, app_spec, count = done.stdout.splitlines()
    assert where.startswith(str(target)), done.stdout
    assert app_spec == "None" and count == "8", done.stdout  # no app.main anywhere
    models = subprocess.run(
        [sys.executable, "-S", "-m", "ctxproxy", "models"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert models.returncode == 0, models.stderr
    assert "gpt-4o" in models.stdout
