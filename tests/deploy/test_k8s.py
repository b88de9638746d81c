"""deploy/k8s: every manifest valid against the Kubernetes schemas (kubernetes-validate, which ships
them: offline, strict, the oldest and newest versions checked), listed in the kustomization, and
consistent with the image and ctxproxy's own behaviour: probes on /readyz and /healthz, a grace
period that covers the preStop pause plus the drain, a numeric non-root user (the Dockerfile's),
resource requests above the measured memory, Redis reachable at CTXPROXY_CACHE_URL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.core.registry import ModelRegistry
from app.settings import Settings
from tests.deploy.repo import REPO, run, tool

K8S = REPO / "deploy" / "k8s"
VERSIONS = ("1.30.0", "1.37.0")
MEASURED_MEMORY_MIB = 240  # README, Benchmarks: resident memory after every scenario


def resource_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in resource_files():
        for document in yaml.safe_load_all(path.read_text()):
            found[(document["kind"], document["metadata"]["name"])] = document
    return found


def validate(*paths: Path, version: str) -> tuple[int, str]:
    result = run(tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *paths)
    return result.returncode, result.stdout + result.stderr


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return float(number) * (1024 if unit == "Gi" else 1)


def proxy_pod() -> dict[str, Any]:
    spec: dict[str, Any] = objects()[("Deployment", "ctxproxy")]["spec"]["template"]["spec"]
    return spec


def proxy_container() -> dict[str, Any]:
    (container,) = proxy_pod()["containers"]
    return container


def config() -> dict[str, str]:
    """The settings ConfigMap (loaded whole into the environment by envFrom)."""
    data: dict[str, str] = objects()[("ConfigMap", "ctxproxy")]["data"]
    return data


def model_table() -> str:
    """The operator model table, from the ConfigMap the config volume mounts."""
    (volume,) = [v for v in proxy_pod()["volumes"] if v["name"] == "config"]
    data: dict[str, str] = objects()[("ConfigMap", volume["configMap"]["name"])]["data"]
    return data["models.toml"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    status, report = validate(*resource_files(), version=version)
    assert status == 0, report


def test_the_validation_would_catch_a_misspelt_field(tmp_path: Path) -> None:
    bad = tmp_path / "deployment.yaml"
    bad.write_text((K8S / "deployment.yaml").read_text().replace("readinessProbe:", "readinesProbe:"))
    status, report = validate(bad, version=VERSIONS[-1])
    assert status != 0 and "readinesProbe" in report


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in resource_files()]
    (image,) = kustomization["images"]
    assert image["name"] == proxy_container()["image"]


def test_probes_readiness_on_readyz_liveness_on_healthz_on_the_served_port() -> None:
    container = proxy_container()
    (port,) = container["ports"]
    assert port["containerPort"] == 8080  # the image's CTXPROXY_PORT
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    readiness_timeout_s = float(config().get("CTXPROXY_READINESS_TIMEOUT_S", "2"))
    assert container["readinessProbe"]["timeoutSeconds"] > readiness_timeout_s


def test_the_grace_period_covers_the_pre_stop_pause_and_the_drain() -> None:
    drain_s = float(config()["CTXPROXY_SHUTDOWN_GRACE_S"])
    command = proxy_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert proxy_pod()["terminationGracePeriodSeconds"] > float(command[1]) + drain_s


def test_the_pod_runs_as_the_images_numeric_non_root_user_on_a_read_only_root() -> None:
    dockerfile_user = re.findall(
        r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), flags=re.MULTILINE
    )[-1]
    security = proxy_pod()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (str(security["runAsUser"]), str(security["runAsGroup"])) == dockerfile_user
    container = proxy_container()["securityContext"]
    assert container["readOnlyRootFilesystem"] is True and container["allowPrivilegeEscalation"] is False
    assert "/tmp" in {m["mountPath"] for m in proxy_container()["volumeMounts"]}


def test_memory_requests_cover_the_measured_footprint() -> None:
    resources = proxy_container()["resources"]
    assert mebibytes(resources["requests"]["memory"]) >= MEASURED_MEMORY_MIB
    assert mebibytes(resources["limits"]["memory"]) > mebibytes(resources["requests"]["memory"])
    assert "cpu" in resources["requests"]  # the HPA's utilization is relative to it


def test_service_hpa_and_pdb_select_the_proxy_pods() -> None:
    found = objects()
    labels = found[("Deployment", "ctxproxy")]["spec"]["template"]["metadata"]["labels"]
    assert found[("Service", "ctxproxy")]["spec"]["selector"].items() <= labels.items()
    assert (
        found[("PodDisruptionBudget", "ctxproxy")]["spec"]["selector"]["matchLabels"].items()
        <= labels.items()
    )
    hpa = found[("HorizontalPodAutoscaler", "ctxproxy")]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ctxproxy"}
    assert hpa["minReplicas"] >= 2  # so the PDB's one disruption leaves a replica serving


def test_redis_is_where_the_cache_url_points_and_only_the_proxy_reaches_it() -> None:
    found = objects()
    env = {e["name"]: e for e in proxy_container()["env"]}
    url = env["CTXPROXY_CACHE_URL"]["value"]
    host, port = re.fullmatch(r"redis://:\$\(REDIS_PASSWORD\)@([a-z0-9-]+):(\d+)/0", url).groups()  # type: ignore[union-attr]
    service = found[("Service", host)]["spec"]
    assert service["ports"][0]["port"] == int(port)
    redis = found[("Deployment", host)]["spec"]["template"]
    assert service["selector"].items() <= redis["metadata"]["labels"].items()
    (container,) = redis["spec"]["containers"]
    assert "$(REDIS_PASSWORD)" in container["args"]
    secret = found[("Secret", "ctxproxy")]["stringData"]
    assert "REDIS_PASSWORD" in secret
    policy = found[("NetworkPolicy", host)]["spec"]
    assert policy["podSelector"]["matchLabels"] == redis["metadata"]["labels"]
    (rule,) = policy["ingress"]
    assert (
        rule["from"][0]["podSelector"]["matchLabels"]
        == found[("Deployment", "ctxproxy")]["spec"]["selector"]["matchLabels"]
    )


def test_every_ctxproxy_variable_is_a_real_setting_with_a_valid_value() -> None:
    found = objects()
    variables = {k: v for k, v in config().items() if k.startswith("CTXPROXY_")}
    variables |= {
        k: v for k, v in found[("Secret", "ctxproxy")]["stringData"].items() if k.startswith("CTXPROXY_")
    }
    variables |= {e["name"]: e["value"] for e in proxy_container()["env"]}
    values = {k.removeprefix("CTXPROXY_").lower(): v for k, v in variables.items()}
    assert set(values) <= set(Settings.model_fields), set(values) - set(Settings.model_fields)
    values.pop("models_file")  # a path inside the pod
    Settings(**values)


def test_the_mounted_model_table_is_where_the_setting_points_and_parses() -> None:
    (mount,) = [m for m in proxy_container()["volumeMounts"] if m["name"] == "config"]
    assert config()["CTXPROXY_MODELS_FILE"] == f"{mount['mountPath']}/models.toml"
    table = ModelRegistry.from_toml(model_table(), source="operator")
    assert table.resolve("Qwen/Qwen2.5-7B-Instruct").source == "operator"


def test_every_key_loaded_into_the_environment_is_a_variable_name() -> None:
    """A ConfigMap or Secret loaded through envFrom turns every key into an environment variable:
    a file key there (models.toml) would put a variable named "models.toml" into the pod."""
    found = objects()
    pods = [d["spec"]["template"]["spec"] for (kind, _), d in found.items() if kind == "Deployment"]
    sources = [s for pod in pods for c in pod["containers"] for s in c.get("envFrom", [])]
    assert sources
    for source in sources:
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        name = (source.get("configMapRef") or source["secretRef"])["name"]
        document = found[(kind, name)]
        keys = {*document.get("data", {}), *document.get("stringData", {})}
        bad = {key for key in keys if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key)}
        assert not bad, f"{kind} {name} is loaded by envFrom but holds keys that are not variables: {bad}"
