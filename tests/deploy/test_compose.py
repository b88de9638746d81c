"""docker-compose.yml: valid against the compose-spec schema (shipped by check-jsonschema, offline),
and the promises the README makes about it: a CPU-only default stack whose health checks gate each
step (model loaded -> proxy ready -> app), vLLM only with --profile gpu, monitoring kept, every port
on 127.0.0.1, the model cache in a named volume, a model table that matches the served windows.
`docker compose config` is not used: CI has no Docker."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from app.core.registry import ModelRegistry
from app.settings import Settings
from tests.deploy.repo import REPO, compose, run, tool

DEFAULT = {"llama", "ctxproxy", "app"}
PROFILES = {"gpu": {"vllm", "ctxproxy-gpu"}, "monitoring": {"prometheus", "grafana"}}


def check_schema(path: Path) -> tuple[int, str]:
    result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path)
    return result.returncode, result.stdout + result.stderr


def healthcheck_command(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test[1:]) if isinstance(test, list) else test


def test_the_compose_file_is_valid_against_the_compose_spec() -> None:
    status, report = check_schema(REPO / "docker-compose.yml")
    assert status == 0, report


def test_the_schema_check_would_catch_a_misspelt_key(tmp_path: Path) -> None:
    bad = tmp_path / "compose.yml"
    bad.write_text(
        (REPO / "docker-compose.yml").read_text().replace("restart: on-failure:5", "restrat: on-failure")
    )
    status, report = check_schema(bad)
    assert status != 0 and "restrat" in report


def test_the_default_stack_runs_on_a_cpu_and_the_gpu_and_monitoring_are_profiles() -> None:
    services = compose()["services"]
    default = {name for name, s in services.items() if "profiles" not in s}
    assert default == DEFAULT
    for profile, names in PROFILES.items():
        assert {name for name, s in services.items() if profile in s.get("profiles", [])} == names
    assert "devices" not in str(services["llama"]) and "nvidia" in str(services["vllm"]["deploy"])


def test_every_dependency_is_started_with_its_dependent_and_healthy_ones_have_a_check() -> None:
    services = compose()["services"]
    for name, service in services.items():
        depends = service.get("depends_on", {})
        for target in depends:
            assert target in services, f"{name} depends on unknown {target}"
            assert set(services[target].get("profiles", [])) <= set(service.get("profiles", [])), (
                f"{name} would start without {target}"
            )
            if isinstance(depends, dict) and depends[target].get("condition") == "service_healthy":
                assert "healthcheck" in services[target], f"{target} is waited on but has no health check"


def test_health_checks_mean_model_loaded_then_proxy_ready_then_app() -> None:
    services = compose()["services"]
    assert "/health" in healthcheck_command(services["llama"])
    assert "/health" in healthcheck_command(services["vllm"])
    for proxy, upstream in (("ctxproxy", "llama"), ("ctxproxy-gpu", "vllm")):
        assert "/readyz" in healthcheck_command(services[proxy])
        assert services[proxy]["depends_on"][upstream]["condition"] == "service_healthy"
        assert services[proxy]["restart"] == "unless-stopped"
    app = services["app"]
    assert app["depends_on"]["ctxproxy"]["condition"] == "service_healthy"
    assert app["restart"].startswith("on-failure")
    assert app["environment"]["OPENAI_BASE_URL"] == "http://ctxproxy:8080/v1"


def test_every_published_port_is_bound_to_loopback() -> None:
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_named_volumes_configs_and_their_files_exist() -> None:
    spec = compose()
    assert any(v.startswith("models:") for v in spec["services"]["llama"]["volumes"])
    for name, service in spec["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in spec["volumes"], f"{name} mounts undeclared volume {source}"
        for config in service.get("configs", []):
            assert config["source"] in spec["configs"], f"{name} uses undeclared config {config['source']}"
    for config in spec["configs"].values():
        if "file" in config:
            assert (REPO / config["file"]).is_file(), config["file"]


def test_the_model_table_states_the_windows_the_upstreams_serve() -> None:
    spec = compose()
    services = spec["services"]
    proxy = services["ctxproxy"]
    (mount,) = proxy["configs"]
    assert mount["target"] == proxy["environment"]["CTXPROXY_MODELS_FILE"]
    table = ModelRegistry.from_toml(spec["configs"][mount["source"]]["content"], source="operator")
    llama = services["llama"]["environment"]
    served = table.resolve(llama["LLAMA_ARG_ALIAS"])
    assert served.source == "operator" and served.window_tokens == int(llama["LLAMA_ARG_CTX_SIZE"])
    assert services["app"]["environment"]["EXAMPLE_MODEL"] == llama["LLAMA_ARG_ALIAS"]
    vllm = services["vllm"]["command"]
    model, window = vllm[vllm.index("--model") + 1], vllm[vllm.index("--max-model-len") + 1]
    assert table.resolve(model).source == "operator" and table.resolve(model).window_tokens == int(window)


@pytest.mark.parametrize("proxy", ["ctxproxy", "ctxproxy-gpu"])
def test_the_proxy_settings_are_real_settings_with_valid_values(proxy: str) -> None:
    environment = compose()["services"][proxy]["environment"]
    values = {k.removeprefix("CTXPROXY_").lower(): v for k, v in environment.items()}
    unknown = set(values) - set(Settings.model_fields)
    assert not unknown, f"not ctxproxy settings: {unknown}"
    values.pop("models_file")  # a path inside the container
    Settings(**values)
    upstream = values["upstream_base_url"]
    host = upstream.split("//", 1)[1].split(":", 1)[0]
    assert host in compose()["services"] and upstream.endswith("/v1")


def test_the_proxy_is_hardened() -> None:
    for name in ("ctxproxy", "ctxproxy-gpu"):
        service = compose()["services"][name]
        assert service["build"] == "." and service["read_only"] is True and service["cap_drop"] == ["ALL"]
        assert "no-new-privileges:true" in service["security_opt"]
        assert shlex.split(healthcheck_command(service))[0] == "python"


def test_inline_configs_come_with_the_compose_version_they_need() -> None:
    """``configs: content:`` exists since Docker Compose 2.23.1: the README and the file say so."""
    inline = [name for name, config in compose()["configs"].items() if "content" in config]
    assert inline, "no inline config left: drop the version note from README and the compose file"
    assert "Compose 2.23.1 or newer" in (REPO / "README.md").read_text()
    assert "Compose 2.23.1 or newer" in (REPO / "docker-compose.yml").read_text()
