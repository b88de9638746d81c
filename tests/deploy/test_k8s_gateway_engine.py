"""deploy/k8s/gateway-engine: ctxproxy as a gateway's compression engine. Every manifest valid against
the Kubernetes schemas (offline, strict), listed in its kustomization, consistent with the image and
the engine's routes; the gateway examples point at the engine's Service and at the routes the code
serves, with the defaults the gateways document."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from app import __version__
from app.api.compress import COMPRESS_PATH, compact_path
from app.core.dialects import CHAT
from app.core.registry import ModelRegistry
from app.settings import Settings
from tests.deploy.repo import REPO, run, tool

ENGINE = REPO / "deploy" / "k8s" / "gateway-engine"
EXAMPLES = ENGINE / "examples"
VERSIONS = ("1.30.0", "1.37.0")


def manifests() -> list[Path]:
    return sorted(p for p in ENGINE.glob("*.yaml") if p.name != "kustomization.yaml")


def objects(*paths: Path) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in paths or tuple(manifests()):
        for document in yaml.safe_load_all(path.read_text()):
            found[(document["kind"], document["metadata"]["name"])] = document
    return found


def pod() -> dict[str, Any]:
    spec: dict[str, Any] = objects()[("Deployment", "ctxproxy-engine")]["spec"]["template"]["spec"]
    return spec


def container() -> dict[str, Any]:
    (only,) = pod()["containers"]
    return only


def environment() -> dict[str, str]:
    found = objects()
    values: dict[str, str] = {}
    for source in container()["envFrom"]:
        values |= found[("ConfigMap", source["configMapRef"]["name"])]["data"]
    return values


def service() -> dict[str, Any]:
    spec: dict[str, Any] = objects()[("Service", "ctxproxy-engine")]["spec"]
    return spec


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_and_the_coordinator_example_are_valid_kubernetes(version: str) -> None:
    paths = [*manifests(), EXAMPLES / "llm-d-coordinator.yaml"]
    result = run(tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *paths)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kustomization_lists_every_manifest_and_the_image_of_this_version() -> None:
    kustomization = yaml.safe_load((ENGINE / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == [p.name for p in manifests()]
    (image,) = kustomization["images"]
    assert image["name"] == container()["image"]
    assert f"{image['newName']}:{image['newTag']}" == f"ctxproxy:{__version__}"


def test_the_engine_needs_no_key_and_every_setting_is_real_and_valid() -> None:
    values = {k.removeprefix("CTXPROXY_").lower(): v for k, v in environment().items()}
    assert set(values) <= set(Settings.model_fields), set(values) - set(Settings.model_fields)
    assert "api_keys" not in values  # the gateways send no credentials to their engine
    assert values["discovery"] == "false"
    assert "compress_aside_tokens" in values
    values.pop("models_file")  # a path inside the pod
    Settings(**values)
    for name in environment():
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", name), f"{name} would be an odd environment variable"


def test_the_mounted_model_table_is_where_the_setting_points_and_parses() -> None:
    (mount,) = [m for m in container()["volumeMounts"] if m["name"] == "config"]
    assert environment()["CTXPROXY_MODELS_FILE"] == f"{mount['mountPath']}/models.toml"
    (volume,) = [v for v in pod()["volumes"] if v["name"] == "config"]
    table = objects()[("ConfigMap", volume["configMap"]["name"])]["data"]["models.toml"]
    assert (
        ModelRegistry.from_toml(table, source="operator").resolve("Qwen/Qwen2.5-7B-Instruct").source
        == "operator"
    )


def test_probes_need_no_upstream_and_the_grace_covers_the_drain() -> None:
    probes = [container()[k]["httpGet"] for k in ("readinessProbe", "livenessProbe", "startupProbe")]
    (port,) = container()["ports"]
    assert all(p == {"path": "/healthz", "port": port["name"]} for p in probes)
    assert port["containerPort"] == 8080 and service()["ports"][0]["targetPort"] == port["name"]
    pause_s = float(container()["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod()["terminationGracePeriodSeconds"] > pause_s + float(
        environment()["CTXPROXY_SHUTDOWN_GRACE_S"]
    )


def test_it_runs_hardened_as_the_images_user_and_only_the_gateways_reach_it() -> None:
    user = re.findall(r"^USER (\d+):(\d+)$", (REPO / "Dockerfile").read_text(), flags=re.MULTILINE)[-1]
    security = pod()["securityContext"]
    assert (
        security["runAsNonRoot"] is True and (str(security["runAsUser"]), str(security["runAsGroup"])) == user
    )
    assert container()["securityContext"]["readOnlyRootFilesystem"] is True
    labels = objects()[("Deployment", "ctxproxy-engine")]["spec"]["template"]["metadata"]["labels"]
    assert service()["selector"].items() <= labels.items()
    policy = objects()[("NetworkPolicy", "ctxproxy-engine")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    (rule,) = policy["ingress"]
    assert [p["port"] for p in rule["ports"]] == [8080]
    allowed = [source["podSelector"]["matchLabels"] for source in rule["from"]]
    assert {"app.kubernetes.io/name": "agentgateway"} in allowed and {"app": "llm-d-coordinator"} in allowed


def test_the_agentgateway_example_points_at_the_engine_with_the_documented_defaults() -> None:
    found = objects(EXAMPLES / "agentgateway-policy.yaml")
    policy = found[("AgentgatewayPolicy", "ctxproxy-compression")]
    compression = policy["spec"]["backend"]["ai"]["contextCompression"]
    ref = compression["backendRef"]
    assert (ref["name"], ref["port"]) == ("ctxproxy-engine", service()["ports"][0]["port"])
    assert compression["path"] == COMPRESS_PATH
    assert compression["failureMode"] == "FailOpen" and compression["minSizeBytes"] == 16384
    grant = found[("ReferenceGrant", "agentgateway-to-ctxproxy-engine")]
    assert grant["metadata"]["namespace"] == ref["namespace"]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": ref["name"]}]
    (source,) = grant["spec"]["from"]
    assert source["namespace"] == policy["metadata"]["namespace"] and source["kind"] == policy["kind"]


def test_the_llm_d_example_calls_the_chat_whole_body_endpoint_of_the_engines_service() -> None:
    namespace = objects(EXAMPLES / "agentgateway-policy.yaml")[
        ("AgentgatewayPolicy", "ctxproxy-compression")
    ]["spec"]["backend"]["ai"]["contextCompression"]["backendRef"]["namespace"]
    config = objects(EXAMPLES / "llm-d-coordinator.yaml")[("ConfigMap", "llm-d-coordinator-config")]
    steps = yaml.safe_load(config["data"]["coordinator.yaml"])["pipeline"]["steps"]
    assert [s["type"] for s in steps] == ["request-inline-compaction", "prefill", "decode"]
    address = urlsplit(steps[0]["params"]["address"])
    assert address.hostname == f"ctxproxy-engine.{namespace}.svc.cluster.local"
    assert address.port == service()["ports"][0]["port"]
    assert address.path == compact_path(CHAT)


def readme_gateway_snippets() -> list[Any]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Behind a gateway: ctxproxy as the compression engine", 1)[1].split("\n## ", 1)[0]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)]


def test_the_readmes_gateway_snippets_parse_and_call_the_routes_the_code_serves() -> None:
    standalone, policy, coordinator = readme_gateway_snippets()
    (model,) = standalone["llm"]["models"]
    compression = model["contextCompression"]
    assert urlsplit(compression["path"]).path == COMPRESS_PATH
    assert compression["target"]["host"] == f"ctxproxy-engine:{service()['ports'][0]['port']}"
    example = objects(EXAMPLES / "agentgateway-policy.yaml")[("AgentgatewayPolicy", "ctxproxy-compression")]
    assert policy["spec"] == example["spec"]  # the README shows the example file's policy
    (step, *_rest) = coordinator["pipeline"]["steps"]
    config = objects(EXAMPLES / "llm-d-coordinator.yaml")[("ConfigMap", "llm-d-coordinator-config")]
    example_step = yaml.safe_load(config["data"]["coordinator.yaml"])["pipeline"]["steps"][0]
    assert step == example_step
