"""The Dockerfile: hadolint finds nothing, the user is numeric and not root, every pip command is held
to the lock (constraints.txt), the command is a console script of the wheel. No image is built here
(no Docker engine in CI); these are the checks that run without one."""

from __future__ import annotations

import fnmatch
import re
import shlex
import tomllib
from pathlib import Path

import yaml

from app import __version__
from tests.deploy.repo import REPO, run, tool

DOCKERFILE = REPO / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for line in joined.splitlines()
        if (parts := line.strip().split(maxsplit=1))
    ]


def hadolint(path: Path) -> tuple[int, str]:
    result = run(tool("hadolint"), "--no-color", path)
    return result.returncode, result.stdout + result.stderr


def test_hadolint_finds_nothing() -> None:
    status, report = hadolint(DOCKERFILE)
    assert status == 0, report


def test_hadolint_would_catch_a_named_user_and_an_unpinned_install(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text().replace("USER 10001:10001", "USER ctxproxy")
    text = text.replace("pip install --constraint constraints.txt hatchling", "pip install hatchling")
    (tmp_path / "Dockerfile").write_text(text)
    status, report = hadolint(tmp_path / "Dockerfile")
    assert status != 0
    assert "DL3066" in report and "DL3013" in report


def test_the_final_user_is_numeric_and_not_root() -> None:
    users = [args for name, args in instructions(DOCKERFILE.read_text()) if name == "USER"]
    assert users, "no USER instruction: the image would run as root"
    match = re.fullmatch(r"(\d+):(\d+)", users[-1])
    assert match, f"USER {users[-1]}: Kubernetes runAsNonRoot needs a numeric uid:gid"
    assert int(match[1]) != 0 and int(match[2]) != 0


def test_every_pip_command_is_held_to_the_lock() -> None:
    pip_runs = [
        args for name, args in instructions(DOCKERFILE.read_text()) if name == "RUN" and "pip " in args
    ]
    assert len(pip_runs) >= 3  # the build backend, the wheels, the runtime install
    for args in pip_runs:
        words = shlex.split(args)
        constraints = [words[i + 1] for i, word in enumerate(words) if word in ("-c", "--constraint")]
        assert constraints and all(c.endswith("constraints.txt") for c in constraints), args
    assert (REPO / "constraints.txt").is_file()


def test_the_image_installs_the_extras_the_lock_was_compiled_for() -> None:
    text = DOCKERFILE.read_text()
    installed = {frozenset(m.split(",")) for m in re.findall(r"\[([a-z,]+)\]\"", text)}
    locked = frozenset(re.findall(r"--extra (\w+)", (REPO / ".ci" / "lint-deploy").read_text()))
    assert installed == {locked}


def build_inputs() -> set[str]:
    """What building the wheel reads, per pyproject.toml: the metadata, the readme, the packages,
    the force-included files, the custom build hook."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    wheel = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = {"pyproject.toml", pyproject["project"]["readme"], *wheel["packages"]}
    needed |= set(wheel.get("force-include", {}))
    if "custom" in wheel.get("hooks", {}):
        needed.add(wheel["hooks"]["custom"].get("path", "hatch_build.py"))
    return needed


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context: Docker's rule, the last
    matching line wins, a ``!`` line re-includes, a line matches a path or any directory above it."""
    verdict = False
    for line in (REPO / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if pattern[:1] in ("", "#"):
            continue
        keep = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            verdict = not keep
    return verdict


def test_the_dockerignore_reading_follows_dockers_rules() -> None:
    assert dockerignored(".ci/run") and dockerignored("tests/test_build.py") and dockerignored(".git")
    assert not dockerignored("app/main.py") and not dockerignored("pyproject.toml")


def test_the_build_stage_copies_everything_the_wheel_build_reads() -> None:
    copied: set[str] = set()
    for name, args in instructions(DOCKERFILE.read_text()):
        if name == "COPY" and not args.startswith("--from"):
            copied |= {source.rstrip("/") for source in args.split()[:-1]}
    for needed in build_inputs():
        top = needed.split("/", 1)[0]
        assert needed in copied or top in copied, f"the image build does not copy {needed}"
        assert not dockerignored(needed), f".dockerignore drops {needed}"
    assert "constraints.txt" in copied and not dockerignored("constraints.txt")


def test_the_command_is_a_console_script_of_the_wheel_and_the_port_is_exposed() -> None:
    steps = instructions(DOCKERFILE.read_text())
    (cmd,) = [args for name, args in steps if name == "CMD"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert cmd.startswith("[") and cmd.split('"')[1] in scripts
    assert ("EXPOSE", "8080") in steps
    assert any(name == "HEALTHCHECK" and "/healthz" in args for name, args in steps)


def test_both_stages_are_the_same_pinned_python_image() -> None:
    steps = instructions(DOCKERFILE.read_text())
    (base,) = [args for name, args in steps if name == "ARG" and args.startswith("PYTHON_IMAGE=")]
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.11-slim-[a-z]+(@sha256:[0-9a-f]{64})?", base)
    assert [args.split()[0] for name, args in steps if name == "FROM"] == ["${PYTHON_IMAGE}"] * 2


def test_the_image_tag_is_the_same_everywhere_and_is_the_package_version() -> None:
    """The Dockerfile's build comment, docker-compose.yml and the kustomization name one image:
    ctxproxy:<version of the package>."""
    wanted = f"ctxproxy:{__version__}"
    built = re.findall(r"docker build -t (\S+) \.", DOCKERFILE.read_text())
    run_tags = re.findall(r"docker run .* (ctxproxy\S*)$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert built == [wanted] and run_tags == [wanted], (built, run_tags)
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["x-ctxproxy"]["image"] == wanted
    for path in sorted((REPO / "deploy" / "k8s").rglob("kustomization.yaml")):
        (image,) = yaml.safe_load(path.read_text())["images"]
        assert f"{image['newName']}:{image['newTag']}" == wanted, path
