"""constraints.txt, the image's lock, covers pyproject.toml: every dependency the image installs (the
runtime, the extras the Dockerfile names, the build backend) is pinned to one version inside its
declared range. Offline; `bash .ci/lint-deploy` re-resolves the whole tree against the index."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.deploy.repo import REPO

# The image: Linux, CPython 3.11 (python:3.11-slim-bookworm).
IMAGE_MARKERS = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def pins() -> dict[str, Version]:
    found: dict[str, Version] = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert match, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        name = canonicalize_name(match[1])
        assert name not in found, f"constraints.txt pins {name} twice"
        found[name] = Version(match[2])
    return found


def image_requirements() -> list[Requirement]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = re.findall(r"--extra (\w+)", (REPO / ".ci" / "lint-deploy").read_text())
    optional = pyproject["project"]["optional-dependencies"]
    specs = [*pyproject["project"]["dependencies"], *pyproject["build-system"]["requires"]]
    for extra in extras:
        specs += optional[extra]
    return [r for r in map(Requirement, specs) if r.marker is None or r.marker.evaluate(IMAGE_MARKERS)]


def test_every_line_is_an_exact_pin() -> None:
    assert len(pins()) >= 20


def test_every_dependency_of_the_image_is_pinned_inside_its_range() -> None:
    locked = pins()
    requirements = image_requirements()
    assert {"fastapi", "tiktoken", "redis", "prometheus-client", "hatchling"} <= {
        canonicalize_name(r.name) for r in requirements
    }
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in locked, (
            f"{name} ({requirement}) is not in constraints.txt: bash .ci/lint-deploy --update"
        )
        assert requirement.specifier.contains(locked[name], prereleases=True), (
            f"constraints.txt pins {name}=={locked[name]}, outside {requirement}: "
            "bash .ci/lint-deploy --update"
        )


def test_the_lock_says_how_to_regenerate_it() -> None:
    assert "bash .ci/lint-deploy --update" in (REPO / "constraints.txt").read_text()
