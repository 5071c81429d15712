"""deploy/kubernetes: every manifest passes kubernetes-validate in strict mode (as written and as
`kubectl kustomize` renders it), the service is set up as the README says, and the pre-flight init
container's own script hands vLLM's command the KV size memest predicts for the pod's flags.
"""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_tool

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
FLAGS_FILE = KUBE / "vllm" / "serve-flags.env"


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """What `kubectl kustomize deploy/kubernetes` renders (generated ConfigMaps, images set)."""
    require_tool("kubectl", command=True)
    done = subprocess.run(
        ["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return _docs(done.stdout)


def _validate(doc: dict[str, Any]) -> None:
    require_tool("kubernetes_validate")
    import kubernetes_validate

    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    return found


def test_kustomization_lists_every_manifest() -> None:
    listed = yaml.safe_load((KUBE / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.relative_to(KUBE).as_posix() for p in _manifest_files())


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.relative_to(KUBE).as_posix())
def test_manifest_validates_strictly(path: Path) -> None:
    docs = _docs(path.read_text())
    assert docs
    for doc in docs:
        _validate(doc)


def test_rendered_kustomization_validates_strictly(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == sorted(
        ["Namespace", "ConfigMap", "ConfigMap", "Service", "Service"]
        + ["PersistentVolumeClaim", "PersistentVolumeClaim", "Deployment", "Deployment"]
    )
    for doc in rendered:
        _validate(doc)


def test_strict_validation_refuses_a_misspelt_field(rendered: list[dict[str, Any]]) -> None:
    """Strict mode is what catches a typo: a probe spelt livenessprobe is refused."""
    require_tool("kubernetes_validate")
    import kubernetes_validate

    bad = copy.deepcopy(_one(rendered, "Deployment", "memest"))
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["livenessprobe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(bad)


def test_service_deployment(rendered: list[dict[str, Any]]) -> None:
    pod = _one(rendered, "Deployment", "memest")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's memest user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert secrets["MEMEST_WRITE_TOKEN"] == {"name": "memest-tokens", "key": "write-token"}
    assert secrets["MEMEST_READ_TOKEN"]["name"] == "memest-tokens"
    assert secrets["MEMEST_DATABASE_URL"]["name"] == "memest-database"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"] == "memest-data"
    assert container["args"][0] == "--forwarded-allow-ips"


def _flags() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in FLAGS_FILE.read_text().splitlines() if line.strip())
    return {key: value for key, value in pairs}


def _script(container: dict[str, Any], mounts: dict[str, Path]) -> str:
    """The container's `sh -c` script with its volume mount paths moved to local folders."""
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    for mount in container["volumeMounts"]:
        if mount["mountPath"] in mounts:
            script = script.replace(mount["mountPath"], str(mounts[mount["mountPath"]]))
    assert isinstance(script, str)
    return script


def test_preflight_init_container_hands_its_kv_size_to_vllm(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    pod = _one(rendered, "Deployment", "vllm")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (vllm,) = pod["containers"]
    env_names = {e["name"]: e for e in vllm["env"]}
    assert env_names["MEMEST_ENABLE"]["value"] == "1"
    assert env_names["MEMEST_SERVICE_URL"]["value"] == "http://memest:8000"
    assert env_names["MEMEST_OUTPUT_DIR"]["value"] in {m["mountPath"] for m in vllm["volumeMounts"]}
    # The ConfigMap the init container mounts, written out as the kubelet would.
    model_config = tmp_path / "model-config"
    model_config.mkdir()
    config_map = _one(rendered, "ConfigMap", "vllm-model-config")
    (model_config / "config.json").write_text(config_map["data"]["config.json"])
    plan = tmp_path / "plan"
    plan.mkdir()
    mounts = {"/model-config": model_config, "/memest-plan": plan}
    # `vllm` stands in as a script that records the arguments it was started with.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "vllm"
    stub.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n"
    )
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, **_flags()}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env["PATH"]])
    for container in (init, vllm):  # every ConfigMap the containers read is the flags one
        (ref,) = container["envFrom"]
        assert ref["configMapRef"]["name"].startswith("vllm-serve-flags")
    done = subprocess.run(
        ["sh", "-c", _script(init, mounts)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    started = subprocess.run(
        ["sh", "-c", _script(vllm, mounts)], env=env, capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 0, started.stderr
    argv = json.loads(started.stdout)
    # The KV size `memest preflight` gives for the flags of serve-flags.env, asked here directly.
    expected = subprocess.run(
        [
            sys.executable,
            "-m",
            "memest",
            "preflight",
            "--model-config",
            str(ROOT / "tests/data/configs/llama8b.json"),
        ]
        + ["--gpu", "h200", "--tensor-parallel-size", "1", "--max-num-seqs", "128"]
        + ["--max-num-batched-tokens", "4096", "--max-model-len", "4096"]
        + ["--gpu-memory-utilization", "0.85", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    kv_bytes = json.loads(expected.stdout)["kv_cache_bytes"]
    assert argv == [
        "serve", "meta-llama/Meta-Llama-3-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--tensor-parallel-size", "1", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096",
        "--max-model-len", "4096", "--gpu-memory-utilization", "0.85",
        "--kv-cache-memory-bytes", str(kv_bytes),
    ]  # fmt: skip
    assert kv_bytes > 100 * 2**30  # an 8B model on a 141 GiB H200 at 0.85 keeps over 100 GiB


def test_compose_binds_loopback_and_has_no_default_password() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    grafana_env = compose["services"]["grafana"]["environment"]
    assert grafana_env["GF_SECURITY_ADMIN_PASSWORD"].endswith(":?set GRAFANA_ADMIN_PASSWORD}")
    assert "memest" not in json.dumps(compose["services"]["db"]["environment"]["POSTGRES_PASSWORD"])
